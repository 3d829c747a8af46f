"""Write a Llama, Qwen2 or Qwen3 model (HF config + HF-named weights) as a GGUF file, the way
llama.cpp's converter lays it out (Q/K rows permuted for llama), quantized by the `gguf` package.

For benchmarks and tests: every engine (sgl, llama.cpp, vLLM, HF) can then load the same
weights, e.g. a random-weight 1B shape written once as Q4_1, Q8_0 and an HF directory.
The tokenizer metadata is copied from another GGUF (e.g. the embedded model's), since
llama.cpp needs one in the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import torch

_LAYER = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
}
PERMUTED_ARCHS = ("llama", "mistral")  # llama.cpp's converter interleaves their Q/K rotary halves
WRITABLE_ARCHS = ("llama", "qwen2", "qwen3")
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter permutation (rotate-half halves -> interleaved pairs), per head."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf_name: str) -> str:
    if hf_name in _TOP:
        return _TOP[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER[module]}.{kind}"


def write_llama_gguf(path: Path, config: dict, weights: Iterable[tuple[str, torch.Tensor]], qtype: str = "F32",
                     tokenizer_from: Path | None = None, embed_qtype: str | None = None, arch: str = "llama") -> None:
    """Write `weights` (HF names, any order) as a GGUF of `arch` (WRITABLE_ARCHS). 2-D weights
    are stored as `qtype` (F32, F16, Q8_0, Q4_0, Q4_1, ...), the token embedding / LM head as
    `embed_qtype` (default: qtype); norms stay F32."""
    import gguf

    if arch not in WRITABLE_ARCHS:
        raise ValueError(f"arch must be one of {WRITABLE_ARCHS}, got {arch!r}")
    qt = gguf.GGMLQuantizationType[qtype]
    et = gguf.GGMLQuantizationType[embed_qtype or qtype]
    w = gguf.GGUFWriter(str(path), arch)
    if tokenizer_from is not None:
        _copy_tokenizer(w, Path(tokenizer_from))
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    w.add_vocab_size(config["vocab_size"])
    w.add_rope_dimension_count(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    for name, tensor in weights:
        arr = tensor.float().numpy()
        if arch not in PERMUTED_ARCHS:
            pass
        elif name.endswith("q_proj.weight"):
            arr = permute_qk(arr, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            arr = permute_qk(arr, config["num_key_value_heads"])
        kind = et if name in ("model.embed_tokens.weight", "lm_head.weight") else qt
        if arr.ndim == 1 or kind == gguf.GGMLQuantizationType.F32:
            w.add_tensor(gguf_name(name), arr.astype(np.float32))
        else:
            w.add_tensor(gguf_name(name), gguf.quants.quantize(arr, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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
