"""The HTTP server's API against its own engine: every answer is checked against an oracle
(the same request made to `engine.generate`, the tokenizer's chat template, `jsonschema`,
the non-streamed answer for a stream), never against a stored snapshot."""

from __future__ import annotations

import json
import threading

import jsonschema
import pytest
import requests
from server_helpers import (
    PERSON,
    ServerThread,
    assert_error,
    kv_whole,
    metric,
    parse_metrics,
    sse_events,
    wait_until,
)

from sgl.lang.chat_template import ChatTemplate
from sgl.server import create_app
from sgl.server.protocol import ChatCompletionResponse, CompletionResponse, ModelInfo

pytestmark = pytest.mark.integration

MODEL = "test-model"
GREEDY = {"max_new_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def url(engine):
    with ServerThread(create_app(engine, MODEL)) as u:
        yield u


def post(url: str, path: str, body: dict, **kw) -> requests.Response:
    return requests.post(url + path, json=body, timeout=120, **kw)


def chat_prompt(engine, messages: list[dict]) -> str:
    return engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


def same_result(got: dict, want: dict) -> None:
    assert got["text"] == want["text"]
    assert got["output_ids"] == want["output_ids"]
    for key in ("prompt_tokens", "completion_tokens", "finish_reason"):
        assert got["meta_info"][key] == want["meta_info"][key], key


# ---------------------------------------------------------------------------- native


def test_generate_equals_engine(url, engine):
    prompt = "The capital of France is"
    got = post(url, "/generate", {"text": prompt, "sampling_params": GREEDY}).json()
    same_result(got, engine.generate(prompt, GREEDY))
    assert set(got) == {"text", "output_ids", "meta_info"}

    prompts = ["1, 2, 3,", "Q: What color is the sky?\nA:"]
    params = [GREEDY, {**GREEDY, "max_new_tokens": 5}]
    got = post(url, "/generate", {"text": prompts, "sampling_params": params}).json()
    want = engine.generate(prompts, params)
    assert len(got) == 2
    for g, w in zip(got, want):
        same_result(g, w)


def test_generate_input_ids_with_logprobs(url, engine):
    ids = engine.encode("Once upon a time")
    req = {
        "input_ids": ids,
        "sampling_params": {**GREEDY, "max_new_tokens": 6},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
    }
    got = post(url, "/generate", req).json()
    want = engine.generate(
        input_ids=ids,
        sampling_params=req["sampling_params"],
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
    )
    same_result(got, want)
    for key in ("output_token_logprobs", "input_token_logprobs"):
        g, w = got["meta_info"][key], want["meta_info"][key]
        assert len(g) == len(w)
        for (glp, gid, gtext), (wlp, wid, wtext) in zip(g, w):
            assert (gid, gtext) == (wid, wtext)
            assert (glp is None) == (wlp is None)
            if glp is not None:
                assert abs(glp - wlp) < 2e-3
    assert all(len(top) == 2 for top in got["meta_info"]["output_top_logprobs"])


def test_generate_stream_is_cumulative(url, engine):
    body = {
        "text": "The capital of France is",
        "sampling_params": {"max_new_tokens": 16, "temperature": 0},
    }
    want = engine.generate(body["text"], body["sampling_params"])
    with post(url, "/generate", {**body, "stream": True}, stream=True) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(resp))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) >= 2
    for a, b in zip(chunks, chunks[1:]):  # cumulative: every chunk extends the previous one
        assert b["text"].startswith(a["text"])
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
        assert a["meta_info"]["finish_reason"] is None
    assert all("index" not in c for c in chunks)  # one request: SGLang's chunk shape
    same_result(chunks[-1], want)


def test_generate_stream_of_a_batch_with_n_samples(url, engine):
    """A batch of 2 prompts x n=2 seeded samples streams as one interleaved SSE stream: each
    chunk names its request by index (prompt k, sample i: k * 2 + i) and carries that
    request's cumulative text; each request's last chunk is its non-streamed answer."""
    prompts = ["1, 2, 3,", "The capital of France is"]
    sp = {"max_new_tokens": 8, "temperature": 0.8, "seed": 5, "n": 2}
    wants = engine.generate(prompts, sp)
    assert len(wants) == 4
    with post(
        url, "/generate", {"text": prompts, "sampling_params": sp, "stream": True}, stream=True
    ) as resp:
        assert resp.status_code == 200, resp.text
        events = list(sse_events(resp))
    assert events[-1] == "[DONE]"
    by_index: dict[int, list[dict]] = {}
    for c in events[:-1]:
        by_index.setdefault(c["index"], []).append(c)
    assert sorted(by_index) == [0, 1, 2, 3]
    for i, chunks in by_index.items():
        for a, b in zip(chunks, chunks[1:]):
            assert (
                b["text"].startswith(a["text"])
                and b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
            )
            assert a["meta_info"]["finish_reason"] is None
        same_result(chunks[-1], wants[i])


def test_tokenize(url, engine):
    assert post(url, "/tokenize", {"text": "Hello world"}).json() == {
        "input_ids": engine.encode("Hello world")
    }
    texts = ["a b c", "<|im_start|>user"]
    assert post(url, "/tokenize", {"text": texts}).json() == {
        "input_ids": [engine.encode(t) for t in texts]
    }


def test_tokenize_in_sglangs_and_vllms_bodies(url, engine):
    tok = engine.tokenizer
    for prompt, special in (("Hello world", True), ("Hello world", False)):
        want = list(tok(prompt, add_special_tokens=special).input_ids)
        got = post(
            url, "/tokenize", {"model": MODEL, "prompt": prompt, "add_special_tokens": special}
        ).json()
        assert got == {"tokens": want, "count": len(want), "max_model_len": engine.context_len}
    texts = ["a b c", "<|im_start|>user"]
    got = post(url, "/v1/tokenize", {"prompt": texts}).json()
    assert got["tokens"] == [list(tok(t).input_ids) for t in texts] and got["count"] == [
        len(t) for t in got["tokens"]
    ]
    msgs = [{"role": "user", "content": "Hi there"}]
    rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    got = post(url, "/tokenize", {"model": MODEL, "messages": msgs}).json()
    assert got["tokens"] == list(tok(rendered, add_special_tokens=False).input_ids)
    assert_error(post(url, "/tokenize", {"prompt": "a", "text": "a"}), 400)
    assert_error(post(url, "/tokenize", {"model": MODEL}), 400)


def test_detokenize_round_trips_tokenize(url, engine):
    ids = post(url, "/tokenize", {"prompt": "The quick brown fox"}).json()["tokens"]
    want = engine.tokenizer.decode(ids, skip_special_tokens=True)
    assert want.strip() == "The quick brown fox"
    assert post(url, "/detokenize", {"model": MODEL, "tokens": ids}).json() == {
        "text": want,
        "prompt": want,
    }
    eos = engine.tokenizer.eos_token_id
    both = post(
        url, "/v1/detokenize", {"tokens": [ids, ids + [eos]], "skip_special_tokens": False}
    ).json()
    assert (
        both["text"]
        == [engine.tokenizer.decode(ids), engine.tokenizer.decode(ids + [eos])]
        == both["prompt"]
    )
    assert_error(post(url, "/detokenize", {"tokens": "abc"}), 400, "tokens")
    vocab = engine.model_config.vocab_size
    for bad in ([vocab], [[1], [-1]]):
        assert (
            str(bad[-1][0] if isinstance(bad[-1], list) else bad[-1])
            in assert_error(post(url, "/detokenize", {"tokens": bad}), 400, "tokens")["message"]
        )


def test_retrieve_model(url):
    listed = requests.get(url + "/v1/models", timeout=30).json()["data"]
    assert requests.get(url + f"/v1/models/{MODEL}", timeout=30).json() == listed[0]
    err = assert_error(requests.get(url + "/v1/models/no-such/model", timeout=30), 404, "model")
    assert "no-such/model" in err["message"]


CUSTOM_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}[/{{ m['role'] }}]\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


def test_chat_template_file_sets_the_served_template(engine, tmp_path):
    from sgl.server.launch_compat import read_chat_template, use_chat_template

    path = tmp_path / "t.jinja"
    path.write_text(CUSTOM_TEMPLATE)
    tok, before = engine.tokenizer, engine.tokenizer.chat_template
    try:
        use_chat_template(tok, read_chat_template(str(path)))
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        assert (
            engine.render_messages(msgs)
            == "[system]Be brief.[/system]\n[user]Hi[/user]\n[assistant]"
        )
        roles = ChatTemplate.from_hf_tokenizer(tok)
        assert (roles.prefix["user"], roles.suffix["user"]) == ("[user]", "[/user]\n")
        with ServerThread(create_app(engine, MODEL)) as templated:
            got = post(templated, "/tokenize", {"messages": msgs}).json()["tokens"]
            assert got == list(
                tok(
                    "[system]Be brief.[/system]\n[user]Hi[/user]\n[assistant]",
                    add_special_tokens=False,
                ).input_ids
            )
            body = {"messages": msgs, "max_tokens": 1, "temperature": 0}
            usage = post(templated, "/v1/chat/completions", body).json()["usage"]
            assert usage["prompt_tokens"] == len(engine.encode(engine.render_messages(msgs)))
    finally:
        tok.chat_template = before


def test_model_and_server_info(url, engine):
    info = requests.get(url + "/get_model_info", timeout=30).json()
    ModelInfo.model_validate(info)
    tmpl = ChatTemplate.from_hf_tokenizer(engine.tokenizer)
    assert info["served_model_name"] == MODEL
    assert info["is_generation"] is True
    assert info["vocab_size"] == engine.model_config.vocab_size
    assert info["context_length"] == engine.context_len
    assert info["eos_token_ids"] == list(engine.eos_token_ids)
    assert info["chat_roles"] == {
        "prefix": tmpl.prefix,
        "suffix": tmpl.suffix,
        "default_system": tmpl.default_system,
    }

    server = requests.get(url + "/get_server_info", timeout=30).json()
    direct = engine.get_server_info()
    for key in ("max_total_tokens", "context_length", "vocab_size", "schedule_policy"):
        assert server[key] == direct[key]

    assert requests.get(url + "/health", timeout=30).json() == {"status": "ok"}
    assert requests.get(url + "/health_generate", timeout=60).status_code == 200
    assert requests.post(url + "/flush_cache", timeout=30).json()["success"] is True
    assert post(url, "/abort_request", {"rid": "no-such-request"}).json()["success"] is True

    models = requests.get(url + "/v1/models", timeout=30).json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]


def test_abort_request_ends_a_running_generation(url, engine):
    rid = "abort-me"
    result: dict = {}

    def run() -> None:
        body = {
            "text": "Count:",
            "rid": rid,
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True, "temperature": 0},
        }
        result["out"] = post(url, "/generate", body).json()

    t = threading.Thread(target=run)
    t.start()
    assert wait_until(lambda: engine.get_server_info()["num_running_reqs"] > 0, timeout=30)
    assert post(url, "/abort_request", {"rid": rid}).json()["success"] is True
    t.join(timeout=60)
    assert result["out"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert result["out"]["meta_info"]["completion_tokens"] < 3000


def test_openapi_describes_the_api(url):
    spec = requests.get(url + "/openapi.json", timeout=30).json()
    for path in (
        "/generate",
        "/tokenize",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/extract",
        "/get_model_info",
        "/metrics",
    ):
        assert path in spec["paths"], path
    chat_schema = spec["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    for field in ("messages", "max_tokens", "response_format", "stream_options", "regex", "top_k"):
        assert field in chat_schema
    assert requests.get(url + "/docs", timeout=30).status_code == 200


def test_openapi_declares_400_not_fastapi_422_for_invalid_bodies(url):
    spec = requests.get(url + "/openapi.json", timeout=30).json()
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            assert "HTTPValidationError" not in repr(op["responses"]), (method, path)
            if op.get("requestBody"):
                assert "400" in op["responses"], (method, path)
    # the server does answer an invalid body with 400, as declared
    resp = requests.post(
        url + "/generate",
        json={"text": "x", "sampling_params": {"max_new_tokens": "many"}},
        timeout=30,
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"]
    assert "422" in spec["paths"]["/v1/extract"]["post"]["responses"]  # its own: output cut short


# ---------------------------------------------------------------------------- OpenAI


MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a fruit."},
]


def test_chat_completion_equals_engine_on_templated_prompt(url, engine):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 12, "temperature": 0}
    resp = post(url, "/v1/chat/completions", body).json()
    ChatCompletionResponse.model_validate(resp)
    want = engine.generate(chat_prompt(engine, MESSAGES), GREEDY)
    choice = resp["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": want["text"]}
    assert choice["finish_reason"] == want["meta_info"]["finish_reason"]["type"]
    usage = resp["usage"]
    assert usage["prompt_tokens"] == want["meta_info"]["prompt_tokens"]
    assert usage["completion_tokens"] == want["meta_info"]["completion_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # the prompt was just computed by the engine call above: the server's request reused it
    assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] <= usage["prompt_tokens"]
    assert resp["model"] == MODEL and resp["object"] == "chat.completion"

    # "default" names the served model too; max_completion_tokens is max_tokens' newer name
    alt = post(
        url,
        "/v1/chat/completions",
        {"model": "default", "messages": MESSAGES, "max_completion_tokens": 12, "temperature": 0},
    ).json()
    assert alt["choices"][0]["message"]["content"] == want["text"]


def test_chat_stream_pieces_concatenate_to_the_answer(url):
    body = {"messages": MESSAGES, "max_tokens": 16, "temperature": 0}
    full = post(url, "/v1/chat/completions", body).json()
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with post(url, "/v1/chat/completions", stream_body, stream=True) as resp:
        assert resp.status_code == 200
        events = list(sse_events(resp))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == full["choices"][0]["message"]["content"]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert reasons[-1] == full["choices"][0]["finish_reason"] and all(
        r is None for r in reasons[:-1]
    )
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert usage_chunk["usage"][key] == full["usage"][key]
    assert all(c["usage"] is None for c in chunks[:-1])


def test_chat_n_samples_streamed_and_not(url):
    body = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0.8, "seed": 11, "n": 2}
    resp = post(url, "/v1/chat/completions", body).json()
    assert [c["index"] for c in resp["choices"]] == [0, 1]
    assert 2 <= resp["usage"]["completion_tokens"] <= 2 * 6  # both samples counted
    again = post(url, "/v1/chat/completions", body).json()  # same seed, same samples
    assert [c["message"]["content"] for c in again["choices"]] == [
        c["message"]["content"] for c in resp["choices"]
    ]

    with post(url, "/v1/chat/completions", {**body, "stream": True}, stream=True) as r:
        chunks = [e for e in sse_events(r) if e != "[DONE]"]
    finished = {c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]}
    assert finished == {0, 1}


def test_chat_response_format_json_schema_and_json_object(url):
    body = {
        "messages": [{"role": "user", "content": "Invent a person. Answer in JSON."}],
        "max_tokens": 64,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
    }
    resp = post(url, "/v1/chat/completions", body).json()
    assert resp["choices"][0]["finish_reason"] == "stop", resp
    jsonschema.validate(json.loads(resp["choices"][0]["message"]["content"]), PERSON)

    body["response_format"] = {"type": "json_object"}
    resp = post(url, "/v1/chat/completions", body).json()
    if resp["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(resp["choices"][0]["message"]["content"]), dict)
    else:  # cut by max_tokens: still a prefix of a JSON object
        assert resp["choices"][0]["message"]["content"].lstrip().startswith("{")

    body["response_format"] = None
    body["regex"] = r"(yes|no)\."
    resp = post(url, "/v1/chat/completions", body).json()
    assert resp["choices"][0]["message"]["content"] in ("yes.", "no.")


def test_chat_logprobs(url):
    body = {
        "messages": MESSAGES,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    resp = post(url, "/v1/chat/completions", body).json()
    ChatCompletionResponse.model_validate(resp)
    content = resp["choices"][0]["logprobs"]["content"]
    assert len(content) == resp["usage"]["completion_tokens"]
    assert "".join(t["token"] for t in content) == resp["choices"][0]["message"]["content"]
    for t in content:
        assert t["logprob"] <= 0 and len(t["top_logprobs"]) == 3
        assert t["top_logprobs"][0]["logprob"] >= t["logprob"] - 1e-6  # greedy picks the top token
        assert bytes(t["bytes"]).decode("utf-8") == t["token"]


def test_completions_equal_engine(url, engine):
    prompts = ["1, 2, 3,", "The opposite of hot is"]
    body = {"model": MODEL, "prompt": prompts, "max_tokens": 8, "temperature": 0, "stop": ["\n"]}
    resp = post(url, "/v1/completions", body).json()
    CompletionResponse.model_validate(resp)
    wants = [
        engine.generate(p, {"max_new_tokens": 8, "temperature": 0, "stop": ["\n"]}) for p in prompts
    ]
    assert [c["text"] for c in resp["choices"]] == [w["text"] for w in wants]
    assert resp["usage"]["prompt_tokens"] == sum(w["meta_info"]["prompt_tokens"] for w in wants)
    assert resp["usage"]["completion_tokens"] == sum(
        w["meta_info"]["completion_tokens"] for w in wants
    )

    # token-id prompt, logprobs, echo
    ids = engine.encode(prompts[0])
    resp = post(
        url, "/v1/completions", {"prompt": ids, "max_tokens": 4, "temperature": 0, "logprobs": 2}
    ).json()
    lp = resp["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 4
    assert "".join(lp["tokens"]) == resp["choices"][0]["text"]
    assert all(
        len(top) <= 2 and max(top.values()) >= tlp - 1e-6
        for top, tlp in zip(lp["top_logprobs"], lp["token_logprobs"])
    )

    resp = post(
        url,
        "/v1/completions",
        {"prompt": prompts[0], "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 1},
    ).json()
    choice = resp["choices"][0]
    assert choice["text"].startswith(prompts[0])
    assert len(choice["logprobs"]["tokens"]) == len(ids) + 4
    assert choice["logprobs"]["token_logprobs"][0] is None  # the first prompt token has no logprob
    assert "".join(choice["logprobs"]["tokens"]) == choice["text"]


def test_unset_max_tokens_is_as_many_as_fit(tiny_engine):
    """No max_tokens: the engine fills what is left of the KV pool (400 tokens here), shared
    by the n samples; the server computes nothing about it."""
    with ServerThread(create_app(tiny_engine, MODEL)) as small_url:
        prompt = [100 + (i % 50) for i in range(380)]
        room = tiny_engine.get_server_info()["max_total_tokens"] - 1 - len(prompt)
        body = {"prompt": prompt, "temperature": 0, "ignore_eos": True, "n": 2}
        resp = post(small_url, "/v1/completions", body).json()
        assert [c["finish_reason"] for c in resp["choices"]] == ["length", "length"], resp
        assert resp["usage"]["completion_tokens"] == 2 * (room // 2)
        msgs = [{"role": "user", "content": "Count: " + "1 2 3 " * 40}]
        resp = post(
            small_url,
            "/v1/chat/completions",
            {"messages": msgs, "temperature": 0, "ignore_eos": True},
        ).json()
        used = resp["usage"]["prompt_tokens"]
        assert resp["choices"][0]["finish_reason"] == "length", resp
        assert (
            resp["usage"]["completion_tokens"]
            == tiny_engine.get_server_info()["max_total_tokens"] - 1 - used
        )
        assert wait_until(lambda: kv_whole(small_url), timeout=60)


def test_completions_stream(url):
    body = {"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0}
    full = post(url, "/v1/completions", body).json()
    with post(
        url,
        "/v1/completions",
        {**body, "stream": True, "stream_options": {"include_usage": True}},
        stream=True,
    ) as r:
        events = list(sse_events(r))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert (
        "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        == full["choices"][0]["text"]
    )
    assert chunks[-1]["usage"]["completion_tokens"] == full["usage"]["completion_tokens"]


# ---------------------------------------------------------------------------- extraction


def test_extract_returns_schema_valid_data(url):
    body = {"text": "Alice Smith is 34 years old and lives in Paris.", "schema": PERSON}
    resp = post(url, "/v1/extract", body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    jsonschema.validate(out["data"], PERSON)
    usage = out["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    body = {
        "messages": [
            {"role": "user", "content": "I'm Bob."},
            {"role": "assistant", "content": "Hi Bob!"},
            {"role": "user", "content": "I turned 27 today."},
        ],
        "schema": PERSON,
        "instructions": "Extract the user's name and age.",
    }
    out = post(url, "/v1/extract", body).json()
    jsonschema.validate(out["data"], PERSON)

    schema = {
        "type": "array",
        "items": {"type": "string", "enum": ["red", "green", "blue"]},
        "maxItems": 3,
    }
    out = post(url, "/v1/extract", {"text": "The flag is red and blue.", "schema": schema}).json()
    jsonschema.validate(out["data"], schema)


def test_extract_cut_by_token_limit_is_422(url):
    resp = post(url, "/v1/extract", {"text": "Alice is 34.", "schema": PERSON, "max_tokens": 2})
    err = assert_error(resp, 422, "max_tokens")
    assert "max_tokens" in err["message"]


def test_extract_bad_input_is_400(url):
    bad_schema = {
        "type": "object",
        "properties": {"a": {"type": "array", "contains": {"type": "string"}}},
    }
    err = assert_error(post(url, "/v1/extract", {"text": "x", "schema": bad_schema}), 400, "schema")
    assert "contains" in err["message"]
    assert_error(post(url, "/v1/extract", {"schema": PERSON}), 400, "text")
    assert_error(post(url, "/v1/extract", {"text": "x"}), 400, "schema")
    assert_error(post(url, "/v1/extract", {"text": "x", "schema": "not an object"}), 400, "schema")


# ---------------------------------------------------------------------------- metrics


def test_metrics_parse_and_count_requests(url):
    before = parse_metrics(requests.get(url + "/metrics", timeout=30).text)
    for name in (
        "sgl:num_running_reqs",
        "sgl:num_waiting_reqs",
        "sgl:token_usage",
        "sgl:cache_hit_rate",
        "sgl:prompt_tokens_total",
        "sgl:generation_tokens_total",
        "sgl:cached_tokens_total",
        "sgl:num_requests_total",
        "sgl:time_to_first_token_seconds_count",
        "sgl:time_per_output_token_seconds_count",
        "sgl:e2e_request_latency_seconds_count",
    ):
        metric(before, name)
    out = post(
        url, "/generate", {"text": "Hello there", "sampling_params": {"max_new_tokens": 4}}
    ).json()
    post(url, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3}).raise_for_status()
    resp = requests.get(url + "/metrics", timeout=30)
    assert resp.headers["content-type"].startswith("text/plain")
    after = parse_metrics(resp.text)
    assert metric(after, "sgl:num_requests_total") == metric(before, "sgl:num_requests_total") + 2
    assert (
        metric(after, "sgl:prompt_tokens_total")
        >= metric(before, "sgl:prompt_tokens_total") + out["meta_info"]["prompt_tokens"]
    )
    assert (
        metric(after, "sgl:generation_tokens_total")
        >= metric(before, "sgl:generation_tokens_total") + out["meta_info"]["completion_tokens"]
    )
    for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert metric(after, f"sgl:{h}_count") == metric(before, f"sgl:{h}_count") + 2
        inf = [v for k, v in after.items() if k.startswith(f"sgl:{h}_bucket") and 'le="+Inf"' in k]
        assert inf == [metric(after, f"sgl:{h}_count")]
    assert 0 <= metric(after, "sgl:token_usage") <= 1
    assert 0 <= metric(after, "sgl:cache_hit_rate") <= 1


CONCURRENT_CLIENTS = 32


def test_concurrent_streaming_clients(url):
    """32 clients stream at once (batched together by the engine); each gets a whole,
    well-formed stream whose text is its own non-streamed greedy answer and whose usage
    matches its own tokens; afterwards every KV slot is free again."""
    n = CONCURRENT_CLIENTS

    def body(i: int) -> dict:
        return {
            "messages": [{"role": "user", "content": f"Say the number {i}."}],
            "max_tokens": 8,
            "temperature": 0,
        }

    # the oracle: each request alone, not streamed
    wants = [post(url, "/v1/chat/completions", body(i)).json() for i in range(n)]
    results: list = [None] * n
    errors: list = []
    barrier = threading.Barrier(n)

    def client(i: int) -> None:
        try:
            barrier.wait(timeout=60)  # all streams open together
            stream_body = {**body(i), "stream": True, "stream_options": {"include_usage": True}}
            with post(url, "/v1/chat/completions", stream_body, stream=True) as r:
                assert r.status_code == 200, r.text
                results[i] = list(sse_events(r))
        except BaseException as e:  # reported below, with the client's index
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    for i, (events, want) in enumerate(zip(results, wants)):
        assert events is not None and events[-1] == "[DONE]", i
        chunks = events[:-1]
        assert len({c["id"] for c in chunks}) == 1
        with_choices = [c for c in chunks if c["choices"]]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in with_choices)
        assert text == want["choices"][0]["message"]["content"], (i, text, want)
        reasons = [c["choices"][0]["finish_reason"] for c in with_choices]
        assert reasons[-1] == want["choices"][0]["finish_reason"] and all(
            r is None for r in reasons[:-1]
        ), i
        usage = chunks[-1]["usage"]
        assert chunks[-1]["choices"] == []
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            assert usage[key] == want["usage"][key], (i, key)
        assert usage["completion_tokens"] <= 8
    assert len({events[0]["id"] for events in results}) == n
    assert wait_until(lambda: kv_whole(url), timeout=60), requests.get(
        url + "/get_server_info", timeout=30
    ).json()
