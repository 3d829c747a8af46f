"""Random-weight models built from a config alone (`load_format="dummy"`).

For benchmarks and tests of the runtime at a real model's size without its checkpoint: the
speed of a forward pass depends on the shapes, not on the values. `model_path` names the
config: a named shape below, a directory holding config.json, or a config .json file.
Weights are normal(0, 0.02) (norms 1, biases 0), drawn on the target device from a seeded
generator, so a dummy 8B model appears in seconds and twice the same seed gives the same model.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from sgl.runtime.model.config import ModelConfig
from sgl.runtime.model.llama import LlamaForCausalLM, RotaryEmbedding

logger = logging.getLogger(__name__)

DUMMY_STD = 0.02

# HF-style configs of shapes worth benchmarking, by name.
NAMED_SHAPES: dict[str, dict[str, Any]] = {
    # Meta-Llama-3-8B
    "llama3-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128009],
    },
    # The embedded default model, SmolLM2-135M-Instruct.
    "smollm2-135m": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    # Seconds on a CPU; the vocabulary fits the embedded tokenizer's ids.
    "tiny-llama": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}
# `--model-path default` with dummy weights: the embedded model's shape.
_DEFAULT_ALIASES = ("default", "smollm2", "SmolLM2-135M-Instruct")


def dummy_hf_config(model_path: str) -> dict[str, Any]:
    """The HF config dict that `model_path` names (a named shape, a directory, a .json file)."""
    name = "smollm2-135m" if model_path in _DEFAULT_ALIASES else model_path
    if name in NAMED_SHAPES:
        return dict(NAMED_SHAPES[name])
    path = Path(model_path).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return json.loads((path / "config.json").read_text())
    if path.is_file() and path.suffix == ".json":
        return json.loads(path.read_text())
    raise FileNotFoundError(
        f"load_format='dummy' needs model_path to be a named shape {sorted(NAMED_SHAPES)}, a directory "
        f"holding config.json, or a config .json file; got {model_path!r}"
    )


def init_dummy_weights(model: torch.nn.Module, seed: int = 0, std: float = DUMMY_STD) -> None:
    """Fill every parameter in place: norm weights 1, biases 0, the rest normal(0, std)."""
    generators: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                gen = generators.get(p.device)
                if gen is None:
                    gen = generators[p.device] = torch.Generator(device=p.device)
                    gen.manual_seed(seed)
                p.normal_(0.0, std, generator=gen)


def load_dummy_model(
    model_path: str, dtype: torch.dtype, device: torch.device, seed: int = 0
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """A random-weight model of the config `model_path` names, in `dtype` on `device`."""
    config = ModelConfig.from_hf_dict(dummy_hf_config(model_path))
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    # Cast on the meta device, so the weights are allocated once, in their final dtype.
    model = model.to(dtype=dtype).to_empty(device=device)
    model.rotary = RotaryEmbedding(config).to(device)  # float32 RoPE tables, computed for real
    init_dummy_weights(model, seed)
    model.requires_grad_(False)
    return model.eval(), config


def dummy_tokenizer_source(model_path: str) -> str | None:
    """Where a dummy model's tokenizer comes from: the config's directory if it holds one,
    else the embedded model's (its ids only need to be below the vocabulary size), else None
    (a byte-level tokenizer is built; see `byte_level_tokenizer`)."""
    path = Path(model_path).expanduser()
    if path.is_dir() and any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return str(path)
    from sgl.runtime.model.loader import resolve_model_path

    try:
        return resolve_model_path("default")
    except FileNotFoundError:
        return None


def byte_level_tokenizer() -> Any:
    """A 257-token tokenizer (the 256 bytes + <eos>) built in memory: what a dummy model uses
    when no real tokenizer is installed, e.g. on a GPU machine without network."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab["<eos>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<eos>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
