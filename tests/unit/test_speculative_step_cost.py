"""Drafts rationed by what a step's rows cost (speculative/step_cost.py, Speculator._ration).

Oracles: the means and straight lines the cost table is defined by; brute force over every
number of drafted tokens for the most expected tokens per second.
"""

from __future__ import annotations

import random

import pytest
from test_speculative_ngram import REPEATING, make_req

from sgl.runtime.speculative.speculator import EXPLORE_EVERY, Speculator
from sgl.runtime.speculative.step_cost import NEWEST_WEIGHT, StepCost, worth_drafting


def table(points: dict[int, float]) -> StepCost:
    cost = StepCost()
    for rows, seconds in points.items():
        cost.observe(rows, seconds)
    return cost


def test_the_table_reads_means_lines_between_and_beyond():
    cost = StepCost()
    cost.observe(16, 0.026)
    assert cost.predict(16) is None  # one count: what a row adds is not known yet
    cost.observe(32, 0.030)
    cost.observe(16, 0.031)  # a count seen again: its mean moves toward the newest step
    t16 = 0.026 + NEWEST_WEIGHT * (0.031 - 0.026)
    assert cost.predict(16) == pytest.approx(t16)
    assert cost.predict(24) == pytest.approx(t16 + (0.030 - t16) / 2)  # between: a line
    assert cost.predict(40) == pytest.approx(0.030 + (0.030 - t16) / 16 * 8)  # beyond: the line on
    assert cost.predict(4) == pytest.approx(t16)  # below: the smallest count's mean
    cost.observe(48, 0.029)  # noise: dearer rows never get cheaper beyond the largest
    assert cost.predict(64) == pytest.approx(0.029)
    assert cost.table_ms() == {"16": pytest.approx(t16 * 1e3, abs=0.01), "32": 30.0, "48": 29.0}


def test_a_step_far_slower_than_its_counts_mean_is_left_out():
    cost = table({1: 0.006, 5: 0.012})
    cost.observe(5, 0.5)  # a first call of a graph, a pause: says nothing about rows
    assert cost.predict(5) == 0.012


def _rate(values, d, rows, expected, cost) -> float:
    return (expected + sum(values[:d])) / cost.predict(rows + d)


def test_worth_drafting_takes_the_count_brute_force_finds_best():
    rng = random.Random(0)
    for _ in range(1500):
        points, t = {}, rng.uniform(0.002, 0.01)
        for rows in sorted(rng.sample(range(1, 80), rng.randint(2, 12))):
            t += rng.uniform(-0.001, 0.004)  # not even monotone: noise
            points[rows] = max(t, 1e-4)
        cost = table(points)
        values = sorted(
            (rng.random() ** rng.choice((0.3, 1, 3)) for _ in range(rng.randint(0, 30))),
            reverse=True,
        )
        rows = rng.randint(1, 48)
        expected = rows * rng.uniform(0.5, 1.0)
        budget = rng.randint(0, 32)
        d = worth_drafting(values, rows, expected, cost, budget)
        rates = [
            _rate(values, m, rows, expected, cost) for m in range(min(len(values), budget) + 1)
        ]
        assert rates[d] == max(rates) and d == rates.index(max(rates))


def test_without_measured_costs_the_budget_alone_counts():
    assert worth_drafting([0.9, 0.5, 0.1], 4, 4, None, 2) == 2
    assert worth_drafting([0.9, 0.5, 0.1], 4, 4, StepCost(), 8) == 3


def _speculator(points: dict[int, float]) -> Speculator:
    spec = Speculator(num_draft_tokens=4)
    spec.step_cost = table(points)
    return spec


def _keeping(r, kept: float, tried: float):
    r.spec.kept, r.spec.tried = kept, tried
    return r


# A batch-1 step of the embedded int4 model on 2 cores: ~2 ms a row over ~4 ms (measured).
BATCH1 = {1: 0.0055, 2: 0.0075, 3: 0.0095, 5: 0.0140}
# Its batch-16 steps: ~1.4 ms a row up to 31 rows, then the dense copies make rows cheap.
BATCH16 = {12: 0.0225, 16: 0.0261, 20: 0.0330, 24: 0.0355, 32: 0.0296, 48: 0.0355}


def test_batch_one_drafts_what_pays_for_its_rows():
    spec = _speculator(BATCH1)
    r = make_req(REPEATING)
    spec._state(r)
    _keeping(r, 19, 20)  # keeps 0.9 of its drafted tokens: all four pay
    spec.propose([r])
    assert r.draft_ids == [3, 4, 5, 6]
    _keeping(r, 5, 10)  # half: the first pays for its row, the second (worth 0.25) does not
    spec.propose([r])
    assert r.draft_ids == [3]


def test_a_batch_drafts_past_the_rows_where_they_turn_cheap():
    """At 16 rows a row costs ~1.4 ms until 32 rows, where the step is barely dearer than at
    16: drafting 16+ tokens pays where a few would not (a straight line under-drafts here)."""
    spec = _speculator(BATCH16)
    reqs = [make_req(REPEATING) for _ in range(16)]
    for r in reqs:
        spec._state(r)
        _keeping(r, 7, 10)
    spec.propose(reqs)
    drafted = sum(len(r.draft_ids) for r in reqs)
    assert drafted >= 16
    values = sorted((spec.keep_chance(r) ** j for r in reqs for j in range(1, 5)), reverse=True)
    assert drafted == worth_drafting(values, 16, 16, spec.step_cost, 32)


def test_held_back_steps_verify_the_whole_budget_now_and_then():
    """Every EXPLORE_EVERY-th step in a row whose offers the costs cut takes all the budget
    allows, so the dearer row counts stay measured."""
    spec = _speculator({1: 0.001, 2: 0.01})  # rows dear: nothing pays
    reqs = [make_req(REPEATING) for _ in range(3)]
    for r in reqs:
        spec._state(r)
        _keeping(r, 5, 10)
    drafted = []
    for _ in range(2 * EXPLORE_EVERY):
        spec.propose(reqs)
        drafted.append(sum(len(r.draft_ids) for r in reqs))
    assert [i for i, d in enumerate(drafted) if d] == [EXPLORE_EVERY - 1, 2 * EXPLORE_EVERY - 1]
    assert drafted[EXPLORE_EVERY - 1] == 12  # every offer whole (within the budget of 32)


def test_keep_chance_follows_what_a_request_kept():
    spec = Speculator(num_draft_tokens=4)
    good, bad = make_req(REPEATING), make_req(REPEATING)
    for _ in range(5):
        spec.accept(good, [3, 4, 5, 6], [3, 4, 5, 6, 7])  # all kept
        spec.accept(bad, [3, 4, 5, 6], [9, 9, 9, 9, 9])  # first refused
    assert spec.keep_chance(good) > 0.8 and spec.keep_chance(bad) < 0.3
    assert spec.stats.keep_rate() == pytest.approx(20 / 25)  # 20 kept, 5 first refusals
