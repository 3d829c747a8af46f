"""Write a model of a family llama.cpp reads (Llama, Qwen2/3, Gemma 2/3, Phi-3, Mixtral,
Qwen2/3-MoE; HF config + HF-named weights) as a GGUF file, the way llama.cpp's converter lays
it out (Q/K rows permuted for llama), quantized by the `gguf` package.

For benchmarks and tests: every engine (sgl, llama.cpp, vLLM, HF) can then load the same
weights, e.g. a random-weight 1B shape written once as Q4_1, Q8_0 and an HF directory.
The tokenizer metadata is copied from another GGUF (e.g. the embedded model's), since
llama.cpp needs one in the file.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
_GEMMA_LAYER = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
PERMUTED_ARCHS = ("llama", "mistral")  # llama.cpp's converter interleaves their Q/K rotary halves
NORM_SHIFTED_ARCHS = ("gemma2", "gemma3")  # the converter stores Gemma's norm weights as 1 + w
_PHI3_LAYER = {
    "self_attn.qkv_proj": "attn_qkv",
    "mlp.gate_up_proj": "ffn_up",
}  # fused, as in its checkpoints
MOE_ARCHS = ("mixtral", "qwen2moe", "qwen3moe")
_FILE_ARCH = {"mixtral": "llama"}  # llama.cpp's name for the architecture in the file
WRITABLE_ARCHS = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", *MOE_ARCHS)
_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter permutation (rotate-half halves -> interleaved pairs), per head."""
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    if hf_name in _TOP:
        return _TOP[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    names = {
        **_LAYER,
        **(_GEMMA_LAYER if arch in NORM_SHIFTED_ARCHS else {}),
        **(_PHI3_LAYER if arch == "phi3" else {}),
    }
    return f"blk.{layer}.{names[module]}.{kind}"


def write_llama_gguf(
    path: Path,
    config: dict,
    weights: Iterable[tuple[str, torch.Tensor]],
    qtype: str = "F32",
    tokenizer_from: Path | None = None,
    embed_qtype: str | None = None,
    arch: str = "llama",
) -> None:
    """Write `weights` (HF names, any order) as a GGUF of `arch` (WRITABLE_ARCHS; Mixtral is
    llama.cpp's `llama` with experts). Weights of 2+ dims are stored as `qtype` (F32, F16,
    Q8_0, Q4_0, Q4_1, ...), the token embedding / LM head as `embed_qtype` (default: qtype);
    norms stay F32."""
    import gguf

    if arch not in WRITABLE_ARCHS:
        raise ValueError(f"arch must be one of {WRITABLE_ARCHS}, got {arch!r}")
    qt = gguf.GGMLQuantizationType[qtype]
    et = gguf.GGMLQuantizationType[embed_qtype or qtype]
    w = gguf.GGUFWriter(str(path), _FILE_ARCH.get(arch, arch))
    if tokenizer_from is not None:
        _copy_tokenizer(w, Path(tokenizer_from))
    _add_header(w, arch, config)
    for name, tensor in weights:
        for out_name, arr in _file_tensors(name, tensor.float().numpy(), arch, config):
            kind = et if name in ("model.embed_tokens.weight", "lm_head.weight") else qt
            if arr.ndim == 1 or kind == gguf.GGMLQuantizationType.F32:
                w.add_tensor(out_name, arr.astype(np.float32))
            else:
                w.add_tensor(out_name, gguf.quants.quantize(arr, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add_header(w, arch: str, config: dict) -> None:
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(_rope_theta(config))
    w.add_vocab_size(config["vocab_size"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    partial = config.get("partial_rotary_factor") or (config.get("rope_parameters") or {}).get(
        "partial_rotary_factor"
    )
    w.add_rope_dimension_count(int(head_dim * (partial or 1.0)))
    if (
        config.get("head_dim") or arch in NORM_SHIFTED_ARCHS
    ):  # as llama.cpp's converter: when the config has it
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch in NORM_SHIFTED_ARCHS:
        _add_gemma_fields(w, arch, config)
    if arch == "phi3":
        _add_phi3_fields(w, config)
    if arch in MOE_ARCHS:
        w.add_expert_count(config.get("num_experts") or config["num_local_experts"])
        w.add_expert_used_count(config["num_experts_per_tok"])
        if arch != "mixtral":
            w.add_expert_feed_forward_length(config["moe_intermediate_size"])
            w.add_expert_weights_norm(bool(config.get("norm_topk_prob", False)))
        if config.get("shared_expert_intermediate_size") and arch == "qwen2moe":
            w.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])


def _file_tensors(
    name: str, arr: np.ndarray, arch: str, config: dict
) -> Iterable[tuple[str, np.ndarray]]:
    """One HF-named weight as the file holds it: Q/K permuted for llama-layout archs, Gemma's
    norms as 1 + w (no tied output), stacked experts' gate and up apart, the shared expert's
    gate as a vector."""
    if (
        arch in NORM_SHIFTED_ARCHS
        and name == "lm_head.weight"
        and config.get("tie_word_embeddings", True)
    ):
        return  # llama.cpp's Gemma has no output tensor when the head is tied
    if name.endswith("mlp.experts.gate_up_proj"):
        layer = name.split(".")[2]
        size = arr.shape[1] // 2
        yield f"blk.{layer}.ffn_gate_exps.weight", np.ascontiguousarray(arr[:, :size])
        yield f"blk.{layer}.ffn_up_exps.weight", np.ascontiguousarray(arr[:, size:])
        return
    if name.endswith("mlp.experts.down_proj"):
        yield f"blk.{name.split('.')[2]}.ffn_down_exps.weight", arr
        return
    if arch in NORM_SHIFTED_ARCHS and name.endswith("norm.weight"):
        arr = arr + 1.0
    if _FILE_ARCH.get(arch, arch) in PERMUTED_ARCHS:
        if name.endswith("q_proj.weight"):
            arr = permute_qk(arr, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            arr = permute_qk(arr, config["num_key_value_heads"])
    if name.endswith("shared_expert_gate.weight"):
        arr = arr.reshape(-1)
    yield gguf_name(name, arch), arr


def _add_gemma_fields(w, arch: str, config: dict) -> None:
    """Gemma's keys as llama.cpp's converter writes them (key length in `_add_header`), plus
    the local RoPE base and the sliding-layer period where a config's differ from
    llama.cpp's fixed ones (10000, 6)."""
    if config.get("sliding_window"):
        w.add_sliding_window(config["sliding_window"])
    if config.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(config["final_logit_softcapping"])
    if arch == "gemma2":
        if config.get("attn_logit_softcapping"):
            w.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        return
    import gguf

    rope = config.get("rope_parameters") or {}
    scaling = (rope.get("full_attention") or {}) if rope else (config.get("rope_scaling") or {})
    if scaling.get("rope_type", scaling.get("type")) == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(scaling["factor"]))
    local = (rope.get("sliding_attention") or {}).get("rope_theta") or config.get(
        "rope_local_base_freq"
    )
    if local:
        w.add_key_value(f"{arch}.rope.freq_base_swa", float(local), gguf.GGUFValueType.FLOAT32)
    types = config.get("layer_types")
    if types:
        w.add_key_value(
            f"{arch}.attention.sliding_window_pattern",
            [t == "sliding_attention" for t in types],
            gguf.GGUFValueType.ARRAY,
            sub_type=gguf.GGUFValueType.BOOL,
        )


def _add_phi3_fields(w, config: dict) -> None:
    """Phi-3's window and LongRoPE as llama.cpp's converter writes them: the factors
    as two F32 tensors, the pre-training context and the attention factor (computed
    when the config has none)."""
    if config.get("sliding_window"):
        w.add_sliding_window(config["sliding_window"])
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type")) != "longrope":
        return
    old_ctx = (
        config.get("original_max_position_embeddings") or rope["original_max_position_embeddings"]
    )
    scale = config["max_position_embeddings"] / old_ctx
    attn = rope.get("attention_factor") or (
        math.sqrt(1 + math.log(scale) / math.log(old_ctx)) if scale > 1 else 1.0
    )
    w.add_rope_scaling_attn_factors(float(attn))
    w.add_rope_scaling_orig_ctx_len(int(old_ctx))
    w.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32))
    w.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32))


def _rope_theta(config: dict) -> float:
    """The (global layers') RoPE base, from either config format (transformers 5's
    rope_parameters)."""
    rope = config.get("rope_parameters") or {}
    rope = rope.get("full_attention") or rope
    return float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0)


def _copy_tokenizer(writer, source: Path) -> None:
    """The tokenizer.* fields of another GGUF file."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, value, vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, vtype)
