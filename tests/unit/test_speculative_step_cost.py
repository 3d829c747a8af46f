"""Drafts rationed by what a step's rows cost (speculative/step_cost.py, Speculator._ration).

Oracles: the least-squares line through exact samples; brute force over every number of
drafted tokens for the best expected tokens per second.
"""

from __future__ import annotations

import random

import pytest
from test_speculative_ngram import REPEATING, make_req

from sgl.runtime.speculative.speculator import EXPLORE_EVERY, Speculator
from sgl.runtime.speculative.step_cost import MIN_WEIGHT, Cost, StepCost, worth_drafting


def test_the_fit_finds_the_fixed_and_per_row_seconds():
    cost = StepCost()
    for i in range(40):
        rows = 1 + i % 20
        cost.observe(rows, 0.005 + 0.001 * rows)
    assert cost.cost.fixed == pytest.approx(0.005, rel=1e-6)
    assert cost.cost.per_row == pytest.approx(0.001, rel=1e-6)


def test_no_fit_until_rows_vary_and_the_last_one_stands_while_they_do_not():
    cost = StepCost()
    for _ in range(50):
        cost.observe(16, 0.01 + 0.002 * 16)
    assert cost.cost is None  # the slope was never seen
    for i in range(int(MIN_WEIGHT) * 4):
        rows = 16 + i % 4 * 8
        cost.observe(rows, 0.01 + 0.002 * rows)
    seen = cost.cost
    assert seen.per_row == pytest.approx(0.002, rel=1e-6)
    for _ in range(500):  # drafting stopped: every step the same rows again
        cost.observe(16, 0.01 + 0.002 * 16)
    assert cost.cost.per_row == pytest.approx(seen.per_row, rel=0.05)


def test_old_steps_fade():
    cost = StepCost()
    for i in range(100):
        cost.observe(1 + i % 5, 0.008 + 0.0002 * (1 + i % 5))
    for i in range(400):  # another process took a core: every row costs more
        cost.observe(1 + i % 5, 0.012 + 0.0009 * (1 + i % 5))
    assert cost.cost.per_row == pytest.approx(0.0009, rel=0.01)


def _throughput(values, n, rows, expected, c: Cost) -> float:
    return (expected + sum(values[:n])) / (c.fixed + c.per_row * (rows + n))


def test_worth_drafting_takes_the_count_brute_force_finds_best():
    rng = random.Random(0)
    for _ in range(2000):
        values = sorted((rng.random() ** rng.choice((0.3, 1, 3)) for _ in range(rng.randint(0, 30))), reverse=True)
        rows = rng.randint(1, 48)
        expected = rows * rng.uniform(0.5, 1.0)
        c = Cost(rng.uniform(0, 0.02), rng.uniform(1e-5, 0.003))
        budget = rng.randint(0, 32)
        n = worth_drafting(values, rows, expected, c, budget)
        best = max(_throughput(values, m, rows, expected, c) for m in range(min(len(values), budget) + 1))
        assert n <= min(len(values), budget)
        assert _throughput(values, n, rows, expected, c) == pytest.approx(best, rel=1e-12)


def test_without_a_cost_the_budget_alone_counts():
    assert worth_drafting([0.9, 0.5, 0.1], 4, 4, None, 2) == 2
    assert worth_drafting([0.9, 0.5, 0.1], 4, 4, None, 8) == 3


def _speculator(cost: Cost) -> Speculator:
    spec = Speculator(num_draft_tokens=4)
    spec.step_cost.cost = cost
    return spec


def _keeping(r, kept: float, tried: float):
    spec_state = r.spec
    spec_state.kept, spec_state.tried = kept, tried
    return r


def test_batch_one_drafts_in_full_where_the_step_is_mostly_fixed_cost():
    spec = _speculator(Cost(fixed=0.008, per_row=0.0007))  # a batch-1 step of a small model
    r = make_req(REPEATING)
    spec._state(r)
    _keeping(r, 9, 10)  # keeps 0.9 of its drafted tokens
    spec.propose([r])
    assert r.draft_ids == [3, 4, 5, 6]
    _keeping(r, 3, 10)  # 0.3: the third and fourth (worth 0.04, 0.01) do not pay for their rows
    spec.propose([r])
    assert r.draft_ids == [3, 4]


def test_a_compute_bound_batch_drafts_only_what_pays_for_its_rows():
    """16 requests, rows costing as much as at batch 16 on 2 cores: the likely first tokens
    of the requests that keep most of their drafts pay; second tokens and the doubtful do not."""
    spec = _speculator(Cost(fixed=0.008, per_row=0.0012))
    reqs = [make_req(REPEATING) for _ in range(16)]
    for i, r in enumerate(reqs):
        spec._state(r)
        _keeping(r, 19 if i < 4 else 5, 20)  # four keep 0.95 of their tokens, the rest 0.25
    spec.propose(reqs)
    drafted = [len(r.draft_ids) for r in reqs]
    assert drafted[4:] == [0] * 12
    assert all(n >= 1 for n in drafted[:4])
    values = sorted((spec.keep_chance(r) ** j for r in reqs for j in range(1, 5)), reverse=True)
    assert sum(drafted) == worth_drafting(values, 16, 16, spec.step_cost.cost, 32)


def test_keep_chance_follows_what_a_request_kept():
    spec = Speculator(num_draft_tokens=4)
    good, bad = make_req(REPEATING), make_req(REPEATING)
    for _ in range(5):
        spec.accept(good, [3, 4, 5, 6], [3, 4, 5, 6, 7])  # all kept
        spec.accept(bad, [3, 4, 5, 6], [9, 9, 9, 9, 9])  # first refused
    assert spec.keep_chance(good) > 0.8 and spec.keep_chance(bad) < 0.3
    assert spec.stats.keep_rate() == pytest.approx(20 / 25)  # 20 kept, 5 first refusals


def test_a_step_far_slower_than_predicted_is_left_out():
    cost = StepCost()
    for i in range(40):
        cost.observe(1 + i % 5, 0.006 + 0.001 * (1 + i % 5))
    seen = cost.cost
    cost.observe(5, 0.5)  # a first call of a graph, a pause: says nothing about rows
    assert cost.cost == seen


def test_a_cost_that_stops_all_drafting_is_probed_again():
    """A fit from other conditions (or a bad one) could stop every draft, and with every step
    the same rows it would never be refitted: every EXPLORE_EVERY-th step held back, the most
    valuable offer is verified whole."""
    spec = _speculator(Cost(fixed=0.0, per_row=0.002))  # rows all that costs: nothing pays
    reqs = [make_req(REPEATING) for _ in range(3)]
    for r, kept in zip(reqs, (5, 9, 2)):
        spec._state(r)
        _keeping(r, kept, 10)
    drafted = []
    for _ in range(2 * EXPLORE_EVERY):
        spec.propose(reqs)
        drafted.append([len(r.draft_ids) for r in reqs])
    probes = [i for i, d in enumerate(drafted) if any(d)]
    assert probes == [EXPLORE_EVERY - 1, 2 * EXPLORE_EVERY - 1]
    assert all(drafted[i] == [0, 4, 0] for i in probes)  # the request keeping most, whole
