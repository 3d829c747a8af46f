"""A GGUF file as an HF model: its config translated to HF keys, its tensors under HF names
(`GgufSource`, read one at a time, quantized codes kept: gguf_weights.py), and, for
quantization "none", a dequantized HF-style copy in the cache (`gguf_to_hf_dir`).

llama.cpp's converter interleaves the rotary halves of Q and K for llama-arch models and stores
Gemma's norms as 1 + w; both are undone on read, so the weights match HF's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from sgl.runtime.model.gguf_weights import GgufTensors
from sgl.runtime.model.paths import cache_root
from sgl.runtime.model.quant_tensor import QuantizedTensor, dense_weight

logger = logging.getLogger(__name__)

_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_GGUF_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs",
}
_GGUF_ARCHS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
}
# Expert tensors as llama.cpp stacks them ([E, I, H] gate and up apart, [E, H, I] down) and the
# shared expert of Qwen2-MoE; `load_moe_layer` joins gate and up.
_GGUF_MOE_NAMES = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# llama.cpp's default renormalization of the chosen experts' weights, where the file has no key.
_GGUF_MOE_NORM = {"llama": True, "qwen2moe": False, "qwen3moe": True}
# Phi-3 keeps q/k/v fused (attn_qkv) and gate/up fused in ffn_up, as its HF checkpoints do.
_GGUF_PHI3_NAMES = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
_GGUF_ROPE_FACTORS = (
    "rope_factors_long.weight",
    "rope_factors_short.weight",
)  # LongRoPE, read into the config
# Gemma's norms around both blocks: llama.cpp's names (its `ffn_norm` is the pre-MLP norm, as
# for Llama), and the converter stores every Gemma norm weight as 1 + w (undone on read).
_GGUF_GEMMA_NAMES = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
GGUF_NORM_SHIFTED = ("gemma2", "gemma3")


def gguf_cache_key(path: Path) -> str:
    st = path.stat()
    raw = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|v1"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def gguf_to_hf_dir(path: Path) -> Path:
    """Dequantize a GGUF file once into an HF-style directory in the cache; return that
    directory."""
    target = cache_root() / "models" / f"{path.stem}-{gguf_cache_key(path)}"
    if (target / "config.json").exists():
        return target
    logger.info("converting %s to %s (first load only)", path, target)
    hf_config, state = read_gguf(path)
    from safetensors.torch import save_file

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=1))
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race; its copy is equivalent
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def open_gguf(path: Path) -> tuple[dict, GgufSource]:
    """HF config dict and the file's weights by HF name (read one at a time, see gguf_weights)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    hf_config = _gguf_hf_config(reader)
    return hf_config, GgufSource(GgufTensors(path, reader), hf_config)


def read_gguf(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """HF config dict and HF-named float32 state dict from a GGUF file (every tensor
    dequantized)."""
    hf_config, source = open_gguf(path)
    return hf_config, {name: dense_weight(source.get(name)) for name in source.names()}


def _gguf_hf_config(reader) -> dict:
    arch = _field(reader, "general.architecture")
    if arch not in _GGUF_ARCHS:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; supported: {sorted(_GGUF_ARCHS)}"
        )
    a = arch
    heads = int(_field(reader, f"{a}.attention.head_count"))
    hidden = int(_field(reader, f"{a}.embedding_length"))
    tensors = {t.name: t for t in reader.tensors}
    vocab = int(_field(reader, f"{a}.vocab_size", 0) or tensors["token_embd.weight"].shape[-1])
    hf_config = {
        "architectures": [_GGUF_ARCHS[arch]],
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, f"{a}.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, f"{a}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, f"{a}.attention.head_count_kv", heads)),
        "head_dim": int(_field(reader, f"{a}.attention.key_length", 0) or hidden // heads),
        "rms_norm_eps": float(_field(reader, f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(_field(reader, f"{a}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(reader, f"{a}.context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
    }
    scale_type = _field(reader, f"{a}.rope.scaling.type")
    if scale_type == "linear":
        hf_config["rope_scaling"] = {
            "rope_type": "linear",
            "factor": float(_field(reader, f"{a}.rope.scaling.factor")),
        }
    if arch in GGUF_NORM_SHIFTED:
        hf_config.update(_gguf_gemma_config(reader, a, hf_config))
    if arch == "phi3":
        hf_config.update(_gguf_phi3_config(reader, a, hf_config, tensors))
    if _field(reader, f"{a}.expert_count"):
        hf_config.update(_gguf_moe_config(reader, a, hf_config, tensors))
    return hf_config


def _gguf_moe_config(reader, a: str, c: dict, tensors: dict) -> dict:
    """Experts: Mixtral is llama.cpp's `llama` with an expert count; Qwen2/3-MoE their own archs,
    a layer without a router (`ffn_gate_inp`) being a dense one (`mlp_only_layers`)."""
    experts, used = (
        int(_field(reader, f"{a}.expert_count")),
        int(_field(reader, f"{a}.expert_used_count")),
    )
    norm = _field(reader, f"{a}.expert_weights_norm")
    out: dict[str, Any] = {
        "num_experts_per_tok": used,
        "norm_topk_prob": bool(_GGUF_MOE_NORM.get(a, True) if norm is None else norm),
    }
    if a == "llama":
        return {**out, "architectures": ["MixtralForCausalLM"], "num_local_experts": experts}
    out.update(
        num_experts=experts,
        moe_intermediate_size=int(_field(reader, f"{a}.expert_feed_forward_length")),
        mlp_only_layers=[
            i
            for i in range(c["num_hidden_layers"])
            if f"blk.{i}.ffn_gate_inp.weight" not in tensors
        ],
    )
    shared = _field(reader, f"{a}.expert_shared_feed_forward_length")
    if shared:
        out["shared_expert_intermediate_size"] = int(shared)
    return out


def _gguf_phi3_config(reader, a: str, c: dict, tensors: dict) -> dict:
    """Phi-3's window, rotary dims and LongRoPE (factors as two small tensors, the pre-training
    context and the attention factor as keys), as llama.cpp's converter writes them."""
    out: dict[str, Any] = {
        "sliding_window": _field(reader, f"{a}.attention.sliding_window") or None
    }
    rope_dims = _field(reader, f"{a}.rope.dimension_count")
    if rope_dims and rope_dims != c["head_dim"]:
        out["partial_rotary_factor"] = rope_dims / c["head_dim"]
    if all(name in tensors for name in _GGUF_ROPE_FACTORS):
        long, short = (
            tensors[name].data.astype("float64").reshape(-1).tolist() for name in _GGUF_ROPE_FACTORS
        )
        out["original_max_position_embeddings"] = int(
            _field(reader, f"{a}.rope.scaling.original_context_length")
        )
        out["rope_scaling"] = {"rope_type": "longrope", "long_factor": long, "short_factor": short}
        attn_factor = _field(reader, f"{a}.rope.scaling.attn_factor")
        if attn_factor is not None:
            out["rope_scaling"]["attention_factor"] = float(attn_factor)
    return out


def _gguf_gemma_config(reader, a: str, c: dict) -> dict:
    """What llama.cpp keeps of a Gemma config: the window, the caps, the local RoPE base and the
    layer pattern (keys, else llama.cpp's fixed values: base 10000, 5 local layers per global
    one for Gemma 3). It stores no query_pre_attn_scalar: like llama.cpp, the head size, except
    Gemma 2 27B's hidden / heads."""
    out = {
        "sliding_window": _field(reader, f"{a}.attention.sliding_window"),
        "final_logit_softcapping": _field(reader, f"{a}.final_logit_softcapping"),
        "query_pre_attn_scalar": c["head_dim"],
    }
    if a == "gemma2":
        out["attn_logit_softcapping"] = _field(reader, f"{a}.attn_logit_softcapping")
        if (c["hidden_size"], c["num_hidden_layers"]) == (4608, 46):  # Gemma 2 27B
            out["query_pre_attn_scalar"] = c["hidden_size"] // c["num_attention_heads"]
    else:
        out["rope_local_base_freq"] = float(_field(reader, f"{a}.rope.freq_base_swa", 10000.0))
        pattern = _field(reader, f"{a}.attention.sliding_window_pattern", 6)
        if isinstance(pattern, list):  # a flag per layer (true: sliding)
            out["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
        else:
            out["sliding_window_pattern"] = int(pattern)
    return {k: v for k, v in out.items() if v is not None}


class GgufSource:
    """A GGUF file's weights under HF names; Q/K rows back in HF's rotate-half order."""

    fresh_reads = True  # every get() builds new tensors: the loader may reuse them in place

    def __init__(self, tensors: GgufTensors, hf_config: dict) -> None:
        self.tensors = tensors
        self.arch = hf_config["model_type"]
        self.heads, self.kv_heads = (
            hf_config["num_attention_heads"],
            hf_config["num_key_value_heads"],
        )
        layer_names = {
            **_GGUF_LAYER_NAMES,
            **(_GGUF_GEMMA_NAMES if self.arch in GGUF_NORM_SHIFTED else {}),
            **(_GGUF_PHI3_NAMES if self.arch == "phi3" else {}),
            **_GGUF_MOE_NAMES,
        }
        self._gguf_name: dict[str, str] = {}
        for name in tensors.infos:
            if name in _GGUF_ROPE_FACTORS:
                continue  # in the config already
            if name in _GGUF_TOP_NAMES:
                self._gguf_name[_GGUF_TOP_NAMES[name]] = name
                continue
            _, layer, kind, suffix = name.split(".", 3)
            if kind not in layer_names:
                raise ValueError(f"unexpected GGUF tensor {name}")
            self._gguf_name[f"model.layers.{layer}.{layer_names[kind]}.{suffix}"] = name

    def names(self) -> list[str]:
        return list(self._gguf_name)

    def has(self, name: str) -> bool:
        return name in self._gguf_name

    def family(self, name: str) -> str | None:
        return self.tensors.family(self._gguf_name[name])

    def get(self, name: str) -> torch.Tensor | QuantizedTensor:
        gname = self._gguf_name[name]
        value = self.tensors.read(gname)
        kind = gname.split(".")[2] if gname.startswith("blk.") else ""
        # llama.cpp's converter interleaves the rotary halves of Q and K for llama-arch
        # models; undo it so the weights match HF's rotate-half RoPE.
        if self.arch in ("llama", "mistral") and kind in ("attn_q", "attn_k"):
            heads = self.heads if kind == "attn_q" else self.kv_heads
            if isinstance(value, QuantizedTensor):
                return value.rows(unpermute_qk(torch.arange(value.shape[0]), heads))
            return unpermute_qk(value, heads)
        if self.arch in GGUF_NORM_SHIFTED and gname.endswith("norm.weight"):
            return dense_weight(value) - 1.0  # stored as 1 + w (Gemma's RMSNorm scales by 1 + w)
        if kind == "ffn_gate_inp_shexp":
            return dense_weight(value).reshape(1, -1)  # [H] in the file, HF's Linear(H, 1) weight
        return value

    def get_experts(self, name: str) -> list[torch.Tensor | QuantizedTensor]:
        """A stacked expert weight as one weight per expert, quantized codes kept as they are."""
        return self.tensors.read_experts(self._gguf_name[name])


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's `permute` (pairs interleaved -> rotate-half halves), per head."""
    out_dim = w.shape[0]
    rest = w.shape[1:]
    return (
        w.reshape(n_heads, out_dim // n_heads // 2, 2, *rest)
        .transpose(1, 2)
        .reshape(out_dim, *rest)
    )
