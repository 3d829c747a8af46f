"""Quantized layers on our AVX-512 VNNI kernels (csrc/quant_matmul_cpu.cpp, library sgl_qmm).

Why: a decode step is a few activation rows against every weight. torch's packed int8 /
int4 CPU kernels convert each weight to float before multiplying; ours multiply the integer
codes by int16-quantized activations with `vpdpwssd` and scale once per group. Measured on
SmolLM2 and Llama-1B shapes (`benchmarks/bench_quant_matmul.py`, results/quant_matmul.json):
1.35-2.5x faster than torch's kernels at 1-16 rows. The activation's int16 rounding (one scale per
row) is the only error added; it is below the bf16 rounding the activations already carry.

The weights are in a tile layout (16 output rows interleaved, see the C++ source), so
these layers hold codes and fp16 scales their own way: fp16 keeps GGUF's Q4_0 / Q4_1 /
Q8_0 block scales exactly, and int8 keeps GGUF's groups of 32 (torch's int8 kernel takes
one scale per row only). Where the kernels cannot be had (no AVX-512 VNNI, no compiler),
`quant.py`'s layers on torch's kernels serve instead (`vnni_available`).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import torch
from torch import nn

from sgl.runtime.model import dense_copy
from sgl.runtime.model.quant_route import (
    crossover_for,
    dense_dtype,
    in_compiled_graph,
    prepared_crossover,
)
from sgl.runtime.model.quant_tensor import QuantizedTensor
from sgl.runtime.model.row_grid import on_row_grid

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "quant_matmul_cpu.cpp"
TILE = 16  # output rows per tile
_lock = threading.Lock()
_available: list[bool] = []


def vnni_available() -> bool:
    """Whether torch.ops.sgl_qmm is built with its kernels on this CPU (built on first call)."""
    with _lock:
        if not _available:
            _available.append(_build())
        return _available[0]


def _build() -> bool:
    try:
        from sgl import native

        native.build(
            "sgl_qmm",
            SOURCE,
            ["-O3", "-march=native", "-fopenmp"],
            ldflags=["-fopenmp"],
            python_module=False,
        )
    except Exception as e:  # no compiler: torch's kernels serve
        logger.warning("the VNNI quantized kernels could not be built (%s); using torch's", e)
        return False
    if not torch.ops.sgl_qmm.supported():
        logger.info("this CPU has no AVX-512 VNNI: quantized layers use torch's kernels")
        return False
    fake = torch.library.register_fake
    fake("sgl_qmm::int4_linear")(
        lambda x, qw, sm, group, n, crossover, dense_dtype, dense, dense_from: x.new_empty(
            x.shape[0], n
        )
    )
    fake("sgl_qmm::int8_linear")(
        lambda x, qw, sc, group, n, crossover, dense_dtype, dense, dense_from: x.new_empty(
            x.shape[0], n
        )
    )
    return True


def fits(q: QuantizedTensor) -> bool:
    """Whether the tile layout takes `q` (inputs in whole steps of 4, groups too)."""
    return q.group % 4 == 0 and q.codes.shape[1] % q.group == 0


# ----------------------------------------------------------------------------- packing


def _padded(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`t` with row 0 repeated up to `rows` rows (the padding outputs are sliced off)."""
    extra = rows - t.shape[0]
    return torch.cat([t, t[:1].expand(extra, *t.shape[1:])]) if extra else t


def _tiled_groups(values: torch.Tensor, tiles: int) -> torch.Tensor:
    """float [N, G] per-row group values -> [tiles, G, 16] (the 16 rows of a tile side by side)."""
    return _padded(values, tiles * TILE).reshape(tiles, TILE, -1).permute(0, 2, 1)


def pack_int4_tiles(q: QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> uint8 [N/16, K/4, 32] codes, fp16 [N/16, K/g, 2, 16] scale and min (w = q s + min)."""
    n, k = q.shape
    tiles = -(-n // TILE)
    c = _padded(q.codes, tiles * TILE).reshape(tiles, TILE, k // 4, 4)
    packed = (c[..., 0:2] | (c[..., 2:4] << 4)).permute(0, 2, 1, 3).reshape(tiles, k // 4, 2 * TILE)
    scale_min = torch.stack(
        [_tiled_groups(q.scales, tiles), _tiled_groups(q.zeros - 8 * q.scales, tiles)], dim=2
    )
    return packed.contiguous(), scale_min.half().contiguous()


def pack_int8_tiles(
    q: QuantizedTensor, consume: bool = False, chunk_tiles: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> int8 [N/16, K/2, 32] codes, fp16 [N/16, K/g, 16] scales (w = q s).

    consume: `q.codes` may be overwritten (the caller drops `q`). A tile's 16 rows occupy the
    same bytes in both layouts, so the codes are then rearranged in place, a few tiles at a
    time, and a large table (the embeddings) never exists twice while loading."""
    n, k = q.shape
    tiles = -(-n // TILE)
    scales = _tiled_groups(q.scales, tiles).half().contiguous()
    codes = _padded(q.codes, tiles * TILE)
    if codes is q.codes and not (consume and codes.is_contiguous()):
        codes = codes.clone(memory_format=torch.contiguous_format)  # q's codes are left as they are
    flat = codes.view(tiles, TILE * k)
    step = chunk_tiles or max(1, (1 << 22) // (TILE * k))
    for t in range(0, tiles, step):
        block = flat[t : t + step]
        block.copy_(block.view(-1, TILE, k // 2, 2).permute(0, 2, 1, 3).reshape(block.shape))
    return codes.view(tiles, k // 2, 2 * TILE), scales


def _untiled(groups: torch.Tensor, n: int) -> torch.Tensor:
    """[tiles, G, 16] -> float [n, G] (inverse of `_tiled_groups`)."""
    return groups.permute(0, 2, 1).reshape(-1, groups.shape[1])[:n].float()


def unpack_int4_tiles(
    packed: torch.Tensor, scale_min: torch.Tensor, n: int
) -> tuple[torch.Tensor, ...]:
    """-> codes uint8 [n, K], scale and min float [n, K/g] (what the kernel holds)."""
    tiles, steps, _ = packed.shape
    b = packed.reshape(tiles, steps, TILE, 2).permute(0, 2, 1, 3)  # [t, i, step, j]
    codes = torch.stack([b & 15, b >> 4], dim=3).reshape(tiles * TILE, steps * 4)[
        :n
    ]  # k = 4 step + 2 h + j
    return codes, _untiled(scale_min[:, :, 0], n), _untiled(scale_min[:, :, 1], n)


def unpack_int8_tiles(
    packed: torch.Tensor, scales: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    tiles, steps, _ = packed.shape
    codes = (
        packed.reshape(tiles, steps, TILE, 2)
        .permute(0, 2, 1, 3)
        .reshape(tiles * TILE, steps * 2)[:n]
    )
    return codes, _untiled(scales, n)


def _expand(groups: torch.Tensor, k: int) -> torch.Tensor:
    return groups.repeat_interleave(k // groups.shape[1], dim=1)


# ----------------------------------------------------------------------------- layers


class _TiledLinear(nn.Module):
    """y = x W^T (+ b): the VNNI kernel up to `crossover` rows, else dequantize + a dense
    matmul (in `quant_route.dense_dtype()`)."""

    kind = ""

    def __init__(self, q: QuantizedTensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.group = q.group
        self.register_buffer("bias", None if bias is None else bias.to(torch.bfloat16))
        self.crossover: int | None = None  # set by prepare_for_compile
        self.dense_dtype = dense_dtype()  # read here: a compiled graph must not trace the CPU probe
        grouped = self.kind == "int4" or q.group != self.in_features
        self.layout = f"{self.kind}_g{q.group}" if grouped else self.kind
        self.register_buffer("dense_packed", None)  # a dense bf16 copy, if kept (dense_copy.py)
        self.dense_from = dense_copy.NEVER

    def _op(self):
        return (
            torch.ops.sgl_qmm.int4_linear if self.kind == "int4" else torch.ops.sgl_qmm.int8_linear
        )

    def packed_mm(self, x: torch.Tensor) -> torch.Tensor:
        return self._op()(
            x,
            self.qweight,
            self.qscales,
            self.group,
            self.out_features,
            1 << 30,
            self.dense_dtype,
            None,
            dense_copy.NEVER,
        )

    def dequantized_t(self) -> torch.Tensor:
        """W^T [K, N padded to 16] in `dense_dtype()` (one call's worth: prefill)."""
        op = (
            torch.ops.sgl_qmm.int4_dequant_t
            if self.kind == "int4"
            else torch.ops.sgl_qmm.int8_dequant_t
        )
        return op(self.qweight, self.qscales, self.group).to(self.dense_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dense = dense_copy.dense_route(self, x)
        if dense is not None:
            return dense
        if in_compiled_graph():
            y = self._op()(
                x,
                self.qweight,
                self.qscales,
                self.group,
                self.out_features,
                prepared_crossover(self),
                self.dense_dtype,
                self.dense_packed,
                self.dense_from,
            )
        else:
            y = self._dispatch(x, crossover_for(self, x.shape[0]))
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def _dispatch(self, x: torch.Tensor, crossover: int) -> torch.Tensor:
        """The op on x; above `crossover` rows (a dequantized dense matmul in oneDNN) on the row
        grid."""

        def call(rows: torch.Tensor) -> torch.Tensor:
            return self._op()(
                rows,
                self.qweight,
                self.qscales,
                self.group,
                self.out_features,
                crossover,
                self.dense_dtype,
                None,
                dense_copy.NEVER,
            )

        return on_row_grid(call, x) if x.shape[0] > crossover else call(x)


class VnniInt4Linear(_TiledLinear):
    kind = "int4"

    def __init__(self, q: QuantizedTensor, bias: torch.Tensor | None) -> None:
        super().__init__(q, bias)
        qweight, scale_min = pack_int4_tiles(q)
        self.register_buffer("qweight", qweight)
        self.register_buffer("qscales", scale_min)

    def held_weight(self) -> torch.Tensor:
        """The float32 [N, K] weight the kernel computes with (codes, fp16 scales and mins),
        exactly."""
        codes, scale, low = unpack_int4_tiles(self.qweight, self.qscales, self.out_features)
        return codes.float() * _expand(scale, self.in_features) + _expand(low, self.in_features)


class VnniInt8Linear(_TiledLinear):
    kind = "int8"

    def __init__(
        self, q: QuantizedTensor, bias: torch.Tensor | None, consume: bool = False
    ) -> None:
        super().__init__(q, bias)
        qweight, scales = pack_int8_tiles(q, consume)
        self.register_buffer("qweight", qweight)
        self.register_buffer("qscales", scales)

    def held_weight(self) -> torch.Tensor:
        codes, scales = unpack_int8_tiles(self.qweight, self.qscales, self.out_features)
        return codes.float() * _expand(scales, self.in_features)


class VnniInt8Embedding(VnniInt8Linear):
    """Token embeddings as int8 codes in the tile layout; doubles as a tied LM head (`logits`)."""

    def __init__(self, q: QuantizedTensor, dtype: torch.dtype, consume: bool = False) -> None:
        super().__init__(q, None, consume)
        self.num_embeddings, self.embedding_dim = q.shape
        self.dtype = dtype
        self.layout = self.layout.replace("int8", "int8_embedding")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [T] -> [T, dim]: each id's codes gathered from its tile, times its scales."""
        flat = ids.reshape(-1)
        tile, lane = flat // TILE, flat % TILE
        steps = self.qweight.shape[1]
        pairs = self.qweight.reshape(-1, steps, TILE, 2)[tile, :, lane]  # [T, K/2, 2]
        scales = self.qscales[tile, :, lane].float()  # [T, G]
        rows = pairs.reshape(len(flat), -1).float() * _expand(scales, self.in_features)
        return rows.to(self.dtype).reshape(*ids.shape, -1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 [N, vocab] = hidden @ E^T (the LM head)."""
        return self._dispatch(hidden.float().contiguous(), crossover_for(self, hidden.shape[0]))
