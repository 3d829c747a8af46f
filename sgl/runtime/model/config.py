"""ModelConfig: the few numbers the Llama-family model needs, from an HF config or GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Architectures that this one implementation covers (HF `architectures` / GGUF `general.architecture`).
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
}


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

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        archs = d.get("architectures") or [d.get("model_type", "llama")]
        arch = SUPPORTED_ARCHITECTURES.get(archs[0]) or SUPPORTED_ARCHITECTURES.get(d.get("model_type", ""))
        if arch is None:
            raise ValueError(
                f"model architecture {archs[0]!r} is not supported; supported: Llama 2/3, Mistral, Qwen2/2.5, SmolLM"
            )
        heads = d["num_attention_heads"]
        # transformers >= 5 keeps rope settings in `rope_parameters`; older configs use
        # `rope_theta` + `rope_scaling`.
        rope = dict(d.get("rope_parameters") or {})
        scaling = d.get("rope_scaling") or None
        theta = rope.pop("rope_theta", None) or d.get("rope_theta", 10000.0)
        if rope and rope.get("rope_type", "default") != "default":
            scaling = rope
        if scaling is not None:
            scaling = dict(scaling)
            if scaling.get("rope_type", scaling.get("type", "default")) == "default":
                scaling = None
        eos = d.get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
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
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2" or bool(d.get("attention_bias", False)),
            o_bias=arch != "qwen2" and bool(d.get("attention_bias", False)),
            mlp_bias=bool(d.get("mlp_bias", False)),
            arch=arch,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim
