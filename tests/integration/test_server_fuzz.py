"""The server against its own published OpenAPI schema: schemathesis drives every operation
of `/openapi.json` over real HTTP with generated bodies, valid and mutated (the documented
examples; its coverage phase: boundary and type-violating values of every field; its fuzzing
phase: hypothesis-generated bodies, both modes), and checks every answer: no 5xx, the status code is
one the operation declares, so is the content type, the body (and each server-sent event's JSON)
matches the declared schema, and the declared headers (`Retry-After` on 429 / 503) are there. Then
the server must be healthy and, once flushed, its KV pool whole: nothing the fuzz did leaked.

The engine is the tiny random-weight Llama with the embedded model's tokenizer (and so its
chat template), and every generation is short (`max_new_tokens_limit`, `max_n`), so thousands
of requests fit in CI; a larger request is answered 413, which the fuzz exercises too.
`SGL_FUZZ_MAX_EXAMPLES` raises the examples per operation and mode for a longer run:

    SGL_FUZZ_MAX_EXAMPLES=400 .venv/bin/python -m pytest -q tests/integration/test_server_fuzz.py

The failures the fuzz found are the regression tests at the end, each the exact body.
"""

from __future__ import annotations

import collections
import json
import os
import time

import hypothesis
import jsonschema
import pytest
import requests
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.errors import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from server_helpers import ServerThread, assert_error, sse_events

from sgl.server import create_app
from sgl.server.lifecycle import ALWAYS_OPEN

pytestmark = pytest.mark.integration

MODEL = "fuzz"
MIN_REQUESTS = 2000
MAX_EXAMPLES = int(os.environ.get("SGL_FUZZ_MAX_EXAMPLES", "40"))
# CI is reproducible: derandomized hypothesis and a fixed seed. A longer run may pick another
# seed (SGL_FUZZ_SEED) to explore other bodies.
SEED = os.environ.get("SGL_FUZZ_SEED")
# Streams are read to their end (at most 4 x 8 tokens per prompt, so a few hundred events).
CONFIG = schemathesis.Config.from_dict(
    {"seed": int(SEED or 0), "request-timeout": 60, "max-stream-events": 100_000}
)
# Hypothesis: no example database, no `explain` phase; its health checks about slowness are
# off (a generation is a real forward pass), none else.
SETTINGS = hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    derandomize=SEED is None,
    database=None,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
    print_blob=False,
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate, hypothesis.Phase.shrink],
)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
# Each call, by operation label ("POST /generate") and status: the proof that every operation was
# driven.
CALLS: collections.Counter = collections.Counter()
STREAMS: collections.Counter = collections.Counter()  # streamed answers whose events were validated
OPENED_SESSIONS: set[str] = set()  # closed after the fuzz: an open session's turns pin their KV


@pytest.fixture(scope="module")
def fuzz_engine():
    import sgl

    engine = sgl.Engine(
        model_path="tiny-llama",
        load_format="dummy",
        random_seed=0,
        context_length=256,
        max_total_tokens=4096,
        # Every generation short: a larger max_tokens / n is a 413 (itself under test).
        max_new_tokens_limit=8,
        max_n=4,
        max_running_requests=16,
        max_queued_requests=16,
    )
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def server(fuzz_engine, tmp_path_factory):
    # With a profile directory /start_profile and /stop_profile do their real work.
    app = create_app(fuzz_engine, MODEL, profile_dir=str(tmp_path_factory.mktemp("profiles")))
    with ServerThread(app) as url:
        yield url


@pytest.fixture(scope="module")
def http(server):
    with requests.Session() as session:
        yield session


@pytest.fixture(scope="module")
def openapi(server):
    return requests.get(server + "/openapi.json", timeout=30).json()


def sse_events_conform(openapi: dict, case, response) -> None:
    """Each server-sent event's `data` is JSON matching the declared event schema (the
    operation's `itemSchema` of `text/event-stream`), and the stream ends with `[DONE]`.
    (schemathesis validates the event envelope; the JSON inside is this check's.)"""
    if not response.headers.get("content-type", [""])[0].startswith("text/event-stream"):
        return
    declared = openapi["paths"][case.operation.path][case.method.lower()]["responses"][
        str(response.status_code)
    ]
    data_schema = declared["content"]["text/event-stream"]["itemSchema"]["properties"]["data"]
    (json_branch,) = [b for b in data_schema["anyOf"] if "contentSchema" in b]
    validator = jsonschema.Draft202012Validator(json_branch["contentSchema"])
    text = response.content.decode("utf-8")
    assert not response.stream_cut_short, (
        "raise max-stream-events: the stream was not read to its end"
    )
    datas = [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]
    assert datas and datas[-1] == "[DONE]", f"the stream does not end with [DONE]: {datas[-3:]}"
    assert "[DONE]" not in datas[:-1]
    for data in datas[:-1]:
        errors = sorted(validator.iter_errors(json.loads(data)), key=lambda e: list(e.path))
        assert not errors, (
            f"an event does not match its declared schema: {errors[0].message}\n{data[:2000]}"
        )
    STREAMS[case.operation.label] += 1


def _stop_profile(http, server: str) -> None:
    """A profile that /start_profile began records every forward step from then on (slow):
    stopped right away, which is also /stop_profile's success path."""
    resp = http.post(server + "/stop_profile", timeout=60)
    CALLS[("POST /stop_profile", resp.status_code)] += 1
    assert resp.status_code == 200, resp.text


def _call(case, server: str, http, openapi: dict) -> None:
    """One real HTTP request with its checks (raises on a failed one)."""
    response = case.call(session=http)
    CALLS[(case.operation.label, response.status_code)] += 1
    if case.operation.label == "POST /start_profile" and response.status_code == 200:
        _stop_profile(http, server)
    if case.operation.label == "POST /open_session" and response.status_code == 200:
        OPENED_SESSIONS.add(response.json())
    case.validate_response(response, checks=CHECKS)
    sse_events_conform(openapi, case, response)


def _has_inputs(operation) -> bool:
    """Whether a request to `operation` can be made invalid: a path segment (`/v1/models/{id}`,
    any string) cannot, so its negative mode would generate nothing."""
    return bool(operation.body) or any(p.location != "path" for p in operation.iter_parameters())


def test_fuzz_every_operation_then_the_server_is_whole(server, http, openapi):
    """Every operation, first with its documented examples, then schemathesis' coverage cases
    (each field at its bounds, of the wrong type, missing, ...), then hypothesis-generated
    bodies, valid and invalid. Every failure is collected, so one run reports them all
    (hypothesis shrinks each to a minimal body first). Then: enough real requests, every
    operation among them, and the server healthy with its whole KV pool free once flushed."""
    schema = schemathesis.openapi.from_url(server + "/openapi.json", config=CONFIG)
    operations = [
        result.ok() for result in schema.get_all_operations()
    ]  # a malformed definition raises here
    assert {op.label for op in operations} == {
        f"{method.upper()} {path}" for path, ops in openapi["paths"].items() for method in ops
    }
    failures: list[str] = []
    for operation in operations:
        for example in operation.get_strategies_from_examples():  # the documented examples first

            @hypothesis.settings(SETTINGS, max_examples=1, phases=[hypothesis.Phase.generate])
            @hypothesis.given(case=example)
            def documented(case):
                _call(case, server, http, openapi)

            try:
                documented()
            except (AssertionError, FailureGroup) as e:
                failures.append(f"{operation.label} (example): {e}")
        coverage = schema.iter_coverage_cases(
            operation,
            generation_modes=list(GenerationMode),
            generation_config=schema.config.generation_for(operation=operation, phase="coverage"),
        )
        for case in coverage:
            try:
                _call(case, server, http, openapi)
            except (AssertionError, FailureGroup) as e:
                failures.append(f"{operation.label} (coverage): {e}")
        modes = list(GenerationMode) if _has_inputs(operation) else [GenerationMode.POSITIVE]
        for mode in modes:

            @SETTINGS
            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            def fuzz(case):
                _call(case, server, http, openapi)

            if SEED is not None:
                fuzz = hypothesis.seed(int(SEED))(fuzz)

            try:
                fuzz()
            except (AssertionError, FailureGroup, ExceptionGroup) as e:
                failures.append(f"{operation.label} ({mode.value}): {e}")
    assert not failures, "\n\n".join(failures)

    by_operation: collections.Counter = collections.Counter()
    for (label, _status), n in CALLS.items():
        by_operation[label] += n
    print(
        f"\n{sum(CALLS.values())} requests: {dict(sorted(by_operation.items()))}; streamed: "
        f"{dict(STREAMS)}"
    )
    assert set(by_operation) >= {op.label for op in operations}
    assert sum(CALLS.values()) >= MIN_REQUESTS, dict(by_operation)
    assert not [key for key in CALLS if key[1] >= 500]

    assert requests.get(server + "/health", timeout=30).status_code == 200
    for (
        sid
    ) in OPENED_SESSIONS:  # an open session's finished turns pin their KV (404: the fuzz closed it)
        assert requests.post(
            server + "/close_session", json={"session_id": sid}, timeout=30
        ).status_code in (200, 404)
    # Nothing leaked: once idle and flushed, every KV slot is free (a request the fuzz
    # abandoned may still be finishing: wait for it, up to a deadline).
    deadline = time.monotonic() + 60
    while True:
        flushed = requests.post(server + "/flush_cache", timeout=30).json()["success"]
        info = requests.get(server + "/get_server_info", timeout=30).json()
        if flushed and info["available_kv_tokens"] == info["max_total_tokens"]:
            break
        assert time.monotonic() < deadline, f"the KV pool is not whole after the fuzz: {info}"
        time.sleep(0.2)
    assert (
        info["num_running_reqs"] == 0
        and info["num_waiting_reqs"] == 0
        and info["num_open_sessions"] == 0
    )


# ---------------------------------------------------------------------------- regressions
# What the fuzz found, each with the exact body it sent; every answer must also be what the
# schema declares (status, content type, body).


def assert_declared(openapi: dict, method: str, path: str, resp: requests.Response) -> None:
    """The answer is one the operation declares: its status, its content type, and (JSON) a
    body matching the declared schema."""
    responses = openapi["paths"][path][method]["responses"]
    assert str(resp.status_code) in responses, (resp.status_code, sorted(responses))
    media = resp.headers["content-type"].split(";")[0].strip()
    content = responses[str(resp.status_code)]["content"]
    assert media in content, (media, sorted(content))
    if media == "application/json":
        schema = {**content[media]["schema"], "components": openapi["components"]}
        jsonschema.Draft202012Validator(schema).validate(resp.json())
    for name, header in responses[str(resp.status_code)].get("headers", {}).items():
        assert not header.get("required") or name in resp.headers, (name, dict(resp.headers))


def test_completion_echo_of_token_ids_out_of_the_vocabulary_is_a_400(server, openapi):
    """Was a 500: echo decoded the prompt's token ids before the engine checked them, and the
    tokenizer overflowed on 99999999999."""
    body = {
        "budget_aware": None,
        "prompt": [
            99999999999,
            -681,
            1013589942421990,
            -9858,
            -8195,
            4881212,
            15737685,
            879,
            129519,
            15,
            -37937820,
            14884034061,
            21407,
            -7863,
            4939853,
            99020,
        ],
        "echo": True,
        "repetition_penalty": None,
    }
    resp = requests.post(server + "/v1/completions", json=body, timeout=60)
    assert_error(resp, 400, "prompt")
    assert_declared(openapi, "post", "/v1/completions", resp)
    batch = requests.post(
        server + "/v1/completions", json={"prompt": [[1, 2], [3, 49152]], "echo": True}, timeout=60
    )
    assert_error(batch, 400, "prompt")
    ok = requests.post(
        server + "/v1/completions",
        json={"prompt": [1, 2, 3], "echo": True, "max_tokens": 2},
        timeout=60,
    )
    assert ok.status_code == 200, ok.text
    assert_declared(openapi, "post", "/v1/completions", ok)


def test_extract_for_an_unknown_model_is_a_declared_404(server, openapi):
    """Was undocumented: /v1/extract answers 404 for a model it does not serve."""
    body = {
        "instructions": None,
        "max_tokens": 1,
        "messages": [],
        "model": "",
        "schema": {},
        "seed": None,
        "temperature": None,
        "text": None,
    }
    resp = requests.post(server + "/v1/extract", json=body, timeout=60)
    assert_error(resp, 404, "model")
    assert_declared(openapi, "post", "/v1/extract", resp)


def test_a_streamed_chat_completion_is_a_declared_event_stream(server, openapi):
    """Was undocumented: `stream: true` answers text/event-stream, which the operation did not
    declare. Now declared, each event's JSON a `chat.completion.chunk`. (The fuzz's body, less
    the fields whose values its report withheld; max_tokens keeps the answer short.)"""
    body = {
        "model": None,
        "n": 1,
        "stream": True,
        "stream_options": None,
        "logit_bias": {},
        "messages": [{"role": "tool"}],
        "logprobs": False,
        "top_logprobs": 0,
        "response_format": None,
        "tools": [],
        "tool_choice": None,
        "separate_reasoning": True,
        "max_tokens": 4,
    }
    resp = requests.post(server + "/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert_declared(openapi, "post", "/v1/chat/completions", resp)
    data = openapi["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"][
        "text/event-stream"
    ]
    (json_branch,) = [
        b for b in data["itemSchema"]["properties"]["data"]["anyOf"] if "contentSchema" in b
    ]
    events = list(sse_events(resp))
    assert events[-1] == "[DONE]" and len(events) > 1
    for event in events[:-1]:
        jsonschema.Draft202012Validator(json_branch["contentSchema"]).validate(event)
        assert event["object"] == "chat.completion.chunk"


def test_the_declared_sampling_params_are_the_engines():
    """/generate's schema lists `sampling_params`' keys (the fuzz generates them from it); the
    engine checks the dict itself, so the two lists must not drift apart."""
    from sgl.runtime.sampling import SamplingParams
    from sgl.server.protocol import SamplingParamsSpec

    assert list(SamplingParamsSpec.model_fields) == SamplingParams.field_names()
    defaults = SamplingParams()
    for name, field in SamplingParamsSpec.model_fields.items():
        assert field.default == getattr(defaults, name), name


def test_every_operation_declares_what_any_route_may_answer(fuzz_engine, openapi):
    """401 without the key (all but /health; /metrics too, as guarded here), 413 for a body over the
    cap, 503 with Retry-After while the server drains (all but the paths that stay open): each
    operation answers them, and declares them (the fuzz's server has no key, no small cap, no
    drain). (429, at capacity, needs requests held in flight: test_server_admission has it; its body
    is the same error response, declared by the same table.)"""
    app = create_app(
        fuzz_engine, MODEL, api_key="k", max_request_bytes=1024, metrics_require_api_key=True
    )
    key = {"Authorization": "Bearer k"}
    with ServerThread(app) as url:
        for path, ops in openapi["paths"].items():
            for method in ops:
                no_key = requests.request(method, url + path, timeout=30)
                assert no_key.status_code == (200 if path == "/health" else 401), (
                    path,
                    no_key.text,
                )
                assert_declared(openapi, method, path, no_key)
                too_large = requests.request(
                    method, url + path, data=b"x" * 2048, headers=key, timeout=30
                )
                assert_error(too_large, 413)
                assert_declared(openapi, method, path, too_large)
        app.state.sgl.lifecycle.start_drain()
        for path, ops in openapi["paths"].items():
            for method in ops:
                if path in ALWAYS_OPEN and path != "/health":  # /health itself says 503
                    # open while draining: a supervisor reads them, a client cancels its work
                    continue
                draining = requests.request(method, url + path, json={}, headers=key, timeout=30)
                assert_error(draining, 503)
                assert draining.headers["Retry-After"].isdigit()
                assert_declared(openapi, method, path, draining)


def test_a_profile_directory_the_file_system_cannot_take_is_a_400(server, openapi):
    """The fuzz's output_dir (control characters) made the profiler write its trace under
    another name (it drops them) while /stop_profile said "trace written to" the asked one; a
    NUL byte was a 500; a component over 255 bytes faulted the engine (every request a 503
    after). Now each is a 400 naming the field, and a trace is where the answer says."""
    for name in ("¶\U0006d22f\n\x1f@Î\x08r«\U000fa6e6", "a\x00b", "a" * 300, "é" * 200):
        resp = requests.post(server + "/start_profile", json={"output_dir": name}, timeout=60)
        assert_error(resp, 400, "output_dir")
        assert_declared(openapi, "post", "/start_profile", resp)
    assert requests.get(server + "/health", timeout=30).status_code == 200
    started = requests.post(server + "/start_profile", json={"output_dir": "fuzz/é"}, timeout=60)
    assert started.status_code == 200, started.text
    stopped = requests.post(server + "/stop_profile", timeout=60)
    assert stopped.status_code == 200, stopped.text
    trace = stopped.json()["message"].removeprefix("trace written to ")
    assert os.path.isfile(trace) and os.sep + os.path.join("fuzz", "é") + os.sep in trace


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/generate", {"text": "x\ud800y", "sampling_params": {"max_new_tokens": 2}}, "text"),
        (
            "/generate",
            {"text": "x", "sampling_params": {"max_new_tokens": 2, "stop": ["\udc00"]}},
            "sampling_params",
        ),
        ("/tokenize", {"text": ["a", "x\ud800y"]}, "text"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x\ud800y"}], "max_tokens": 2},
            "messages",
        ),
        ("/v1/completions", {"prompt": "x\ud800y", "max_tokens": 2, "echo": True}, "prompt"),
        ("/v1/extract", {"text": "\udc00", "schema": {}}, "text"),
        (
            "/run_program",
            {"program": {"format_version": 1, "nodes": [{"type": "text", "text": "\ud800"}]}},
            "program",
        ),
        ("/open_session", {"session_id": "x\ud800y"}, "session_id"),
        ("/close_session", {"session_id": "\udc00"}, "session_id"),
        ("/abort_request", {"rid": "\udc00"}, "rid"),
        ("/start_profile", {"output_dir": "x\ud800y"}, "output_dir"),
    ],
)
def test_a_string_that_is_not_unicode_is_a_400_naming_the_field(server, openapi, path, body, param):
    """Was a 500 (the tokenizer, the file system or the answer's JSON failed on it): a lone
    surrogate, which a JSON `\\ud800` escape carries. Found probing beside the fuzz, whose
    generated strings are valid Unicode."""
    resp = requests.post(
        server + path,
        data=json.dumps(body),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    err = assert_error(resp, 400, param)
    assert "not valid Unicode" in err["message"]
    assert_declared(openapi, "post", path, resp)
