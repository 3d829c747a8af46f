"""Engine behaviour on the embedded model: radix reuse, KV accounting, sampling options,
streaming, validation and concurrency.

Expected values come from HF transformers (greedy outputs, next-token distributions),
from the HF tokenizer's decode, from brute force over the token ids / text, never from an
earlier run of the engine itself.
"""

from __future__ import annotations

import asyncio
import math
import threading

import pytest
import torch
from oracle_helpers import (
    EOS,
    GREEDY_MAX_NEW,
    assert_pool_whole_after_flush,
    assert_same_greedy,
    chat,
    hf_greedy,
    hf_logits,
    kv_all_returned,
    long_text,
    truncate_at_eos,
    wait_until,
)

import sgl

pytestmark = pytest.mark.integration

GREEDY = {"temperature": 0, "max_new_tokens": GREEDY_MAX_NEW}


def _lcp(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _ref(greedy_refs, i):
    return greedy_refs.prompts[i], greedy_refs.prompt_ids[i], greedy_refs.hf_outputs[i]


def _index_of(greedy_refs, pred) -> int:
    for i, out in enumerate(greedy_refs.hf_outputs):
        if pred(out):
            return i
    raise AssertionError("no reference prompt fits this test")


# --------------------------------------------------------------------------- radix cache


def test_radix_reuse_between_two_requests(engine, hf_model):
    assert engine.flush_cache() is True
    shared = engine.encode(long_text(2))
    a = shared + engine.encode(" Which invention is this text about?")
    b = shared + engine.encode(" Who was Johannes Gutenberg?")
    first = engine.generate(input_ids=a, sampling_params={"temperature": 0, "max_new_tokens": 1})
    assert first["meta_info"]["cached_tokens"] == 0
    second = engine.generate(input_ids=b, sampling_params={"temperature": 0, "max_new_tokens": 4})
    # The tree holds a (its one output token has no K/V); at least one token of b must run.
    expected = min(_lcp(a, b), len(b) - 1)
    assert expected >= len(shared)
    assert second["meta_info"]["cached_tokens"] == expected
    # The reused K/V is right: the continuation equals HF's.
    assert_same_greedy(
        hf_model, b, truncate_at_eos(hf_greedy(hf_model, b, 4)), second["output_ids"], "cached b"
    )


def test_radix_reuse_text_prompts(engine):
    """Text prompts sharing a text prefix share all its tokens but (at most) the last one."""
    assert engine.flush_cache() is True
    prefix = long_text(1)
    pa, pb = prefix + " Summarize it.", prefix + " Translate it into French."
    ia, ib = engine.encode(pa), engine.encode(pb)
    engine.generate(pa, {"temperature": 0, "max_new_tokens": 1})
    res = engine.generate(pb, {"temperature": 0, "max_new_tokens": 1})
    expected = min(_lcp(ia, ib), len(ib) - 1)
    assert expected >= len(engine.encode(prefix)) - 1
    assert res["meta_info"]["cached_tokens"] == expected


def test_shared_prefix_across_concurrent_requests(engine, hf_model):
    assert engine.flush_cache() is True
    prefix = engine.encode(long_text(3))[:300]
    suffixes = [
        engine.encode(f" Question {i}: what happened in year {1400 + 7 * i}?") for i in range(48)
    ]
    prompts = [prefix + s for s in suffixes]
    before = engine.get_server_info()
    outs = engine.generate(
        input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 2}
    )
    after = engine.get_server_info()
    cached = [o["meta_info"]["cached_tokens"] for o in outs]
    assert sum(c >= 300 for c in cached) >= 47, cached  # only the first computes the prefix
    # Brute-force bound on the work: the prefix once, each suffix once.
    computed = after["prefill_tokens"] - before["prefill_tokens"]
    assert computed <= 300 + sum(len(s) for s in suffixes), computed
    assert after["cached_tokens"] - before["cached_tokens"] == sum(cached)
    for i in (0, 17, 47):  # the shared K/V gives HF's continuation
        want = truncate_at_eos(hf_greedy(hf_model, prompts[i], 2))
        assert_same_greedy(
            hf_model, prompts[i], want, outs[i]["output_ids"], f"shared-prefix request {i}"
        )
    assert wait_until(lambda: kv_all_returned(engine))


# --------------------------------------------------------------------------- KV accounting


def test_kv_returns_after_every_kind_of_request(tiny_engine):
    e = tiny_engine
    cap = e.get_server_info()["max_total_tokens"]
    prompt = "The quick brown fox jumps over the lazy dog because"

    # finished (length and EOS) and stopped by a stop string / stop token
    reasons = [
        e.generate(prompt, {"temperature": 0, "max_new_tokens": 8}),
        e.generate(chat(e.tokenizer, "What is 2+2?"), {"temperature": 0, "max_new_tokens": 40}),
        e.generate(prompt, {"temperature": 0, "max_new_tokens": 40, "stop": [" the", ".", ","]}),
        e.generate(
            prompt, {"temperature": 0, "max_new_tokens": 40, "stop_token_ids": e.encode(" the")}
        ),
    ]
    reasons = [r["meta_info"]["finish_reason"] for r in reasons]
    assert reasons[0]["type"] == "length" and reasons[1] == {"type": "stop", "matched": EOS}
    assert isinstance(reasons[2]["matched"], str) and reasons[3]["matched"] == e.encode(" the")[0]
    assert wait_until(lambda: kv_all_returned(e))

    # aborted mid-stream (the consumer walks away)
    stream = e.generate(
        prompt, {"temperature": 0, "max_new_tokens": 200, "ignore_eos": True}, stream=True
    )
    for i, _ in enumerate(stream):
        if i == 2:
            break
    del stream
    assert wait_until(lambda: kv_all_returned(e))

    # retracted: more KV than the pool holds
    before = e.get_server_info()["retractions"]
    prompts = [
        f"Request number {i} asks the model to keep writing a long story about dragons."
        for i in range(8)
    ]
    outs = e.generate(prompts, {"temperature": 0, "max_new_tokens": 60, "ignore_eos": True})
    assert e.get_server_info()["retractions"] > before
    assert all(len(o["output_ids"]) == 60 for o in outs)
    assert wait_until(lambda: kv_all_returned(e))

    # n > 1, sampled
    outs = e.generate(prompt, {"temperature": 0.8, "max_new_tokens": 16, "n": 3, "seed": 5})
    assert len(outs) == 3
    assert wait_until(lambda: kv_all_returned(e))

    # invalid requests never take KV
    with pytest.raises(sgl.InvalidRequestError):
        e.generate(prompt, {"temperature": -1})
    with pytest.raises(sgl.InvalidRequestError) as info:
        e.generate(prompt, {"max_new_tokens": cap})  # cannot fit in the pool
    assert info.value.param == "max_new_tokens"

    # aborted while running and while waiting in the queue: four ~64-token prompts with 60 new
    # tokens each outgrow the pool early (at admission, or by retraction after ~35 steps), and one
    # request then waits for ~20 steps, a window a loaded machine still sees
    rids = [f"kv-abort-{i}" for i in range(4)]
    long_prompts = [p * 4 for p in prompts[:4]]
    box = {}
    t = threading.Thread(
        target=lambda: box.setdefault(
            "out",
            e.generate(
                long_prompts, {"temperature": 0, "max_new_tokens": 60, "ignore_eos": True}, rid=rids
            ),
        )
    )
    t.start()
    some_run_some_wait = lambda i: i["num_running_reqs"] > 0 and i["num_waiting_reqs"] > 0  # noqa: E731
    assert wait_until(lambda: some_run_some_wait(e.get_server_info()), timeout=90)
    e.abort(rids[0])
    e.abort(rids[3])
    t.join(timeout=120)
    assert not t.is_alive()
    reasons = {o["meta_info"]["id"]: o["meta_info"]["finish_reason"]["type"] for o in box["out"]}
    assert reasons[rids[0]] == "abort" and reasons[rids[3]] == "abort"

    assert wait_until(lambda: kv_all_returned(e))
    assert_pool_whole_after_flush(e)
    assert e.get_server_info()["available_kv_tokens"] == cap


def test_flush_refused_while_running(engine):
    stream = engine.generate(
        "Count from one to one hundred:", {"max_new_tokens": 300, "ignore_eos": True}, stream=True
    )
    first = next(stream)
    assert first["meta_info"]["finish_reason"] is None
    assert engine.flush_cache() is False
    stream.close()
    assert wait_until(lambda: engine.get_server_info()["num_running_reqs"] == 0)
    assert_pool_whole_after_flush(engine)


# --------------------------------------------------------------------------- sampling


def test_seed_determinism(engine):
    prompt = chat(engine.tokenizer, "Tell me a short story about a robot.")
    params = {"temperature": 1.0, "max_new_tokens": 16, "seed": 1234}
    a = engine.generate(prompt, params)
    b = engine.generate(prompt, params)
    assert a["output_ids"] == b["output_ids"]
    # Same seed inside a batch of unrelated, unseeded requests: still the same tokens.
    batch = engine.generate(
        [prompt, "Hello", prompt],
        [
            {"temperature": 1.0, "max_new_tokens": 16},
            {"temperature": 0.7, "max_new_tokens": 5},
            params,
        ],
    )
    assert batch[2]["output_ids"] == a["output_ids"]
    others = {
        tuple(engine.generate(prompt, dict(params, seed=s))["output_ids"]) for s in (1, 2, 3, 4)
    }
    assert len(others | {tuple(a["output_ids"])}) > 1


def _dist_check(samples: list[int], probs: torch.Tensor, what: str) -> None:
    """Samples lie in the support of `probs` and pass a chi-square test against it (p > 1e-6)."""
    n = len(samples)
    for t in set(samples):
        assert float(probs[t]) > 0, f"{what}: sampled token {t} outside the support"
    big = torch.nonzero(probs >= 0.03).flatten().tolist()
    observed = [samples.count(t) for t in big]
    expected = [n * float(probs[t]) for t in big]
    rest = n - sum(expected)
    if rest > 1e-6 * n:
        observed.append(n - sum(observed))
        expected.append(rest)
    assert min(expected) >= 5, f"{what}: too few samples for a chi-square test"
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    dof = len(expected) - 1
    # Wilson-Hilferty approximation of the chi-square quantile at upper tail 1e-6 (z = 4.75).
    crit = dof * (1 - 2 / (9 * dof) + 4.75 * math.sqrt(2 / (9 * dof))) ** 3
    assert chi2 <= crit, (
        f"{what}: chi2 {chi2:.1f} > {crit:.1f}; observed {observed}, expected {expected}"
    )


def test_sampling_distribution_matches_hf(engine, hf_model):
    """First sampled token under temperature / top_k / top_p follows HF's softmax (seeded:
    deterministic)."""
    ids = engine.encode("My favorite color is")
    logits = hf_logits(hf_model, ids)[-1]
    groups = {
        "t1": ({"temperature": 1.0}, torch.softmax(logits, -1), 300),
        "t0.5": ({"temperature": 0.5}, torch.softmax(logits / 0.5, -1), 200),
    }
    # top_k 3: renormalized over HF's top 3.
    p = torch.softmax(logits, -1)
    top3 = torch.zeros_like(p)
    idx = p.topk(3).indices
    top3[idx] = p[idx]
    groups["topk3"] = ({"temperature": 1.0, "top_k": 3}, top3 / top3.sum(), 150)
    # top_p 0.3: the smallest descending prefix with mass >= 0.3.
    vals, order = p.sort(descending=True)
    keep = (vals.cumsum(0) - vals) < 0.3
    nucleus = torch.zeros_like(p)
    nucleus[order[keep]] = vals[keep]
    groups["topp0.3"] = ({"temperature": 1.0, "top_p": 0.3}, nucleus / nucleus.sum(), 150)

    params, names = [], []
    for name, (sp, _, n) in groups.items():
        for i in range(n):
            params.append(dict(sp, max_new_tokens=1, seed=10_000 + i))
            names.append(name)
    outs = engine.generate(input_ids=[ids] * len(params), sampling_params=params)
    for name, (_, probs, _) in groups.items():
        samples = [o["output_ids"][0] for o, nm in zip(outs, names) if nm == name]
        _dist_check(samples, probs, name)


def test_n_greedy_returns_n_copies_of_hf(engine, hf_model, greedy_refs):
    prompt, ids, want = _ref(greedy_refs, 2)
    outs = engine.generate(prompt, dict(GREEDY, n=3))
    assert isinstance(outs, list) and len(outs) == 3
    assert len({o["meta_info"]["id"] for o in outs}) == 3
    for o in outs:
        assert_same_greedy(hf_model, ids, want, o["output_ids"], "n=3 greedy")


def test_n_sampled_returns_n_results(engine):
    outs = engine.generate("Once upon a time", {"temperature": 1.0, "max_new_tokens": 8, "n": 3})
    assert len(outs) == 3
    for o in outs:
        assert 1 <= len(o["output_ids"]) <= 8
        assert o["text"] == engine.tokenizer.decode(o["output_ids"], skip_special_tokens=True)


def _token_offsets(tok, ids):
    """Character offset of each token's start in decode(ids) (ASCII-safe prefix decodes)."""
    return [len(tok.decode(ids[:k], skip_special_tokens=True)) for k in range(len(ids) + 1)]


def test_stop_string_spanning_token_boundary(engine, greedy_refs):
    tok = engine.tokenizer
    i = _index_of(greedy_refs, lambda o: len(o) >= 20 and EOS not in o)
    prompt, ids, ref = _ref(greedy_refs, i)
    full = tok.decode(ref, skip_special_tokens=True)
    offs = _token_offsets(tok, ref)
    # Find a token boundary k with >= 2 chars on each side; the stop is the 4 chars across it.
    stop, k = None, None
    for k in range(3, len(ref) - 2):
        a, b = full[offs[k - 1] : offs[k]], full[offs[k] : offs[k + 1]]
        cand = full[offs[k] - 2 : offs[k] + 2]
        if len(a) >= 2 and len(b) >= 2 and cand.isascii() and full.find(cand) == offs[k] - 2:
            stop = cand
            break
    assert stop is not None, full
    cut = offs[k] - 2
    out = engine.generate(prompt, dict(GREEDY, stop=["never appears \u2603", stop]))
    assert out["text"] == full[:cut]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["output_ids"] == ref[: k + 1]  # stopped on the token completing the stop string
    kept = engine.generate(prompt, dict(GREEDY, stop=stop, no_stop_trim=True))
    assert kept["text"] == full[: cut + len(stop)]
    assert kept["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    # Streaming gives the same text, split anywhere.
    pieces = list(engine.generate(prompt, dict(GREEDY, stop=stop), stream=True))
    assert "".join(p["text"] for p in pieces) == full[:cut]
    assert pieces[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_stop_string_completed_by_the_last_allowed_token(engine, greedy_refs):
    """The final token (max_new_tokens) completes stop Y while a longer stop X that starts
    earlier is still a possible match: the text must be cut at Y and the reason be Y."""
    tok = engine.tokenizer
    for i, ref in enumerate(greedy_refs.hf_outputs):  # noqa: B007 (i is read after the break)
        full = tok.decode(ref, skip_special_tokens=True)
        if (
            len(ref) == GREEDY_MAX_NEW
            and EOS not in ref
            and full[-3:].isascii()
            and full.find(full[-2:]) == len(full) - 2
        ):
            break
    else:
        raise AssertionError("no reference output ends with a fresh 2-char tail")
    prompt = greedy_refs.prompts[i]
    y, x = full[-2:], full[-3:] + "\u2603"
    out = engine.generate(prompt, dict(GREEDY, stop=[x, y]))
    assert out["output_ids"] == ref
    assert out["text"] == full[:-2]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": y}
    kept = engine.generate(prompt, dict(GREEDY, stop=[x, y], no_stop_trim=True))
    assert kept["text"] == full
    assert kept["meta_info"]["finish_reason"] == {"type": "stop", "matched": y}


def test_stop_token_ids(engine, greedy_refs):
    tok = engine.tokenizer
    i = _index_of(greedy_refs, lambda o: len(o) >= 12)
    prompt, ids, ref = _ref(greedy_refs, i)
    j = next(j for j in range(4, len(ref)) if ref[j] != EOS and ref[j] not in ref[:j])
    out = engine.generate(prompt, dict(GREEDY, stop_token_ids=[ref[j]]))
    assert out["output_ids"] == ref[: j + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": ref[j]}
    assert out["text"].startswith(tok.decode(ref[:j], skip_special_tokens=True))


def test_ignore_eos_runs_to_length(engine, hf_model, greedy_refs):
    i = _index_of(greedy_refs, lambda o: o[-1] == EOS and len(o) <= 20)
    prompt, ids, ref = _ref(greedy_refs, i)
    limit = len(ref) + 6
    out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": limit, "ignore_eos": True})
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": limit}
    assert len(out["output_ids"]) == limit
    assert_same_greedy(hf_model, ids, ref, out["output_ids"][: len(ref)], "ignore_eos head")
    # After the EOS, decoding continues with HF's argmax.
    nxt = int(hf_logits(hf_model, ids + ref)[-1].argmax())
    assert_same_greedy(hf_model, ids, ref + [nxt], out["output_ids"][: len(ref) + 1], "after eos")
    assert "<|im_end|>" not in out["text"]


def test_min_new_tokens_prevents_early_eos(engine, hf_model, greedy_refs):
    i = _index_of(greedy_refs, lambda o: o[-1] == EOS and len(o) <= 20)
    prompt, ids, ref = _ref(greedy_refs, i)
    min_new = len(ref) + 3
    out = engine.generate(
        prompt, {"temperature": 0, "max_new_tokens": min_new + 4, "min_new_tokens": min_new}
    )
    oids = out["output_ids"]
    assert len(oids) >= min_new and EOS not in oids[:min_new]
    # Where greedy would emit EOS, the engine takes HF's best non-EOS token.
    logits = hf_logits(hf_model, ids + ref[:-1])[-1]
    logits[EOS] = float("-inf")
    want = ref[:-1] + [int(logits.argmax())]
    assert_same_greedy(hf_model, ids, want, oids[: len(want)], "min_new_tokens")


# --------------------------------------------------------------------------- streaming


def test_stream_concatenates_to_greedy(engine, hf_model, greedy_refs):
    tok = engine.tokenizer
    for i in (1, 6):
        prompt, ids, ref = _ref(greedy_refs, i)
        chunks = list(engine.generate(prompt, GREEDY, stream=True))
        assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
        assert chunks[-1]["meta_info"]["finish_reason"] is not None
        out_ids = [t for c in chunks for t in c["output_ids"]]
        assert_same_greedy(hf_model, ids, ref, out_ids, f"stream {i}")
        assert "".join(c["text"] for c in chunks) == tok.decode(out_ids, skip_special_tokens=True)
        assert chunks[-1]["meta_info"]["completion_tokens"] == len(out_ids)


def test_stream_never_splits_characters(engine):
    tok = engine.tokenizer
    prompts = [
        "Emoji for happy: 😀, sad: 😢, angry:",
        "用中文介绍一下你自己：",
        chat(tok, "Write 'hello' in Chinese characters."),
        chat(tok, "Give me three emoji for a birthday party."),
    ]
    split_somewhere = clean_end = wide_chars = False
    for prompt in prompts:
        chunks = list(engine.generate(prompt, GREEDY, stream=True))
        ids = [t for c in chunks for t in c["output_ids"]]
        full = tok.decode(ids, skip_special_tokens=True)
        text = "".join(c["text"] for c in chunks)
        assert text == full
        wide_chars |= any(ord(ch) > 0x2E80 for ch in full)
        # A piece may hold U+FFFD only where decode(ids) itself does: at a cut at the very end.
        for c in chunks[:-1]:
            assert "\ufffd" not in c["text"], (prompt, [c["text"] for c in chunks])
        if "\ufffd" not in full:
            clean_end = True
            assert "\ufffd" not in chunks[-1]["text"]
        if any(tok.decode(ids[:k]).endswith("\ufffd") for k in range(1, len(ids))):
            split_somewhere = True
    assert (
        wide_chars and split_somewhere and clean_end
    )  # the prompts did exercise multi-token characters


def test_stream_break_aborts_request(engine):
    assert wait_until(lambda: kv_all_returned(engine))
    start = engine.get_server_info()
    stream = engine.generate(
        "Write a very long essay about the sea.",
        {"max_new_tokens": 1000, "ignore_eos": True},
        stream=True,
    )
    n = 0
    for _chunk in stream:
        n += 1
        if n == 3:
            break
    stream.close()
    assert wait_until(lambda: kv_all_returned(engine), timeout=120)
    info = engine.get_server_info()
    assert info["finished_requests"] == start["finished_requests"] + 1
    assert (
        0 < info["decode_tokens"] - start["decode_tokens"] < 999
    )  # aborted, not run to its 1,000 tokens


def test_async_stream(engine, greedy_refs):
    prompt, ids, ref = _ref(greedy_refs, 1)

    async def run():
        it = await engine.async_generate(prompt, GREEDY, stream=True)
        return [c async for c in it]

    chunks = asyncio.run(run())
    assert [t for c in chunks for t in c["output_ids"]] == engine.generate(prompt, GREEDY)[
        "output_ids"
    ]
    assert chunks[-1]["meta_info"]["finish_reason"] is not None


# --------------------------------------------------------------------------- validation


VOCAB = 49152


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(prompt="Hi", sampling_params={"temprature": 0.5}), "temprature"),
        (dict(prompt="Hi", sampling_params={"temperature": -1}), "temperature"),
        (dict(prompt="Hi", sampling_params={"top_p": 0}), "top_p"),
        (dict(input_ids=[1, 2, VOCAB]), "input_ids"),
        (dict(input_ids=[-1, 5]), "input_ids"),
        (dict(prompt=""), "prompt"),
        (dict(input_ids=[]), "prompt"),
        (dict(prompt="Hi", sampling_params={"max_new_tokens": 8192}), "max_new_tokens"),
        (dict(input_ids=[1, 2, 3], return_logprob=True, logprob_start_len=3), "logprob_start_len"),
        (dict(prompt="Hi", sampling_params={"stop_token_ids": [VOCAB]}), "stop_token_ids"),
        (dict(prompt=["fine", "also fine"], sampling_params=[{}, {"top_k": -5}]), "top_k"),
    ],
    ids=[
        "unknown-key",
        "neg-temperature",
        "top_p-0",
        "id-too-big",
        "id-negative",
        "empty-text",
        "empty-ids",
        "over-context",
        "logprob-start",
        "stop-id",
        "batch-one-bad",
    ],
)
def test_invalid_requests_are_rejected(engine, kwargs, param):
    before = engine.get_server_info()["finished_requests"]
    with pytest.raises(sgl.InvalidRequestError) as info:
        engine.generate(**kwargs)
    assert isinstance(info.value, ValueError)
    assert info.value.param == param, str(info.value)
    assert engine.get_server_info()["finished_requests"] == before  # nothing was submitted


def test_engine_serves_after_errors(engine, hf_model, greedy_refs):
    for bad in ({"temperature": -1}, {"top_p": 0}, {"nope": 1}):
        with pytest.raises(sgl.InvalidRequestError):
            engine.generate("Hi", bad)
    prompt, ids, ref = _ref(greedy_refs, 0)
    assert_same_greedy(
        hf_model, ids, ref, engine.generate(prompt, GREEDY)["output_ids"], "after errors"
    )


# --------------------------------------------------------------------------- concurrency


def test_threads_get_sequential_greedy_results(engine, hf_model, greedy_refs):
    n = len(greedy_refs.prompts)
    results: dict[int, dict] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(16)

    def worker(k: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[k] = engine.generate(greedy_refs.prompts[k % n], GREEDY)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors and len(results) == 16
    for k, res in results.items():
        i = k % n
        assert_same_greedy(
            hf_model,
            greedy_refs.prompt_ids[i],
            greedy_refs.hf_outputs[i],
            res["output_ids"],
            f"thread {k}",
        )


def test_async_generate_gather(engine, hf_model, greedy_refs):
    async def run():
        return await asyncio.gather(
            *(engine.async_generate(p, GREEDY) for p in greedy_refs.prompts[:8])
        )

    outs = asyncio.run(run())
    for i, res in enumerate(outs):
        assert_same_greedy(
            hf_model,
            greedy_refs.prompt_ids[i],
            greedy_refs.hf_outputs[i],
            res["output_ids"],
            f"async {i}",
        )


def _run_in_thread(fn):
    box: dict = {}

    def target():
        try:
            box["out"] = fn()
        except BaseException as exc:  # noqa: BLE001
            box["err"] = exc

    t = threading.Thread(target=target, daemon=True)  # a hung call must not block interpreter exit
    t.start()
    return t, box


def test_abort_long_request(engine):
    rid = "abort-me-long"
    t, box = _run_in_thread(
        lambda: engine.generate(
            "Tell me everything.", {"max_new_tokens": 4000, "ignore_eos": True}, rid=rid
        )
    )
    assert wait_until(lambda: engine.get_server_info()["num_running_reqs"] == 1)
    engine.abort(rid)
    t.join(timeout=120)  # a bound for a stalled abort, not a speed check (the machine may be busy)
    assert not t.is_alive() and "err" not in box
    meta = box["out"]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort"
    assert meta["id"] == rid and meta["completion_tokens"] < 4000
    assert wait_until(lambda: kv_all_returned(engine))


def test_async_cancel_aborts_request(engine):
    async def run():
        coro = engine.async_generate(
            "Tell me everything.", {"max_new_tokens": 4000, "ignore_eos": True}
        )
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(coro, timeout=1.0)

    asyncio.run(run())
    assert wait_until(lambda: kv_all_returned(engine), timeout=10)


def test_duplicate_rids_in_one_batch_do_not_hang(engine):
    t, box = _run_in_thread(
        lambda: engine.generate(["Hi", "Hello"], {"max_new_tokens": 2}, rid=["dup", "dup"])
    )
    t.join(timeout=8)
    assert not t.is_alive(), "generate(rid=['dup', 'dup']) never returned"
    assert "out" in box or (
        isinstance(box.get("err"), sgl.InvalidRequestError) and box["err"].param == "rid"
    )


def test_oversized_top_logprobs_num_fails_alone(engine):
    params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    t, box = _run_in_thread(lambda: engine.generate("Write a long story about a ship.", params))
    try:
        assert wait_until(lambda: engine.get_server_info()["num_running_reqs"] == 1)
        try:
            res = engine.generate(
                "Hello there",
                {"max_new_tokens": 1},
                return_logprob=True,
                logprob_start_len=0,
                top_logprobs_num=VOCAB + 1,
            )
        except sgl.InvalidRequestError as exc:
            assert exc.param == "top_logprobs_num"
        else:
            assert all(len(x) == VOCAB for x in res["meta_info"]["input_top_logprobs"][1:])
    finally:
        t.join(timeout=60)
    assert "err" not in box, f"an unrelated request failed: {box.get('err')!r}"
    assert box["out"]["meta_info"]["finish_reason"] == {"type": "length", "length": 40}


def test_abort_by_rid_with_n_greater_than_one(engine):
    rid = "abort-me-n2"
    t, box = _run_in_thread(
        lambda: engine.generate(
            "Tell me everything.",
            {"max_new_tokens": 4000, "ignore_eos": True, "n": 2, "temperature": 0.8},
            rid=rid,
        )
    )
    try:
        assert wait_until(lambda: engine.get_server_info()["num_running_reqs"] == 2)
        engine.abort(rid)
        t.join(timeout=5)
        assert not t.is_alive()
        assert [o["meta_info"]["finish_reason"]["type"] for o in box["out"]] == ["abort", "abort"]
    finally:  # never leave 2 x 4000 tokens running for the next tests
        for i in range(2):
            engine.abort(f"{rid}-{i}")
        t.join(timeout=30)
        wait_until(lambda: kv_all_returned(engine))
