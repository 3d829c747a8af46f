"""The CUDA-graph runner's bucketing and padding, and the whole decode path through it.

The capture itself needs a GPU (tests/gpu). Here the runner runs its static buffers,
padding rows and backend hooks without capturing, inside a real engine on the CPU, with a
reference backend that has hooks; greedy tokens must equal the plain torch_native path's.
"""

from __future__ import annotations

import json
import random

import pytest
from graph_test_backend import DenseDecodeBackend

import sgl
import sgl.runtime.model_runner as runner_mod
from sgl.runtime.cuda_graph import DecodeInputs, capture_batch_sizes, padded_batch_size
from sgl.runtime.model.dummy import byte_level_tokenizer


def test_capture_sizes():
    assert capture_batch_sizes(160) == [1, 2, 4, 8] + list(range(16, 161, 8))
    assert capture_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_batch_sizes(16) == [1, 2, 4, 8, 16]
    assert capture_batch_sizes(3) == [1, 2, 3]
    assert capture_batch_sizes(1) == [1]
    with pytest.raises(ValueError):
        capture_batch_sizes(0)


@pytest.mark.parametrize(
    "bs, padded",
    [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (17, 24), (160, 160), (161, None), (0, None)],
)
def test_padded_batch_size(bs, padded):
    assert padded_batch_size(bs, capture_batch_sizes(160)) == padded


def test_every_batch_size_has_a_bucket():
    sizes = capture_batch_sizes(37)
    for bs in range(1, 38):
        p = padded_batch_size(bs, sizes)
        assert p is not None and bs <= p and p in sizes
        assert p - bs < 8  # at most one bucket step of padding


def test_padding_rows_read_only_the_padding_slot():
    step = DecodeInputs(
        input_ids=[11, 12, 13],
        positions=[5, 9, 2],
        out_cache_loc=[40, 41, 42],
        req_rows=[3, 1, 7],
        seq_lens=[6, 10, 3],
    )
    p = step.padded(8, padding_row=0)
    assert p.input_ids == [11, 12, 13, 0, 0, 0, 0, 0]
    assert p.positions == [5, 9, 2, 0, 0, 0, 0, 0]
    assert p.out_cache_loc == [40, 41, 42, 0, 0, 0, 0, 0]  # slot 0: the pool's padding slot
    assert p.req_rows == [3, 1, 7, 0, 0, 0, 0, 0]
    assert p.seq_lens == [6, 10, 3, 1, 1, 1, 1, 1]
    assert step.padded(3, 0) == step
    with pytest.raises(ValueError):
        step.padded(2, 0)


VOCAB = 300


@pytest.fixture(scope="module")
def dummy_dir(tmp_path_factory):
    """A dummy model's directory: config.json and a byte-level tokenizer, no weights."""
    path = tmp_path_factory.mktemp("dummy-tiny")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
    }
    (path / "config.json").write_text(json.dumps(config))
    byte_level_tokenizer().save_pretrained(path)
    return path


def _engine(path, **kw):
    # std 0.02 weights give near-uniform logits; a seed fixes the model either way
    return sgl.Engine(
        model_path=str(path),
        load_format="dummy",
        random_seed=3,
        max_total_tokens=4096,
        context_length=128,
        **kw,
    )


def _greedy(engine, prompts, new_tokens):
    sp = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in new_tokens]
    return [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=sp)]


def test_decode_through_the_runner_matches_eager(dummy_dir, monkeypatch):
    rng = random.Random(0)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 30))] for _ in range(11)]
    new_tokens = [rng.randint(2, 12) for _ in prompts]  # rows finish at different steps: sizes vary
    with _engine(dummy_dir) as plain:
        expected = _greedy(plain, prompts, new_tokens)
        assert plain.get_server_info()["cuda_graph_steps"] == 0

    backend = DenseDecodeBackend()
    monkeypatch.setattr(runner_mod, "cuda_graph_max_bs", lambda cfg, device: 8)
    monkeypatch.setattr(
        runner_mod,
        "create_attention_backend",
        lambda name, device, dtype=None, needs=frozenset(): backend,
    )
    with _engine(dummy_dir) as graphed:
        got = _greedy(graphed, prompts, new_tokens)
        info = graphed.get_server_info()
        # the padding row is reserved on top of the running limit
        assert graphed.debug_state()["req_to_token_rows"] == graphed.config.max_running_requests + 1
    assert got == expected
    assert info["cuda_graph_batch_sizes"] == [1, 2, 4, 8]
    assert info["cuda_graph_steps"] > 0
    captured = [bs for kind, bs in backend.calls if kind == "capture"]
    assert captured == [8, 4, 2, 1]  # largest first
    replayed = {bs for kind, bs in backend.calls if kind == "replay"}
    assert replayed <= {1, 2, 4, 8} and len(replayed) > 1  # padded sizes, several of them


def test_steps_beyond_the_graph_limit_and_extends_run_eagerly(dummy_dir, monkeypatch):
    """12 requests decoding together exceed cuda_graph_max_bs=4 (eager); the last two, alone,
    replay graphs; prefills are never graphed."""
    prompts = [[(7 * i + j) % (VOCAB - 1) + 1 for j in range(5 + i)] for i in range(12)]
    new_tokens = [6] * 10 + [14, 14]
    with _engine(dummy_dir) as plain:
        expected = _greedy(plain, prompts, new_tokens)
    backend = DenseDecodeBackend()
    monkeypatch.setattr(runner_mod, "cuda_graph_max_bs", lambda cfg, device: 4)
    monkeypatch.setattr(
        runner_mod,
        "create_attention_backend",
        lambda name, device, dtype=None, needs=frozenset(): backend,
    )
    with _engine(dummy_dir) as graphed:
        assert _greedy(graphed, prompts, new_tokens) == expected
        info = graphed.get_server_info()
    assert 0 < info["cuda_graph_steps"] < info["forward_steps"]
    assert {bs for kind, bs in backend.calls if kind == "replay"} == {2}
