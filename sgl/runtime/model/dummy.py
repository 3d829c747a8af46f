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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sgl.runtime.distributed import TPGroup
from sgl.runtime.model.config import ModelConfig
from sgl.runtime.model.llama import LlamaForCausalLM
from sgl.runtime.model.parallel import cut_of, param_dims, rule_for
from sgl.runtime.model.registry import build_model

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
    # Qwen3-0.6B (q/k norms)
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": True,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
    # gemma-2-2b (sliding window on alternate layers, soft-capping, sandwich norms)
    "gemma2-2b": {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "vocab_size": 256000,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
    },
    # gemma-3-1b (5 local layers per global one, each kind with its own RoPE base)
    "gemma3-1b": {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": 262144,
        "hidden_size": 1152,
        "intermediate_size": 6912,
        "num_hidden_layers": 26,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
    },
    # Phi-3-mini-4k-instruct (qkv and gate/up fused in its checkpoints, a 2047-token window)
    "phi3-mini": {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "vocab_size": 32064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "sliding_window": 2047,
        "tie_word_embeddings": False,
        "pad_token_id": 32000,
        "bos_token_id": 1,
        "eos_token_id": 32000,
    },
    # Qwen3-30B-A3B (128 experts, 8 per token; ~61 GB in bf16: benchmark a few of its layers
    # by giving a config file with fewer num_hidden_layers)
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
    # Mixtral-8x7B (8 experts, 2 per token; ~93 GB in bf16, as above)
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
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
        f"load_format='dummy' needs model_path to be a named shape {sorted(NAMED_SHAPES)}, a "
        "directory "
        f"holding config.json, or a config .json file; got {model_path!r}"
    )


def init_dummy_weights(model: torch.nn.Module, seed: int = 0, std: float = DUMMY_STD) -> None:
    """Fill every parameter in place: norms scale by 1 (Gemma's stored w - 1: 0), biases 0,
    the rest normal(0, std)."""
    fill = _dummy_filler(getattr(model, "config", None), seed, std)
    with torch.no_grad():
        for name, p in model.named_parameters():
            fill(name, p)


def _dummy_filler(
    config: ModelConfig | None, seed: int, std: float
) -> Callable[[str, torch.Tensor], None]:
    """fill(name, tensor): the dummy value of one parameter, drawn from one seeded generator
    per device in the order the parameters are filled."""
    generators: dict[torch.device, torch.Generator] = {}
    norm_value = 1.0 - (config.norm_offset if config is not None else 0.0)

    def fill(name: str, p: torch.Tensor) -> None:
        if name.endswith("norm.weight"):
            p.fill_(norm_value)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            gen = generators.get(p.device)
            if gen is None:
                gen = generators[p.device] = torch.Generator(device=p.device)
                gen.manual_seed(seed)
            p.normal_(0.0, std, generator=gen)

    return fill


def init_dummy_shards(model: LlamaForCausalLM, seed: int = 0, std: float = DUMMY_STD) -> None:
    """A tensor-parallel rank's shards of exactly the weights `init_dummy_weights` gives the
    whole model: each whole parameter is drawn in turn (same order, shapes, dtype and
    generator) and cut by `parallel.SHARD_RULES`, so at most one whole parameter exists at once."""
    with torch.device("meta"):
        whole = build_model(model.config)
    ours = dict(model.named_parameters())
    dtype = next(iter(ours.values())).dtype
    fill = _dummy_filler(model.config, seed, std)
    with torch.no_grad():
        for name, meta in whole.named_parameters():
            device = ours[name].device if name in ours else next(iter(ours.values())).device
            full = torch.empty(meta.shape, dtype=dtype, device=device)
            fill(name, full)
            cut = cut_of(
                model.shards,
                rule_for(name),
                tuple(full.shape),
                *param_dims(name, full.dim()),
                name=name,
            )
            if cut is not None:  # None: a row-parallel bias, rank 0's only
                ours[name].copy_(cut.apply(full, name))


def load_dummy_model(
    model_path: str,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
    tp: TPGroup | None = None,
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """A random-weight model of the config `model_path` names, in `dtype` on `device`; with
    `tp`, this rank's shard of the same weights as the whole model's."""
    config = ModelConfig.from_hf_dict(dummy_hf_config(model_path))
    with torch.device("meta"):
        model = build_model(config, tp)
    # Cast on the meta device, so the weights are allocated once, in their final dtype.
    model = model.to(dtype=dtype).to_empty(device=device)
    model.build_rotary(device)  # float32 RoPE tables, computed for real
    if model.shards.sharded:
        init_dummy_shards(model, seed)
    else:
        init_dummy_weights(model, seed)
    model.requires_grad_(False)
    return model.eval(), config


def dummy_tokenizer_source(model_path: str) -> str | None:
    """Where a dummy model's tokenizer comes from: the config's directory if it holds one,
    else the embedded model's (its ids only need to be below the vocabulary size), else None
    (a byte-level tokenizer is built; see `byte_level_tokenizer`)."""
    path = Path(model_path).expanduser()
    if path.is_dir() and any(
        (path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    ):
        return str(path)
    from sgl.runtime.model.paths import resolve_model_path

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
