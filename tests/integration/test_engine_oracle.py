"""The engine against HF transformers on the embedded SmolLM2 model (fp32, CPU).

Oracles: HF's log_softmax over the same prompt's logits (input/output logprobs, top-k),
HF `generate(do_sample=False)` run per prompt alone (greedy outputs), and the token ids
themselves (how many tokens the radix cache can serve). Greedy outputs must also be
invariant under every scheduling knob: radix cache, chunk size, batching, schedule
policy and forced retraction.
"""

from __future__ import annotations

import pytest
import torch
from oracle_helpers import (
    EOS,
    GREEDY_MAX_NEW,
    LOGPROB_ATOL,
    NEAR_TIE,
    ORACLE_EXACT,
    TINY_POOL,
    assert_pool_whole_after_flush,
    assert_same_greedy,
    hf_logits,
    kv_all_returned,
    long_text,
    truncate_at_eos,
    wait_until,
)

pytestmark = pytest.mark.integration

GREEDY = {"temperature": 0, "max_new_tokens": GREEDY_MAX_NEW}
SMALL_CHUNK = 16


def _make_engine(**kwargs):
    import sgl

    return sgl.Engine(**{**ORACLE_EXACT, **kwargs})


@pytest.fixture(scope="module")
def chunked_engine():
    e = _make_engine(chunked_prefill_size=SMALL_CHUNK)
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def batch_outputs(engine, greedy_refs):
    """The default engine's greedy outputs for all prompts, submitted in ONE generate call."""
    return engine.generate(greedy_refs.prompts, GREEDY)


def _check_greedy_outputs(hf, refs, outs, what, max_new=GREEDY_MAX_NEW):
    assert len(outs) == len(refs.prompts)
    for i, (ids, want, out) in enumerate(zip(refs.prompt_ids, refs.hf_outputs, outs)):
        want = truncate_at_eos(want[:max_new])
        assert_same_greedy(hf, ids, want, out["output_ids"], f"{what}, prompt {i}")
        assert out["text"] == refs.tokenizer.decode(out["output_ids"], skip_special_tokens=True), (
            f"{what}, prompt {i}"
        )


# --------------------------------------------------------------------------- logprobs


def _check_input_logprobs(hf, ids, res, start, top_n):
    """input_token_logprobs[j] scores ids[start + j] given ids[:start + j] (None for token 0)."""
    logp = torch.log_softmax(hf_logits(hf, ids), dim=-1)
    meta = res["meta_info"]
    lps = meta["input_token_logprobs"]
    assert len(lps) == len(ids) - start
    if top_n:
        assert len(meta["input_top_logprobs"]) == len(lps)
    for j, entry in enumerate(lps):
        t = start + j
        value, tid = entry[0], entry[1]
        assert tid == ids[t]
        if t == 0:
            assert value is None
            continue
        want = float(logp[t - 1, ids[t]])
        assert abs(value - want) <= LOGPROB_ATOL, f"position {t}: engine {value}, HF {want}"
        if top_n:
            _check_top(logp[t - 1], meta["input_top_logprobs"][j], top_n, f"input position {t}")


def _check_top(logp_row: torch.Tensor, top: list, n: int, what: str) -> None:
    """Engine's top-n (value, id, text) list equals HF's topk (ties within NEAR_TIE may swap)."""
    vals, idx = logp_row.topk(n)
    assert len(top) == n, what
    for r, entry in enumerate(top):
        value, tid = entry[0], entry[1]
        assert abs(value - float(vals[r])) <= LOGPROB_ATOL, (
            f"{what} rank {r}: {value} vs HF {float(vals[r])}"
        )
        if tid != int(idx[r]):  # only a tie may reorder: the engine's id must score the same in HF
            assert abs(float(logp_row[tid]) - float(vals[r])) < NEAR_TIE, (
                f"{what} rank {r}: id {tid} vs HF {int(idx[r])}"
            )
    assert len({e[1] for e in top}) == n, f"{what}: duplicate ids in top list"


@pytest.mark.parametrize("which", [0, 1, 3, 5], ids=["plain-5tok", "chat", "code", "chat-161tok"])
def test_input_logprobs_match_hf(engine, hf_model, greedy_refs, which):
    ids = greedy_refs.prompt_ids[which]
    res = engine.generate(
        input_ids=ids,
        sampling_params={"max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=5,
    )
    assert res["output_ids"] == []
    assert res["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    _check_input_logprobs(hf_model, ids, res, 0, 5)


def test_output_logprobs_match_hf(engine, hf_model, greedy_refs):
    ids = greedy_refs.prompt_ids[1]
    res = engine.generate(
        input_ids=ids,
        sampling_params={"max_new_tokens": 1, "temperature": 0},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=4,
    )
    _check_input_logprobs(hf_model, ids, res, 0, 4)
    logp = torch.log_softmax(hf_logits(hf_model, ids)[-1], dim=-1)
    ((value, tid, _),) = res["meta_info"]["output_token_logprobs"]
    assert res["output_ids"] == [tid]
    assert abs(float(logp[tid]) - float(logp.max())) < NEAR_TIE  # greedy picked HF's argmax
    assert abs(value - float(logp[tid])) <= LOGPROB_ATOL
    _check_top(logp, res["meta_info"]["output_top_logprobs"][0], 4, "output token")


def test_long_prompt_logprobs_chunked_match_hf(chunked_engine, hf_model):
    """> 300 tokens in 16-token chunks, every position scored."""
    ids = chunked_engine.encode(long_text(3))
    assert len(ids) > 300
    res = chunked_engine.generate(
        input_ids=ids,
        sampling_params={"max_new_tokens": 1, "temperature": 0},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=3,
    )
    _check_input_logprobs(hf_model, ids, res, 0, 3)
    logp = torch.log_softmax(hf_logits(hf_model, ids)[-1], dim=-1)
    assert abs(float(logp[res["output_ids"][0]]) - float(logp.max())) < NEAR_TIE


def test_logprobs_after_cached_prefix_chunked_match_hf(chunked_engine, hf_model):
    """A prompt extending a cached one: the engine may reuse the cache only up to
    logprob_start_len - 1 tokens, then computes (in chunks) the scored positions."""
    e = chunked_engine
    base = e.encode(long_text(3))
    e.generate(input_ids=base, sampling_params={"max_new_tokens": 1, "temperature": 0})  # cache it
    ids = base + e.encode(" To sum up, the printing press changed how people learned and argued.")
    start = len(base) - 5
    res = e.generate(
        input_ids=ids,
        sampling_params={"max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=start,
        top_logprobs_num=2,
    )
    assert res["meta_info"]["cached_tokens"] == start - 1
    _check_input_logprobs(hf_model, ids, res, start, 2)


# --------------------------------------------------------------------------- greedy vs HF


def test_prompt_set_is_varied(greedy_refs):
    lens = [len(x) for x in greedy_refs.prompt_ids]
    assert len(lens) >= 8 and min(lens) >= 5 and max(lens) <= 200 and max(lens) >= 150, lens
    chat = sum("<|im_start|>" in p for p in greedy_refs.prompts)
    assert 3 <= chat <= len(lens) - 3
    # Both ways of finishing occur: EOS before the limit, and the limit.
    assert any(o[-1] == EOS and len(o) < GREEDY_MAX_NEW for o in greedy_refs.hf_outputs)
    assert any(len(o) == GREEDY_MAX_NEW and EOS not in o for o in greedy_refs.hf_outputs)


def test_greedy_batch_matches_hf(engine, hf_model, greedy_refs, batch_outputs):
    _check_greedy_outputs(hf_model, greedy_refs, batch_outputs, "batched")
    tok = engine.tokenizer
    for ids, out in zip(greedy_refs.prompt_ids, batch_outputs):
        meta, oids = out["meta_info"], out["output_ids"]
        assert meta["prompt_tokens"] == len(ids)
        assert meta["completion_tokens"] == len(oids)
        if oids[-1] == EOS:
            assert meta["finish_reason"] == {"type": "stop", "matched": EOS}
            assert EOS not in oids[:-1]
        else:
            assert EOS not in oids and len(oids) == GREEDY_MAX_NEW
            assert meta["finish_reason"] == {"type": "length", "length": GREEDY_MAX_NEW}
        assert out["text"] == tok.decode(oids, skip_special_tokens=True)


def test_greedy_one_at_a_time_equals_batched(engine, hf_model, greedy_refs, batch_outputs):
    outs = [engine.generate(p, GREEDY) for p in greedy_refs.prompts]
    _check_greedy_outputs(hf_model, greedy_refs, outs, "sequential")
    for ids, a, b in zip(greedy_refs.prompt_ids, batch_outputs, outs):
        assert_same_greedy(hf_model, ids, a["output_ids"], b["output_ids"], "batched vs sequential")


def test_greedy_with_warm_radix_cache(engine, hf_model, greedy_refs, batch_outputs):
    engine.generate(greedy_refs.prompts, GREEDY)
    again = engine.generate(greedy_refs.prompts, GREEDY)
    for ids, out in zip(greedy_refs.prompt_ids, again):
        # The whole prompt is cached; one token must still run to produce logits.
        assert out["meta_info"]["cached_tokens"] == len(ids) - 1
    _check_greedy_outputs(hf_model, greedy_refs, again, "radix-warm")
    for ids, a, b in zip(greedy_refs.prompt_ids, batch_outputs, again):
        assert_same_greedy(hf_model, ids, a["output_ids"], b["output_ids"], "cold vs warm cache")


def test_greedy_without_radix_cache(hf_model, greedy_refs, batch_outputs):
    e = _make_engine(disable_radix_cache=True)
    try:
        first = e.generate(greedy_refs.prompts, GREEDY)
        second = e.generate(greedy_refs.prompts, GREEDY)
        for out in first + second:
            assert out["meta_info"]["cached_tokens"] == 0
        for outs, what in ((first, "no-radix"), (second, "no-radix again")):
            _check_greedy_outputs(hf_model, greedy_refs, outs, what)
            for ids, a, b in zip(greedy_refs.prompt_ids, batch_outputs, outs):
                assert_same_greedy(
                    hf_model, ids, a["output_ids"], b["output_ids"], f"radix vs {what}"
                )
        assert e.get_server_info()["available_kv_tokens"] == e.get_server_info()["max_total_tokens"]
    finally:
        e.shutdown()


def test_greedy_small_chunks(chunked_engine, hf_model, greedy_refs, batch_outputs):
    outs = chunked_engine.generate(greedy_refs.prompts, GREEDY)
    _check_greedy_outputs(hf_model, greedy_refs, outs, f"chunk {SMALL_CHUNK}")
    for ids, a, b in zip(greedy_refs.prompt_ids, batch_outputs, outs):
        assert_same_greedy(hf_model, ids, a["output_ids"], b["output_ids"], "chunk 2048 vs 16")


POLICY_MAX_NEW = 16


@pytest.mark.parametrize("policy", ["lpm", "fcfs", "dfs-weight"])
def test_greedy_schedule_policies(hf_model, greedy_refs, batch_outputs, policy):
    """A queue forms (max 3 running), so the policy decides the admission order."""
    e = _make_engine(schedule_policy=policy, max_running_requests=3)
    try:
        params = {"temperature": 0, "max_new_tokens": POLICY_MAX_NEW}
        outs = e.generate(greedy_refs.prompts, params)
        _check_greedy_outputs(hf_model, greedy_refs, outs, policy, max_new=POLICY_MAX_NEW)
        for ids, a, b in zip(greedy_refs.prompt_ids, batch_outputs, outs):
            want = truncate_at_eos(a["output_ids"][:POLICY_MAX_NEW])
            assert_same_greedy(hf_model, ids, want, b["output_ids"], f"lpm/unlimited vs {policy}")
        assert wait_until(lambda: kv_all_returned(e))
    finally:
        e.shutdown()


# --------------------------------------------------------------------------- retraction

RETRACT_PROMPTS = [
    "Alice packed her bag for the long journey north, checking twice that she had the map, the "
    "lantern, "
    "the dried apples and the letter from her grandmother, which she had not yet opened. Then she",
    "The committee met on a rainy Tuesday to discuss the new library budget, which had been cut "
    "by a "
    "third since last spring, leaving the children's section without new books for a year. The "
    "chair opened by saying that",
    "In the laboratory, the graduate student carefully measured the temperature of the solution "
    "every "
    "five minutes and wrote the numbers in a small green notebook that her advisor had given her "
    "on the first day. After an hour,",
    "Marcus had never seen the ocean before. When the train finally came around the last hill and "
    "the "
    "water appeared, bright and endless under the afternoon sun, he pressed his face to the "
    "window and",
    "To bake a simple loaf of bread you need flour, water, salt and yeast. First, mix the dry "
    "ingredients in a large bowl, then slowly add the warm water, a little at a time, while",
    "Quarterly revenue rose by twelve percent, driven mostly by strong sales in the European "
    "market "
    "and a successful product launch in March, despite rising costs for shipping. Analysts expect "
    "that next quarter",
    "Every night the old lighthouse keeper climbed the spiral stairs, polished the great lens and "
    "lit "
    "the lamp, even though no ship had passed in years and the village below had long been empty. "
    "One evening,",
    "Python lists are ordered, mutable collections that can hold items of any type. You can append "
    "to them, slice them and sort them in place with a custom key function, but be careful when",
]
RETRACT_PARAMS = {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}


def test_retraction_keeps_greedy_outputs(engine, tiny_engine, hf_model):
    ids = [tiny_engine.encode(p) for p in RETRACT_PROMPTS]
    assert all(35 <= len(x) <= 45 for x in ids), [len(x) for x in ids]
    assert sum(len(x) + 64 for x in ids) > 2 * TINY_POOL  # cannot all fit at once
    before = tiny_engine.get_server_info()["retractions"]
    outs = tiny_engine.generate(input_ids=ids, sampling_params=RETRACT_PARAMS)
    retracted = tiny_engine.get_server_info()["retractions"] - before
    assert retracted > 0
    assert sum(o["meta_info"].get("num_retractions", 0) for o in outs) == retracted
    ref = engine.generate(input_ids=ids, sampling_params=RETRACT_PARAMS)
    for x, a, b in zip(ids, ref, outs):
        assert len(b["output_ids"]) == 64
        assert b["meta_info"]["finish_reason"] == {"type": "length", "length": 64}
        assert_same_greedy(
            hf_model, x, a["output_ids"], b["output_ids"], "unconstrained vs tiny pool"
        )
        assert b["text"] == tiny_engine.tokenizer.decode(b["output_ids"], skip_special_tokens=True)
    assert_pool_whole_after_flush(tiny_engine)
