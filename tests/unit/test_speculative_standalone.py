"""STANDALONE speculation (a draft model) on tiny random models: greedy output equal to the same
engine without speculation token for token, whatever the draft (the target's own weights,
quantized or not, or another model sharing the vocabulary); the draft's KV given back; and the
refusals that name the option."""

from __future__ import annotations

import random

import pytest
from tiny_models import save_tiny_engine_dir

import sgl
from sgl.runtime.config import EngineConfig
from sgl.runtime.speculative.speculator import DRAFT_MODEL_MAX_BATCH

VOCAB = 320
NEW = 32


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    target, _ = save_tiny_engine_dir(tmp_path_factory.mktemp("target"), VOCAB)
    other, _ = save_tiny_engine_dir(tmp_path_factory.mktemp("draft"), VOCAB, num_hidden_layers=1)
    return target, other


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Random prompts, half with a repeated span (the tiny models then often repeat it)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        span = [rng.randrange(1, VOCAB) for _ in range(rng.randint(3, 10))]
        out.append(span * (3 if i % 2 else 1) + span[:2])
    return out


def greedy(engine, batch, **extra) -> list[dict]:
    params = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True, **extra}
    return engine.generate(input_ids=batch, sampling_params=params)


@pytest.fixture(scope="module")
def reference(dirs):
    target, _ = dirs
    batch = prompts(DRAFT_MODEL_MAX_BATCH + 2)
    with sgl.Engine(model_path=str(target), dtype="float32", max_total_tokens=4096) as engine:
        plain = [o["output_ids"] for o in greedy(engine, batch)]
        regex = [o["text"] for o in greedy(engine, batch[:2], regex="(ab|[a-z ]){1,40}")]
    return batch, plain, regex


def draft_pool_whole(engine) -> bool:
    spec = engine.get_server_info()["speculative"]
    return spec["draft_kv_available"] == spec["draft_kv_tokens"]


@pytest.mark.parametrize(
    "draft",
    [
        dict(speculative_draft_model_quantization="none"),  # the same model: every draft kept
        dict(speculative_draft_model_quantization="int8"),
        dict(speculative_draft_model_path="other"),
    ],
    ids=["self", "self-int8", "other-model"],
)
def test_greedy_output_is_the_non_speculative_output(dirs, reference, draft):
    target, other = dirs
    batch, plain, regex = reference
    if draft.get("speculative_draft_model_path") == "other":
        draft = dict(speculative_draft_model_path=str(other))
    with sgl.Engine(
        model_path=str(target),
        dtype="float32",
        max_total_tokens=4096,
        speculative_algorithm="STANDALONE",
        speculative_num_draft_tokens=4,
        **draft,
    ) as engine:
        outs = greedy(engine, batch[:DRAFT_MODEL_MAX_BATCH])
        assert [o["output_ids"] for o in outs] == plain[:DRAFT_MODEL_MAX_BATCH]
        drafted = sum(o["meta_info"]["spec_draft_tokens"] for o in outs)
        accepted = sum(o["meta_info"]["spec_accepted_tokens"] for o in outs)
        assert drafted > 0 and 0 <= accepted <= drafted
        if "speculative_draft_model_path" not in draft:  # the target's own weights agree often
            assert accepted > 0
        # (an unrelated random model's drafts are mostly rejected: the rejection path's test)
        if draft.get("speculative_draft_model_quantization") == "none":
            assert accepted == drafted  # the draft is the target: nothing is rejected
        assert [o["text"] for o in greedy(engine, batch[:2], regex="(ab|[a-z ]){1,40}")] == regex
        # more requests than a draft model pays for: they decode without drafts
        outs = greedy(engine, batch)
        assert [o["output_ids"] for o in outs] == plain
        assert sum(o["meta_info"]["spec_draft_tokens"] for o in outs) == 0
        info = engine.get_server_info()["speculative"]
        assert info["algorithm"] == "STANDALONE" and info["draft_weight_bytes"] > 0
        # the draft's KV is given back once nothing decodes (one loop turn later)
        assert _wait(lambda: draft_pool_whole(engine))
        assert engine.flush_cache()
        after = engine.get_server_info()
        assert after["available_kv_tokens"] == after["max_total_tokens"]


def _wait(cond, timeout: float = 30.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_a_draft_with_another_vocabulary_is_refused_naming_the_option(dirs, tmp_path):
    target, _ = dirs
    small, _ = save_tiny_engine_dir(tmp_path / "small-vocab", 300)
    with pytest.raises(ValueError, match="speculative_draft_model_path.*vocabulary"):
        sgl.Engine(
            model_path=str(target),
            dtype="float32",
            max_total_tokens=1024,
            speculative_algorithm="STANDALONE",
            speculative_draft_model_path=str(small),
        )


@pytest.mark.parametrize(
    "options, field",
    [
        (dict(speculative_algorithm="EAGLE"), "speculative_algorithm"),
        (dict(speculative_algorithm="ngram", speculative_num_draft_tokens=0), "num_draft_tokens"),
        (dict(speculative_algorithm="STANDALONE", speculative_num_steps=40), "num_steps"),
        (dict(speculative_algorithm="STANDALONE", tp_size=2), "STANDALONE runs with tp_size 1"),
        (dict(speculative_draft_model_quantization="int3"), "draft_model_quantization"),
    ],
)
def test_bad_speculative_options_are_refused_naming_the_field(options, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**options).validate()


def test_algorithm_names_are_taken_in_any_case():
    cfg = EngineConfig(speculative_algorithm="ngram")
    cfg.validate()
    assert cfg.speculative_algorithm == "NGRAM"


def test_the_draft_reads_the_newest_token_again_when_it_already_read_every_token(dirs):
    """Forced text (jump-forward) can commit exactly the tokens the draft model drafted and
    read: its K/V then covers the whole request, and the next draft must still start from
    the newest token's logits (this once indexed the draft's table with an empty tensor)."""
    import torch

    from sgl.runtime.messages import GenerateRequest
    from sgl.runtime.request import Req
    from sgl.runtime.sampling import SamplingParams
    from sgl.runtime.worker import build_draft_model

    target, _ = dirs
    cfg = EngineConfig(model_path=str(target), dtype="float32", max_running_requests=4)
    mc = type("Target", (), {"vocab_size": VOCAB})()
    draft = build_draft_model(cfg, mc, str(target), torch.float32, torch.device("cpu"), 512)
    prompt = prompts(1)[0]
    req = Req(GenerateRequest("r", list(prompt), SamplingParams(max_new_tokens=64)), prompt)
    req.output_ids = [5]
    first = draft.draft([req], [3])[0]
    assert len(first) == 3
    req.output_ids += first[:2]  # committed: exactly what the draft has read
    again = draft.draft([req], [3])[0]
    assert len(again) == 3 and again[0] == first[2]  # the same context: the same next token
    draft.release_others(set())
    assert draft.pool.available_size() == draft.pool.capacity
