"""What a decode step costs for its rows, measured while the engine runs, and how many drafted
tokens are worth computing at that cost.

A verify row costs about what a decode row costs, and a step also pays a fixed part (reading
the weights, dispatch). How much a row adds depends on where the step is: on 2 cores with the
embedded int4 model, rows 12-20 each add ~1.4 ms to a 26 ms step (the int4 kernel's work grows
with the rows), while 32 and 48 rows took 29.6 and 35.5 ms (from 32 rows the quantized layers
take their dense bf16 copies, whose cost per row is far lower). A straight line through such
steps under-drafts at batch 16 and a fixed budget over-drafts where rows are dear, so
`StepCost` keeps the model's seconds per row count (a fading mean of each count seen, read
between and beyond them by straight lines), and `worth_drafting` picks the number of drafted
tokens that gives the step the most expected tokens per second.
"""

from __future__ import annotations

import bisect

# Weight a row count's mean gives its newest step: conditions change (the contexts grow, other
# processes take CPUs), so a count seen again soon follows them.
NEWEST_WEIGHT = 0.2
# A step this many times slower than its count's mean (a first call of a graph, a collection
# pause, the process preempted) says nothing about rows: left out.
OUTLIER_FACTOR = 4.0


class StepCost:
    """Seconds of a decode step's model work by its row count, as measured."""

    def __init__(self) -> None:
        self._seconds: dict[int, float] = {}
        self._rows: list[int] = []  # the counts seen, sorted

    def observe(self, rows: int, seconds: float) -> None:
        mean = self._seconds.get(rows)
        if mean is None:
            bisect.insort(self._rows, rows)
            self._seconds[rows] = seconds
        elif seconds <= OUTLIER_FACTOR * mean:
            self._seconds[rows] = mean + NEWEST_WEIGHT * (seconds - mean)

    def predict(self, rows: int) -> float | None:
        """Seconds for a step of `rows`: the mean at that count, else a straight line between
        the nearest counts seen on either side, beyond the largest the line through the two
        largest (never falling), below the smallest the smallest's mean. None before two
        counts were seen (nothing says what a row adds yet)."""
        seen = self._rows
        if len(seen) < 2:
            return None
        if rows in self._seconds:
            return self._seconds[rows]
        i = bisect.bisect_left(seen, rows)
        if i == 0:
            return self._seconds[seen[0]]
        lo, hi = (seen[i - 1], seen[i]) if i < len(seen) else (seen[-2], seen[-1])
        t_lo, t_hi = self._seconds[lo], self._seconds[hi]
        if i < len(seen):
            return t_lo + (t_hi - t_lo) * (rows - lo) / (hi - lo)
        return t_hi + max((t_hi - t_lo) / (hi - lo), 0.0) * (rows - hi)

    def table_ms(self) -> dict[str, float]:
        """The means, in ms by row count (reported)."""
        return {str(n): round(self._seconds[n] * 1e3, 2) for n in self._rows}


def worth_drafting(
    values: list[float], rows: int, expected: float, cost: StepCost | None, budget: int
) -> int:
    """How many of `values` (each a drafted token's probability of being kept, in descending
    order) to verify in a step that already computes `rows` rows for `expected` tokens: the
    count, at most `budget`, with the most expected tokens per second (the fewest on a tie).
    Without measured costs, the `budget` alone."""
    most = min(len(values), budget)
    now = cost.predict(rows) if cost is not None else None
    if now is None:
        return most
    best, best_rate, tokens = 0, expected / now, expected
    for d in range(1, most + 1):
        tokens += values[d - 1]
        rate = tokens / cost.predict(rows + d)
        if rate > best_rate:
            best, best_rate = d, rate
    return best
