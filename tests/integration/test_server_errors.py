"""The server under bad input, a missing API key and clients that vanish mid-stream: every
4xx carries the OpenAI-style error body, nothing leaks KV, and the server goes on serving."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import pytest
import requests
from server_helpers import (
    ServerThread,
    assert_error,
    kv_whole,
    metric,
    parse_metrics,
    sse_events,
    wait_until,
)

from sgl.server import create_app

pytestmark = pytest.mark.integration

MODEL = "test-model"
MSGS = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def url(engine):
    with ServerThread(create_app(engine, MODEL)) as u:
        yield u


@pytest.fixture(scope="module")
def keyed_url(engine):
    with ServerThread(
        create_app(engine, MODEL, api_key="sekrit", metrics_require_api_key=True)
    ) as u:
        yield u


def post(url: str, path: str, body, **kw) -> requests.Response:
    return requests.post(url + path, json=body, timeout=60, **kw)


def still_serving(url: str) -> None:
    assert requests.get(url + "/health", timeout=30).status_code == 200
    out = post(
        url, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    )
    assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] >= 1


def test_malformed_json_and_wrong_types(url):
    headers = {"Content-Type": "application/json"}
    for path in ("/generate", "/v1/chat/completions", "/v1/completions", "/v1/extract"):
        err = assert_error(
            requests.post(url + path, data='{"text": "x",', headers=headers, timeout=30), 400
        )
        assert "JSON" in err["message"]
    assert_error(requests.post(url + "/generate", data="[1, 2]", headers=headers, timeout=30), 400)
    assert_error(
        requests.post(url + "/generate", data='{"text": "x"}', timeout=30), 400
    )  # no JSON content type
    assert_error(post(url, "/generate", {"text": 5}), 400, "text")
    assert_error(post(url, "/generate", {"text": "x", "stream": "yes"}), 400, "stream")
    assert_error(
        post(url, "/generate", {"text": "x", "sampling_params": {"max_new_tokens": "8"}}),
        400,
        "max_new_tokens",
    )
    assert_error(
        post(url, "/generate", {"text": "x", "sampling_params": {"max_new_tokens": True}}),
        400,
        "max_new_tokens",
    )
    assert_error(
        post(url, "/generate", {"text": "x", "sampling_params": {"max_tokens": 8}}),
        400,
        "max_tokens",
    )
    assert_error(post(url, "/generate", {"text": "x", "bogus_field": 1}), 400, "bogus_field")
    assert_error(post(url, "/generate", {}), 400, "text")
    assert_error(post(url, "/generate", {"text": "x", "input_ids": [1]}), 400, "text")
    assert_error(
        post(url, "/v1/chat/completions", {"messages": MSGS, "max_tokens": "ten"}),
        400,
        "max_tokens",
    )
    assert_error(post(url, "/v1/chat/completions", {"messages": "hi"}), 400, "messages")
    assert_error(post(url, "/v1/chat/completions", {"messages": []}), 400, "messages")
    assert_error(
        post(url, "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}),
        400,
        "messages.0.role",
    )
    assert_error(post(url, "/v1/chat/completions", {"messages": MSGS, "n": 0}), 400, "n")
    assert_error(post(url, "/v1/completions", {"prompt": []}), 400, "prompt")
    assert_error(post(url, "/tokenize", {"text": 3}), 400, "text")
    still_serving(url)


def test_out_of_range_values(url):
    assert_error(
        post(url, "/generate", {"text": "x", "sampling_params": {"temperature": -1}}),
        400,
        "temperature",
    )
    assert_error(
        post(url, "/v1/chat/completions", {"messages": MSGS, "temperature": -0.5}),
        400,
        "temperature",
    )
    assert_error(post(url, "/v1/chat/completions", {"messages": MSGS, "top_p": 1.5}), 400, "top_p")
    assert_error(
        post(url, "/v1/completions", {"prompt": "x", "presence_penalty": 3}),
        400,
        "presence_penalty",
    )
    assert_error(
        post(url, "/v1/chat/completions", {"messages": MSGS, "logprobs": True, "top_logprobs": 50}),
        400,
        "top_logprobs",
    )
    assert_error(
        post(url, "/v1/chat/completions", {"messages": MSGS, "max_tokens": -1}), 400, "max_tokens"
    )
    still_serving(url)


def test_unknown_model_is_404(url):
    for path, body in (
        ("/v1/chat/completions", {"messages": MSGS}),
        ("/v1/completions", {"prompt": "x"}),
        ("/v1/extract", {"text": "x", "schema": {"type": "string"}}),
    ):
        err = assert_error(post(url, path, {**body, "model": "gpt-9"}), 404, "model")
        assert MODEL in err["message"] and "gpt-9" in err["message"]
    assert_error(requests.get(url + "/no/such/path", timeout=30), 404)
    still_serving(url)


def test_prompt_beyond_context_and_ids_outside_vocab(url, engine):
    ctx, vocab = engine.context_len, engine.model_config.vocab_size
    long_ids = [100] * (ctx - 10)
    err = assert_error(
        post(url, "/generate", {"input_ids": long_ids, "sampling_params": {"max_new_tokens": 50}}),
        400,
        "max_new_tokens",
    )
    assert str(ctx) in err["message"]
    assert_error(post(url, "/generate", {"input_ids": [100] * (ctx + 5)}), 400, "prompt")
    assert_error(
        post(url, "/v1/completions", {"prompt": long_ids, "max_tokens": 50}), 400, "max_tokens"
    )
    assert_error(
        post(
            url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hello " * ctx}]}
        ),
        400,
        "messages",
    )
    assert_error(post(url, "/generate", {"input_ids": [1, vocab]}), 400, "input_ids")
    assert_error(post(url, "/generate", {"input_ids": [1, -3]}), 400, "input_ids")
    assert_error(post(url, "/v1/completions", {"prompt": [1, vocab + 7]}), 400, "prompt")
    still_serving(url)


def test_invalid_constraints(url):
    assert_error(
        post(url, "/generate", {"text": "x", "sampling_params": {"regex": "(["}}), 400, "regex"
    )
    assert_error(
        post(url, "/v1/chat/completions", {"messages": MSGS, "regex": "a{2,1}"}), 400, "regex"
    )
    assert_error(
        post(url, "/v1/chat/completions", {"messages": MSGS, "ebnf": "root ::= root"}), 400, "ebnf"
    )
    bad_schema = {"type": "array", "contains": {"type": "string"}}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": bad_schema}}
    assert_error(
        post(url, "/v1/chat/completions", {"messages": MSGS, "response_format": rf}),
        400,
        "response_format",
    )
    assert_error(
        post(
            url,
            "/v1/chat/completions",
            {"messages": MSGS, "response_format": {"type": "json_schema"}},
        ),
        400,
        "response_format.json_schema.schema",
    )
    assert_error(
        post(url, "/v1/chat/completions", {"messages": MSGS, "response_format": {"type": "xml"}}),
        400,
        "response_format.type",
    )
    still_serving(url)


def test_api_key(keyed_url):
    assert requests.get(keyed_url + "/health", timeout=30).status_code == 200
    for method, path in (
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("GET", "/get_model_info"),
        ("POST", "/generate"),
        ("GET", "/health_generate"),
        ("GET", "/openapi.json"),
    ):
        assert_error(requests.request(method, keyed_url + path, timeout=30), 401)
        wrong = {"Authorization": "Bearer nope"}
        assert_error(requests.request(method, keyed_url + path, headers=wrong, timeout=30), 401)
    ok = {"Authorization": "Bearer sekrit"}
    assert requests.get(keyed_url + "/v1/models", headers=ok, timeout=30).status_code == 200
    resp = post(keyed_url, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 2}, headers=ok)
    assert resp.status_code == 200
    # a bad request with the right key is still judged on its merits
    assert_error(post(keyed_url, "/generate", {"text": 1}, headers=ok), 400, "text")
    assert requests.get(keyed_url + "/metrics", headers=ok, timeout=30).status_code == 200


def test_metrics_open_under_an_api_key_by_default(engine):
    with ServerThread(create_app(engine, MODEL, api_key="sekrit")) as keyed:
        resp = requests.get(keyed + "/metrics", timeout=30)
        assert resp.status_code == 200 and parse_metrics(resp.text)
        assert_error(requests.get(keyed + "/v1/models", timeout=30), 401)
        assert_error(requests.get(keyed + "/get_model_info", timeout=30), 401)


@pytest.mark.parametrize(
    "path,body",
    [
        (
            "/generate",
            {
                "text": "Count to a thousand:",
                "stream": True,
                "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True},
            },
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "Count to a thousand."}],
                "n": 2,
                "stream": True,
                "max_tokens": 4000,
                "ignore_eos": True,
            },
        ),
    ],
)
def test_disconnect_mid_stream_releases_kv(url, path, body):
    aborted_before = metric(
        parse_metrics(requests.get(url + "/metrics", timeout=30).text),
        "sgl:num_aborted_requests_total",
    )
    resp = post(url, path, body, stream=True)
    assert resp.status_code == 200
    events = sse_events(resp)  # held: dropping a half-read iterator already closes the connection
    first = next(events)
    assert isinstance(first, dict) and "error" not in first, first
    info = requests.get(url + "/get_server_info", timeout=30).json()
    assert info["num_running_reqs"] + info["num_waiting_reqs"] >= 1, info
    resp.close()  # the client goes away mid-stream
    assert wait_until(lambda: kv_whole(url), timeout=60), requests.get(
        url + "/get_server_info", timeout=30
    ).json()
    aborted_after = metric(
        parse_metrics(requests.get(url + "/metrics", timeout=30).text),
        "sgl:num_aborted_requests_total",
    )
    assert aborted_after >= aborted_before + (2 if "n" in body else 1)
    still_serving(url)


@pytest.mark.parametrize(
    "path,body",
    [
        (
            "/generate",
            {
                "text": "Count to a thousand:",
                "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True},
            },
        ),
        (
            "/v1/completions",
            {"prompt": "Count to a thousand:", "max_tokens": 4000, "ignore_eos": True},
        ),
    ],
)
def test_disconnect_while_waiting_for_a_whole_answer_releases_kv(url, engine, path, body):
    with pytest.raises(requests.Timeout):  # the client gives up and closes the connection
        requests.post(url + path, json=body, timeout=(10, 1.5))
    assert wait_until(lambda: kv_whole(url), timeout=60), requests.get(
        url + "/get_server_info", timeout=30
    ).json()
    still_serving(url)


def _send_raw_post(url: str, path: str, body: dict) -> socket.socket:
    """POST `body` on a socket this test controls: closing it is the client leaving, at the
    moment the test chooses (no client timeout races the server)."""
    host, port = urlsplit(url).hostname, urlsplit(url).port
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, port), timeout=30)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def test_disconnect_from_extract_stops_the_program(url):
    # A pattern that forces 300 characters: the extraction runs for seconds at batch 1.
    schema = {
        "type": "object",
        "properties": {"t": {"type": "string", "pattern": "^[a-z ]{300}$"}},
        "required": ["t"],
        "additionalProperties": False,
    }
    aborted_before = metric(
        parse_metrics(requests.get(url + "/metrics", timeout=30).text),
        "sgl:num_aborted_requests_total",
    )
    sock = _send_raw_post(
        url, "/v1/extract", {"text": "Write anything.", "schema": schema, "max_tokens": 400}
    )
    try:  # the program's generation is running (its schema compiled, its prompt submitted)
        assert wait_until(
            lambda: (
                requests.get(url + "/get_server_info", timeout=30).json()["num_running_reqs"] >= 1
            ),
            timeout=120,
            interval=0.02,
        )
    finally:
        sock.close()  # the client goes away
    assert wait_until(
        lambda: (
            metric(
                parse_metrics(requests.get(url + "/metrics", timeout=30).text),
                "sgl:num_aborted_requests_total",
            )
            == aborted_before + 1
        ),
        timeout=60,
    )
    assert wait_until(lambda: kv_whole(url), timeout=60), requests.get(
        url + "/get_server_info", timeout=30
    ).json()
    # stopped, not run to its end; and nothing else of it ran or was aborted after
    assert (
        metric(
            parse_metrics(requests.get(url + "/metrics", timeout=30).text),
            "sgl:num_aborted_requests_total",
        )
        == aborted_before + 1
    )

    def no_session() -> bool:
        info = requests.get(url + "/get_server_info", timeout=30).json()
        return info["num_open_sessions"] == 0 and info["session_locked_tokens"] == 0

    assert wait_until(no_session, timeout=30), requests.get(
        url + "/get_server_info", timeout=30
    ).json()
    still_serving(url)
