"""The lpm policy's starvation bound (runtime/batch.py MAX_OVERTAKES).

lpm orders waiting requests by their cached prefix, so one that shares nothing cached loses to
every request that does. Simulated here: each step two new requests with a cached prefix arrive
and the two first in policy order are admitted. Without the bound the lonely request would never
be first; with it, it is first once MAX_OVERTAKES admissions have happened since it was queued.
"""

from __future__ import annotations

from types import SimpleNamespace

from sgl.runtime.batch import MAX_OVERTAKES, BatchBuilder


class _Cache:
    """match_prefix: a request's first token id is how many of its tokens are cached."""

    shares_prefixes = True

    def match_prefix(self, ids):
        return [0] * ids[0], None


def _req(cached: int) -> SimpleNamespace:
    return SimpleNamespace(fill_ids=[cached, 1, 2, 3], queued_at_admission=None)


def _builder() -> BatchBuilder:
    config = SimpleNamespace(engine=SimpleNamespace(schedule_policy="lpm"))
    return BatchBuilder(config, SimpleNamespace(cache=_Cache()))


def _admit_first(builder: BatchBuilder, n: int) -> list:
    order = builder.policy_order()[:n]
    for r in order:
        builder.waiting.remove(r)
        builder.admissions += 1
    return order


def test_a_request_sharing_nothing_is_admitted_after_at_most_max_overtakes():
    builder = _builder()
    lonely = _req(0)
    builder.waiting.append(lonely)
    for _ in range(10 * MAX_OVERTAKES):
        builder.waiting += [_req(10), _req(10)]
        admitted = _admit_first(builder, 2)
        if lonely in admitted:
            break
        assert builder.admissions <= MAX_OVERTAKES  # passed over only until the bound
    else:
        raise AssertionError("the request sharing nothing cached was never admitted")
    assert builder.admissions - 2 == MAX_OVERTAKES  # admitted in the step the bound was reached


def test_lpm_order_holds_below_the_bound():
    builder = _builder()
    builder.waiting += [_req(0), _req(5), _req(20)]
    assert [r.fill_ids[0] for r in builder.policy_order()] == [20, 5, 0]
    builder.admissions = MAX_OVERTAKES  # every waiting request has now seen the bound
    builder.waiting.append(_req(30))  # a newcomer has not
    assert [r.fill_ids[0] for r in builder.policy_order()] == [
        0,
        5,
        20,
        30,
    ]  # aged in arrival order first
