"""The route a quantized layer takes on each call: its packed kernel, or dequantize + dense matmul.

The packed kernels cost in proportion to the rows (no reuse of a weight across rows), so for
many tokens at once (prefill) a layer dequantizes its weight for the call and uses the dense
matmul instead, in `dense_dtype()`: bf16 where the CPU multiplies it natively (AMX /
AVX512-BF16), else float32 (oneDNN emulates bf16 there: 25x slower than float32 on an AVX2
EPYC). Where that pays depends on the shape and the CPU, so it is measured, once per layer
shape, on the first call above `DEQUANT_MIN_TOKENS` rows (`crossover_rows`), and kept on disk
(crossovers.py). Under torch.compile a layer calls one C++ op that makes the choice per call
(`in_compiled_graph`), with the crossover measured beforehand (`prepare_for_compile`).

Shared by the layers on torch's kernels (quant.py) and on ours (quant_vnni.py), which is why
it is a module of its own: each imports it, and neither imports the other's internals.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from sgl.runtime.model import crossovers, dense_copy
from sgl.runtime.model.linear_ops import compiled_ops_ready, linear_ops_built

# Calls of up to this many rows always take the packed kernel; above it, a layer takes the
# dequantize-then-dense-matmul route past its measured crossover (`crossover_rows`).
DEQUANT_MIN_TOKENS = 16
# Rows at which the dense matmul's cost per row is measured (`crossover_rows`).
DENSE_PROBE_ROWS = 64
# The crossover of a layer that never dequantizes (its packed kernel is as cheap per row).
NEVER_DEQUANTIZE = 1 << 30


@functools.cache
def dense_dtype() -> torch.dtype:
    """The dtype of a quantized layer's dequantized route: bf16 where this CPU multiplies it
    natively, else float32 (emulated bf16 matmuls are ~25x slower than float32 on AVX2).
    The packed kernels take bf16 activations on every CPU (they are fast on all of them)."""
    from sgl.runtime.cpu_features import bf16_matmul_support

    return torch.bfloat16 if bf16_matmul_support() else torch.float32


def crossover_rows(layer: nn.Module) -> int:
    """Rows above which dequantize + dense matmul beats the packed kernel for this layer's
    shape. Costs per call: packed = a * rows, dense = D + b * rows (D: one dequantization, b:
    the dense matmul per row), equal at D / (a - b); where the dense matmul is no cheaper per
    row (a <= b) the layer never dequantizes. Measured once per (layout, shape, dense dtype)
    on this machine (a few ms; at most ~0.5 s for a 1B layer) and kept on disk
    (`crossovers.py`), so compiled graphs stay the same from one start to the next."""
    dtype = dense_dtype()
    key = (
        f"{type(layer).__name__} {layer.out_features}x{layer.in_features} "
        f"g{getattr(layer, 'group', 0)} "
        f"{str(dtype).removeprefix('torch.')}"
    )

    def measure() -> int:
        size = dense_copy.copy_bytes(layer)  # the weight as dense bf16 (what is evicted)
        x = torch.zeros(DEQUANT_MIN_TOKENS, layer.in_features, dtype=torch.bfloat16)
        packed = crossovers.cold_seconds(lambda: layer.packed_mm(x), 3, size)
        dequantize = (
            layer.dequantized_t
            if hasattr(layer, "dequantized_t")
            else (lambda: layer.dequantized().t())
        )
        dequant = crossovers.cold_seconds(dequantize, 2, size)
        weight_t, rows = dequantize(), torch.zeros(DENSE_PROBE_ROWS, layer.in_features, dtype=dtype)
        dense = crossovers.cold_seconds(lambda: torch.mm(rows, weight_t), 2, size)
        packed_per_row = packed / DEQUANT_MIN_TOKENS
        dense_per_row = dense / DENSE_PROBE_ROWS
        if packed_per_row <= dense_per_row:
            return NEVER_DEQUANTIZE
        return min(
            NEVER_DEQUANTIZE,
            max(DEQUANT_MIN_TOKENS, int(dequant / (packed_per_row - dense_per_row))),
        )

    return crossovers.measured(key, measure)


def crossover_for(layer: nn.Module, rows: int) -> int:
    """The row count above which `layer` dequantizes: measured only when a call is above
    DEQUANT_MIN_TOKENS (small calls never pay the measurement)."""
    return crossover_rows(layer) if rows > DEQUANT_MIN_TOKENS else DEQUANT_MIN_TOKENS


def in_compiled_graph() -> bool:
    """Whether a layer is being traced by torch.compile with the C++ ops at hand (cpu_compile):
    it then calls one op that makes the packed-or-dequantize choice on each call's real row
    count, so a graph compiled with a symbolic row count neither guards on it nor traces the
    crossover's measurement."""
    return torch.compiler.is_compiling() and compiled_ops_ready()


def prepared_crossover(layer: nn.Module) -> int:
    if layer.crossover is None:
        raise RuntimeError("compiling a quantized layer needs prepare_for_compile(model) first")
    return layer.crossover


def prepare_for_compile(model: nn.Module) -> None:
    """Build the C++ ops and measure every quantized layer's crossover now, before a compiled
    graph reads them."""
    linear_ops_built()
    for module in model.modules():
        if hasattr(module, "crossover"):
            module.crossover = crossover_rows(module)
