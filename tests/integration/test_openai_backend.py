"""Programs through `sgl.OpenAI` against sgl's own `/v1/*` endpoints, and its HTTP behaviour.

Oracles: the native backend (`RuntimeEndpoint`) on the same server, greedy: a completion
model is sent the very text the native backend sends, so text, variables and choices are
equal; chat mode renders the same conversation on the server, so a gen that opens the
assistant turn is equal too. Constrained output: `re.fullmatch` and `jsonschema`. Retries:
a local stub server that fails before answering. Speculation: the same program with and
without `num_api_spec_tokens`, equal results and fewer calls and prompt tokens.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jsonschema
import pytest
from process_helpers import BLOCK_RUNTIME
from server_helpers import PERSON, ServerThread

import sgl
from sgl.lang.backends.openai_dialects import UnsupportedParameterError
from sgl.lang.backends.runtime_endpoint import RemoteError


@pytest.fixture(scope="module")
def server_url(engine):
    from sgl.server.app import create_app

    with ServerThread(create_app(engine, "default")) as url:
        yield url


@pytest.fixture(scope="module")
def native(server_url):
    return sgl.RuntimeEndpoint(server_url)


@pytest.fixture(scope="module")
def chat_api(server_url):
    return sgl.OpenAI("default", base_url=server_url + "/v1")


@pytest.fixture(scope="module")
def text_api(server_url):
    return sgl.OpenAICompatible("default", server_url + "/v1", is_chat_model=False)


# ---------------------------------------------------------------------- programs


@sgl.function
def chat(s, question):
    s += sgl.system("You are brief.")
    with s.user():
        s += question
    s += sgl.assistant(sgl.gen("answer", max_tokens=16))


@sgl.function
def classify(s, text):
    s += f"Review: {text}\nSentiment:"
    s += sgl.select("label", [" positive", " negative"])
    s += "\nConfidence (1-9): " + sgl.gen_int("score", max_tokens=2)


@sgl.function
def constrained(s):
    s += "A phone number: " + sgl.gen("phone", regex=r"\d{3}-\d{4}", max_tokens=12)
    s += "\nA person as JSON: " + sgl.gen("person", json_schema=PERSON, max_tokens=48)


@sgl.function
def chat_json(s):
    s += sgl.user("Invent a person.")
    s += sgl.assistant(sgl.gen("person", json_schema=PERSON, max_tokens=48))


@sgl.function
def chat_choice(s):
    s += sgl.user("Is the sky blue? Answer Yes or No.")
    s += sgl.assistant(sgl.select("yn", ["Yes", "No"]))


@sgl.function
def branches(s, mode):
    s += "Name two colors and two animals.\n" * 2
    forks = s.fork(2)
    forks += lambda i: ["Color:", "Animal:"][i] + sgl.gen("item", max_tokens=6, stop="\n")
    forks.join(mode=mode)


def _same(a: sgl.ProgramState, b: sgl.ProgramState) -> None:
    assert a.text() == b.text()
    assert a.messages() == b.messages()
    assert a.stream_executor.variables == b.stream_executor.variables


# ---------------------------------------------------------------------- against sgl's server


def test_detects_sgl_and_renders_roles_as_the_server(chat_api, text_api, native):
    assert chat_api.server_kind == text_api.server_kind == "sgl"
    assert chat_api.chat_template() == native.chat_template()


def test_gen_in_chat_and_completion_mode_equals_native(chat_api, text_api, native):
    want = chat.run(question="Name a planet.", temperature=0, backend=native)
    for api in (chat_api, text_api):
        got = chat.run(question="Name a planet.", temperature=0, backend=api)
        _same(got, want)
        meta = got.get_meta_info("answer")
        assert meta["finish_reason"]["type"] in ("stop", "length")
        assert meta["prompt_tokens"] > 0 and 0 < meta["completion_tokens"] <= 16


def test_select_and_dtype_equal_native_with_logprob_scoring(text_api, native):
    got = classify.run(text="Great food, lovely staff.", temperature=0, backend=text_api)
    want = classify.run(text="Great food, lovely staff.", temperature=0, backend=native)
    _same(got, want)
    meta = got.get_meta_info("label")
    assert meta["select_method"] == "logprobs"
    assert meta["normalized_prompt_logprobs"] == pytest.approx(
        want.get_meta_info("label")["normalized_prompt_logprobs"], abs=1e-3
    )
    assert re.fullmatch(r"[-+]?[0-9]{1,18}", got["score"])


def test_regex_and_json_schema_are_enforced(text_api, chat_api, native):
    got = constrained.run(temperature=0, backend=text_api)
    _same(got, constrained.run(temperature=0, backend=native))
    assert re.fullmatch(r"\d{3}-\d{4}", got["phone"])
    jsonschema.validate(json.loads(got["person"]), PERSON)
    person = chat_json.run(temperature=0, backend=chat_api)["person"]
    jsonschema.validate(json.loads(person), PERSON)


def test_select_on_chat_model_by_each_method(server_url, chat_api):
    # sgl's own roles are known, so the rendered conversation is scored exactly.
    assert chat_api.chat_template().name == "server"
    by_logprobs = chat_choice.run(temperature=0, backend=chat_api)
    assert by_logprobs.get_meta_info("yn")["select_method"] == "logprobs"
    # As an SGLang server (roles unknown): the server forces one choice by regex.
    sglang = sgl.OpenAI("default", base_url=server_url + "/v1", server_kind="sglang")
    state = chat_choice.run(temperature=0, backend=sglang)
    assert state.get_meta_info("yn")["select_method"] == "constrained"
    assert state["yn"] in ("Yes", "No")
    # As OpenAI (no constraint): generate, then the answer must match a choice exactly.
    openai_kind = sgl.OpenAI("default", base_url=server_url + "/v1", server_kind="openai")
    state = chat_choice.run(temperature=0, backend=openai_kind)
    meta = state.get_meta_info("yn")
    assert meta["select_method"] == "generation"
    assert meta["generated"].startswith(state["yn"])


def test_fork_and_run_batch_equal_native(text_api, chat_api, native):
    for mode in ("gather_variable", "concate_and_append"):
        _same(
            branches.run(mode=mode, temperature=0, backend=text_api),
            branches.run(mode=mode, temperature=0, backend=native),
        )
    questions = [{"question": q} for q in ("Name a fruit.", "Name a color.", "Name a river.")]
    got = chat.run_batch(questions, temperature=0, backend=chat_api)
    want = chat.run_batch(questions, temperature=0, backend=native)
    for a, b in zip(got, want):
        _same(a, b)


@pytest.mark.parametrize("mode", ["chat", "completion"])
def test_streaming_equals_whole(mode, chat_api, text_api):
    api = chat_api if mode == "chat" else text_api
    state = chat.run(question="Name a fruit.", temperature=0, stream=True, backend=api)
    pieces = list(state.text_iter("answer"))
    assert len(pieces) > 2
    whole = chat.run(question="Name a fruit.", temperature=0, backend=api)
    assert "".join(pieces) == state["answer"] == whole["answer"]
    assert (
        state.get_meta_info("answer")["completion_tokens"]
        == whole.get_meta_info("answer")["completion_tokens"]
    )


SEPARATED = "a\u2028b\u0085c"  # str.splitlines breaks at both; SSE does not


@sgl.function
def separated_text(s):
    s += "Write it: " + sgl.gen("x", regex=SEPARATED, max_tokens=16)


@sgl.function
def separated_chat(s):
    s += sgl.user("Write it.")
    s += sgl.assistant(sgl.gen("x", regex=SEPARATED, max_tokens=16))


@pytest.mark.parametrize("mode", ["chat", "completion"])
def test_streamed_text_with_unicode_line_separators_arrives_whole(mode, chat_api, text_api):
    program, api = (separated_chat, chat_api) if mode == "chat" else (separated_text, text_api)
    state = program.run(temperature=0, stream=True, backend=api)
    pieces = list(state.text_iter("x"))
    assert "".join(pieces) == state["x"] == SEPARATED


# ---------------------------------------------------------------------- refusals


def test_chat_model_refuses_gen_after_text_in_assistant_turn(chat_api):
    @sgl.function
    def mid_turn(s):
        s += sgl.user("Hi")
        with s.assistant():
            s += "Sure: " + sgl.gen("a", max_tokens=4)

    @sgl.function
    def outside(s):
        s += sgl.user("Hi")
        s += "Answer: " + sgl.gen("a", max_tokens=4)

    @sgl.function
    def loose(s):
        s += "Context no role carries.\n"
        s += sgl.user("Hi")
        s += sgl.assistant(sgl.gen("a", max_tokens=4))

    calls = chat_api.token_usage.snapshot()["calls"]
    for program, where in (
        (mid_turn, "after text already in the assistant turn"),
        (outside, "outside any role"),
        (loose, "text outside any role"),
    ):
        with pytest.raises(sgl.ProgramError, match="chat model") as info:
            program.run(backend=chat_api)
        assert where in str(info.value.__cause__) and "is_chat_model=False" in str(
            info.value.__cause__
        )
    assert chat_api.token_usage.snapshot()["calls"] == calls  # refused before any request


def test_unenforceable_constraints_are_refused_naming_the_parameter(server_url):
    url = server_url + "/v1"
    cases = [
        (
            sgl.OpenAI("default", base_url=url, server_kind="openai", is_chat_model=False),
            sgl.gen("x", regex=r"\d+", max_tokens=4),
            "regex",
        ),
        (
            sgl.OpenAI("default", base_url=url, server_kind="openai", is_chat_model=False),
            sgl.gen_int("x", max_tokens=4),
            "dtype=int",
        ),
        (
            sgl.OpenAI("default", base_url=url, server_kind="openai", is_chat_model=False),
            sgl.gen("x", json_schema=PERSON, max_tokens=4),
            "json_schema",
        ),
        (
            sgl.OpenAI("default", base_url=url, server_kind="llama.cpp", is_chat_model=False),
            sgl.gen("x", regex=r"\d+", max_tokens=4),
            "regex",
        ),
        (
            sgl.OpenAI("default", base_url=url, server_kind="openai", is_chat_model=False),
            sgl.gen("x", top_k=5, max_tokens=4),
            "top_k",
        ),
    ]
    for api, expr, param in cases:

        @sgl.function
        def program(s, expr=expr):
            s += "Q: " + expr

        with pytest.raises(sgl.ProgramError) as info:
            program.run(backend=api)
        cause = info.value.__cause__
        assert (
            isinstance(cause, UnsupportedParameterError) and cause.param == param.split("=")[0]
        ), cause
        assert param in str(cause)
        assert api.token_usage.snapshot()["calls"] == 0


# ---------------------------------------------------------------------- speculative execution


@sgl.function(num_api_spec_tokens=48)
def people(s, age_label):
    s += "Name: Alice\nAge: 30\nCity: Paris\n\nName: Bob\nAge: 25\nCity: London\n\nName:"
    s += (
        sgl.gen("name", max_tokens=8, stop="\n")
        + f"\n{age_label}:"
        + sgl.gen("age", max_tokens=4, stop="\n")
    )
    s += "\nCity:" + sgl.gen("city", max_tokens=8, stop="\n")


def test_speculation_saves_calls_and_prompt_tokens_with_equal_results(text_api):
    plain = sgl.function(people.func)
    text_api.token_usage.reset()
    want = plain.run(age_label="Age", temperature=0, backend=text_api)
    without = text_api.token_usage.snapshot()
    text_api.token_usage.reset()
    got = people.run(age_label="Age", temperature=0, backend=text_api)
    with_spec = text_api.token_usage.snapshot()
    _same(got, want)
    assert without["calls"] == 3 and with_spec["calls"] == 1
    assert with_spec["prompt_tokens"] < without["prompt_tokens"] / 2
    assert got.get_meta_info("city")["speculative"] is True


def test_speculation_that_does_not_hold_makes_a_new_call(text_api):
    # The model writes "Age:", the program "Years:": the age gen cannot come from the speculation.
    plain = sgl.function(people.func)
    want = plain.run(age_label="Years", temperature=0, backend=text_api)
    text_api.token_usage.reset()
    got = people.run(age_label="Years", temperature=0, backend=text_api)
    _same(got, want)
    assert text_api.token_usage.snapshot()["calls"] >= 2


# ---------------------------------------------------------------------- retries (a local stub)


class _Stub:
    """An OpenAI-ish server on 127.0.0.1 answering from a script of (status, headers) before a
    200."""

    def __init__(self, failures: list[tuple[int, dict[str, str]]]) -> None:
        self.failures = list(failures)
        self.requests: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                stub.requests.append(
                    json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                )
                if stub.failures:
                    status, headers = stub.failures.pop(0)
                    payload = json.dumps(
                        {"error": {"message": "busy", "type": "server_error"}}
                    ).encode()
                else:
                    status, headers = 200, {}
                    payload = json.dumps(
                        {
                            "id": "c1",
                            "object": "text_completion",
                            "choices": [{"index": 0, "text": " 4", "finish_reason": "stop"}],
                            "usage": {
                                "prompt_tokens": 5,
                                "completion_tokens": 2,
                                "total_tokens": 7,
                            },
                        }
                    ).encode()
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Stub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@sgl.function
def arithmetic(s):
    s += "2 + 2 =" + sgl.gen("a", max_tokens=2)


def test_retries_429_and_503_then_answers():
    with _Stub([(429, {"Retry-After": "0"}), (503, {})]) as stub:
        api = sgl.OpenAI(
            "m", base_url=stub.url, server_kind="openai", is_chat_model=False, retry_backoff=0.001
        )
        state = arithmetic.run(temperature=0, backend=api)
        assert state["a"] == " 4"
        assert len(stub.requests) == 3 and stub.requests[0] == stub.requests[2]
        assert api.token_usage.snapshot() == {
            "calls": 1,
            "prompt_tokens": 5,
            "completion_tokens": 2,
            "retries": 2,
        }


def test_gives_up_after_max_retries_and_never_retries_a_400():
    with _Stub([(503, {})] * 3) as stub:
        api = sgl.OpenAI(
            "m",
            base_url=stub.url,
            server_kind="openai",
            is_chat_model=False,
            retry_backoff=0.001,
            max_retries=1,
        )
        with pytest.raises(sgl.ProgramError) as info:
            arithmetic.run(backend=api)
        assert isinstance(info.value.__cause__, RemoteError) and info.value.__cause__.status == 503
        assert len(stub.requests) == 2
    with _Stub([(400, {})]) as stub:
        api = sgl.OpenAI(
            "m", base_url=stub.url, server_kind="openai", is_chat_model=False, retry_backoff=0.001
        )
        with pytest.raises(sgl.ProgramError) as info:
            arithmetic.run(backend=api)
        assert info.value.__cause__.status == 400 and len(stub.requests) == 1


def test_example_runs_against_the_server(server_url):
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "openai_backend.py"
    proc = subprocess.run(
        [sys.executable, str(example), "--base-url", server_url + "/v1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = {line.split(":", 1)[0]: line for line in proc.stdout.splitlines()}
    assert lines["server kind"].endswith("sgl")
    assert "by logprobs" in lines["select"]
    assert "'calls': 1" in lines["3 gens, speculative"]
    assert "first thing in an assistant turn" in lines["refused"]


# ---------------------------------------------------------------------- the bare package


def test_programs_run_with_the_frontend_alone(server_url):
    """What `pip install sgl` gives (no torch, transformers, numpy, fastapi...: made unimportable
    here) runs programs against a server, natively (a shipped batch included) and through /v1."""
    program = (
        BLOCK_RUNTIME
        + f"""
import json, re, sgl

@sgl.function
def prog(s, topic):
    s += "A number about " + topic + ": " + sgl.gen("n", regex="[0-9]{{1,3}}", max_tokens=4)
    s += "\\nIs it big? " + sgl.select("big", choices=["yes", "no"])
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += " Fact " + str(i) + ":" + sgl.gen("fact", max_tokens=3)

@sgl.function
def chat(s):
    s += sgl.user("Say hi") + sgl.assistant(sgl.gen("reply", max_tokens=4))

native = sgl.RuntimeEndpoint({server_url!r})
one = prog.run(topic="cats", backend=native, temperature=0)
batch = prog.run_batch([{{"topic": t}} for t in ("dogs", "owls")], backend=native, ship=True,
                       temperature=0)
reply = chat.run(backend=sgl.OpenAI("default", base_url={server_url + "/v1"!r}), temperature=0)
print(json.dumps({{"n": [one["n"]] + [b["n"] for b in batch],
                  "big": [one["big"]] + [b["big"] for b in batch],
                  "reply": reply["reply"]}}))
"""
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(out["n"]) == 3 and all(re.fullmatch(r"[0-9]{1,3}", n) for n in out["n"]), out
    assert all(b in ("yes", "no") for b in out["big"]) and isinstance(out["reply"], str)
