"""Weight sources: checkpoint tensors by HF name, read one at a time.

A source has `names()`, `has(name)`, `get(name)` and `family(name)` (the quantized layout a
GGUF tensor is in, else None); a GGUF's is in gguf_model.py. `ShardedSource` wraps any of
them to give one tensor-parallel rank's shard of each weight, and `RecordedSource` notes
what was read, so the loader can refuse weights nothing asked for.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch

from sgl.runtime.model.parallel import (
    REPLICATED,
    SHARD_RULES,
    Cut,
    ShardRule,
    TPShards,
    cut_of,
    pad_rows,
    param_dims,
)


class SafetensorsSource:
    """HF checkpoint weights by name, each read when asked (safe_open), never all at once."""

    fresh_reads = True

    def __init__(self, weights_dir: Path) -> None:
        from safetensors import safe_open

        index = weights_dir / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = sorted(p.name for p in weights_dir.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no .safetensors weights in {weights_dir}")
        self._where: dict[str, Any] = {}
        self._paths: dict[str, Path] = {}
        for name in files:
            handle = safe_open(str(weights_dir / name), framework="pt")
            for key in handle.keys():
                self._where[key] = handle
                self._paths[key] = weights_dir / name

    def names(self) -> list[str]:
        return list(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        return self._where[name].get_tensor(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._where[name].get_slice(name).get_shape())

    def read_slices(self, name: str, dim: int, ranges: list[tuple[int, int]]) -> torch.Tensor:
        """Only the pieces `ranges` along `dim` of a tensor, concatenated (a rank's shard),
        read straight from the file: safetensors' own `get_slice` reads the whole tensor and
        returns a view of it, which would hold the whole tensor on every rank."""
        return read_safetensors_slices(self._paths[name], name, dim, ranges)

    def family(self, name: str) -> str | None:
        return None


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
}


def read_safetensors_slices(
    path: Path, name: str, dim: int, ranges: list[tuple[int, int]]
) -> torch.Tensor:
    """The pieces `ranges` along `dim` of tensor `name` in a safetensors file, concatenated,
    reading only their bytes: one read per run of contiguous bytes (rows before `dim` times
    pieces), into the result's own memory."""
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        entry = json.loads(f.read(header_len))[name]
        dtype, shape = _SAFETENSORS_DTYPES[entry["dtype"]], entry["shape"]
        start = 8 + header_len + entry["data_offsets"][0]
        outer, inner_bytes = math.prod(shape[:dim]), math.prod(shape[dim + 1 :]) * dtype.itemsize
        taken = sum(b - a for a, b in ranges)
        out = torch.empty((*shape[:dim], taken, *shape[dim + 1 :]), dtype=dtype)
        dest = out.view(-1).view(torch.uint8).numpy().reshape(outer, taken * inner_bytes)
        for o in range(outer):
            at = 0
            for a, b in ranges:
                f.seek(start + (o * shape[dim] + a) * inner_bytes)
                f.readinto(memoryview(dest[o, at * inner_bytes : (at + b - a) * inner_bytes]))
                at += b - a
    return out


class DictSource:
    """An in-memory state dict (HF names) as a weight source."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def names(self) -> list[str]:
        return list(self._state)

    def has(self, name: str) -> bool:
        return name in self._state

    def get(self, name: str) -> Any:
        return self._state[name]

    def family(self, name: str) -> str | None:
        return None


# HF checkpoint names (less `model.layers.N.` and `.weight` / `.bias`; `E` an expert's number)
# -> (our layer, which of its fused parts the tensor is, None: all), to cut by `SHARD_RULES`.
_HF_LAYERS: dict[str, tuple[str, int | None]] = {
    "model.embed_tokens": ("embed_tokens", None),
    "lm_head": ("lm_head", None),
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "self_attn.qkv_proj": ("self_attn.qkv_proj", None),
    "self_attn.o_proj": ("self_attn.o_proj", None),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
    "mlp.gate_up_proj": ("mlp.gate_up_proj", None),
    "mlp.down_proj": ("mlp.down_proj", None),
    "mlp.shared_expert.gate_proj": ("mlp.shared_expert.gate_up_proj", 0),
    "mlp.shared_expert.up_proj": ("mlp.shared_expert.gate_up_proj", 1),
    "mlp.shared_expert.down_proj": ("mlp.shared_expert.down_proj", None),
    # stacked: transformers 5 ([E, 2I, H], [E, H, I]) and GGUF (gate and up apart, [E, I, H])
    "mlp.experts.gate_up_proj": ("mlp.experts.gate_up_proj", None),
    "mlp.experts.down_proj": ("mlp.experts.down_proj", None),
    "mlp.experts.gate_proj": ("mlp.experts.gate_up_proj", 0),
    "mlp.experts.up_proj": ("mlp.experts.gate_up_proj", 1),
    # per expert: Qwen-MoE's and Mixtral's Hub names
    "mlp.experts.E.gate_proj": ("mlp.experts.gate_up_proj", 0),
    "mlp.experts.E.up_proj": ("mlp.experts.gate_up_proj", 1),
    "mlp.experts.E.down_proj": ("mlp.experts.down_proj", None),
    "block_sparse_moe.experts.E.w1": ("mlp.experts.gate_up_proj", 0),
    "block_sparse_moe.experts.E.w3": ("mlp.experts.gate_up_proj", 1),
    "block_sparse_moe.experts.E.w2": ("mlp.experts.down_proj", None),
}
_HF_KEY = re.compile(r"^model\.layers\.\d+\.|\.(weight|bias)$")
_HF_EXPERT = re.compile(r"\.experts\.\d+\.")


class ShardedSource:
    """A weight source giving one tensor-parallel rank's shard of each weight (`SHARD_RULES`
    via `_HF_LAYERS`). Safetensors files are read only in the rank's rows (`read_slices`);
    other sources (a state dict, a GGUF's blocks) are read whole and cut at once, the whole
    tensor dropped before the next read. A row-parallel bias is the rank-0's alone: other
    ranks do not see it (`has`)."""

    def __init__(self, source, shards: TPShards) -> None:
        self._source, self.shards = source, shards
        self.fresh_reads = getattr(source, "fresh_reads", False)
        self.family = source.family

    def _rule(self, name: str) -> tuple[ShardRule, int | None]:
        layer, part = _HF_LAYERS.get(
            _HF_EXPERT.sub(".experts.E.", _HF_KEY.sub("", name)), ("", None)
        )
        return SHARD_RULES.get(layer, REPLICATED), part

    def _cut(self, name: str, shape: tuple[int, ...]) -> Cut | None:
        rule, part = self._rule(name)
        out_dim, in_dim = param_dims(name, len(shape))
        return cut_of(self.shards, rule, shape, out_dim, in_dim, part, name)

    def _held(self, name: str) -> bool:
        """Whether this rank holds any of `name`: all but a row-parallel bias off rank 0."""
        return not (
            name.endswith(".bias")
            and self._rule(name)[0].kind == "row"
            and self.shards.tp.rank != 0
        )

    def names(self) -> list[str]:
        return [n for n in self._source.names() if self._held(n)]

    def has(self, name: str) -> bool:
        return self._source.has(name) and self._held(name)

    def get(self, name: str) -> Any:
        if hasattr(self._source, "read_slices"):
            cut = self._cut(name, self._source.shape(name))
            if cut.dim is None:
                return self._source.get(name)
            return pad_rows(self._source.read_slices(name, cut.dim, list(cut.ranges)), cut.pad)
        value = self._source.get(name)
        return self._cut(name, tuple(value.shape)).apply(value, name)

    def get_experts(self, name: str) -> list[Any]:
        """A stacked [E, N, K] weight as E weights, each this rank's shard."""
        if not hasattr(self._source, "get_experts"):
            return list(self.get(name).unbind(0))
        per_expert = self._source.get_experts(name)
        cut = self._cut(name, (len(per_expert), *per_expert[0].shape))
        cut = Cut(
            None if cut.dim is None else cut.dim - 1, cut.ranges, cut.pad
        )  # the expert dim gone
        return [cut.apply(w, name) for w in per_expert]


class RecordedSource:
    """A weight source that remembers which names were read (to refuse unexpected weights)."""

    def __init__(self, source) -> None:
        self._source, self.read = source, set()
        self.fresh_reads = getattr(source, "fresh_reads", False)
        self.names, self.has, self.family = source.names, source.has, source.family

    def get(self, name: str) -> Any:
        self.read.add(name)
        return self._source.get(name)

    def get_experts(self, name: str) -> list[Any]:
        """A stacked [E, N, K] weight as E weights (a GGUF's quantized codes kept as they are)."""
        self.read.add(name)
        if hasattr(self._source, "get_experts"):
            return self._source.get_experts(name)
        return list(self._source.get(name).unbind(0))
