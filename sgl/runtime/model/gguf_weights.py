"""Read a GGUF file's tensors one at a time, quantized ones kept quantized.

Why not `gguf.GGUFReader.tensors[i].data`: that is a view of a memory map of the whole
file, and reading through it leaves the file's pages in the process's resident set, so a
4 GB file costs 4 GB of RSS on top of the weights made from it. Here each tensor's bytes
are read with a plain file read, converted, and dropped: loading peaks near the size of
the weights kept, not twice it.

Q4_0, Q4_1 and Q4_K blocks map exactly onto the int4 layout (groups of 32), Q8_0 onto
int8 codes in groups of 32 (`QuantizedTensor`); every other type is dequantized, tensor
by tensor, to float32 and `family` says which kernel layout suits it ("auto" quantization).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sgl.runtime.model.quant_tensor import QuantizedTensor

# The kernel layout each GGUF type is kept in under quantization="auto" (None: dense).
FAMILY = {
    "F32": None,
    "F16": None,
    "BF16": None,
    "Q4_0": "int4",
    "Q4_1": "int4",
    "Q4_K": "int4",
    "Q3_K": "int4",
    "Q2_K": "int4",
    "IQ4_NL": "int4",
    "IQ4_XS": "int4",
    "Q8_0": "int8",
    "Q6_K": "int8",
    "Q5_0": "int8",
    "Q5_1": "int8",
    "Q5_K": "int8",
}


class GgufTensors:
    """Tensors of one GGUF file by name; `read(name)` -> float32 tensor or QuantizedTensor,
    shaped [rows, cols] like the PyTorch weight (the GGUF shape reversed)."""

    def __init__(self, path: Path, reader) -> None:
        self.path = path
        self.infos = {t.name: t for t in reader.tensors}

    def type_name(self, name: str) -> str:
        return self.infos[name].tensor_type.name

    def family(self, name: str) -> str | None:
        return FAMILY.get(self.type_name(name), "int8")

    def _raw(self, name: str) -> np.ndarray:
        t = self.infos[name]
        with open(self.path, "rb") as f:
            f.seek(int(t.data_offset))
            buf = f.read(int(t.n_bytes))
        return np.frombuffer(buf, dtype=np.uint8)

    def read(self, name: str) -> torch.Tensor | QuantizedTensor:
        t = self.infos[name]
        shape = [int(x) for x in reversed(t.shape)]
        kind = t.tensor_type.name
        if kind in _EXACT and len(shape) == 2:
            return self.read_blocks(name, kind, *shape)
        import gguf

        arr = gguf.quants.dequantize(self._raw(name).reshape(-1), t.tensor_type)
        return torch.from_numpy(np.asarray(arr, dtype=np.float32).reshape(shape).copy())

    def read_experts(self, name: str) -> list[torch.Tensor | QuantizedTensor]:
        """A stacked expert tensor ([E, N, K] in PyTorch's order) as E weights [N, K]: an exact
        type's codes stay quantized (the file's rows are the experts' rows end to end)."""
        t = self.infos[name]
        e, n, k = (int(x) for x in reversed(t.shape))
        kind = t.tensor_type.name
        if kind not in _EXACT:
            return list(self.read(name).unbind(0))
        w = self.read_blocks(name, kind, e * n, k)
        return [
            QuantizedTensor(
                w.kind,
                w.codes[i * n : (i + 1) * n],
                w.scales[i * n : (i + 1) * n],
                None if w.zeros is None else w.zeros[i * n : (i + 1) * n],
                w.group,
            )
            for i in range(e)
        ]

    def read_blocks(
        self, name: str, kind: str, n: int, k: int, chunk_elems: int = 1 << 22
    ) -> QuantizedTensor:
        """A block-quantized tensor, a few million weights (whole rows) at a time into its codes
        and scales: neither the file's bytes nor the decoders' temporaries exist whole at once
        (a 128k-token Q8_0 embedding would otherwise cost ~3x its size while read)."""
        t = self.infos[name]
        row_bytes = int(t.n_bytes) // n
        rows = max(1, chunk_elems // k)
        out: QuantizedTensor | None = None
        with open(self.path, "rb") as f:
            f.seek(int(t.data_offset))
            for start in range(0, n, rows):
                m = min(rows, n - start)
                part = _EXACT[kind](np.frombuffer(f.read(m * row_bytes), dtype=np.uint8), m, k)
                if out is None:
                    zeros = None if part.zeros is None else torch.empty(n, part.zeros.shape[1])
                    out = QuantizedTensor(
                        part.kind,
                        torch.empty(n, k, dtype=part.codes.dtype),
                        torch.empty(n, part.scales.shape[1]),
                        zeros,
                        part.group,
                    )
                out.codes[start : start + m] = part.codes
                out.scales[start : start + m] = part.scales
                if out.zeros is not None:
                    out.zeros[start : start + m] = part.zeros
        return out


def _blocks(raw: np.ndarray, n: int, k: int, block_elems: int, block_bytes: int) -> np.ndarray:
    return raw.reshape(n, k // block_elems, block_bytes)


def _f16(b: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(b).view(np.float16).astype(np.float32)[..., 0])


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 codes: the low nibbles are elements 0..15, the high ones 16..31."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _q4_0(raw: np.ndarray, n: int, k: int) -> QuantizedTensor:
    b = _blocks(raw, n, k, 32, 18)
    d = _f16(b[..., 0:2])
    codes = torch.from_numpy(_nibbles(b[..., 2:]).reshape(n, k))  # a new array already: no copy
    return QuantizedTensor("int4", codes, d, torch.zeros_like(d), 32)  # w = d (q - 8)


def _q4_1(raw: np.ndarray, n: int, k: int) -> QuantizedTensor:
    b = _blocks(raw, n, k, 32, 20)
    d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    codes = torch.from_numpy(_nibbles(b[..., 4:]).reshape(n, k))
    return QuantizedTensor("int4", codes, d, m + 8 * d, 32)  # w = d q + m


def _q4_k(raw: np.ndarray, n: int, k: int) -> QuantizedTensor:
    """Super-blocks of 256: 8 sub-blocks of 32 with 6-bit scale and min, w = d sc q - dmin m."""
    from gguf.quants import Q4_K

    b = _blocks(raw, n, k, 256, 144).reshape(-1, 144)
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = Q4_K.get_scale_min(b[:, 4:16].copy())
    scale = d.unsqueeze(1) * torch.from_numpy(sc.astype(np.float32))  # [blocks, 8]
    low = dmin.unsqueeze(1) * torch.from_numpy(mn.astype(np.float32))
    qs = b[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    codes = torch.from_numpy((qs & 15).reshape(n, k))
    groups = k // 32
    scale, low = scale.reshape(n, groups), low.reshape(n, groups)
    return QuantizedTensor("int4", codes, scale, 8 * scale - low, 32)


def _q8_0(raw: np.ndarray, n: int, k: int) -> QuantizedTensor:
    b = _blocks(raw, n, k, 32, 34)
    d = _f16(b[..., 0:2])
    codes = torch.from_numpy(np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(n, k))
    return QuantizedTensor("int8", codes, d, None, 32)  # w = d q, groups of 32


_EXACT = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q4_K": _q4_k, "Q8_0": _q8_0}
