"""Streaming (`run(stream=True)`) against the fake backend: pieces, variables, errors."""

from __future__ import annotations

import asyncio
import threading

import pytest
from lang_fakes import FakeBackend, FakeBackendError, split_pieces, within

import sgl

REPLY = "The quick brown fox"  # streamed by the fake in 3 pieces


def _qa():
    @sgl.function
    def prog(s, q):
        s += "Q: " + q + "\nA:" + sgl.gen("a")
        s += "\nMore:" + sgl.gen("b", max_tokens=6)

    return prog


def _gated_backend(**kwargs):
    """A fake whose streamed generations wait for `gate` (set by the test)."""
    gate = threading.Event()

    def wait(call):
        if call.kind == "generate_stream":
            assert gate.wait(5), "the test never opened the gate"

    return FakeBackend(default=REPLY, on_call=wait, **kwargs), gate


@within(10)
def test_stream_run_returns_before_the_backend_finishes():
    fake, gate = _gated_backend()
    state = _qa().run("hi", stream=True, backend=fake)
    # run returned while the first generation is still blocked in the backend.
    assert not gate.is_set()
    assert all(c.result is None for c in fake.gen_calls)
    gate.set()
    pieces = list(state.text_iter())
    assert len(pieces) > 3
    assert "".join(pieces) == state.text() == f"Q: hi\nA:{REPLY}\nMore:{REPLY[:6]}"
    assert state["a"] == REPLY and state["b"] == REPLY[:6]
    assert state.get_meta_info("a")["finish_reason"] == {"type": "stop", "matched": None}
    assert state.get_meta_info("b")["finish_reason"] == {"type": "length", "length": 6}
    assert [c.kind for c in fake.gen_calls] == ["generate_stream", "generate_stream"]


@within(10)
def test_text_iter_of_one_variable():
    fake = FakeBackend(default=REPLY)
    state = _qa().run("hi", stream=True, backend=fake)
    pieces = list(state.text_iter("a"))
    assert pieces == split_pieces(REPLY, 3)
    assert "".join(pieces) == state["a"]


@within(10)
def test_text_async_iter():
    fake = FakeBackend(default=REPLY)
    state = _qa().run("hi", stream=True, backend=fake)

    async def collect(var=None):
        return [p async for p in state.text_async_iter(var)]

    pieces = asyncio.run(collect())
    assert "".join(pieces) == state.text()

    state = _qa().run("hi", stream=True, backend=fake)
    assert asyncio.run(collect("b")) == split_pieces(REPLY[:6], 3)


@within(10)
def test_text_iter_can_be_read_more_than_once():
    fake = FakeBackend(default=REPLY)
    state = _qa().run("hi", stream=True, backend=fake)
    everything = list(state.text_iter())
    assert "".join(everything) == state.text()
    # A second reader sees the same pieces, not an empty stream.
    assert list(state.text_iter()) == everything
    assert "".join(state.text_iter("a")) == REPLY


@within(10)
def test_two_concurrent_readers_each_get_every_piece():
    fake, gate = _gated_backend()
    state = _qa().run("hi", stream=True, backend=fake)
    results: dict[str, list[str]] = {}

    def read(key, var):
        results[key] = list(state.text_iter(var))

    readers = [
        threading.Thread(target=read, args=("all", None)),
        threading.Thread(target=read, args=("a", "a")),
    ]
    for t in readers:
        t.start()
    gate.set()
    for t in readers:
        t.join(5)
    assert "".join(results["all"]) == state.text()
    assert "".join(results["a"]) == REPLY


@within(10)
def test_stream_state_read_waits_for_the_whole_program():
    """Reading a streamed state from outside (text(), sync(), s[...]) waits for the program
    body to finish, not only for what it has submitted so far."""
    body_gate = threading.Event()

    @sgl.function
    def prog(s):
        s += "a"
        assert body_gate.wait(5)
        s += "b" + sgl.gen("v")

    threading.Timer(0.2, body_gate.set).start()
    state = prog.run(stream=True, backend=FakeBackend(default="c"))
    assert state.text() == "abc"
    assert state["v"] == "c"


@within(10)
def test_stream_error_raised_by_text_iter_and_sync():
    fake = FakeBackend(default=REPLY, fail_on=lambda call: call.text.endswith("More:"))
    state = _qa().run("hi", stream=True, backend=fake)
    pieces = []
    with pytest.raises(sgl.ProgramError) as info:
        for piece in state.text_iter():
            pieces.append(piece)
    assert isinstance(info.value.__cause__, FakeBackendError)
    assert "".join(pieces).endswith(REPLY + "\nMore:")
    with pytest.raises(sgl.ProgramError):
        state.sync()
    with pytest.raises(sgl.ProgramError):
        list(state.text_iter("b"))
    assert isinstance(state.error, FakeBackendError)


@within(10)
def test_stream_error_raised_by_sync_without_reading_the_stream():
    body_gate = threading.Event()

    @sgl.function
    def prog(s):
        s += "x"
        assert body_gate.wait(5)
        s += "y" + sgl.gen("v")

    threading.Timer(0.2, body_gate.set).start()
    fake = FakeBackend(fail_on=lambda call: call.kind.startswith("generate"))
    state = prog.run(stream=True, backend=fake)
    with pytest.raises(sgl.ProgramError) as info:
        state.sync()
    assert isinstance(info.value.__cause__, FakeBackendError)


@within(10)
def test_stream_body_exception():
    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("v")
        raise LookupError("body failed")

    state = prog.run(stream=True, backend=FakeBackend())
    with pytest.raises(sgl.ProgramError) as info:
        list(state.text_iter())
    assert isinstance(info.value.__cause__, LookupError)
    with pytest.raises(sgl.ProgramError):
        state.text()


@within(10)
def test_stream_with_fork_and_select():
    @sgl.function
    def prog(s):
        s += "Pick:" + sgl.select("c", choices=["red", "blue"])
        forks = s.fork(2)
        forks += lambda i: f" [{i}]" + sgl.gen("v", max_tokens=2)
        forks.join("concate_and_append")

    fake = FakeBackend(default="okay", table={"red": [-2.0], "blue": [-0.5]})
    state = prog.run(stream=True, backend=fake)
    pieces = list(state.text_iter())
    assert "".join(pieces) == state.text() == "Pick:blue [0]ok [1]ok"
    assert list(state.text_iter("c")) == ["blue"]


@within(10)
def test_text_iter_without_stream_yields_the_final_text_once():
    state = _qa().run("hi", backend=FakeBackend(default=REPLY))
    assert list(state.text_iter()) == [state.text()]
    assert list(state.text_iter("a")) == [REPLY]


def test_run_batch_precaches_only_when_global_config_says_so():
    from lang_fakes import FakeBackend

    import sgl

    @sgl.function
    def prog(s, q):
        s += "A long constant instruction. Q: " + q + sgl.gen("a", max_tokens=3)

    fake = FakeBackend()
    prog.run_batch([{"q": "1"}, {"q": "2"}], backend=fake)
    assert len(fake.of_kind("cache_prefix")) == 1
    sgl.global_config.enable_precache_with_tracing = False
    try:
        fake = FakeBackend()
        prog.run_batch([{"q": "1"}, {"q": "2"}], backend=fake)
        assert fake.of_kind("cache_prefix") == []
    finally:
        sgl.global_config.enable_precache_with_tracing = True
