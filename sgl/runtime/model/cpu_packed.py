"""Dense bf16 linear layers prepacked once for oneDNN (CPU), the LM head included.

Why: `torch.mm` on a plain bf16 weight has oneDNN reorder that weight into its blocked
layout (AMX tiles / AVX512-BF16) on every call, which costs about as much as the multiply
for the shapes of decoding. Reordered once at load (`mkldnn._reorder_linear_weight`, what
inductor's freezing pass does), a call only multiplies. Measured on SmolLM2's shapes
(AMX machine, 2 threads): a layer's four matmuls 0.67 -> 0.49 ms at 48 rows and
0.66 -> 0.41 ms at 1 row; the LM head 4.8 -> 2.3 ms and 2.4 -> 1.45 ms.

A tied LM head gets its own packed copy of the embedding table (the lookup needs plain rows):
vocab x hidden x 2 bytes more (56 MB on SmolLM2-135M, 200 MB on a 1B with a 49k vocabulary).

Only on CPUs with native bf16 matmuls (`bf16_matmul_support`); elsewhere layers stay plain.
Under torch.compile the call goes through our C++ op `sgl_linear::packed_linear`
(csrc/linear_ops_cpu.cpp), because inductor lowers oneDNN's packed linear only for weights
it packed itself. Row counts go through `row_grid` (a bounded set of shapes for oneDNN's per-shape
caches). Where that op is built, eager calls take it too: it multiplies many rows on fixed row
slices, so a row's result does not depend on how many threads the team has now (dense_copy.h).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from sgl.runtime.cpu_features import bf16_matmul_support
from sgl.runtime.model.linear_ops import compiled_ops_ready, linear_ops_built
from sgl.runtime.model.row_grid import on_row_grid


class PackedLinear(nn.Module):
    """y = x W^T (+ b), W [out, in] bf16 held in oneDNN's packed layout."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, rows_hint: int = 32
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("packed", pack_bf16(weight, rows_hint))
        self.register_buffer(
            "bias", None if bias is None else bias.detach().to(torch.bfloat16).contiguous()
        )

    def held_weight(self) -> torch.Tensor:
        """The float32 [out, in] weight the layer computes with, exactly."""
        return self.packed.to_dense().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() and compiled_ops_ready():
            return torch.ops.sgl_linear.packed_linear(x, self.packed, self.bias)
        return on_row_grid(self._matmul, x)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return packed_matmul(x, self.packed, self.bias)


def pack_bf16(weight: torch.Tensor, rows_hint: int = 32) -> torch.Tensor:
    """A [out, in] weight in bf16, reordered once into oneDNN's blocked layout."""
    return torch.ops.mkldnn._reorder_linear_weight(
        weight.detach().to(torch.bfloat16).contiguous(), rows_hint
    )


def packed_matmul(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """bf16 x [M, in] @ W^T (+ b) for a weight from `pack_bf16`: our op (on row slices) where it
    is built, else oneDNN's directly."""
    # lock-free once built: eager decode calls this for every layer of every step
    if compiled_ops_ready() or linear_ops_built():
        return torch.ops.sgl_linear.packed_linear(x, packed, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def packing_applies(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `pack_dense_layers` would pack here: bf16 on a CPU with native bf16 matmuls."""
    return (
        device.type == "cpu"
        and dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and bf16_matmul_support() is not None
    )


class CpuPackable(Protocol):
    """A module that knows how to pack its own dense bf16 weights for oneDNN: llama.py's
    `Linear` (replaced by a PackedLinear), moe.py's `StackedExperts` (one PackedLinear pair per
    expert) and `LlamaForCausalLM` (its LM head). A new layer kind packs itself by having this
    method; `pack_dense_layers` needs no change."""

    def pack_for_cpu(self) -> tuple[nn.Module, int]:
        """(the module to hold in this one's place, itself if it packed in place; how many
        linear layers it packed, 0 where it has nothing to pack: not bf16, quantized, packed)."""
        ...


def pack_dense_layers(model: nn.Module) -> int:
    """Have every module of `model` that is `CpuPackable` pack itself (dense bf16 linear
    layers, bf16 MoE experts, the LM head, tied or not); returns how many layers were packed.
    Quantized layers are left alone."""
    count = 0
    for qual, module in list(model.named_modules()):
        pack_for_cpu = getattr(module, "pack_for_cpu", None)
        if pack_for_cpu is None:
            continue
        packed, layers = pack_for_cpu()
        if packed is not module:
            if not qual:
                raise ValueError(
                    f"{type(module).__name__}.pack_for_cpu returned another module: the model "
                    "itself can only pack in place"
                )
            owner, _, attr = qual.rpartition(".")
            setattr(model.get_submodule(owner), attr, packed)
        count += layers
    return count
