"""Weight-only quantized layers on torch's CPU kernels: int8 per output channel and int4 in
groups, on torch's packed matmuls (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`).
Where the CPU has AVX-512 VNNI, `quantized_linear` / `int8_embedding` build the layers of
quant_vnni.py (our kernels, ~2x faster at decode shapes) instead; the layers here serve every
other CPU. The weights come in as `QuantizedTensor`s (quant_tensor.py); each call goes to the
packed kernel or to a dequantized dense matmul past the layer's measured crossover (quant_route.py).

Why these layouts: they are what torch's CPU kernels take, and on both AMX and AVX-512-only
CPUs they move 2x / 4x fewer weight bytes than bf16 for the skinny activations of decoding,
where a step is bound by weight bandwidth. For many rows (prefill) an int4 layer dequantizes
in one C++ pass (csrc/linear_ops_cpu.cpp).

Where torch's int4 pack puts each code depends on the CPU kernel torch runs (AVX-512, AVX2
or neither: `Int4PackLayout`), so the layout is read off torch once per process
(`int4_pack_layout`) and every reader of packed bytes (`unpack_int4`, the C++ dequantize)
is given it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sgl.runtime.model import dense_copy, quant_vnni
from sgl.runtime.model.linear_ops import linear_ops_built
from sgl.runtime.model.quant_route import (
    crossover_for,
    dense_dtype,
    in_compiled_graph,
    prepared_crossover,
)
from sgl.runtime.model.quant_tensor import (
    INT4_GROUP_SIZES as INT4_GROUP_SIZES,  # beside QUANTIZATIONS (config.py)
)
from sgl.runtime.model.quant_tensor import QuantizedTensor, cat_rows, per_row_int8
from sgl.runtime.model.row_grid import on_row_grid

QUANTIZATIONS = ("auto", "none", "int8", "int4")
# Int4Linear pads its rows to a multiple of this: whole blocks in every Int4PackLayout, so a
# layer's buffers have the same shapes on every CPU.
INT4_PAD_ROWS = 64


# ----------------------------------------------------------------------------- packing


@dataclass(frozen=True)
class Int4PackLayout:
    """Where torch's CPU int4 pack (`_convert_weight_to_int4pack_for_cpu`) puts each code.

    The [N, K/2] bytes are blocks of `block_n` output rows, one after the other; within a
    block, input k has block_n / 2 bytes, and byte j holds two of the block's rows:
        halves (pairs=False): row j in the low nibble, row j + block_n / 2 in the high one;
        pairs  (pairs=True):  row 2j in the low nibble, row 2j + 1 in the high one.
    Why there are several: torch packs for the matmul kernel of the CPU capability it
    dispatches to at run time (torch.backends.cpu.get_cpu_capability(); int4mm_kernel.cpp,
    BLOCK_N = 4 vector widths): AVX512 -> 64 rows in halves, AVX2 -> 32 in halves, DEFAULT
    (neither) -> 32 in pairs. (A last block of fewer rows is in pairs; Int4Linear never has one.)
    """

    name: str
    block_n: int
    pairs: bool


INT4_PACK_LAYOUTS = (
    Int4PackLayout("avx512", 64, pairs=False),
    Int4PackLayout("avx2", 32, pairs=False),
    Int4PackLayout("default", 32, pairs=True),
)


def _torch_pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """torch's pack of uint8 [N, K] codes (the op takes int32; 2: inner k tiles, unused on CPU)."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 2)


def int4_probe_codes() -> torch.Tensor:
    """Fixed random codes, [64, 16]: whole blocks in every layout, and (checked by the unit
    tests) packed differently by each, so exactly one layout reads torch's pack back."""
    return torch.randint(
        0, 16, (INT4_PAD_ROWS, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(4)
    )


@functools.cache
def int4_pack_layout() -> Int4PackLayout:
    """The layout torch's int4 pack writes in this process: the one of INT4_PACK_LAYOUTS that
    reads a packed probe back to its codes. Found by packing, not from the CPU's flags,
    because torch's choice is what counts (ATEN_CPU_CAPABILITY can lower it); once per
    process, since torch's capability is fixed at start. A torch whose pack matches no known
    layout fails here, loudly, rather than computing with scrambled weights."""
    probe = int4_probe_codes()
    packed = _torch_pack_int4(probe)
    n, k = probe.shape
    matches = [
        layout
        for layout in INT4_PACK_LAYOUTS
        if torch.equal(unpack_int4(packed, n, k, layout), probe)
    ]
    if len(matches) != 1:
        raise RuntimeError(
            f"torch {torch.__version__}'s CPU int4 pack (capability "
            f"{torch.backends.cpu.get_cpu_capability()}) matches "
            f"{[m.name for m in matches] or 'none'} of the known layouts "
            f"{[m.name for m in INT4_PACK_LAYOUTS]}: the int4 kernels cannot read it"
        )
    return matches[0]


def pack_int4(codes: torch.Tensor, chunk_elems: int = 1 << 22) -> torch.Tensor:
    """uint8 [N, K] codes -> torch's CPU int4 layout ([N, K/2] bytes; `int4_pack_layout`).
    The op takes int32 codes, so it goes a few million at a time, in multiples of 64 rows:
    whole blocks in every layout, which torch packs independently (the bytes are those of
    one call), and a 4-byte copy of a whole large weight never exists."""
    n, k = codes.shape
    rows = max(INT4_PAD_ROWS, chunk_elems // k // INT4_PAD_ROWS * INT4_PAD_ROWS)
    return torch.cat([_torch_pack_int4(codes[i : i + rows]) for i in range(0, n, rows)])


def unpack_int4(
    packed: torch.Tensor, n: int, k: int, layout: Int4PackLayout | None = None
) -> torch.Tensor:
    """Inverse of `pack_int4`: uint8 [N, K] codes of bytes in `layout` (default: this
    process's, `int4_pack_layout`), N a multiple of its block."""
    layout = layout or int4_pack_layout()
    if n % layout.block_n:
        raise ValueError(
            f"unpack_int4: {n} rows are not whole blocks of {layout.block_n} ({layout.name} layout)"
        )
    blocks = packed.reshape(n // layout.block_n, k, layout.block_n // 2)
    low, high = blocks & 15, blocks >> 4  # [N/B, K, B/2]
    if layout.pairs:  # byte j: rows 2j, 2j + 1
        rows = torch.stack([low, high], dim=3).reshape(n // layout.block_n, k, layout.block_n)
    else:  # byte j: rows j, j + B/2
        rows = torch.cat([low, high], dim=2)
    return rows.transpose(1, 2).reshape(n, k)


def _pad_rows(q: QuantizedTensor, multiple: int) -> QuantizedTensor:
    extra = -q.codes.shape[0] % multiple
    if not extra:
        return q
    pad = torch.zeros(extra, dtype=torch.long)  # row 0, repeated; sliced off the output
    return cat_rows([q, q.rows(pad)])


def int4_dequant_op() -> Callable | None:
    """torch.ops.sgl_linear.int4_dequant_t (C++, built on first use like the attention kernel;
    called as op(packed, scales_zeros, group, layout.block_n, layout.pairs, dtype)), or None
    where it cannot be built: `Int4Linear` then dequantizes with torch ops (slower)."""
    return torch.ops.sgl_linear.int4_dequant_t if linear_ops_built() else None


def int8_mm(
    xb: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, crossover: int
) -> torch.Tensor:
    """bf16 x [M, K] @ (int8 W [N, K] * scales)^T: packed kernel up to `crossover` rows (bf16
    out), else dequantized (a oneDNN matmul in `dense_dtype()`, on the row grid)."""
    if xb.shape[0] > crossover:
        weight = _int8_dequantized(qweight, scales)
        return on_row_grid(lambda rows: F.linear(rows, weight), xb.to(weight.dtype))
    return torch.ops.aten._weight_int8pack_mm(xb, qweight, scales)


def _int8_dequantized(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The [N, K] weight (in `dense_dtype()`) of int8 codes with per-row bf16 scales."""
    dtype = dense_dtype()
    return qweight.to(dtype) * scales.to(dtype).unsqueeze(1)


def int4_mm(
    xb: torch.Tensor,
    qweight: torch.Tensor,
    scales_zeros: torch.Tensor,
    group: int,
    padded_out: int,
    crossover: int,
    layout: Int4PackLayout,
) -> torch.Tensor:
    """bf16 x [M, K] @ W^T for torch's packed int4 W (padded_out rows, in `layout`): packed
    kernel up to `crossover` rows (bf16 out), else dequantized (one C++ pass where it builds)
    and multiplied in `dense_dtype()`."""
    if xb.shape[0] > crossover:
        weight_t = int4_dequantized_t(qweight, scales_zeros, group, padded_out, xb.shape[1], layout)
        return on_row_grid(lambda rows: torch.mm(rows, weight_t), xb.to(weight_t.dtype))
    return torch.ops.aten._weight_int4pack_mm_for_cpu(xb, qweight, group, scales_zeros)


def int4_dequantized_t(
    qweight: torch.Tensor,
    scales_zeros: torch.Tensor,
    group: int,
    n: int,
    k: int,
    layout: Int4PackLayout,
) -> torch.Tensor:
    """W^T [K, N] in `dense_dtype()` (padded rows included): one C++ pass where the op is
    built, else torch ops."""
    op, dtype = int4_dequant_op(), dense_dtype()
    if op is None:
        return int4_dequantized(qweight, scales_zeros, group, n, k, layout, dtype).t()
    return op(qweight, scales_zeros, group, layout.block_n, layout.pairs, dtype)


def int4_dequantized(
    qweight: torch.Tensor,
    scales_zeros: torch.Tensor,
    group: int,
    n: int,
    k: int,
    layout: Int4PackLayout,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """The [N, K] weight (padded rows included) of torch's packed int4 bytes in `layout`, with torch
    ops."""
    codes = unpack_int4(qweight, n, k, layout).to(dtype).reshape(n, k // group, group)
    scales, zeros = scales_zeros.to(dtype).permute(2, 1, 0).unsqueeze(3)  # [N, K/g, 1] each
    return ((codes - 8) * scales + zeros).reshape(n, k)


class Int8Linear(nn.Module):
    """y = x W^T (+ b) with W int8 per output channel, bf16 activations (the dense route of
    prefill in `dense_dtype()`)."""

    def __init__(self, q: QuantizedTensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        assert q.kind == "int8"
        self.out_features, self.in_features = q.shape
        self.register_buffer("qweight", q.codes.contiguous())
        self.register_buffer("scales", q.scales[:, 0].to(torch.bfloat16).contiguous())
        self.register_buffer("bias", None if bias is None else bias.to(torch.bfloat16))
        self.crossover: int | None = None  # set by prepare_for_compile
        self.dense_dtype = dense_dtype()  # read here: a compiled graph must not trace the CPU probe
        self.layout = "int8"
        self.register_buffer("dense_packed", None)  # a dense bf16 copy, if kept (dense_copy.py)
        self.dense_from = dense_copy.NEVER

    def dequantized(self) -> torch.Tensor:
        """The [N, K] weight in `dense_dtype()` (one call's worth; prefill)."""
        return _int8_dequantized(self.qweight, self.scales)

    def held_weight(self) -> torch.Tensor:
        """The float32 [N, K] weight the kernel computes with (codes x bf16 scales), exactly."""
        return self.qweight.float() * self.scales.float().unsqueeze(1)

    def packed_mm(self, xb: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(xb, self.qweight, self.scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dense = dense_copy.dense_route(self, x)
        if dense is not None:
            return dense
        xb = x.to(torch.bfloat16)
        if in_compiled_graph():
            y = torch.ops.sgl_linear.int8_linear(
                xb,
                self.qweight,
                self.scales,
                prepared_crossover(self),
                self.dense_dtype,
                self.dense_packed,
                self.dense_from,
            )
        else:
            y = int8_mm(xb, self.qweight, self.scales, crossover_for(self, xb.shape[0]))
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)


class Int4Linear(nn.Module):
    """y = x W^T (+ b) with W int4 in groups along the input dim, bf16 activations (the dense
    route of prefill in `dense_dtype()`)."""

    def __init__(self, q: QuantizedTensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        assert q.kind == "int4"
        self.out_features, self.in_features = q.shape
        self.group = q.group
        padded = _pad_rows(q, INT4_PAD_ROWS)
        self.padded_out = padded.codes.shape[0]
        self.pack_layout = (
            int4_pack_layout()
        )  # how torch laid out qweight: read by every dequantize
        self.register_buffer("qweight", pack_int4(padded.codes))
        sz = torch.stack([padded.scales.t(), padded.zeros.t()], dim=2)  # [K/g, N, 2]
        self.register_buffer("scales_zeros", sz.to(torch.bfloat16).contiguous())
        self.register_buffer("bias", None if bias is None else bias.to(torch.bfloat16))
        self.crossover: int | None = None  # set by prepare_for_compile
        self.dense_dtype = dense_dtype()  # read here: a compiled graph must not trace the CPU probe
        self.layout = f"int4_g{self.group}"
        self.register_buffer("dense_packed", None)  # a dense bf16 copy, if kept (dense_copy.py)
        self.dense_from = dense_copy.NEVER

    def dequantized_t(self) -> torch.Tensor:
        """W^T [K, N] in `dense_dtype()` (padded rows included; one call's worth: prefill)."""
        return int4_dequantized_t(
            self.qweight,
            self.scales_zeros,
            self.group,
            self.padded_out,
            self.in_features,
            self.pack_layout,
        )

    def dequantized(self) -> torch.Tensor:
        """The bf16 [N, K] weight (padded rows included), with torch ops."""
        return int4_dequantized(
            self.qweight,
            self.scales_zeros,
            self.group,
            self.padded_out,
            self.in_features,
            self.pack_layout,
        )

    def held_weight(self) -> torch.Tensor:
        """The float32 [N, K] weight the kernel computes with (codes, bf16 scales and zeros),
        exactly."""
        w = int4_dequantized(
            self.qweight,
            self.scales_zeros,
            self.group,
            self.padded_out,
            self.in_features,
            self.pack_layout,
            torch.float32,
        )
        return w[: self.out_features]

    def packed_mm(self, xb: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            xb, self.qweight, self.group, self.scales_zeros
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dense = dense_copy.dense_route(self, x)
        if dense is not None:
            return dense
        xb = x.to(torch.bfloat16)
        if in_compiled_graph():
            y = torch.ops.sgl_linear.int4_linear(
                xb,
                self.qweight,
                self.scales_zeros,
                self.group,
                self.pack_layout.block_n,
                self.pack_layout.pairs,
                prepared_crossover(self),
                self.dense_dtype,
                self.dense_packed,
                self.dense_from,
            )
        else:
            y = int4_mm(
                xb,
                self.qweight,
                self.scales_zeros,
                self.group,
                self.padded_out,
                crossover_for(self, xb.shape[0]),
                self.pack_layout,
            )
        if self.padded_out != self.out_features:
            y = y[:, : self.out_features]
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)


class Int8Embedding(nn.Module):
    """Token embeddings as int8 rows (per-row scale); doubles as a tied int8 LM head."""

    def __init__(self, q: QuantizedTensor, dtype: torch.dtype) -> None:
        super().__init__()
        assert q.kind == "int8"
        self.num_embeddings, self.embedding_dim = q.shape
        self.out_features, self.in_features = q.shape  # as the LM head
        self.dtype = dtype
        self.layout = "int8_embedding"
        self.register_buffer("qweight", q.codes.contiguous())
        self.register_buffer("scales", q.scales[:, 0].to(torch.bfloat16).contiguous())

    def held_weight(self) -> torch.Tensor:
        return self.qweight.float() * self.scales.float().unsqueeze(1)

    def packed_mm(self, xb: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(xb, self.qweight, self.scales)

    def dequantized(self) -> torch.Tensor:
        return _int8_dequantized(self.qweight, self.scales)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.qweight[ids].to(torch.bfloat16) * self.scales[ids].unsqueeze(-1)
        return rows.to(self.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 [N, vocab] = hidden @ E^T (the LM head)."""
        return int8_mm(
            hidden.to(torch.bfloat16).contiguous(),
            self.qweight,
            self.scales,
            crossover_for(self, hidden.shape[0]),
        ).float()


def quantized_linear(q: QuantizedTensor, bias: torch.Tensor | None) -> nn.Module:
    """The layer for `q`: on our VNNI kernels where the CPU has them (quant_vnni), else
    on torch's (an int8 weight in groups then goes to one scale per row, the only
    layout torch's kernel takes)."""
    if quant_vnni.vnni_available() and quant_vnni.fits(q):
        return (
            quant_vnni.VnniInt8Linear(q, bias)
            if q.kind == "int8"
            else quant_vnni.VnniInt4Linear(q, bias)
        )
    if q.kind == "int8":
        return Int8Linear(per_row_int8(q), bias)
    return Int4Linear(q, bias)


def int8_embedding(q: QuantizedTensor, dtype: torch.dtype, consume: bool = False) -> nn.Module:
    """Token embeddings (and tied LM head) of int8 codes, on the VNNI kernels where they are had.
    consume: `q`'s codes may be reused in place (the loader's: it drops `q`)."""
    if quant_vnni.vnni_available() and quant_vnni.fits(q):
        return quant_vnni.VnniInt8Embedding(q, dtype, consume)
    return Int8Embedding(per_row_int8(q), dtype)


def quantization_summary(model: nn.Module) -> dict[str, int]:
    """How many layers of each weight layout the model holds (for get_server_info)."""
    counts: dict[str, int] = {}
    for module in model.modules():
        if hasattr(module, "layout"):
            key = module.layout
        elif type(module).__name__ == "PackedLinear":
            key = "dense_packed"
        elif isinstance(module, (nn.Linear, nn.Embedding)) or type(module).__name__ == "Linear":
            key = "dense"
        else:
            continue
        counts[key] = counts.get(key, 0) + 1
    return counts
