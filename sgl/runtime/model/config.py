"""ModelConfig: the numbers and switches the decoder needs, from an HF config or GGUF metadata.

One decoder implementation (`model/llama.py`) covers the dense families below; what differs
between them is read here, per architecture, into plain fields. A config key that changes the
model and that the decoder does not implement raises `UnsupportedConfigError` naming the key:
a model that loads must compute what the checkpoint's authors trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# HF `architectures` / `model_type` / GGUF `general.architecture` -> our family name.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MinistralForCausalLM": "ministral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "llama": "llama",
    "mistral": "mistral",
    "ministral": "ministral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "phi3": "phi3",
    "mixtral": "mixtral",
    "qwen2_moe": "qwen2_moe",
    "qwen3_moe": "qwen3_moe",
}
SUPPORTED_NAMES = (
    "Llama 2/3, Mistral, Ministral, Qwen2/2.5, Qwen3, Gemma 2, Gemma 3 (text), "
    "Phi-3 / 3.5 / Phi-4-mini, Mixtral, Qwen2-MoE, Qwen3-MoE, SmolLM"
)
ROPE_KINDS = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
# The activation each family's MLP gate uses (HF `hidden_act` / `hidden_activation`).
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


class UnsupportedConfigError(ValueError):
    """A config key that changes the model and that sgl does not implement (named in the
    message)."""


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    arch: str = "llama"
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    # Per-frequency divisors (GGUF's `rope_freqs.weight`, how llama.cpp stores llama3 scaling).
    rope_freq_factors: list[float] | None = None
    # --- what the other families change
    hidden_act: str = "silu"  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    qk_norm: bool = False  # RMSNorm over each head of q and k before RoPE (Qwen3, Gemma 3)
    norm_offset: float = 0.0  # RMSNorm scales by (offset + w): Gemma stores w - 1
    sandwich_norms: bool = (
        False  # Gemma 2/3: norms after attention and MLP too, before each residual add
    )
    embed_scale: float | None = None  # embeddings times this (Gemma: sqrt(hidden))
    attn_scale: float | None = None  # q.k scale; None: head_dim ** -0.5
    attn_logit_cap: float = 0.0  # scores -> cap * tanh(scores / cap); 0: none
    final_logit_cap: float = 0.0  # the same on the output logits
    # Keys a query sees, itself included, per layer (0: all). Empty: every layer full.
    layer_windows: list[int] = field(default_factory=list)
    # RoPE base of the sliding-window layers when it differs (Gemma 3's local layers, unscaled).
    local_rope_theta: float | None = None
    # Leading dims of each head that RoPE rotates (Phi-4-mini: 3/4 of them); 0: the whole head.
    rotary_dim: int = 0
    # --- mixture of experts (num_experts 0: every MLP dense)
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalize the chosen experts' weights to sum to 1
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's always-on expert (0: none)
    sparse_layers: list[bool] = field(default_factory=list)  # per layer: MoE block (else dense MLP)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        arch = architecture_of(d)
        _refuse_unsupported(d, arch)
        heads = d["num_attention_heads"]
        theta, scaling, local_theta = _rope_settings(d, arch)
        eos = d.get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        gemma = arch in ("gemma2", "gemma3")
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=_max_positions(d, scaling),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", gemma)),
            qkv_bias=(
                arch == "qwen2"
                or bool(d.get("attention_bias", False))
                or (arch == "qwen2_moe" and d.get("qkv_bias", True))
            ),
            o_bias=arch not in ("qwen2", "qwen2_moe") and bool(d.get("attention_bias", False)),
            mlp_bias=bool(d.get("mlp_bias", False)),
            arch=arch,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            hidden_act=_activation(d, arch),
            qk_norm=arch in ("qwen3", "qwen3_moe", "gemma3"),
            norm_offset=1.0 if gemma else 0.0,
            sandwich_norms=gemma,
            embed_scale=math.sqrt(d["hidden_size"]) if gemma else None,
            attn_scale=float(d.get("query_pre_attn_scalar", 256)) ** -0.5 if gemma else None,
            attn_logit_cap=float(d.get("attn_logit_softcapping") or 0.0) if gemma else 0.0,
            final_logit_cap=float(d.get("final_logit_softcapping") or 0.0) if gemma else 0.0,
            layer_windows=_layer_windows(d, arch),
            local_rope_theta=local_theta,
            rotary_dim=_rotary_dim(d),
            **_moe_settings(d, arch),
        )

    @property
    def rope_dim(self) -> int:
        return self.rotary_dim or self.head_dim

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def is_sparse(self, layer: int) -> bool:
        """Whether this layer's MLP is a mixture of experts."""
        return bool(self.sparse_layers) and self.sparse_layers[layer]

    def window_of(self, layer: int) -> int:
        """Keys a query of this layer sees, itself included (0: all of its context)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def attention_features(self) -> frozenset[str]:
        """What the attention backend must implement for this model (`attention.FEATURES`)."""
        needs = set()
        if any(self.layer_windows):
            needs.add("sliding_window")
        if self.attn_logit_cap:
            needs.add("logit_cap")
        return frozenset(needs)


def architecture_of(d: dict[str, Any]) -> str:
    archs = d.get("architectures") or [d.get("model_type", "llama")]
    arch = SUPPORTED_ARCHITECTURES.get(archs[0]) or SUPPORTED_ARCHITECTURES.get(
        d.get("model_type", "")
    )
    if arch is None:
        raise UnsupportedConfigError(
            f"model architecture {archs[0]!r} (config key 'architectures') is not supported; "
            "supported: "
            f"{SUPPORTED_NAMES}"
        )
    return arch


def _activation(d: dict[str, Any], arch: str) -> str:
    key = (
        "hidden_activation"
        if arch in ("gemma2", "gemma3") and "hidden_activation" in d
        else "hidden_act"
    )
    default = "gelu_pytorch_tanh" if arch in ("gemma2", "gemma3") else "silu"
    name = d.get(key) or default
    if name not in ACTIVATIONS:
        raise UnsupportedConfigError(
            f"config key {key!r} = {name!r} is not supported (supported: {sorted(ACTIVATIONS)})"
        )
    return ACTIVATIONS[name]


def _rope_settings(d: dict[str, Any], arch: str) -> tuple[float, dict | None, float | None]:
    """(rope_theta, rope_scaling or None, local layers' theta or None) from either config format:
    transformers >= 5 keeps rope settings in `rope_parameters` (Gemma 3: one dict per layer
    type), older configs in `rope_theta` + `rope_scaling` (+ Gemma 3's `rope_local_base_freq`)."""
    params = dict(d.get("rope_parameters") or {})
    local_theta = None
    if arch == "gemma3":
        if "full_attention" in params or "sliding_attention" in params:
            local = dict(params.get("sliding_attention") or {})
            params = dict(params.get("full_attention") or {})
            local_theta = local.get("rope_theta")
            if _rope_kind(local) != "default":
                raise UnsupportedConfigError(
                    "config key 'rope_parameters.sliding_attention.rope_type' = "
                    f"{_rope_kind(local)!r}: sgl scales only the global layers' RoPE"
                )
        local_theta = float(local_theta or d.get("rope_local_base_freq") or 10000.0)
    default_theta = 1_000_000.0 if arch == "gemma3" else 10000.0
    theta = params.pop("rope_theta", None) or d.get("rope_theta") or default_theta
    scaling = (
        params if params and _rope_kind(params) != "default" else d.get("rope_scaling") or None
    )
    if scaling is not None:
        scaling = dict(scaling)
        kind = _rope_kind(scaling)
        if kind == "default":
            scaling = None
        elif kind not in ROPE_KINDS:
            raise UnsupportedConfigError(
                f"config key 'rope_scaling' has rope_type {kind!r}, which sgl does not implement "
                "yet "
                f"(supported: {', '.join(ROPE_KINDS)})"
            )
        else:
            _complete_scaling(scaling, kind, d)
    return float(theta), scaling, local_theta


def _complete_scaling(scaling: dict[str, Any], kind: str, d: dict[str, Any]) -> None:
    """The pre-training context these kinds scale from (a top-level
    `original_max_position_embeddings` wins, as Phi-3 configs keep it there; else the model's own),
    and LongRoPE's factor lists checked against the rotary dims."""
    if kind in ("llama3", "yarn", "longrope"):
        top = d.get("original_max_position_embeddings")
        if top:
            scaling["original_max_position_embeddings"] = top
        elif kind != "llama3":  # llama3 keeps its own default (8192)
            scaling.setdefault(
                "original_max_position_embeddings", d.get("max_position_embeddings", 4096)
            )
    if (
        kind == "dynamic"
    ):  # HF scales from the model's own max_position_embeddings, whatever else is set
        factor = scaling.get("factor")
        if not isinstance(factor, (int, float)) or factor < 1:
            raise UnsupportedConfigError(
                f"config key 'rope_scaling.factor' = {factor!r}: dynamic NTK needs a factor >= 1"
            )
        scaling["original_max_position_embeddings"] = d.get("max_position_embeddings", 4096)
    if kind == "longrope":
        head_dim = d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]
        half = (_rotary_dim(d) or head_dim) // 2
        for key in ("short_factor", "long_factor"):
            if len(scaling.get(key) or []) != half:
                raise UnsupportedConfigError(
                    f"config key 'rope_scaling.{key}' must list {half} factors (one per "
                    f"rotary frequency), got {len(scaling.get(key) or [])}"
                )


def _max_positions(d: dict[str, Any], scaling: dict[str, Any] | None) -> int:
    """Positions the model serves: the config's, times the factor for dynamic NTK (whose config
    keeps the pre-training length, the one its formula scales from), as vLLM counts it."""
    n = d.get("max_position_embeddings", 4096)
    if scaling is not None and _rope_kind(scaling) == "dynamic":
        return int(n * scaling["factor"])
    return n


def _rope_kind(scaling: dict[str, Any]) -> str:
    return scaling.get("rope_type", scaling.get("type", "default")) or "default"


def _layer_windows(d: dict[str, Any], arch: str) -> list[int]:
    """Per layer, the sliding window (0: full attention), from `layer_types` when the config has
    it, else by each family's rule (HF's defaults for configs written before `layer_types`)."""
    n = d["num_hidden_layers"]
    window = d.get("sliding_window")
    if arch in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not d.get(
        "use_sliding_window", False
    ):
        window = (
            None  # Qwen configs carry a sliding_window that applies only with use_sliding_window
        )
    types = d.get("layer_types")
    if types is None:
        if arch in ("mistral", "ministral", "phi3", "mixtral"):
            types = ["sliding_attention" if window else "full_attention"] * n
        elif arch == "qwen2_moe":  # HF: alternate layers below max_window_layers
            last = d.get("max_window_layers", n)
            types = [
                "sliding_attention" if window and (i + 1) % 2 and i < last else "full_attention"
                for i in range(n)
            ]
        elif arch in ("qwen2", "qwen3", "qwen3_moe"):
            first = d.get("max_window_layers", n)
            types = [
                "sliding_attention" if window and i >= first else "full_attention" for i in range(n)
            ]
        elif arch in ("gemma2", "gemma3"):
            every = 2 if arch == "gemma2" else int(d.get("sliding_window_pattern", 6))
            types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]
        else:
            if window:
                raise UnsupportedConfigError(
                    f"config key 'sliding_window' = {window} is not part of the {arch} "
                    "architecture; "
                    "remove it, or set 'architectures' to the family the checkpoint belongs to"
                )
            return []
    if len(types) != n:
        raise UnsupportedConfigError(
            f"config key 'layer_types' has {len(types)} entries for {n} layers"
        )
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown:
        raise UnsupportedConfigError(
            f"config key 'layer_types' names {unknown}, which sgl does not implement "
            "(supported: sliding_attention, full_attention)"
        )
    if "sliding_attention" in types and not window:
        if arch in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
            return []  # HF's Qwen layers slide only with use_sliding_window
        raise UnsupportedConfigError(
            "config key 'layer_types' names sliding_attention but 'sliding_window' is not set"
        )
    windows = [int(window) if t == "sliding_attention" else 0 for t in types]
    return windows if any(windows) else []


def _moe_settings(d: dict[str, Any], arch: str) -> dict[str, Any]:
    """The ModelConfig MoE fields: Mixtral's every layer, top-k renormalized; Qwen-MoE's layers
    per `decoder_sparse_step` except `mlp_only_layers`, renormalized per `norm_topk_prob`."""
    if arch not in ("mixtral", "qwen2_moe", "qwen3_moe"):
        return {}
    n = d["num_hidden_layers"]
    if arch == "mixtral":
        experts, size, sparse = d.get("num_local_experts", 8), d["intermediate_size"], [True] * n
    else:
        # transformers 5 writes Qwen3-MoE's num_experts as num_local_experts
        experts = d.get("num_experts") or d.get("num_local_experts") or 60
        size = d["moe_intermediate_size"]
        step, dense = d.get("decoder_sparse_step", 1) or 1, set(d.get("mlp_only_layers") or [])
        sparse = [i not in dense and experts > 0 and (i + 1) % step == 0 for i in range(n)]
    k = d.get("num_experts_per_tok", 2)
    if not 0 < k <= experts:
        raise UnsupportedConfigError(
            f"config key 'num_experts_per_tok' = {k} must be between 1 and the {experts} experts"
        )
    return dict(
        num_experts=experts,
        experts_per_token=k,
        moe_intermediate_size=size,
        norm_topk_prob=True if arch == "mixtral" else bool(d.get("norm_topk_prob", False)),
        shared_expert_intermediate_size=d.get("shared_expert_intermediate_size", 0)
        if arch == "qwen2_moe"
        else 0,
        sparse_layers=sparse,
    )


def _rotary_dim(d: dict[str, Any]) -> int:
    """Dims of a head that RoPE rotates, from `partial_rotary_factor` (top level, or in
    transformers 5's `rope_parameters`); 0 when it is the whole head."""
    factor = (
        d.get("partial_rotary_factor")
        or (d.get("rope_parameters") or {}).get("partial_rotary_factor")
        or 1.0
    )
    if factor == 1.0:
        return 0
    head_dim = d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]
    dim = int(head_dim * factor)
    if not 0 < dim <= head_dim or dim % 2:
        raise UnsupportedConfigError(
            f"config key 'partial_rotary_factor' = {factor} gives {dim} rotary dims of "
            f"{head_dim}; it must give an even number between 2 and the head size"
        )
    return dim


def _refuse_unsupported(d: dict[str, Any], arch: str) -> None:
    """Keys that change the model in ways the decoder does not implement."""
    if d.get("use_bidirectional_attention"):
        raise UnsupportedConfigError(
            "config key 'use_bidirectional_attention' is not supported: sgl runs causal decoders"
        )
