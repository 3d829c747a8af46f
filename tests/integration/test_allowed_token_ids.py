"""allowed_token_ids end to end (Engine, /generate, /v1 as vLLM's extra field, sgl.gen). Oracles:
the engine's own top logprobs of the same prefix without the field (greedy must pick the
best-ranked allowed id), set membership of sampled tokens, and the error naming the field."""

from __future__ import annotations

import pytest
import requests
from server_helpers import ServerThread, assert_error

import sgl
from sgl.lang.backends.engine import EngineBackend
from sgl.server import create_app

pytestmark = pytest.mark.integration

MODEL = "test-model"
PROMPT = "The capital of France is"
TOP = 20


@pytest.fixture(scope="module")
def url(engine):
    with ServerThread(create_app(engine, MODEL)) as u:
        yield u


@pytest.fixture(scope="module")
def allowed(engine) -> list[int]:
    """Ids ranked 2nd, 5th and 9th for the prompt's first token, plus ids of common words."""
    res = engine.generate(
        PROMPT, {"max_new_tokens": 1, "temperature": 0}, return_logprob=True, top_logprobs_num=TOP
    )
    top = [tid for _, tid, *_ in res["meta_info"]["output_top_logprobs"][0]]
    words = [engine.encode(w)[-1] for w in (" the", " a", " of", ".", " and")]
    return sorted({top[1], top[4], top[8], *words})


def test_greedy_picks_the_best_allowed_id_of_the_unconstrained_ranking(engine, allowed):
    res = engine.generate(
        PROMPT, {"max_new_tokens": 6, "temperature": 0, "allowed_token_ids": allowed}
    )
    out = res["output_ids"]
    assert out and set(out) <= set(allowed)
    prompt_ids = engine.encode(PROMPT)
    for i, tok in enumerate(out):  # teacher-forced: the same prefix, no allowed_token_ids
        ref = engine.generate(
            input_ids=prompt_ids + out[:i],
            sampling_params={"max_new_tokens": 1, "temperature": 0},
            return_logprob=True,
            top_logprobs_num=TOP,
        )
        ranking = [tid for _, tid, *_ in ref["meta_info"]["output_top_logprobs"][0]]
        in_top = [t for t in ranking if t in allowed]
        if in_top:  # the best allowed id is within the top TOP: it is the one picked
            assert tok == in_top[0], (i, tok, in_top)
        else:  # else the pick is below every one of the top TOP
            assert tok not in ranking


def test_sampled_tokens_stay_in_the_set(url, allowed):
    body = {
        "text": PROMPT,
        "sampling_params": {
            "max_new_tokens": 8,
            "temperature": 1.5,
            "n": 4,
            "seed": 3,
            "allowed_token_ids": allowed,
            "ignore_eos": True,
        },
    }
    outs = requests.post(url + "/generate", json=body, timeout=120).json()
    assert len(outs) == 4
    for o in outs:
        assert o["output_ids"] and set(o["output_ids"]) <= set(allowed)


def test_v1_extra_field_matches_generate(url, allowed):
    native = requests.post(
        url + "/generate",
        json={
            "text": PROMPT,
            "sampling_params": {
                "max_new_tokens": 5,
                "temperature": 0,
                "allowed_token_ids": allowed,
            },
        },
        timeout=120,
    ).json()
    v1 = requests.post(
        url + "/v1/completions",
        json={
            "model": MODEL,
            "prompt": PROMPT,
            "max_tokens": 5,
            "temperature": 0,
            "allowed_token_ids": allowed,
        },
        timeout=120,
    )
    assert v1.status_code == 200, v1.text
    assert v1.json()["choices"][0]["text"] == native["text"]


@pytest.mark.parametrize("bad", [[-1], [10**9], ["1"]])
def test_bad_ids_are_a_400_naming_the_field(url, bad):
    r = requests.post(
        url + "/generate",
        json={"text": PROMPT, "sampling_params": {"allowed_token_ids": bad}},
        timeout=60,
    )
    assert_error(r, 400, "allowed_token_ids")
    r = requests.post(
        url + "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "allowed_token_ids": bad,
        },
        timeout=60,
    )
    assert r.status_code == 400 and "allowed_token_ids" in r.text, r.text


def test_with_a_regex_only_ids_both_allow_and_an_empty_intersection_ends_the_request(engine):
    digits = sorted({engine.encode(d)[-1] for d in "12"})
    assert all(engine.decode([d]) in "12" for d in digits)
    res = engine.generate(
        PROMPT,
        {"max_new_tokens": 4, "temperature": 0, "regex": "[0-9]+", "allowed_token_ids": digits},
    )
    assert set(res["output_ids"]) <= set(digits) and res["text"] and set(res["text"]) <= set("12")
    letters = [engine.encode(" the")[-1]]  # no digit: nothing the regex allows is left
    dead = engine.generate(
        PROMPT,
        {"max_new_tokens": 4, "temperature": 0, "regex": "[0-9]+", "allowed_token_ids": letters},
    )
    assert dead["meta_info"]["finish_reason"]["type"] == "abort" and dead["output_ids"] == []
    again = engine.generate(
        PROMPT, {"max_new_tokens": 2, "temperature": 0}
    )  # the engine still serves
    assert len(again["output_ids"]) == 2


def test_sgl_gen_passes_it_through(engine, allowed):
    @sgl.function
    def prog(s):
        s += PROMPT + sgl.gen("a", max_tokens=4, temperature=0, allowed_token_ids=allowed)

    state = prog.run(backend=EngineBackend(engine))
    want = engine.generate(
        PROMPT, {"max_new_tokens": 4, "temperature": 0, "allowed_token_ids": allowed}
    )
    assert state["a"] == want["text"]


def test_forced_text_of_a_constraint_is_not_inserted_past_the_allowed_ids(engine):
    """Jump-forward inserts a constraint's forced text without the sampler; with
    allowed_token_ids it must not: every output id stays in the set, even where the text is
    forced (the regex forces "answer: " and the spelling jump-forward would pick is not allowed)."""
    forced = "answer: "
    pieces = sorted({engine.encode(c)[-1] for c in "answer:"} | {engine.encode(" ")[-1]})
    digits = sorted({engine.encode(d)[-1] for d in "0123456789"})
    assert len(engine.encode(forced)) < len(forced)  # the usual spelling has multi-char tokens
    res = engine.generate(
        PROMPT,
        {
            "max_new_tokens": 12,
            "temperature": 0,
            "regex": "answer: [0-9]",
            "allowed_token_ids": pieces + digits,
        },
    )
    assert set(res["output_ids"]) <= set(pieces + digits), res
    assert res["text"].startswith(forced) or res["meta_info"]["finish_reason"]["type"] == "abort"
