"""The decoder of the dense families sgl runs (Llama 2/3, Mistral/Ministral, Qwen2/2.5, Qwen3,
Gemma 2/3 text, Phi-3/3.5/4-mini, SmolLM) and the mixture-of-experts ones (Mixtral, Qwen2/3-MoE:
`moe.py` blocks in place of the MLP): GQA, RoPE, RMSNorm, a gated MLP, with the per-family switches
that `ModelConfig` reads (q/k norms, Gemma's (1 + w) norms around both blocks and scaled
embeddings, GeGLU, logit soft-capping, sliding-window layers with their own RoPE base,
RoPE over part of each head).

The model works on a flat batch of tokens from many requests (no padding). Attention is
delegated to an `AttentionBackend`, which writes the new K/V into the paged pool and reads
each request's context through the request-to-token table. Q/K/V and gate/up projections
are fused into one matmul each.

Built for a tensor-parallel group (`tp`, see `parallel.py`), each rank holds its shard of
every layer; attention and MLP blocks then return this rank's partial sum, which
`DecoderLayer` all-reduces (one collective per block). At tp size 1 nothing differs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sgl.runtime.attention.base import AttentionBackend, ForwardBatch
from sgl.runtime.distributed import TPGroup
from sgl.runtime.model.config import ModelConfig
from sgl.runtime.model.cpu_packed import PackedLinear
from sgl.runtime.model.layer_ops import fused_ops_for
from sgl.runtime.model.moe import SparseMoE
from sgl.runtime.model.parallel import TPShards
from sgl.runtime.model.rope import RotaryEmbedding, rotate


class Linear(nn.Module):
    """y = x W^T + b, with W stored transposed ([in, out], contiguous).

    On CPU, MKL's GEMM runs ~10% faster on this layout for the skinny activations of
    decoding (measured on the whole engine, single-threaded). Checkpoints keep HF's
    [out, in] layout; the loader transposes.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight_t = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def held_weight(self) -> torch.Tensor:
        """The float32 [out, in] weight the layer computes with."""
        return self.weight_t.t().float()

    def pack_for_cpu(self) -> tuple[nn.Module, int]:
        """A bf16 layer as a `PackedLinear` to hold in its place (cpu_packed.CpuPackable)."""
        if self.weight_t.dtype != torch.bfloat16:
            return self, 0
        return PackedLinear(self.weight_t.t(), self.bias), 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return torch.mm(x, self.weight_t)
        return torch.addmm(self.bias, x, self.weight_t)


class RMSNorm(nn.Module):
    """x / rms(x) * w; Gemma's variant (offset 1) scales by (1 + w), in float32 as HF does."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_ops_for(x) and self.weight.dtype == x.dtype:
            return torch.ops.sgl_layer.rms_norm(x, self.weight, self.eps, self.offset)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (x32 * (self.offset + self.weight.float())).to(dtype)
        return self.weight * x32.to(dtype)

    def add_forward(self, x: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + a, this norm of it): the residual add and the next block's norm, one call."""
        if fused_ops_for(x) and self.weight.dtype == x.dtype == a.dtype and x.dim() == 2:
            return torch.ops.sgl_layer.add_rms_norm(
                x.contiguous(), a.contiguous(), self.weight, self.eps, self.offset
            )
        x = x + a
        return x, self(x)


def _single(config: ModelConfig, shards: TPShards | None) -> TPShards:
    return shards if shards is not None else TPShards(config, TPGroup.single())


class Attention(nn.Module):
    """This rank's query heads and the KV heads they read (all of them at tp size 1); the
    output is o_proj's partial sum over this rank's heads (bias on rank 0 only)."""

    def __init__(self, config: ModelConfig, layer_id: int, shards: TPShards | None = None) -> None:
        super().__init__()
        shards = _single(config, shards)
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads = shards.num_heads, shards.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = (
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        self.qkv_proj = Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias
        )
        self.o_proj = Linear(
            self.q_size, config.hidden_size, bias=config.o_bias and shards.tp.rank == 0
        )
        self.scaling = config.attn_scale or self.head_dim**-0.5
        self.qk_norm = config.qk_norm
        if config.qk_norm:  # per head, before RoPE
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, config.norm_offset)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, config.norm_offset)
        # Only what the layer uses is passed on, so backends without these features still run
        # the models that do not need them.
        self.features = {
            k: v
            for k, v in (
                ("sliding_window", config.window_of(layer_id)),
                ("logit_cap", config.attn_logit_cap),
            )
            if v
        }

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], batch: ForwardBatch
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = (
            q.view(-1, self.num_heads, self.head_dim),
            k.view(-1, self.num_kv_heads, self.head_dim),
        )
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if fused_ops_for(x) and rope[0].dtype == torch.float32:  # contiguous, as the kernels want
            q, k = torch.ops.sgl_layer.rotate(q, *rope), torch.ops.sgl_layer.rotate(k, *rope)
        else:
            q, k = rotate(q, *rope), rotate(k, *rope)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        out = batch.attn_backend.forward(
            q, k, v, self.layer_id, self.scaling, batch, **self.features
        )
        return self.o_proj(out.reshape(-1, self.q_size))


class MLP(nn.Module):
    """Gated MLP on this rank's slice of the intermediate dim; the output is down_proj's
    partial sum (bias on rank 0 only)."""

    def __init__(
        self,
        config: ModelConfig,
        intermediate_size: int | None = None,
        shards: TPShards | None = None,
    ) -> None:
        super().__init__()
        shards = _single(config, shards)
        self.intermediate_size = size = shards.split(
            intermediate_size or config.intermediate_size, "intermediate_size"
        )
        self.gate_up_proj = Linear(config.hidden_size, 2 * size, bias=config.mlp_bias)
        self.down_proj = Linear(
            size, config.hidden_size, bias=config.mlp_bias and shards.tp.rank == 0
        )
        self.gelu = config.hidden_act == "gelu_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if fused_ops_for(gate_up) and gate_up.dim() == 2:
            return self.down_proj(torch.ops.sgl_layer.gated_act(gate_up, self.gelu))
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        gate = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.down_proj(gate * up)


class DecoderLayer(nn.Module):
    """Pre-norm blocks; with `sandwich_norms` (Gemma 2/3) each block's output is normed too
    (`post_attention_layernorm` then norms the attention output, not the MLP input).
    Under tensor parallelism each block's output is summed over ranks here, once per block."""

    def __init__(self, config: ModelConfig, layer_id: int, shards: TPShards | None = None) -> None:
        super().__init__()
        shards = _single(config, shards)
        self.tp = shards.tp
        norm = lambda: RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_offset)  # noqa: E731
        self.input_layernorm = norm()
        self.self_attn = Attention(config, layer_id, shards)
        self.post_attention_layernorm = norm()
        self.mlp = (
            SparseMoE(config, MLP, shards)
            if config.is_sparse(layer_id)
            else MLP(config, shards=shards)
        )
        self.sandwich = config.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = norm()
            self.post_feedforward_layernorm = norm()
        # Sliding-window layers with their own RoPE base read the model's local tables.
        self.local_rope = bool(config.window_of(layer_id)) and config.local_rope_theta is not None

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], batch: ForwardBatch
    ) -> torch.Tensor:
        reduce = self.tp.all_reduce  # returns its argument at tp size 1
        if self.sandwich:
            x = x + self.post_attention_layernorm(
                reduce(self.self_attn(self.input_layernorm(x), rope, batch))
            )
            return x + self.post_feedforward_layernorm(
                reduce(self.mlp(self.pre_feedforward_layernorm(x)))
            )
        attn = reduce(self.self_attn(self.input_layernorm(x), rope, batch))
        x, h = self.post_attention_layernorm.add_forward(x, attn)
        return x + reduce(self.mlp(h))


class LlamaForCausalLM(nn.Module):
    """The decoder, or this rank's shard of it when `tp` has more than one rank (a config that
    cannot be cut in `tp.size` shards is refused here, `parallel.check_splittable`).

    What the runtime sizes per rank from it: `local_num_heads` (the attention backend's query
    heads) and `local_num_kv_heads` (the KV pool's heads); `config` stays the whole model's,
    and `compute_logits` returns the whole vocabulary on every rank."""

    def __init__(self, config: ModelConfig, tp: TPGroup | None = None) -> None:
        super().__init__()
        self.config = config
        self.tp = tp if tp is not None else TPGroup.single()
        self.shards = shards = TPShards(config, self.tp)
        self.local_num_heads, self.local_num_kv_heads = shards.num_heads, shards.num_kv_heads
        self.embed_tokens = nn.Embedding(shards.vocab_per_rank, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, shards) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_offset)
        self.build_rotary()
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, shards.vocab_per_rank, bias=False)

    def build_rotary(self, device: torch.device | str | None = None) -> None:
        """The float32 RoPE tables (not in checkpoints: loaders build them for real after a
        meta-device construction), and the local layers' own where their base differs."""
        self.rotary = RotaryEmbedding(self.config)
        if any(layer.local_rope for layer in self.layers):
            self.rotary_local = RotaryEmbedding(self.config, local=True)
        if device is not None:
            self.rotary.to(device)
            getattr(self, "rotary_local", self.rotary).to(device)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """Final hidden states [T, hidden] for the flat token batch (after the last norm)."""
        x = self.embed(input_ids)
        if (
            self.config.embed_scale is not None
        ):  # rounded to the activations' dtype first, as HF does
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
        rope = self.rotary.tables(positions)
        local = self.rotary_local.tables(positions) if hasattr(self, "rotary_local") else rope
        for layer in self.layers:
            x = layer(x, local if layer.local_rope else rope, batch)
        return self.norm(x)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings; sharded, each rank looks up the ids in its vocabulary slice (zeros
        for the others') and the ranks' rows are summed."""
        if not self.shards.sharded:
            return self.embed_tokens(input_ids)
        local = input_ids - self.shards.vocab_start
        outside = (local < 0) | (local >= self.shards.vocab_per_rank)
        x = self.embed_tokens(local.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0)
        return self.tp.all_reduce(x)

    def pack_for_cpu(self) -> tuple[nn.Module, int]:
        """Pack the bf16 LM head for oneDNN, a tied one as its own packed copy of the embedding
        table (the lookup needs plain rows); the layers pack themselves (cpu_packed.CpuPackable)."""
        head = getattr(self, "lm_head", None)
        if isinstance(head, nn.Linear) and head.weight.dtype == torch.bfloat16:
            self.lm_head = PackedLinear(head.weight, head.bias)
            return self, 1
        if (
            head is None
            and isinstance(self.embed_tokens, nn.Embedding)
            and self.embed_tokens.weight.dtype == torch.bfloat16
        ):
            self.lm_head = PackedLinear(
                self.embed_tokens.weight, None
            )  # a packed copy of the tied table
            return self, 1
        return self, 0

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits [N, vocab] for the selected hidden rows (soft-capped where the model
        is)."""
        head = getattr(self, "lm_head", None)  # untied, or a tied table's packed copy (cpu_packed)
        if head is not None:
            logits = head(hidden).float()
        elif isinstance(self.embed_tokens, nn.Embedding):
            logits = F.linear(hidden, self.embed_tokens.weight).float()
        else:
            logits = self.embed_tokens.logits(hidden)  # quantized embeddings serve as the head
        if self.shards.sharded:  # each rank's vocabulary slice, in rank order; the padding dropped
            logits = self.tp.all_gather(logits, dim=-1)[:, : self.config.vocab_size]
        cap = self.config.final_logit_cap
        return logits if not cap else torch.tanh(logits / cap) * cap


__all__ = ["LlamaForCausalLM", "AttentionBackend", "ForwardBatch"]
