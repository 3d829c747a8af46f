"""Admission limits, refusals and faults as a client sees them: size limits are a 413 naming
the field, a full queue a 429 with Retry-After (nothing queued), an engine fault a 500
naming an incident, after which /health and new requests get 503 while the KV pool is whole
again; an unknown session a 404.

A tiny random-weight model serves them: these are properties of the server, not the model.
To hold requests in flight without racing a timer, the scheduler's forward step waits on an
event the test sets (`held`)."""

from __future__ import annotations

import json
import logging
import threading
from contextlib import contextmanager

import pytest
import requests
from server_helpers import ServerThread, assert_error, sse_lines, wait_until

import sgl
from sgl.server import create_app

pytestmark = pytest.mark.integration
LIMITS = dict(max_n=2, max_top_logprobs=2, max_prompt_tokens=40, max_new_tokens_limit=8)
SECRET = "/srv/secret/weights.bin"


def _engine(**kwargs) -> sgl.Engine:
    return sgl.Engine(
        model_path="tiny-llama", load_format="dummy", max_total_tokens=1024, random_seed=0, **kwargs
    )


@pytest.fixture(scope="module")
def limited():
    engine = _engine(max_running_requests=1, max_queued_requests=1, **LIMITS)
    engine.test_app = create_app(engine, "m", max_request_bytes=4096)
    with ServerThread(engine.test_app) as url:
        yield engine, url
    engine.shutdown()


@contextmanager
def held(engine):
    """Every forward step waits until the block ends: requests stay in flight meanwhile."""
    release = threading.Event()

    def hold(forward):
        def waiting_forward(*args, **kwargs):
            release.wait()
            return forward(*args, **kwargs)

        return waiting_forward

    try:
        with engine.debug_wrap("forward", hold):
            yield
    finally:
        release.set()


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/generate", {"text": "a", "sampling_params": {"n": 3, "max_new_tokens": 2}}, "n"),
        ("/generate", {"text": "a " * 60, "sampling_params": {"max_new_tokens": 2}}, "prompt"),
        ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 9}}, "max_new_tokens"),
        (
            "/generate",
            {
                "text": "a",
                "sampling_params": {"max_new_tokens": 2},
                "return_logprob": True,
                "top_logprobs_num": 3,
            },
            "top_logprobs_num",
        ),
        (
            "/generate",
            {"text": ["a", "b", "c"], "sampling_params": {"max_new_tokens": 2}},
            "prompt",
        ),
        ("/v1/completions", {"prompt": "a", "n": 3, "max_tokens": 2}, "n"),
        ("/v1/completions", {"prompt": "a", "max_tokens": 9}, "max_tokens"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "max_tokens": 9},
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "a"}],
                "max_tokens": 2,
                "logprobs": True,
                "top_logprobs": 3,
            },
            "top_logprobs",
        ),
    ],
)
def test_a_request_over_a_size_limit_is_a_413_naming_the_field(limited, path, body, param):
    _, url = limited
    err = assert_error(requests.post(url + path, json=body, timeout=60), 413, param)
    assert "this server takes at most" in err["message"] or "in flight" in err["message"]


def test_a_body_over_the_byte_cap_is_a_413_with_or_without_its_length(limited):
    _, url = limited
    big = {"text": "x" * 5000, "sampling_params": {"max_new_tokens": 1}}
    err = assert_error(requests.post(url + "/generate", json=big, timeout=60), 413)
    assert "4096 bytes" in err["message"]

    def chunks():  # no Content-Length: the cap is found while reading
        data = json.dumps(big).encode()
        for i in range(0, len(data), 1000):
            yield data[i : i + 1000]

    assert_error(
        requests.post(
            url + "/generate",
            data=chunks(),
            headers={"Content-Type": "application/json"},
            timeout=60,
        ),
        413,
    )
    ok = requests.post(
        url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 1}}, timeout=60
    )
    assert ok.status_code == 200, ok.text


def test_a_full_queue_is_a_429_with_retry_after_and_queues_nothing(limited):
    engine, url = limited
    body = {"text": "a", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    results: list[requests.Response] = []
    with held(engine):
        threads = [
            threading.Thread(
                target=lambda: results.append(
                    requests.post(url + "/generate", json=body, timeout=120)
                )
            )
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        assert wait_until(lambda: engine.debug_state()["in_flight"] == 2, timeout=60, interval=0.02)
        for path, extra in (
            ("/generate", body),
            ("/v1/completions", {"prompt": "a", "max_tokens": 2}),
            (
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "a"}], "max_tokens": 2, "stream": True},
            ),
        ):
            r = requests.post(url + path, json=extra, timeout=60)
            err = assert_error(r, 429)
            assert err["type"] == "rate_limit_error" and "capacity" in err["message"]
            assert int(r.headers["Retry-After"]) >= 1
        assert engine.debug_state()["in_flight"] == 2  # the refused ones were never queued
    for t in threads:
        t.join(timeout=120)
    assert [r.status_code for r in results] == [200, 200]
    assert requests.post(url + "/generate", json=body, timeout=60).status_code == 200
    metrics = requests.get(url + "/metrics", timeout=30).text
    counted = [
        line
        for line in metrics.splitlines()
        if line.startswith("sgl:num_refused_requests_total{") and 'code="429"' in line
    ]
    assert counted and int(counted[0].split()[-1]) >= 3


def test_a_turn_of_an_unknown_session_is_a_404(limited):
    _, url = limited
    body = {
        "text": "a",
        "sampling_params": {"max_new_tokens": 2},
        "session_params": {"id": "gone-after-restart"},
    }
    err = assert_error(
        requests.post(url + "/generate", json=body, timeout=60), 404, "session_params.id"
    )
    assert "restart" in err["message"]


@pytest.fixture()
def faulty():
    """A server whose engine raises inside its forward step for the request with rid 'boom'."""
    engine = _engine()

    def fail_boom(forward):
        def forward_or_fail(step, *args, **kwargs):
            if any(r.rid == "boom" for r in step.reqs):
                raise RuntimeError(f"cannot read {SECRET}")
            return forward(step, *args, **kwargs)

        return forward_or_fail

    with engine.debug_wrap("forward", fail_boom), ServerThread(create_app(engine, "m")) as url:
        yield engine, url
    engine.shutdown()


def _incident(err: dict) -> str:
    assert (
        err["code"] == 500 and SECRET not in err["message"] and "RuntimeError" not in err["message"]
    )
    return err["message"].split("incident ")[1].split(";")[0].split(")")[0]


def test_an_engine_fault_is_an_incident_then_the_server_reports_unhealthy(faulty, caplog):
    engine, url = faulty
    assert requests.get(url + "/health", timeout=10).status_code == 200
    streaming = {
        "text": "a",
        "sampling_params": {"max_new_tokens": 200, "ignore_eos": True},
        "stream": True,
        "rid": "bystander",
    }
    with caplog.at_level(logging.ERROR):
        with requests.post(
            url + "/generate", json=streaming, stream=True, timeout=120
        ) as bystander:
            lines = sse_lines(bystander)
            assert next(line for line in lines if line)  # the bystander is running
            r = requests.post(
                url + "/generate",
                json={"text": "b", "sampling_params": {"max_new_tokens": 2}, "rid": "boom"},
                timeout=60,
            )
            incident = _incident(assert_error(r, 500))
            rest = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert (
        rest and _incident(rest[-1]["error"]) == incident
    )  # the stream in flight failed with it, reported
    logged = [rec for rec in caplog.records if incident in rec.getMessage() and rec.exc_info]
    assert logged and SECRET in str(logged[0].exc_info[1])

    health = requests.get(url + "/health", timeout=10)
    assert incident in assert_error(health, 503)["message"]
    refused = requests.post(
        url + "/generate", json={"text": "c", "sampling_params": {"max_new_tokens": 2}}, timeout=60
    )
    assert (
        incident in assert_error(refused, 503)["message"]
        and int(refused.headers["Retry-After"]) >= 1
    )
    info = requests.get(
        url + "/get_server_info", timeout=10
    ).json()  # still answers, for the operator
    assert info["available_kv_tokens"] + info["radix_cache_tokens"] == info["max_total_tokens"]
    assert info["num_running_reqs"] == info["num_waiting_reqs"] == 0


def test_draining_refuses_new_work_but_finishes_what_is_in_flight(limited):
    engine, url = limited
    lifecycle = engine.test_app.state.sgl.lifecycle
    body = {"text": "a", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    result: list[requests.Response] = []
    with held(engine):
        t = threading.Thread(
            target=lambda: result.append(requests.post(url + "/generate", json=body, timeout=120))
        )
        t.start()
        assert wait_until(lambda: lifecycle.in_flight == 1, timeout=60, interval=0.02)
        lifecycle.start_drain()
        try:
            assert not lifecycle.wait_idle(0)
            assert (
                "shutting down"
                in assert_error(requests.get(url + "/health", timeout=10), 503)["message"]
            )
            refused = requests.post(url + "/generate", json=body, timeout=60)
            assert_error(refused, 503)
            assert int(refused.headers["Retry-After"]) >= 1
            # control paths still answer: a client may abort (info waits on the held scheduler)
            assert (
                requests.post(
                    url + "/abort_request", json={"rid": "nothing"}, timeout=10
                ).status_code
                == 200
            )
        except BaseException:
            lifecycle.draining = False
            raise
    t.join(timeout=120)
    try:
        assert lifecycle.wait_idle(60)
        assert (
            result[0].status_code == 200 and result[0].json()["meta_info"]["completion_tokens"] == 4
        )
        assert (
            requests.get(url + "/get_server_info", timeout=10).status_code == 200
        )  # an operator may look
    finally:
        lifecycle.draining = False


def test_a_failing_query_is_the_callers_error_not_an_engine_fault(limited, tmp_path):
    engine, url = limited
    a_file = tmp_path / "trace.json"
    a_file.write_text("{}")
    with pytest.raises(sgl.runtime.errors.InvalidRequestError) as e:  # a directory under a file
        engine.start_profile(str(a_file / "sub"))
    assert e.value.param == "output_dir"
    assert engine.fault is None
    assert requests.get(url + "/health", timeout=10).status_code == 200
