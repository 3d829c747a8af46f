"""Row counts of CPU matmuls rounded up to a fixed grid, so oneDNN's per-shape caches stop growing.

Why: every bf16 matmul torch runs through oneDNN (`torch.mm`, `F.linear`, the packed
`mkldnn._linear_pointwise`) builds a primitive for its exact shape, JIT code included, and
keeps it in two caches of 1024 entries each (oneDNN's primitive cache, ~0.2 MB an entry, and
torch's ideep layer's, ~0.3 MB). Decode batches take few row counts, but prefill takes any,
so a server's RSS grew by ~450 MB over its first few thousand requests while both caches
filled, and kept churning after (measured on SmolLM2: 200 distinct prompt lengths -> +300 MB
of malloc in use). On the grid, a weight shape has 176 row counts up to 8192 and the caches
settle once they hold them.

The grid: exact up to EXACT_ROWS (every decode batch that size or smaller), then 16 steps per
octave, so at most 1/16 of a call's rows are padding (zeros, sliced off the output).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

EXACT_ROWS = 64
STEPS_PER_OCTAVE_LOG2 = 4  # 16 steps per octave above EXACT_ROWS


def padded_rows(rows: int) -> int:
    """`rows` rounded up to the grid: itself up to EXACT_ROWS, else to a multiple of
    2^(floor(log2 rows) - 4)."""
    if rows <= EXACT_ROWS:
        return rows
    step = 1 << (rows.bit_length() - 1 - STEPS_PER_OCTAVE_LOG2)
    return -(-rows // step) * step


def on_row_grid(matmul: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """`matmul(x)` for x [..., K] -> [..., N], computed on x's rows padded with zeros to the grid.
    Not inside a torch.compile graph (its shapes are the compiler's; a symbolic row count has
    no bit length)."""
    if torch.compiler.is_compiling():
        return matmul(x)
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    padded = padded_rows(rows)
    if padded == rows:
        return matmul(x)
    flat = x.reshape(rows, x.shape[-1])
    y = matmul(torch.cat([flat, flat.new_zeros(padded - rows, x.shape[-1])]))
    return y[:rows].reshape(*x.shape[:-1], y.shape[-1])
