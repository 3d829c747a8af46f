"""A dense bf16 copy kept beside a quantized layer's codes, for the row counts where it is faster.

Why: the quantized kernels (quant_vnni.py; torch's packed int4 / int8) stream every weight
once per block of activation rows, so their cost grows with the rows. For a few rows (batch-1
decode) they win by reading 2-4x fewer bytes; from some rows on (a decode step of 16-48
requests) a bf16 matmul on oneDNN's prepacked weight is faster (SmolLM2's decode at 48 rows on
a 2-core Zen 4: 409 tok/s int4, 506 dense bf16; `benchmarks/bench_dense_copy.py`). Dequantizing for
a call costs about as much as the call, so without a copy a layer only switches to the dense route
at hundreds of rows (`quant_route.crossover_rows`). With a copy it switches at the row count where
the dense matmul wins, measured per layer shape on this machine (`dense_rows`, kept with the
crossovers).

The copy costs memory (bf16: 4x an int4 layer, 2x an int8 one), so it is kept only where the
CPU multiplies bf16 natively (`cpu_packed.packing_applies`) and where all copies fit the
budget: "auto" takes at most `AUTO_FRACTION` of the memory available at load and at most
`AUTO_MAX_BYTES`; "on" keeps them whatever they cost; "off" never. The copy is exactly the
weight the quantized kernel computes with (`held_weight()`), rounded to bf16, as the
dequantized prefill route already is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from sgl.runtime.model import crossovers
from sgl.runtime.model.cpu_packed import pack_bf16, packed_matmul
from sgl.runtime.model.row_grid import on_row_grid

logger = logging.getLogger(__name__)

DENSE_COPY_MODES = ("auto", "on", "off")
AUTO_FRACTION = 0.2
AUTO_MAX_BYTES = 4 << 30
# Row counts at which the two routes are timed; the dense route is taken from the smallest one
# where it wins at that count and every larger one.
PROBE_ROWS = (2, 4, 8, 16, 32, 64, 128)
NEVER = 1 << 30


def copy_bytes(layer: nn.Module) -> int:
    return layer.out_features * layer.in_features * 2


def quantized_layers(model: nn.Module) -> list[nn.Module]:
    """The model's quantized linear layers that can hold a copy (not the int8 embedding table)."""
    return [
        m
        for m in model.modules()
        if hasattr(m, "dense_packed") and not hasattr(m, "num_embeddings")
    ]


def held_copy_bytes(model: nn.Module) -> int:
    """Bytes of the dense copies the model holds."""
    return sum(copy_bytes(m) for m in quantized_layers(model) if m.dense_packed is not None)


def budget_bytes(mode: str, available: int) -> int:
    if mode not in DENSE_COPY_MODES:
        raise ValueError(f"dense_copy must be one of {DENSE_COPY_MODES}, got {mode!r}")
    if mode == "off":
        return 0
    return 1 << 62 if mode == "on" else min(int(available * AUTO_FRACTION), AUTO_MAX_BYTES)


def add_dense_copies(model: nn.Module, budget: Callable[[], int]) -> int:
    """Give every quantized linear layer a dense bf16 copy when all of them fit `budget()` bytes
    (asked only when the model has quantized layers); returns the bytes added (0: none kept)."""
    layers = quantized_layers(model)
    if not layers:
        return 0
    total, allowed = sum(copy_bytes(m) for m in layers), budget()
    if total > allowed:
        logger.info(
            "dense copies of the quantized layers (%.0f MB) exceed the budget (%.0f MB): not kept",
            total / 2**20,
            allowed / 2**20,
        )
        return 0
    for layer in layers:
        layer.dense_packed = pack_bf16(layer.held_weight())
        layer.dense_from = dense_rows(layer)
    logger.info(
        "kept dense bf16 copies of %d quantized layers (%.0f MB)", len(layers), total / 2**20
    )
    return total


def _seconds(fn: Callable[[], object], weight_bytes: int) -> float:
    fn()  # the first call builds oneDNN's primitive for the shape
    return crossovers.cold_seconds(fn, 3, weight_bytes)


def dense_rows(layer: nn.Module) -> int:
    """Rows from which the copy's dense matmul beats the quantized kernel for this layer's
    shape, on this machine (kept on disk with the crossovers)."""
    key = (
        f"{type(layer).__name__} {layer.out_features}x{layer.in_features} "
        f"g{getattr(layer, 'group', 0)} dense-copy"
    )

    def measure() -> int:
        wins, dense_bytes = [], copy_bytes(layer)
        for rows in PROBE_ROWS:
            x = torch.randn(rows, layer.in_features).to(torch.bfloat16)
            wins.append(
                _seconds(lambda x=x: packed_matmul(x, layer.dense_packed, None), dense_bytes)
                < _seconds(lambda x=x: layer.packed_mm(x), dense_bytes)
            )
        for i in range(len(PROBE_ROWS)):
            if all(wins[i:]):
                return PROBE_ROWS[i]
        return NEVER

    return crossovers.measured(key, measure)


def dense_route(layer: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """y = x W^T (+ b) on the layer's dense copy where it has one and x has enough rows, else
    None. Eager only: in a compiled graph the layer's C++ op takes the copy and `dense_from`
    and makes the same choice per call (csrc/dense_copy.h), so the graph does not guard on rows."""
    if torch.compiler.is_compiling() or layer.dense_packed is None or x.shape[0] < layer.dense_from:
        return None
    y = on_row_grid(
        lambda rows: packed_matmul(rows, layer.dense_packed, layer.bias), x.to(torch.bfloat16)
    )
    return y.to(x.dtype)
