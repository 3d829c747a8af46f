"""Speculative decoding: tokens drafted cheaply, verified together in one forward of the model.

`ngram.py` drafts by prompt lookup (the sequence's own earlier text); `speculator.py` is the
scheduler's policy (who drafts, how much, what was accepted) and says why verification is exact;
`step_cost.py` measures what a step's rows cost and which drafted tokens pay for theirs.
The scheduler, batch builder and model runner carry a request's draft through a decode step.
"""

from sgl.runtime.speculative.ngram import NgramIndex
from sgl.runtime.speculative.speculator import (
    MAX_DRAFT_TOKENS,
    SPECULATIVE_ALGORITHMS,
    Speculator,
    cost_rationing,
    expand_rows,
)

__all__ = [
    "MAX_DRAFT_TOKENS",
    "SPECULATIVE_ALGORITHMS",
    "NgramIndex",
    "Speculator",
    "cost_rationing",
    "expand_rows",
]
