"""What a decode step costs for its rows, measured while the engine runs, and the drafted tokens
worth computing at that cost.

A verify row costs about what a decode row costs (its share of the matmuls, its attention over
the request's context, its logits), and a step also pays a fixed part (reading the weights,
dispatch, sampling set-up). At batch 1 the fixed part dominates and drafted rows are nearly
free; at batch 16 on 2 cores the rows dominate, and a row accepted 3 times in 4 cost more than
it brought (held-out copy tasks ran at 0.87-0.89x with drafting). So the scheduler times its
decode steps, `StepCost` fits seconds = fixed + per_row x rows by least squares with old steps
fading, and `worth_drafting` keeps a drafted token only while it raises the step's expected
tokens per second: a token expected with probability v joins a step of expected tokens N and
time T when (N + v) / (T + per_row) > N / T, i.e. v x T > per_row x N.
"""

from __future__ import annotations

from dataclasses import dataclass

# Weight a step's observation keeps per later step (~50 steps of memory): the costs change with
# the batch, the contexts' length and the CPUs other processes leave.
FORGET = 0.98
# A fit needs this much weight and this spread of row counts (variance, rows^2) to be trusted;
# until then the last trusted fit (or none: drafting is not cut) stands.
MIN_WEIGHT, MIN_ROW_VARIANCE = 16.0, 0.5
# A step this many times slower than the trusted fit predicts (a first call of a graph, a
# collection pause, the process preempted) says nothing about rows: left out of the fit.
OUTLIER_FACTOR = 4.0


@dataclass(frozen=True)
class Cost:
    fixed: float  # seconds a step costs whatever its rows
    per_row: float  # seconds each row adds


class StepCost:
    """Least-squares fit of decode-step seconds on rows, exponentially forgetting."""

    def __init__(self, forget: float = FORGET) -> None:
        self.forget = forget
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self.cost: Cost | None = None  # the last trusted fit

    def observe(self, rows: int, seconds: float) -> None:
        if self.cost is not None and seconds > OUTLIER_FACTOR * self.predict(rows):
            return
        f = self.forget
        self._w = f * self._w + 1.0
        self._x = f * self._x + rows
        self._y = f * self._y + seconds
        self._xx = f * self._xx + rows * rows
        self._xy = f * self._xy + rows * seconds
        self._refit()

    def predict(self, rows: int) -> float:
        assert self.cost is not None
        return self.cost.fixed + self.cost.per_row * rows

    def _refit(self) -> None:
        if self._w < MIN_WEIGHT:
            return
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var_x = self._xx / self._w - mean_x * mean_x
        if var_x < MIN_ROW_VARIANCE:
            return  # every recent step had about the same rows: the slope is not seen
        slope = (self._xy / self._w - mean_x * mean_y) / var_x
        slope = max(slope, 0.0)  # noise can tilt it below zero: rows are not free-er than free
        self.cost = Cost(max(mean_y - slope * mean_x, 0.0), slope)


def worth_drafting(
    values: list[float], rows: int, expected: float, cost: Cost | None, budget: int
) -> int:
    """How many of `values` (each a drafted token's probability of being accepted, in
    descending order) to verify in a step that already computes `rows` rows for `expected`
    tokens: while each raises expected tokens per second, and at most `budget`. Without a
    trusted cost, the `budget` alone."""
    if cost is None or cost.per_row <= 0.0:
        return min(len(values), budget)
    seconds = cost.fixed + cost.per_row * rows
    taken = 0
    for v in values[:budget]:
        if v * seconds <= cost.per_row * expected:
            break  # later values are smaller and the bar only rises as tokens join
        seconds += cost.per_row
        expected += v
        taken += 1
    return taken
