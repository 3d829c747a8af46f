"""Programs through the remote backend (HTTP) against a server on the same engine.

Oracle: the same program run in process on the same engine, greedy, gives the same text,
variables and choices; the server process from `sgl.Runtime` serves programs too.
"""

from __future__ import annotations

import pytest
from oracle_helpers import kv_all_returned, wait_until
from server_helpers import ServerThread

import sgl


@pytest.fixture(scope="module")
def server_url(engine):
    from sgl.server.app import create_app

    with ServerThread(create_app(engine, "default")) as url:
        yield url


@pytest.fixture(scope="module")
def remote(server_url):
    return sgl.RuntimeEndpoint(server_url)


@pytest.fixture(scope="module")
def local(engine):
    return sgl.as_backend(engine)


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
def branches(s, mode):
    s += "Name two colors and two animals.\n" * 2
    forks = s.fork(2)
    forks += lambda i: ["Color:", "Animal:"][i] + sgl.gen("item", max_tokens=6, stop="\n")
    forks.join(mode=mode)


def _same(a: sgl.ProgramState, b: sgl.ProgramState) -> None:
    assert a.text() == b.text()
    assert a.messages() == b.messages()
    assert a.stream_executor.variables == b.stream_executor.variables


def test_chat_select_and_forks_match_in_process(remote, local):
    _same(
        chat.run(question="Name a planet.", temperature=0, backend=remote),
        chat.run(question="Name a planet.", temperature=0, backend=local),
    )
    r = classify.run(text="Great food, lovely staff.", temperature=0, backend=remote)
    lo = classify.run(text="Great food, lovely staff.", temperature=0, backend=local)
    _same(r, lo)
    assert r.get_meta_info("label")["normalized_prompt_logprobs"] == pytest.approx(
        lo.get_meta_info("label")["normalized_prompt_logprobs"], abs=1e-4
    )
    for mode in ("gather_variable", "concate_and_append"):
        _same(
            branches.run(mode=mode, temperature=0, backend=remote),
            branches.run(mode=mode, temperature=0, backend=local),
        )


def test_streaming_over_http(remote, local):
    state = chat.run(question="Name a fruit.", temperature=0, stream=True, backend=remote)
    pieces = list(state.text_iter())
    assert len(pieces) > 2
    assert (
        "".join(pieces)
        == state.text()
        == chat.run(question="Name a fruit.", temperature=0, backend=local).text()
    )


def test_run_batch_over_http(remote, local):
    items = [
        {"question": f"Give a word that rhymes with {w}."} for w in ("cat", "sun", "tree", "cake")
    ]
    remote_states = chat.run_batch(items, temperature=0, backend=remote)
    local_states = chat.run_batch(items, temperature=0, backend=local)
    assert [s["answer"] for s in remote_states] == [s["answer"] for s in local_states]


def test_remote_errors_and_abandoned_streams(remote, engine):
    @sgl.function
    def bad(s):
        s += "x" + sgl.gen("v", regex="(unclosed")

    with pytest.raises(sgl.ProgramError) as err:
        bad.run(backend=remote)
    cause = err.value.__cause__
    assert cause.status == 400 and "regex" in str(cause).lower()

    # A stream abandoned after its first piece: the connection closes and the server aborts.
    pieces = remote.generate_stream(
        "Once upon a time", {"max_new_tokens": 200, "ignore_eos": True}, {}
    )
    next(pieces)
    pieces.close()
    assert wait_until(lambda: kv_all_returned(engine), timeout=30)


def test_runtime_subprocess_serves_programs():
    runtime = sgl.Runtime(model_path="default", max_total_tokens=4096)
    try:
        assert runtime.url.startswith("http://127.0.0.1:")
        state = chat.run(question="Name a color.", temperature=0, backend=runtime)
        assert state["answer"]
        assert state.get_meta_info("answer")["completion_tokens"] > 0
    finally:
        runtime.shutdown()
    assert runtime.process.poll() is not None


# the separators str.splitlines breaks at (and SSE does not): a stream split on decoded text cut
# them
SEPARATED = "a\u2028b\u0085c"


@sgl.function
def separated(s):
    s += "Write it: " + sgl.gen("x", regex=SEPARATED, max_tokens=16)


def test_streamed_text_with_unicode_line_separators_arrives_whole(remote):
    state = separated.run(temperature=0, stream=True, backend=remote)
    pieces = list(state.text_iter("x"))
    assert "".join(pieces) == state["x"] == SEPARATED
