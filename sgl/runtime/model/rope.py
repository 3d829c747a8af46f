"""Rotary position embeddings: the inverse frequencies of every scaling kind the supported
configs use (linear, dynamic NTK, llama3, YaRN, LongRoPE; GGUF's per-frequency factors), float32
cos/sin tables indexed by absolute position, and the rotate-half rotation over all or the leading
part of each head.

LongRoPE (Phi-3.5, Phi-4-mini, the 128k Phi-3s) has two sets of factors: HF transformers
takes the long ones for a whole forward once the sequence passes
`original_max_position_embeddings` (and keeps the keys it cached before as they were). sgl
picks per position: the short factors below that length, the long ones from it on, so a
request's cached keys never change meaning and requests in one batch do not affect each
other. Up to `original_max_position_embeddings` tokens both agree exactly.

Dynamic NTK scales the RoPE base with the sequence length once it passes the pre-training
context: HF recomputes the frequencies for the longest position of each forward. sgl again
picks per position: position p uses the base HF computes for a sequence of p + 1 tokens. That
is exactly HF's token-by-token decoding (where the newest position is the longest), and exact
for every prompt within the pre-training context; a long prompt prefilled at once differs from
HF's single-base prefill, as it does in vLLM and SGLang, which use one base for the longest
context instead (and so differ from HF on short prompts too).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from sgl.runtime.model.config import ModelConfig


def rope_inv_freq(config: ModelConfig, local: bool = False, long: bool = False) -> torch.Tensor:
    """Inverse frequencies [rope_dim / 2] (float64), scaled per `config.rope_scaling` or GGUF's
    per-frequency factors; `local`: the sliding-window layers' own base (unscaled); `long`:
    LongRoPE's long factors."""
    dim = config.rope_dim
    theta = config.local_rope_theta if local else config.rope_theta
    base_freq = theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv_freq = 1.0 / base_freq
    scaling = {} if local else config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if config.rope_freq_factors is not None and not local:
        inv_freq = inv_freq / torch.tensor(config.rope_freq_factors, dtype=torch.float64)
    elif kind == "llama3":
        inv_freq = _llama3(inv_freq, scaling)
    elif kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "yarn":
        inv_freq = _yarn(base_freq, dim, theta, scaling, config)
    elif (
        kind == "dynamic"
    ):  # the pre-training context's frequencies; RotaryEmbedding scales past it
        pass
    elif kind == "longrope":
        factors = torch.tensor(
            scaling["long_factor" if long else "short_factor"], dtype=torch.float64
        )
        inv_freq = 1.0 / (factors * base_freq)
    elif kind not in (None, "default"):
        raise ValueError(
            f"rope scaling type {kind!r} is not supported (supported: llama3, linear, dynamic, "
            "yarn, longrope)"
        )
    return inv_freq


def _llama3(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1's scaling: long wavelengths divided by the factor, short ones kept, a smooth
    blend between."""
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_ctx = scaling.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_ctx / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_mid, mid, scaled)


def _dynamic_ntk_inv_freq(config: ModelConfig, positions: torch.Tensor) -> torch.Tensor:
    """[P, rope_dim / 2] inverse frequencies per position: past the pre-training context L, the
    base grows to theta * (factor * (p + 1) / L - (factor - 1)) ** (dim / (dim - 2)), HF's
    formula for a sequence of p + 1 tokens; below L it is theta."""
    dim, scaling = config.rope_dim, config.rope_scaling
    factor, old_ctx = scaling["factor"], scaling["original_max_position_embeddings"]
    seq_len = (positions + 1).clamp(min=old_ctx)
    base = config.rope_theta * (factor * seq_len / old_ctx - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / base[:, None] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def _yarn_factor(scaling: dict, config: ModelConfig) -> float:
    return (
        scaling.get("factor")
        or config.max_position_embeddings / scaling["original_max_position_embeddings"]
    )


def _yarn(
    base_freq: torch.Tensor, dim: int, theta: float, scaling: dict, config: ModelConfig
) -> torch.Tensor:
    """YaRN: frequencies that turn fewer than `beta_slow` times over the original context are
    interpolated (divided by the factor), those turning more than `beta_fast` times kept, with
    a linear ramp over the dims between."""
    factor = _yarn_factor(scaling, config)
    old_ctx = scaling["original_max_position_embeddings"]
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def dim_turning(
        turns: float,
    ) -> float:  # the dim whose frequency turns `turns` times over old_ctx
        return dim * math.log(old_ctx / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_turning(fast), dim_turning(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate
    return (1.0 / (factor * base_freq)) * (1 - keep) + (1.0 / base_freq) * keep


def rope_attention_factor(config: ModelConfig) -> float:
    """The factor YaRN and LongRoPE put on cos and sin (so on every q.k), 1 otherwise."""
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "yarn":
        factor = _yarn_factor(scaling, config)
        if scaling.get("attention_factor") is not None:
            return float(scaling["attention_factor"])

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        return mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    if kind == "longrope":
        old_ctx = scaling["original_max_position_embeddings"]
        factor = scaling.get("factor") or config.max_position_embeddings / old_ctx
        if scaling.get("attention_factor") is not None:
            return float(scaling["attention_factor"])
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old_ctx))
    return 1.0


class RotaryEmbedding(nn.Module):
    """Neox-style (rotate-half) RoPE tables indexed by absolute position (`tables`, applied by
    `rotate`)."""

    def __init__(self, config: ModelConfig, local: bool = False) -> None:
        super().__init__()
        self.head_dim = config.rope_dim
        t = torch.arange(config.max_position_embeddings, dtype=torch.float64)
        freqs = torch.outer(t, rope_inv_freq(config, local))
        scaling = {} if local else config.rope_scaling or {}
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind == "longrope":  # long factors from the old context on
            long = torch.outer(t, rope_inv_freq(config, local, long=True))
            freqs = torch.where(
                t[:, None] >= scaling["original_max_position_embeddings"], long, freqs
            )
        elif kind == "dynamic":
            freqs = t[:, None] * _dynamic_ntk_inv_freq(config, t)
        factor = 1.0 if local else rope_attention_factor(config)
        self.register_buffer("cos", (freqs.cos() * factor).float(), persistent=False)
        self.register_buffer("sin", (freqs.sin() * factor).float(), persistent=False)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin), each [T, 1, D] float32, for `rotate`: once per forward, not per
        layer."""
        cos, sin = self.cos[positions], self.sin[positions]  # [T, D/2]
        return torch.cat((cos, cos), -1).unsqueeze(1), torch.cat((-sin, sin), -1).unsqueeze(1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x [T, heads, D] in float32: x cos + (x2, x1) (-sin, sin), over the
    first R = cos.shape[-1] dims of each head (all of them but with partial rotary)."""
    x32 = x.float()
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return (x32 * cos + torch.roll(x32, r // 2, -1) * sin).to(x.dtype)
    part = x32[..., :r]
    return torch.cat((part * cos + torch.roll(part, r // 2, -1) * sin, x32[..., r:]), -1).to(
        x.dtype
    )
