"""Weight-only quantization on CPU: int8 per output channel and int4 in groups, on torch's
packed matmuls (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`). Where the CPU has
AVX-512 VNNI, `quantized_linear` / `int8_embedding` build the layers of quant_vnni.py (our
kernels, ~2x faster at decode shapes) instead; the layers here serve every other CPU.

Why these layouts: they are what torch's CPU kernels take, and on both AMX and AVX-512-only
CPUs they move 2x / 4x fewer weight bytes than bf16 for the skinny activations of decoding,
where a step is bound by weight bandwidth. The packed kernels cost in proportion to the rows
(no reuse of a weight across rows), so for many tokens at once (prefill) a layer dequantizes
its weight for the call and uses the dense matmul instead (int4 in one C++ pass,
csrc/linear_ops_cpu.cpp), in `dense_dtype()`: bf16 where the CPU multiplies it natively (AMX /
AVX512-BF16), else float32 (oneDNN emulates bf16 there: 25x slower than float32 on an AVX2
EPYC). Where that pays depends on the shape and the CPU, so it is measured, once per layer
shape, on the first call above `DEQUANT_MIN_TOKENS` rows (`crossover_rows`).

A `QuantizedTensor` is the unpacked, row-editable form used while loading: codes, scales,
zeros per row. Rows can be permuted (the GGUF Q/K head order) and concatenated (fused
QKV / gate-up) before `pack_*` turns it into a module's buffers. Values are
    int8:  w[n, k] = codes[n, k] * scales[n, 0]
    int4:  w[n, k] = (codes[n, k] - 8) * scales[n, k // g] + zeros[n, k // g]
(torch's int4 convention, so Q4_0 / Q4_1 / Q4_K blocks of 32 map onto it exactly).
The kernels take bf16 scales: packing rounds them to bf16, the one error a repacked GGUF
block gets (relative <= 2^-8 of a group's scale; `packing_error` measures it).

Where torch's int4 pack puts each code depends on the CPU kernel torch runs (AVX-512, AVX2
or neither: `Int4PackLayout`), so the layout is read off torch once per process
(`int4_pack_layout`) and every reader of packed bytes (`unpack_int4`, the C++ dequantize)
is given it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from sgl.runtime.model import crossovers, dense_copy
from sgl.runtime.model.linear_ops import compiled_ops_ready, linear_ops_built
from sgl.runtime.model.row_grid import on_row_grid

QUANTIZATIONS = ("auto", "none", "int8", "int4")
INT4_GROUP_SIZES = (32, 64, 128)
# Calls of up to this many rows always take the packed kernel; above it, a layer takes the
# dequantize-then-dense-matmul route past its measured crossover (`crossover_rows`).
DEQUANT_MIN_TOKENS = 16
# Rows at which the dense matmul's cost per row is measured (`crossover_rows`).
DENSE_PROBE_ROWS = 64
# The crossover of a layer that never dequantizes (its packed kernel is as cheap per row).
NEVER_DEQUANTIZE = 1 << 30
# Int4Linear pads its rows to a multiple of this: whole blocks in every Int4PackLayout, so a
# layer's buffers have the same shapes on every CPU.
INT4_PAD_ROWS = 64


@dataclass
class QuantizedTensor:
    """A [N, K] weight as integer codes with per-row (int8) or per-group (int4) scales."""

    kind: str  # "int8" | "int4"
    codes: torch.Tensor  # int8 [N, K] (int8) or uint8 [N, K] in 0..15 (int4)
    scales: torch.Tensor  # float32 [N, K // group] (int8: group = K)
    zeros: torch.Tensor | None  # float32 [N, K // group] (int4 only)
    group: int

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)  # type: ignore[return-value]

    def dequantize(self) -> torch.Tensor:
        """The float32 [N, K] weight these codes stand for."""
        scales = self.scales.repeat_interleave(self.group, dim=1)
        if self.kind == "int8":
            return self.codes.float() * scales
        return (self.codes.float() - 8) * scales + self.zeros.repeat_interleave(self.group, dim=1)

    def rows(self, index: torch.Tensor) -> "QuantizedTensor":
        """The rows `index` (a permutation or a selection), codes and scales together."""
        zeros = None if self.zeros is None else self.zeros[index]
        return QuantizedTensor(self.kind, self.codes[index], self.scales[index], zeros, self.group)

    def columns(self, start: int, stop: int, name: str = "a weight") -> "QuantizedTensor":
        """Inputs start:stop (a row-parallel shard): exact on group boundaries, and anywhere
        for one scale per row (int8), which then covers the slice alone."""
        n, k = self.shape
        per_row = self.scales.shape[1] == 1
        if not per_row and (start % self.group or stop % self.group):
            raise ValueError(f"tensor parallelism: {name} of shape {[n, k]} cannot give inputs {start}:{stop} to a "
                             f"rank: its quantization groups of {self.group} would be split; choose a tp_size "
                             f"with in_features / tp_size a multiple of {self.group}")
        g0, g1 = (0, 1) if per_row else (start // self.group, stop // self.group)
        zeros = None if self.zeros is None else self.zeros[:, g0:g1].contiguous()
        return QuantizedTensor(self.kind, self.codes[:, start:stop].contiguous(), self.scales[:, g0:g1].contiguous(),
                               zeros, stop - start if per_row else self.group)

    def rounded_scales(self) -> "QuantizedTensor":
        """The same codes with scales and zeros rounded to bf16, as the packed kernels hold them."""
        zeros = None if self.zeros is None else self.zeros.bfloat16().float()
        return QuantizedTensor(self.kind, self.codes, self.scales.bfloat16().float(), zeros, self.group)


def cat_rows(parts: list[QuantizedTensor]) -> QuantizedTensor:
    """Stack weights along the output dim (fused QKV, gate-up); all must share kind and group."""
    kinds = {(p.kind, p.group, p.codes.shape[1]) for p in parts}
    if len(kinds) != 1:
        raise ValueError(f"cannot fuse quantized weights of different layouts: {sorted(kinds)}")
    zeros = None if parts[0].zeros is None else torch.cat([p.zeros for p in parts])
    return QuantizedTensor(parts[0].kind, torch.cat([p.codes for p in parts]),
                           torch.cat([p.scales for p in parts]), zeros, parts[0].group)


# ----------------------------------------------------------------------------- quantizers


def quantize_int8(w: torch.Tensor) -> QuantizedTensor:
    """Symmetric int8 per output row: scale = max|w| / 127."""
    w = w.float()
    scale = (w.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)
    codes = torch.round(w / scale).clamp_(-127, 127).to(torch.int8)
    return QuantizedTensor("int8", codes, scale, None, w.shape[1])


def int4_group_for(k: int, group: int) -> int | None:
    """The largest supported group <= `group` that divides K (None: K is not a multiple of 32)."""
    for g in sorted(INT4_GROUP_SIZES, reverse=True):
        if g <= group and k % g == 0:
            return g
    return None


def quantize_int4(w: torch.Tensor, group: int) -> QuantizedTensor:
    """Asymmetric int4 per group of `group` inputs: the group's [min, max] on 16 levels."""
    w = w.float()
    n, k = w.shape
    wg = w.reshape(n, k // group, group)
    lo, hi = wg.amin(dim=2), wg.amax(dim=2)
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    codes = torch.round((wg - lo.unsqueeze(2)) / scale.unsqueeze(2)).clamp_(0, 15).to(torch.uint8)
    return QuantizedTensor("int4", codes.reshape(n, k), scale, lo + 8 * scale, group)


def quantize(w: torch.Tensor | QuantizedTensor, kind: str, group: int,
             chunk_elems: int = 1 << 22) -> QuantizedTensor:
    """`w` (dense, or codes in another layout) in `kind`'s layout. Rows are independent, so
    it goes a few million weights at a time: the float32 temporaries stay small (a 128k x 4k
    embedding would otherwise need several 2 GB copies at once)."""
    rows = max(1, chunk_elems // w.shape[1])
    parts = []
    for start in range(0, w.shape[0], rows):
        index = torch.arange(start, min(start + rows, w.shape[0]))
        chunk = w.rows(index).dequantize() if isinstance(w, QuantizedTensor) else w[start : start + rows].float()
        parts.append(quantize_int8(chunk) if kind == "int8" else quantize_int4(chunk, group))
    return cat_rows(parts)


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


def _int4_probe_codes() -> torch.Tensor:
    """Fixed random codes, [64, 16]: whole blocks in every layout, and (checked by the unit
    tests) packed differently by each, so exactly one layout reads torch's pack back."""
    return torch.randint(0, 16, (INT4_PAD_ROWS, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))


@functools.cache
def int4_pack_layout() -> Int4PackLayout:
    """The layout torch's int4 pack writes in this process: the one of INT4_PACK_LAYOUTS that
    reads a packed probe back to its codes. Found by packing, not from the CPU's flags,
    because torch's choice is what counts (ATEN_CPU_CAPABILITY can lower it); once per
    process, since torch's capability is fixed at start. A torch whose pack matches no known
    layout fails here, loudly, rather than computing with scrambled weights."""
    probe = _int4_probe_codes()
    packed = _torch_pack_int4(probe)
    n, k = probe.shape
    matches = [layout for layout in INT4_PACK_LAYOUTS if torch.equal(unpack_int4(packed, n, k, layout), probe)]
    if len(matches) != 1:
        raise RuntimeError(f"torch {torch.__version__}'s CPU int4 pack (capability "
                           f"{torch.backends.cpu.get_cpu_capability()}) matches "
                           f"{[m.name for m in matches] or 'none'} of the known layouts "
                           f"{[m.name for m in INT4_PACK_LAYOUTS]}: the int4 kernels cannot read it")
    return matches[0]


def pack_int4(codes: torch.Tensor, chunk_elems: int = 1 << 22) -> torch.Tensor:
    """uint8 [N, K] codes -> torch's CPU int4 layout ([N, K/2] bytes; `int4_pack_layout`).
    The op takes int32 codes, so it goes a few million at a time, in multiples of 64 rows:
    whole blocks in every layout, which torch packs independently (the bytes are those of
    one call), and a 4-byte copy of a whole large weight never exists."""
    n, k = codes.shape
    rows = max(INT4_PAD_ROWS, chunk_elems // k // INT4_PAD_ROWS * INT4_PAD_ROWS)
    return torch.cat([_torch_pack_int4(codes[i : i + rows]) for i in range(0, n, rows)])


def unpack_int4(packed: torch.Tensor, n: int, k: int, layout: Int4PackLayout | None = None) -> torch.Tensor:
    """Inverse of `pack_int4`: uint8 [N, K] codes of bytes in `layout` (default: this
    process's, `int4_pack_layout`), N a multiple of its block."""
    layout = layout or int4_pack_layout()
    if n % layout.block_n:
        raise ValueError(f"unpack_int4: {n} rows are not whole blocks of {layout.block_n} ({layout.name} layout)")
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
    key = (f"{type(layer).__name__} {layer.out_features}x{layer.in_features} g{getattr(layer, 'group', 0)} "
           f"{str(dtype).removeprefix('torch.')}")

    def measure() -> int:
        x = torch.zeros(DEQUANT_MIN_TOKENS, layer.in_features, dtype=torch.bfloat16)
        packed_per_row = crossovers.best_seconds(lambda: layer.packed_mm(x), 3) / DEQUANT_MIN_TOKENS
        dequantize = layer.dequantized_t if hasattr(layer, "dequantized_t") else (lambda: layer.dequantized().t())
        dequant = crossovers.best_seconds(dequantize, 2)
        weight_t, rows = dequantize(), torch.zeros(DENSE_PROBE_ROWS, layer.in_features, dtype=dtype)
        dense_per_row = crossovers.best_seconds(lambda: torch.mm(rows, weight_t), 2) / DENSE_PROBE_ROWS
        if packed_per_row <= dense_per_row:
            return NEVER_DEQUANTIZE
        return min(NEVER_DEQUANTIZE, max(DEQUANT_MIN_TOKENS, int(dequant / (packed_per_row - dense_per_row))))

    return crossovers.measured(key, measure)


def _crossover(layer: nn.Module, rows: int) -> int:
    """The row count above which `layer` dequantizes: measured only when a call is above
    DEQUANT_MIN_TOKENS (small calls never pay the measurement)."""
    return crossover_rows(layer) if rows > DEQUANT_MIN_TOKENS else DEQUANT_MIN_TOKENS


def _in_compiled_graph() -> bool:
    """Whether a layer is being traced by torch.compile with the C++ ops at hand (cpu_compile):
    it then calls one op that makes the packed-or-dequantize choice on each call's real row
    count, so a graph compiled with a symbolic row count neither guards on it nor traces the
    crossover's measurement."""
    return torch.compiler.is_compiling() and compiled_ops_ready()


def _prepared_crossover(layer: nn.Module) -> int:
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


def int8_mm(xb: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, crossover: int) -> torch.Tensor:
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


def int4_mm(xb: torch.Tensor, qweight: torch.Tensor, scales_zeros: torch.Tensor, group: int, padded_out: int,
            crossover: int, layout: Int4PackLayout) -> torch.Tensor:
    """bf16 x [M, K] @ W^T for torch's packed int4 W (padded_out rows, in `layout`): packed
    kernel up to `crossover` rows (bf16 out), else dequantized (one C++ pass where it builds)
    and multiplied in `dense_dtype()`."""
    if xb.shape[0] > crossover:
        weight_t = _int4_dequantized_t(qweight, scales_zeros, group, padded_out, xb.shape[1], layout)
        return on_row_grid(lambda rows: torch.mm(rows, weight_t), xb.to(weight_t.dtype))
    return torch.ops.aten._weight_int4pack_mm_for_cpu(xb, qweight, group, scales_zeros)


def _int4_dequantized_t(qweight: torch.Tensor, scales_zeros: torch.Tensor, group: int, n: int, k: int,
                        layout: Int4PackLayout) -> torch.Tensor:
    """W^T [K, N] in `dense_dtype()` (padded rows included): one C++ pass where the op is
    built, else torch ops."""
    op, dtype = int4_dequant_op(), dense_dtype()
    if op is None:
        return _int4_dequantized(qweight, scales_zeros, group, n, k, layout, dtype).t()
    return op(qweight, scales_zeros, group, layout.block_n, layout.pairs, dtype)


def _int4_dequantized(qweight: torch.Tensor, scales_zeros: torch.Tensor, group: int, n: int, k: int,
                      layout: Int4PackLayout, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The [N, K] weight (padded rows included) of torch's packed int4 bytes in `layout`, with torch ops."""
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
        if _in_compiled_graph():
            y = torch.ops.sgl_linear.int8_linear(xb, self.qweight, self.scales, _prepared_crossover(self),
                                                 self.dense_dtype, self.dense_packed, self.dense_from)
        else:
            y = int8_mm(xb, self.qweight, self.scales, _crossover(self, xb.shape[0]))
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
        self.pack_layout = int4_pack_layout()  # how torch laid out qweight: read by every dequantize
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
        return _int4_dequantized_t(self.qweight, self.scales_zeros, self.group, self.padded_out, self.in_features,
                                   self.pack_layout)

    def dequantized(self) -> torch.Tensor:
        """The bf16 [N, K] weight (padded rows included), with torch ops."""
        return _int4_dequantized(self.qweight, self.scales_zeros, self.group, self.padded_out, self.in_features,
                                 self.pack_layout)

    def held_weight(self) -> torch.Tensor:
        """The float32 [N, K] weight the kernel computes with (codes, bf16 scales and zeros), exactly."""
        w = _int4_dequantized(self.qweight, self.scales_zeros, self.group, self.padded_out, self.in_features,
                              self.pack_layout, torch.float32)
        return w[: self.out_features]

    def packed_mm(self, xb: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.qweight, self.group, self.scales_zeros)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dense = dense_copy.dense_route(self, x)
        if dense is not None:
            return dense
        xb = x.to(torch.bfloat16)
        if _in_compiled_graph():
            y = torch.ops.sgl_linear.int4_linear(xb, self.qweight, self.scales_zeros, self.group,
                                                 self.pack_layout.block_n, self.pack_layout.pairs,
                                                 _prepared_crossover(self), self.dense_dtype, self.dense_packed,
                                                 self.dense_from)
        else:
            y = int4_mm(xb, self.qweight, self.scales_zeros, self.group, self.padded_out,
                        _crossover(self, xb.shape[0]), self.pack_layout)
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
        return int8_mm(hidden.to(torch.bfloat16).contiguous(), self.qweight, self.scales, _crossover(self, hidden.shape[0])).float()


def quantized_linear(q: QuantizedTensor, bias: torch.Tensor | None) -> nn.Module:
    """The layer for `q`: on our VNNI kernels where the CPU has them (quant_vnni), else on torch's
    (an int8 weight in groups then goes to one scale per row, the only layout torch's kernel takes)."""
    from sgl.runtime.model import quant_vnni

    if quant_vnni.vnni_available() and quant_vnni.fits(q):
        return quant_vnni.VnniInt8Linear(q, bias) if q.kind == "int8" else quant_vnni.VnniInt4Linear(q, bias)
    if q.kind == "int8":
        return Int8Linear(per_row_int8(q), bias)
    return Int4Linear(q, bias)


def int8_embedding(q: QuantizedTensor, dtype: torch.dtype, consume: bool = False) -> nn.Module:
    """Token embeddings (and tied LM head) of int8 codes, on the VNNI kernels where they are had.
    consume: `q`'s codes may be reused in place (the loader's: it drops `q`)."""
    from sgl.runtime.model import quant_vnni

    if quant_vnni.vnni_available() and quant_vnni.fits(q):
        return quant_vnni.VnniInt8Embedding(q, dtype, consume)
    return Int8Embedding(per_row_int8(q), dtype)


def per_row_int8(q: QuantizedTensor) -> QuantizedTensor:
    """`q` with one scale per row (requantized if it is in groups)."""
    return q if q.group == q.shape[1] else quantize(q, "int8", q.shape[1])


def packing_error(q: QuantizedTensor) -> float:
    """Largest |w - w'| / max|w| between the codes' exact weight and what the kernel holds
    (bf16 scales): the error a GGUF block gets from being repacked."""
    exact = q.dequantize()
    held = q.rounded_scales().dequantize()
    return float((exact - held).abs().max() / exact.abs().max().clamp_min(1e-30))


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


def dense_weight(value: torch.Tensor | QuantizedTensor) -> torch.Tensor:
    """A checkpoint weight as a dense tensor (quantized codes dequantized to float32)."""
    return value.dequantize() if isinstance(value, QuantizedTensor) else value
