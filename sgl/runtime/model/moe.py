"""Mixture-of-experts MLP blocks (Mixtral, Qwen2-MoE, Qwen3-MoE): a router picks `top_k` of
E experts per token, each a gated MLP; the block's output is their weighted sum (plus, in
Qwen2-MoE, a shared expert scaled by a sigmoid gate).

Expert weights are stacked ([E, 2I, H] gate/up, [E, H, I] down), as transformers >= 5 keeps
them, so loading is a copy and a future grouped-GEMM kernel reads one tensor. The compute is
grouped: the (token, expert) pairs are sorted by expert, each expert's rows are gathered once
and run through its two matmuls as one batch, and the results are scattered back with their
routing weights. The Python loop runs over experts that received tokens, never over tokens.
Each expert's row count is padded to `row_grid` (oneDNN keeps a primitive per matmul shape).
On CUDA with Triton the same grouping runs as two kernels that read the stacked weights in
place and need no host sync (`moe_triton.py`).

Tensor parallelism splits each expert's intermediate dim across ranks (gate/up rows and
down's inputs, as for a dense MLP; the router is replicated): every rank routes every token
the same way and runs the chosen experts on its slice, and the block's output, shared expert
included, is a partial sum that `DecoderLayer` all-reduces once. This is the choice over
expert parallelism (whole experts per rank): no token exchange, balanced work whatever the
routing, and the same shard rules as the dense layers.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from sgl.runtime.model.config import ModelConfig
from sgl.runtime.model.cpu_packed import PackedLinear
from sgl.runtime.model.parallel import TPShards
from sgl.runtime.model.row_grid import on_row_grid


def activation(x: torch.Tensor, kind: str) -> torch.Tensor:
    return F.gelu(x, approximate="tanh") if kind == "gelu_tanh" else F.silu(x)


class StackedExperts(nn.Module):
    """E gated MLPs in two stacked parameters; `forward` runs the tokens routed to each.

    Where stacked weights do not suit the kernel, each expert gets its own pair of layers
    (`per_expert`) and the stacked parameters are dropped: quantized experts (int8 / int4
    layers, from the loader) and, on a CPU with native bf16 matmuls, bf16 experts packed for
    oneDNN (`pack_for_cpu`; a plain bf16 weight is reordered into oneDNN's blocked layout on
    every call, which for the few rows an expert gets in decoding costs several times the
    multiply)."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, act: str) -> None:
        super().__init__()
        self.num_experts, self.intermediate, self.act = num_experts, intermediate, act
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self.per_expert: nn.ModuleList | None = (
            None  # per expert: (gate_up, down) layers, once split
        )

    def use_per_expert_layers(self, layers: list[tuple[nn.Module, nn.Module]]) -> None:
        """Compute with these (gate_up [2I, H], down [H, I]) layers, one pair per expert."""
        if len(layers) != self.num_experts:
            raise ValueError(f"{len(layers)} expert layer pairs for {self.num_experts} experts")
        self.per_expert = nn.ModuleList(nn.ModuleList(pair) for pair in layers)
        for name in ("gate_up_proj", "down_proj"):
            self._parameters.pop(name, None)

    def pack_for_cpu(self) -> tuple[nn.Module, int]:
        """Pack each expert's two bf16 weights for oneDNN, dropping the stacked ones (peak
        memory: one more copy of this block's experts, while it packs); in place
        (cpu_packed.CpuPackable). Experts already split (quantized or packed) stay as they are."""
        if self.per_expert is not None or self.gate_up_proj.dtype != torch.bfloat16:
            return self, 0
        self.use_per_expert_layers(
            [
                (PackedLinear(self.gate_up_proj[e], None), PackedLinear(self.down_proj[e], None))
                for e in range(self.num_experts)
            ]
        )
        return self, 2 * self.num_experts

    def stacked_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [E, 2I, H], down [E, H, I]) as float32: exactly the weights computed with."""
        if self.per_expert is None:
            return self.gate_up_proj.float(), self.down_proj.float()
        held = [[layer.held_weight() for layer in pair] for pair in self.per_expert]
        return torch.stack([pair[0] for pair in held]), torch.stack([pair[1] for pair in held])

    def forward(
        self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """x [T, H]; experts, weights [T, k] (each token's chosen experts and their weights)."""
        if self.per_expert is None and x.is_cuda and _triton_grouped_experts() is not None:
            return _triton_grouped_experts()(
                x, self.gate_up_proj, self.down_proj, experts, weights, self.act
            )
        return self.grouped_matmuls(x, experts, weights)

    def grouped_matmuls(
        self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """The torch path: one gate/up and one down matmul per expert that received rows."""
        k = experts.shape[1]
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # the (token, slot) pairs grouped by expert
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        tokens = order // k
        rows = x.index_select(0, tokens)
        out_rows = torch.empty_like(rows)
        start = 0
        for e, n in enumerate(counts):
            if n:  # rows padded to the grid: an expert's row count takes any value in prefill
                out_rows[start : start + n] = on_row_grid(
                    functools.partial(self._expert_mlp, e), rows[start : start + n]
                )
                start += n
        out_rows = out_rows * weights.reshape(-1).index_select(0, order).unsqueeze(1).to(
            out_rows.dtype
        )
        return torch.zeros_like(x).index_add_(0, tokens, out_rows)

    def _expert_mlp(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        if self.per_expert is not None:
            gate_up, down = self.per_expert[e]
            gate, up = gate_up(rows).split(self.intermediate, -1)
            return down(activation(gate, self.act) * up)
        gate, up = F.linear(rows, self.gate_up_proj[e]).split(self.intermediate, -1)
        return F.linear(activation(gate, self.act) * up, self.down_proj[e])


@functools.cache
def _triton_grouped_experts():
    """`moe_triton.grouped_experts`, or None where Triton is not installed."""
    try:
        from sgl.runtime.model.moe_triton import grouped_experts
    except ImportError:
        return None
    return grouped_experts


class SparseMoE(nn.Module):
    """Router (softmax over all experts in float32, top-k, renormalized where the model says)
    -> stacked experts (+ the gated shared expert of Qwen2-MoE). Sharded (`shards`), the
    experts and the shared expert hold this rank's slice of their intermediate dims and the
    output is this rank's partial sum; the router and the shared expert's gate are whole."""

    def __init__(
        self, config: ModelConfig, dense_mlp: type[nn.Module], shards: TPShards | None = None
    ) -> None:
        super().__init__()
        self.top_k, self.renormalize = config.experts_per_token, config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        size = (
            shards.split(config.moe_intermediate_size, "moe_intermediate_size")
            if shards
            else config.moe_intermediate_size
        )
        self.experts = StackedExperts(
            config.num_experts, config.hidden_size, size, config.hidden_act
        )
        if config.shared_expert_intermediate_size:
            self.shared_expert = dense_mlp(
                config, config.shared_expert_intermediate_size, shards=shards
            )
            self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(experts [T, k], weights [T, k] float32) for each token."""
        probs = F.linear(x, self.gate.weight).float().softmax(-1)
        weights, experts = probs.topk(self.top_k, -1)
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return experts, weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, *self.route(x))
        if hasattr(self, "shared_expert"):
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
