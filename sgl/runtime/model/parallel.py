"""Tensor parallelism for the decoder: how each layer is cut across ranks, and what one
rank holds of it.

The cut (Megatron's): in each attention block the fused QKV projection is column-parallel
and o_proj row-parallel over the same query heads. With at least N KV heads, a rank holds a
contiguous run of KV heads with their query heads (as even as the count allows: SmolLM2's 3 KV
heads at tp 2 give 2 and 1, i.e. 6 and 3 query heads); with fewer, KV heads are replicated and
each rank holds num_heads / N query heads that all read one KV head;
in each MLP gate_up is column-parallel (a slice of the intermediate dim in both halves) and
down_proj row-parallel. A row-parallel layer's output is a partial sum, so each block costs
one all-reduce (done by `DecoderLayer`), and its bias lives on rank 0 only, so it is added
once. Embeddings and the LM head are vocab-parallel: each rank a contiguous slice of the
(padded) vocabulary. Mixture-of-experts blocks split every expert's intermediate dim the
same way (the router and the shared expert's gate are replicated): tensor parallelism over
experts, not expert parallelism, so every rank runs every chosen expert on its slice and the
block still needs one all-reduce. Norms and RoPE tables are replicated.

`SHARD_RULES` is the one declaration of this per layer; the loader (HF names -> our layers)
and the dummy weights (our parameters) both slice by it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from sgl.runtime.distributed import TPGroup
from sgl.runtime.model.config import ModelConfig
from sgl.runtime.model.quant_tensor import QuantizedTensor, cat_rows


@dataclass(frozen=True)
class ShardRule:
    """How a layer is cut: "column" (its output dim; `parts` are its fused pieces in output
    order, each cut on its own: "q" by this rank's query heads, "kv" by its KV heads, "even"
    in N equal slices), "row" (its input dim, cut as its one part; bias on rank 0 only),
    "vocab" (rows of the padded vocabulary) or "replicated"."""

    kind: str
    parts: tuple[str, ...] = ("even",)


REPLICATED = ShardRule("replicated")
ROW = ShardRule("row")
ATTN_OUT = ShardRule("row", ("q",))  # o_proj: its inputs are this rank's query heads
VOCAB = ShardRule("vocab")
QKV = ShardRule("column", ("q", "kv", "kv"))
GATE_UP = ShardRule("column", ("even", "even"))

# Our layers (inside a decoder layer, or at the top) -> their cut; anything else is replicated.
SHARD_RULES: dict[str, ShardRule] = {
    "embed_tokens": VOCAB,
    "lm_head": VOCAB,
    "self_attn.qkv_proj": QKV,
    "self_attn.o_proj": ATTN_OUT,
    "mlp.gate_up_proj": GATE_UP,
    "mlp.down_proj": ROW,
    "mlp.shared_expert.gate_up_proj": GATE_UP,
    "mlp.shared_expert.down_proj": ROW,
    "mlp.experts.gate_up_proj": GATE_UP,  # stacked [E, 2I, H]: cut along 2I
    "mlp.experts.down_proj": ROW,  # stacked [E, H, I]: cut along I
}
_LAYER_PREFIX = re.compile(r"^layers\.\d+\.")
_PARAM_SUFFIX = re.compile(r"\.(weight|weight_t|bias)$")


def rule_for(name: str) -> ShardRule:
    """The rule of a layer or parameter of ours ("layers.3.mlp.down_proj.weight_t", "lm_head")."""
    key = _PARAM_SUFFIX.sub("", _LAYER_PREFIX.sub("", name))
    return SHARD_RULES.get(key, REPLICATED)


def _balanced(count: int, size: int, rank: int) -> tuple[int, int]:
    """(start, length) of rank's run when `count` items are cut in `size` contiguous runs as
    even as they can be (the first count % size runs one longer)."""
    base, extra = divmod(count, size)
    return rank * base + min(rank, extra), base + (rank < extra)


def check_splittable(config: ModelConfig, size: int) -> None:
    """Refuse a config whose layers cannot be cut in `size` shards (ValueError naming the
    field). Attention is cut by KV heads (unevenly where they do not divide); KV heads fewer
    than ranks are replicated, so each rank's query heads must then all use one KV head:
    size a multiple of num_key_value_heads and a divisor of num_attention_heads. The MLP
    dims are cut in equal slices."""
    if size == 1:
        return
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    sizes = {"num_attention_heads": heads} if kv < size else {}
    if any(not config.is_sparse(i) for i in range(config.num_hidden_layers)):
        sizes["intermediate_size"] = config.intermediate_size
    if config.num_experts:
        sizes["moe_intermediate_size"] = config.moe_intermediate_size
        if config.shared_expert_intermediate_size:
            sizes["shared_expert_intermediate_size"] = config.shared_expert_intermediate_size
    for name, value in sizes.items():
        if value % size:
            raise ValueError(
                f"tensor parallelism: {name}={value} is not divisible by tp_size={size}; "
                f"choose a tp_size that divides it"
            )
    if kv < size and size % kv:
        raise ValueError(
            f"tensor parallelism: num_key_value_heads={kv} is fewer than tp_size={size} and does "
            f"not divide it, so KV heads cannot be replicated evenly; choose a tp_size that is a "
            f"multiple or divisor of {kv}"
        )


class TPShards:
    """What one rank holds of each layer: head counts, vocabulary rows, and the index ranges
    of a full weight's output or input dim that are this rank's."""

    def __init__(self, config: ModelConfig, tp: TPGroup) -> None:
        check_splittable(config, tp.size)
        self.config, self.tp = config, tp
        n, r = tp.size, tp.rank
        heads, kv = config.num_attention_heads, config.num_key_value_heads
        if kv >= n:  # a run of KV heads, and the query heads that read them
            self.kv_head_start, self.num_kv_heads = _balanced(kv, n, r)
            group = heads // kv
            self.q_head_start, self.num_heads = (
                self.kv_head_start * group,
                self.num_kv_heads * group,
            )
        else:  # replicated: rank r's query heads all read KV head r * kv // n
            self.num_kv_heads, self.kv_head_start = 1, r * kv // n
            self.num_heads = heads // n
            self.q_head_start = r * self.num_heads
        self.vocab_per_rank = -(-config.vocab_size // n)
        self.vocab_start = r * self.vocab_per_rank

    @property
    def sharded(self) -> bool:
        return self.tp.size > 1

    def split(self, size: int, name: str = "a dimension") -> int:
        """size / N (refusing sizes that do not divide)."""
        if size % self.tp.size:
            raise ValueError(
                f"tensor parallelism: {name} of size {size} is not divisible by "
                f"tp_size={self.tp.size}"
            )
        return size // self.tp.size

    def part_range(self, kind: str, size: int) -> tuple[int, int]:
        """This rank's rows of one fused part of `size` rows (or inputs of a row-parallel one)."""
        if kind == "kv":
            head_dim = size // self.config.num_key_value_heads
            return self.kv_head_start * head_dim, (
                self.kv_head_start + self.num_kv_heads
            ) * head_dim
        if kind == "q":
            head_dim = size // self.config.num_attention_heads
            return self.q_head_start * head_dim, (self.q_head_start + self.num_heads) * head_dim
        per = self.split(size)
        return self.tp.rank * per, (self.tp.rank + 1) * per

    def out_ranges(
        self, rule: ShardRule, size: int, part: int | None = None
    ) -> list[tuple[int, int]]:
        """This rank's rows of a column-parallel weight's output dim of `size`: of the whole
        fused weight (part None), or of its `part`-th piece alone."""
        if part is not None:
            return [self.part_range(rule.parts[part], size)]
        sizes = self._part_sizes(rule.parts, size)
        ranges, offset = [], 0
        for kind, n in zip(rule.parts, sizes):
            a, b = self.part_range(kind, n)
            ranges.append((offset + a, offset + b))
            offset += n
        return ranges

    def _part_sizes(self, parts: tuple[str, ...], size: int) -> list[int]:
        known = {"q": self.config.q_size, "kv": self.config.kv_size}
        rest = size - sum(known[p] for p in parts if p in known)
        even = [p for p in parts if p not in known]
        if even and rest % len(even) or rest < 0:
            raise ValueError(f"a fused weight of {size} rows does not split into the parts {parts}")
        return [known.get(p, rest // max(len(even), 1)) for p in parts]

    def in_range(
        self, size: int, name: str = "a row-parallel layer", kind: str = "even"
    ) -> tuple[int, int]:
        """This rank's slice of a row-parallel weight's input dim (`kind`: its rule's part)."""
        if kind != "even":
            return self.part_range(kind, size)
        per = self.split(size, f"the input dim of {name}")
        return self.tp.rank * per, (self.tp.rank + 1) * per

    def whole_inputs(self, rule: ShardRule, local: int) -> int:
        """The inputs at tp size 1 of a layer holding `local` of them here (int4 groups are
        chosen for the whole layer, so a rank's shard computes what the whole does)."""
        if rule.kind != "row" or not self.sharded:
            return local
        return self.config.q_size if rule.parts[0] == "q" else local * self.tp.size

    def vocab_range(self, size: int) -> tuple[int, int, int]:
        """(start, stop, padding rows) of this rank's slice of a `size`-row vocabulary table."""
        start = min(self.vocab_start, size)
        stop = min(self.vocab_start + self.vocab_per_rank, size)
        return start, stop, self.vocab_per_rank - (stop - start)


def take(
    value: torch.Tensor | QuantizedTensor,
    dim: int,
    ranges: list[tuple[int, int]],
    name: str = "a weight",
) -> torch.Tensor | QuantizedTensor:
    """The pieces `ranges` of `value` along `dim`, concatenated, as a new tensor (the caller
    may drop `value` at once). Quantized codes are cut along rows, or along inputs on their
    groups' boundaries only."""
    if isinstance(value, QuantizedTensor):
        if dim == 0:
            return value.rows(torch.cat([torch.arange(a, b) for a, b in ranges]))
        ((a, b),) = ranges
        return value.columns(a, b, name)
    pieces = [value.narrow(dim, a, b - a) for a, b in ranges]
    return pieces[0].clone() if len(pieces) == 1 else torch.cat(pieces, dim)


def pad_rows(value: torch.Tensor | QuantizedTensor, extra: int) -> torch.Tensor | QuantizedTensor:
    """`value` with `extra` zero rows appended (the vocabulary's padding to a multiple of N)."""
    if not extra:
        return value
    if isinstance(value, QuantizedTensor):
        n, k = value.shape
        zeros = QuantizedTensor(
            value.kind,
            torch.zeros(extra, k, dtype=value.codes.dtype),
            torch.zeros(extra, value.scales.shape[1]),
            None if value.zeros is None else torch.zeros(extra, value.zeros.shape[1]),
            value.group,
        )
        if value.kind == "int4":
            zeros.codes.fill_(8)  # (8 - 8) * s + 0
        return cat_rows([value, zeros])
    return torch.cat([value, value.new_zeros(extra, *value.shape[1:])])


@dataclass(frozen=True)
class Cut:
    """This rank's part of one full tensor: the pieces `ranges` along `dim` (None: the whole
    tensor), then `pad` zero rows (the vocabulary's padding)."""

    dim: int | None
    ranges: tuple[tuple[int, int], ...] = ()
    pad: int = 0

    def apply(
        self, value: torch.Tensor | QuantizedTensor, name: str = "a weight"
    ) -> torch.Tensor | QuantizedTensor:
        if self.dim is None:
            return value
        return pad_rows(take(value, self.dim, list(self.ranges), name), self.pad)


def cut_of(
    shards: TPShards,
    rule: ShardRule,
    shape: tuple[int, ...],
    out_dim: int,
    in_dim: int | None,
    part: int | None = None,
    name: str = "a weight",
) -> Cut | None:
    """How `rule` cuts a full weight (or, `in_dim` None, bias) of `shape` for this rank; None
    where the rank holds none of it (a row-parallel bias off rank 0)."""
    if not shards.sharded or rule.kind == "replicated":
        return Cut(None)
    if rule.kind == "column":
        return Cut(out_dim, tuple(shards.out_ranges(rule, shape[out_dim], part)))
    if rule.kind == "vocab":
        start, stop, extra = shards.vocab_range(shape[out_dim])
        return Cut(out_dim, ((start, stop),), extra)
    if in_dim is None:  # a row-parallel layer's bias: added once, by rank 0
        return Cut(None) if shards.tp.rank == 0 else None
    return Cut(in_dim, (shards.in_range(shape[in_dim], name, rule.parts[0]),))


def param_dims(name: str, ndim: int) -> tuple[int, int | None]:
    """(output dim, input dim) of one of our parameters: `Linear.weight_t` is [in, out],
    other weights [out, in] or stacked [E, out, in], biases [out]."""
    if name.endswith("bias") or ndim == 1:
        return 0, None
    if name.endswith("weight_t"):
        return 1, 0
    return ndim - 2, ndim - 1
