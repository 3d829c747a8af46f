"""KV pool sizing: fraction x free memory after the weights, less activation headroom, over
the KV bytes of one token. The arithmetic is checked with fake free-memory values."""

from __future__ import annotations

import json

import pytest
import torch

import sgl
import sgl.runtime.memory_plan as engine_mod
from sgl.runtime.memory import TokenToKVPool
from sgl.runtime.memory_plan import (
    CUDA_FIXED_HEADROOM_BYTES,
    activation_headroom_bytes,
    kv_pool_tokens,
)
from sgl.runtime.model.config import ModelConfig
from sgl.runtime.model.dummy import NAMED_SHAPES, byte_level_tokenizer

GiB = 1 << 30


def test_bytes_per_token_llama3_8b_bf16():
    c = ModelConfig.from_hf_dict(NAMED_SHAPES["llama3-8b"])
    # K and V x 32 layers x 8 KV heads x 128 dims x 2 bytes = 128 KiB per token
    assert (
        TokenToKVPool.bytes_per_token_for(
            c.num_hidden_layers, c.num_key_value_heads, c.head_dim, torch.bfloat16
        )
        == 131072
    )


def test_pool_tokens_arithmetic():
    # 100 GiB free after the weights, 85% of it, less 2 GiB headroom, at 128 KiB a token
    assert (
        kv_pool_tokens(100 * GiB, 0.85, 131072, 2 * GiB)
        == (int(100 * GiB * 0.85) - 2 * GiB) // 131072
    )
    assert kv_pool_tokens(100 * GiB, 0.85, 131072, 2 * GiB) == 83 * 8192  # 83 GiB in 128 KiB tokens
    assert kv_pool_tokens(10_000, 0.5, 100, 0) == 50
    assert (
        kv_pool_tokens(1 * GiB, 0.5, 1000, 2 * GiB) == 0
    )  # headroom exceeds the share: nothing, never negative


def test_activation_headroom_llama3_8b():
    c = ModelConfig.from_hf_dict(NAMED_SHAPES["llama3-8b"])
    tokens, running = 2048 + 256, 256
    per_token = 2 * (4 * 14336 + 2 * (4096 + 2 * 1024) + 4 * 4096) + 4 * (3 * 4096 + 2 * 4096)
    logits = 16 * 128256 * running
    expected = tokens * per_token + logits + CUDA_FIXED_HEADROOM_BYTES
    assert activation_headroom_bytes(c, torch.bfloat16, tokens, running) == expected
    assert (
        2 * GiB < expected < 3 * GiB
    )  # small next to a 100 GiB pool, large next to a step's real peak


@pytest.fixture
def tiny_dir(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(dict(NAMED_SHAPES["tiny-llama"], vocab_size=300))
    )
    byte_level_tokenizer().save_pretrained(tmp_path)
    return tmp_path


def test_engine_sizes_the_pool_from_free_memory(tiny_dir, monkeypatch):
    monkeypatch.setattr(engine_mod, "available_memory_bytes", lambda device: 64 << 20)
    with sgl.Engine(
        model_path=str(tiny_dir), load_format="dummy", dtype="float32", mem_fraction_static=0.5
    ) as engine:
        plan = engine.get_server_info()["memory_plan"]
        capacity = engine.get_server_info()["max_total_tokens"]  # the pool the scheduler built
    per_token = 2 * 2 * 2 * 16 * 4  # K/V x 2 layers x 2 KV heads x 16 dims x float32
    assert plan["kv_bytes_per_token"] == per_token
    assert plan["free_bytes_after_weights"] == 64 << 20 and plan["mem_fraction_static"] == 0.5
    assert plan["headroom_bytes"] == 0  # on a CPU only the fraction holds memory back
    assert capacity == plan["max_total_tokens"] == (32 << 20) // per_token


def test_engine_cpu_pool_is_capped(tiny_dir, monkeypatch):
    monkeypatch.setattr(engine_mod, "available_memory_bytes", lambda device: 1 << 40)
    with sgl.Engine(model_path=str(tiny_dir), load_format="dummy") as engine:
        assert engine.get_server_info()["max_total_tokens"] == 1 << 17


def test_explicit_max_total_tokens_wins(tiny_dir, monkeypatch):
    monkeypatch.setattr(
        engine_mod, "available_memory_bytes", lambda device: pytest.fail("free memory was read")
    )
    with sgl.Engine(model_path=str(tiny_dir), load_format="dummy", max_total_tokens=3000) as engine:
        assert engine.get_server_info()["max_total_tokens"] == 3000
