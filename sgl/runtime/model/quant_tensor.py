"""A weight in integer codes while it is loaded (`QuantizedTensor`), and the quantizers.

A `QuantizedTensor` is the unpacked, row-editable form used while loading: codes, scales,
zeros per row. Rows can be permuted (the GGUF Q/K head order) and concatenated (fused
QKV / gate-up) before a layer (quant.py, quant_vnni.py) packs it into its buffers. Values are
    int8:  w[n, k] = codes[n, k] * scales[n, 0]
    int4:  w[n, k] = (codes[n, k] - 8) * scales[n, k // g] + zeros[n, k // g]
(torch's int4 convention, so Q4_0 / Q4_1 / Q4_K blocks of 32 map onto it exactly).
The kernels take bf16 scales: packing rounds them to bf16, the one error a repacked GGUF
block gets (relative <= 2^-8 of a group's scale; `packing_error` measures it).

Separate from the layers so that the loader, the GGUF reader and both kernel families
(quant.py, quant_vnni.py) share it without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT4_GROUP_SIZES = (32, 64, 128)


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

    def rows(self, index: torch.Tensor) -> QuantizedTensor:
        """The rows `index` (a permutation or a selection), codes and scales together."""
        zeros = None if self.zeros is None else self.zeros[index]
        return QuantizedTensor(self.kind, self.codes[index], self.scales[index], zeros, self.group)

    def columns(self, start: int, stop: int, name: str = "a weight") -> QuantizedTensor:
        """Inputs start:stop (a row-parallel shard): exact on group boundaries, and anywhere
        for one scale per row (int8), which then covers the slice alone."""
        n, k = self.shape
        per_row = self.scales.shape[1] == 1
        if not per_row and (start % self.group or stop % self.group):
            raise ValueError(
                f"tensor parallelism: {name} of shape {[n, k]} cannot give inputs {start}:{stop} "
                "to a "
                f"rank: its quantization groups of {self.group} would be split; choose a tp_size "
                f"with in_features / tp_size a multiple of {self.group}"
            )
        g0, g1 = (0, 1) if per_row else (start // self.group, stop // self.group)
        zeros = None if self.zeros is None else self.zeros[:, g0:g1].contiguous()
        return QuantizedTensor(
            self.kind,
            self.codes[:, start:stop].contiguous(),
            self.scales[:, g0:g1].contiguous(),
            zeros,
            stop - start if per_row else self.group,
        )

    def rounded_scales(self) -> QuantizedTensor:
        """The same codes with scales and zeros rounded to bf16, as the packed kernels hold them."""
        zeros = None if self.zeros is None else self.zeros.bfloat16().float()
        return QuantizedTensor(
            self.kind, self.codes, self.scales.bfloat16().float(), zeros, self.group
        )


def cat_rows(parts: list[QuantizedTensor]) -> QuantizedTensor:
    """Stack weights along the output dim (fused QKV, gate-up); all must share kind and group."""
    kinds = {(p.kind, p.group, p.codes.shape[1]) for p in parts}
    if len(kinds) != 1:
        raise ValueError(f"cannot fuse quantized weights of different layouts: {sorted(kinds)}")
    zeros = None if parts[0].zeros is None else torch.cat([p.zeros for p in parts])
    return QuantizedTensor(
        parts[0].kind,
        torch.cat([p.codes for p in parts]),
        torch.cat([p.scales for p in parts]),
        zeros,
        parts[0].group,
    )


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


def quantize(
    w: torch.Tensor | QuantizedTensor, kind: str, group: int, chunk_elems: int = 1 << 22
) -> QuantizedTensor:
    """`w` (dense, or codes in another layout) in `kind`'s layout. Rows are independent, so
    it goes a few million weights at a time: the float32 temporaries stay small (a 128k x 4k
    embedding would otherwise need several 2 GB copies at once)."""
    rows = max(1, chunk_elems // w.shape[1])
    parts = []
    for start in range(0, w.shape[0], rows):
        index = torch.arange(start, min(start + rows, w.shape[0]))
        chunk = (
            w.rows(index).dequantize()
            if isinstance(w, QuantizedTensor)
            else w[start : start + rows].float()
        )
        parts.append(quantize_int8(chunk) if kind == "int8" else quantize_int4(chunk, group))
    return cat_rows(parts)


def per_row_int8(q: QuantizedTensor) -> QuantizedTensor:
    """`q` with one scale per row (requantized if it is in groups)."""
    return q if q.group == q.shape[1] else quantize(q, "int8", q.shape[1])


def packing_error(q: QuantizedTensor) -> float:
    """Largest |w - w'| / max|w| between the codes' exact weight and what the kernel holds
    (bf16 scales): the error a GGUF block gets from being repacked."""
    exact = q.dequantize()
    held = q.rounded_scales().dequantize()
    return float((exact - held).abs().max() / exact.abs().max().clamp_min(1e-30))


def dense_weight(value: torch.Tensor | QuantizedTensor) -> torch.Tensor:
    """A checkpoint weight as a dense tensor (quantized codes dequantized to float32)."""
    return value.dequantize() if isinstance(value, QuantizedTensor) else value
