"""The server through the official `openai` Python client, as real users call it.

Real servers on 127.0.0.1 (uvicorn in a thread, on the session's engine); every answer is
checked against an oracle: the same request made to `engine.generate` on the prompt the
tokenizer's chat template renders, the non-streamed answer for a stream, `jsonschema` for
structured output, the engine's own logprobs. No stored snapshots.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from server_helpers import PERSON, ServerThread, kv_whole, wait_until

from sgl.server import create_app

pytestmark = pytest.mark.integration

MODEL = "openai-client-model"
KEY = "k"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a fruit."},
]


@pytest.fixture(scope="module")
def url(engine):
    with ServerThread(create_app(engine, MODEL)) as u:
        yield u


@pytest.fixture(scope="module")
def keyed_url(engine):
    with ServerThread(create_app(engine, MODEL, api_key=KEY)) as u:
        yield u


def make_client(url: str, api_key: str = "none") -> openai.OpenAI:
    # no retries: an error must surface as the first answer's error, not be retried away
    return openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(url):
    c = make_client(url)
    yield c
    c.close()


def chat_prompt(engine, messages: list[dict]) -> str:
    return engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


# ---------------------------------------------------------------------------- models


def test_models_list_names_the_served_model(client, engine):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    card = models.data[0]
    assert card.object == "model" and isinstance(card.created, int)


# ---------------------------------------------------------------------------- chat


@pytest.mark.parametrize("max_tokens", [3, 48])
def test_chat_greedy_equals_engine_on_templated_prompt(client, engine, max_tokens):
    """3 tokens: cut by the limit ('length'); 48: long enough for the model to end its answer.
    Either way the server must report what the engine reports."""
    resp = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=max_tokens, temperature=0
    )
    want = engine.generate(
        chat_prompt(engine, MESSAGES), {"max_new_tokens": max_tokens, "temperature": 0}
    )
    assert resp.object == "chat.completion" and resp.model == MODEL
    assert len(resp.choices) == 1
    choice = resp.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert choice.message.content == want["text"]
    engine_reason = want["meta_info"]["finish_reason"]["type"]
    assert engine_reason in ("stop", "length")
    assert choice.finish_reason == engine_reason
    # 'length' exactly when the limit was reached
    assert (choice.finish_reason == "length") == (
        want["meta_info"]["completion_tokens"] == max_tokens
    )
    assert resp.usage.prompt_tokens == want["meta_info"]["prompt_tokens"]
    assert resp.usage.prompt_tokens == len(engine.encode(chat_prompt(engine, MESSAGES)))
    assert (
        resp.usage.completion_tokens
        == want["meta_info"]["completion_tokens"]
        == len(want["output_ids"])
    )
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_chat_stream_deltas_concatenate_to_the_greedy_answer(client, engine):
    params = {"model": MODEL, "messages": MESSAGES, "max_tokens": 16, "temperature": 0}
    full = client.chat.completions.create(**params)
    want = engine.generate(chat_prompt(engine, MESSAGES), {"max_new_tokens": 16, "temperature": 0})
    assert full.choices[0].message.content == want["text"]

    chunks = list(
        client.chat.completions.create(
            **params, stream=True, stream_options={"include_usage": True}
        )
    )
    assert len(chunks) >= 3  # role/first piece, more pieces, the usage chunk
    assert all(c.object == "chat.completion.chunk" and c.model == MODEL for c in chunks)
    assert len({c.id for c in chunks}) == 1
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == full.choices[0].message.content == want["text"]
    reasons = [c.choices[0].finish_reason for c in with_choices]
    assert reasons[-1] == full.choices[0].finish_reason and all(r is None for r in reasons[:-1])

    final = chunks[-1]
    assert final.choices == [] and final.usage is not None
    assert (
        final.usage.prompt_tokens == full.usage.prompt_tokens == want["meta_info"]["prompt_tokens"]
    )
    assert (
        final.usage.completion_tokens
        == full.usage.completion_tokens
        == want["meta_info"]["completion_tokens"]
    )
    assert final.usage.total_tokens == final.usage.prompt_tokens + final.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_response_format_json_schema_strict(client, engine):
    messages = [{"role": "user", "content": "Invent a person. Answer in JSON."}]
    resp = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=64,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
    )
    assert resp.choices[0].finish_reason == "stop", resp
    content = resp.choices[0].message.content
    jsonschema.validate(json.loads(content), PERSON)
    want = engine.generate(
        chat_prompt(engine, messages),
        {"max_new_tokens": 64, "temperature": 0, "json_schema": PERSON},
    )
    assert content == want["text"]


def test_chat_response_format_json_object(client, engine):
    # a prompt whose greedy JSON answer closes well within the limit (a vaguer one can nest forever)
    messages = [
        {"role": "user", "content": "Give a JSON object with keys name and age for Bob, 30."}
    ]
    resp = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert resp.choices[0].finish_reason == "stop", resp
    content = resp.choices[0].message.content
    assert isinstance(json.loads(content), dict)
    want = engine.generate(
        chat_prompt(engine, messages), {"max_new_tokens": 64, "temperature": 0, "json_object": True}
    )
    assert content == want["text"]


# ---------------------------------------------------------------------------- completions


def test_completions_n_samples_are_indexed_and_seeded(client, engine):
    prompt = "My favourite animal is the"
    params = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 6,
        "temperature": 1.0,
        "seed": 1234,
        "n": 3,
    }
    resp = client.completions.create(**params)
    assert resp.object == "text_completion"
    assert [c.index for c in resp.choices] == [0, 1, 2]
    # oracle: the engine's own n == 3 sampling with the same seed (sample i is seeded seed + i)
    wants = engine.generate(prompt, {"max_new_tokens": 6, "temperature": 1.0, "seed": 1234, "n": 3})
    assert [c.text for c in resp.choices] == [w["text"] for w in wants]
    assert [c.finish_reason for c in resp.choices] == [
        w["meta_info"]["finish_reason"]["type"] for w in wants
    ]
    assert (
        resp.usage.prompt_tokens == wants[0]["meta_info"]["prompt_tokens"]
    )  # the prompt counted once
    assert resp.usage.completion_tokens == sum(w["meta_info"]["completion_tokens"] for w in wants)
    again = client.completions.create(**params)
    assert [c.text for c in again.choices] == [c.text for c in resp.choices]


def test_completions_logprobs_equal_engine(client, engine):
    prompt = "The opposite of hot is"
    resp = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=2
    )
    want = engine.generate(
        prompt,
        {"max_new_tokens": 6, "temperature": 0},
        return_logprob=True,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
    )
    choice = resp.choices[0]
    assert choice.text == want["text"]
    lp = choice.logprobs
    want_lp = want["meta_info"]["output_token_logprobs"]
    assert len(lp.tokens) == len(lp.token_logprobs) == len(want_lp) == resp.usage.completion_tokens
    assert "".join(lp.tokens) == choice.text
    assert lp.tokens == [text for _lp, _tid, text in want_lp]
    for got, (wlp, _tid, _text) in zip(lp.token_logprobs, want_lp):
        assert got == pytest.approx(wlp, abs=1e-4)
    assert len(lp.top_logprobs) == len(lp.tokens)
    for top, tlp, wtop in zip(
        lp.top_logprobs, lp.token_logprobs, want["meta_info"]["output_top_logprobs"]
    ):
        assert 1 <= len(top) <= 2
        assert max(top.values()) == pytest.approx(tlp, abs=1e-4)  # greedy took the top token
        assert sorted(top.values()) == pytest.approx(sorted(w for w, _t, _x in wtop), abs=1e-4)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]


# ---------------------------------------------------------------------------- errors


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-9", messages=MESSAGES, max_tokens=2)
    assert exc.value.status_code == 404
    assert exc.value.param == "model"
    assert MODEL in exc.value.message and "gpt-9" in exc.value.message
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-9", prompt="x", max_tokens=2)


def test_bad_regex_is_bad_request_with_param(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=4, extra_body={"regex": "("}
        )
    err = exc.value
    assert err.status_code == 400
    body = err.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["param"] == "regex" and body["error"]["code"] == 400
    assert err.param == "regex" and err.type == "invalid_request_error"
    # the server goes on serving
    ok = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, temperature=0)
    assert ok.choices[0].finish_reason in ("stop", "length")


# ---------------------------------------------------------------------------- API key


def test_api_key(keyed_url, engine):
    wrong = make_client(keyed_url, api_key="not-the-key")
    with pytest.raises(openai.AuthenticationError) as exc:
        wrong.models.list()
    assert exc.value.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    wrong.close()

    right = make_client(keyed_url, api_key=KEY)
    assert [m.id for m in right.models.list().data] == [MODEL]
    resp = right.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0
    )
    want = engine.generate(chat_prompt(engine, MESSAGES), {"max_new_tokens": 4, "temperature": 0})
    assert resp.choices[0].message.content == want["text"]
    right.close()


def test_no_kv_leaked(url):
    """Last in this module: everything above finished and gave its KV back."""
    assert wait_until(lambda: kv_whole(url), timeout=60)
