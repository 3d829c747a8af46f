"""`load_format="dummy"`: random-weight models from a config or a named shape, no checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

import sgl
from sgl.runtime.model.config import ModelConfig
from sgl.runtime.model.dummy import (
    NAMED_SHAPES,
    byte_level_tokenizer,
    dummy_hf_config,
    dummy_tokenizer_source,
    load_dummy_model,
)
from sgl.runtime.model.llama import LlamaForCausalLM


def _param_count(name: str) -> int:
    with torch.device("meta"):
        model = LlamaForCausalLM(ModelConfig.from_hf_dict(NAMED_SHAPES[name]))
    return sum(p.numel() for p in model.parameters())


def test_llama3_8b_shape():
    c = ModelConfig.from_hf_dict(dummy_hf_config("llama3-8b"))
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (
        4096,
        32,
        32,
        8,
    )
    assert (c.intermediate_size, c.vocab_size, c.head_dim) == (14336, 128256, 128)
    assert (c.rope_theta, c.max_position_embeddings, c.tie_word_embeddings) == (
        500000.0,
        8192,
        False,
    )
    assert _param_count("llama3-8b") == 8_030_261_248  # Meta-Llama-3-8B's published size


def test_default_alias_is_the_embedded_shape():
    assert dummy_hf_config("default") == NAMED_SHAPES["smollm2-135m"]
    assert 134e6 < _param_count("smollm2-135m") < 136e6


def test_config_from_a_directory_or_a_file(tmp_path):
    cfg = dict(NAMED_SHAPES["tiny-llama"], vocab_size=123)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert dummy_hf_config(str(tmp_path))["vocab_size"] == 123
    assert dummy_hf_config(str(tmp_path / "config.json"))["vocab_size"] == 123
    with pytest.raises(FileNotFoundError, match="named shape"):
        dummy_hf_config(str(tmp_path / "missing"))


def test_weights_are_finite_shaped_and_seeded():
    model, config = load_dummy_model("tiny-llama", torch.float32, torch.device("cpu"), seed=5)
    again, _ = load_dummy_model("tiny-llama", torch.float32, torch.device("cpu"), seed=5)
    other, _ = load_dummy_model("tiny-llama", torch.float32, torch.device("cpu"), seed=6)
    params = dict(model.named_parameters())
    assert params["embed_tokens.weight"].shape == (config.vocab_size, config.hidden_size)
    qkv = config.q_size + 2 * config.kv_size
    assert params["layers.0.self_attn.qkv_proj.weight_t"].shape == (config.hidden_size, qkv)
    assert params["layers.1.mlp.gate_up_proj.weight_t"].shape == (
        config.hidden_size,
        2 * config.intermediate_size,
    )
    assert params["lm_head.weight"].shape == (config.vocab_size, config.hidden_size)
    for name, p in params.items():
        assert torch.isfinite(p).all(), name
        assert not p.requires_grad
        if name.endswith("norm.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
        else:
            assert 0.015 < p.std().item() < 0.025, name
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    assert not torch.equal(
        params["embed_tokens.weight"], dict(other.named_parameters())["embed_tokens.weight"]
    )
    assert model.rotary.cos.dtype == torch.float32


def test_bfloat16_weights_are_allocated_in_bfloat16():
    model, _ = load_dummy_model("tiny-llama", torch.bfloat16, torch.device("cpu"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.rotary.cos.dtype == torch.float32  # RoPE tables stay float32


def test_byte_level_tokenizer_round_trips():
    tok = byte_level_tokenizer()
    text = 'héllo wörld, {"a": 1}\n'
    ids = tok(text).input_ids
    assert max(ids) < 256 and tok.decode(ids) == text
    assert tok.eos_token_id == 256 and len(tok) == 257


def test_tokenizer_source(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(NAMED_SHAPES["tiny-llama"]))
    assert dummy_tokenizer_source(str(tmp_path)) != str(tmp_path)  # no tokenizer there
    byte_level_tokenizer().save_pretrained(tmp_path)
    assert dummy_tokenizer_source(str(tmp_path)) == str(tmp_path)


def test_dummy_engine_generates_on_cpu(tmp_path):
    cfg = dict(NAMED_SHAPES["tiny-llama"], vocab_size=300)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    byte_level_tokenizer().save_pretrained(tmp_path)
    with sgl.Engine(
        model_path=str(tmp_path), load_format="dummy", max_total_tokens=2048, random_seed=1
    ) as engine:
        out = engine.generate("hello", {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True})
        batch = engine.generate(
            input_ids=[[5, 6, 7], [8] * 20],
            sampling_params={"max_new_tokens": 5, "temperature": 0.8},
        )
        info = engine.get_server_info()
    assert len(out["output_ids"]) == 12 and all(0 <= t < 300 for t in out["output_ids"])
    assert isinstance(out["text"], str)
    for o in batch:  # sampled: may stop early at an EOS
        assert (
            1 <= o["meta_info"]["completion_tokens"] <= 5
            and o["meta_info"]["finish_reason"] is not None
        )
    assert info["load_format"] == "dummy" and info["vocab_size"] == 300


def test_unknown_shape_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="llama3-8b"):
        sgl.Engine(model_path="llama9-1t", load_format="dummy")


@pytest.mark.parametrize(
    "name", ["qwen3-0.6b", "gemma2-2b", "gemma3-1b", "phi3-mini", "qwen3-30b-a3b", "mixtral-8x7b"]
)
def test_family_shapes_have_hfs_parameter_count(name):
    """Each named shape builds the same parameters as HF transformers' model of that config
    (both on the meta device; tied tables counted once)."""
    import transformers

    hf_cfg = dict(NAMED_SHAPES[name])
    config = transformers.AutoConfig.for_model(hf_cfg.pop("model_type"), **hf_cfg)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    assert _param_count(name) == sum(p.numel() for p in hf.parameters())
