"""A client that leaves while its request is still being built, or while its constraint
compiles in the scheduler, stops it before anything reaches the scheduler, or at the latest
before it runs: nothing a cancelled request submitted ever finishes with 'stop' or 'length'.

Deterministic: the build (tokenizing) or the compile is made to block on an event, the
cancellation happens while it blocks, and only then is it released. Observed through the
engine's own boundary: the messages sent to the scheduler (the test hook
`engine.debug_wrap("send", ...)`) and its finish events."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future

import pytest
from tiny_models import save_tiny_engine_dir

import sgl
from sgl.lang.backends.engine import EngineBackend
from sgl.runtime.errors import InvalidRequestError
from sgl.runtime.messages import ReqEvent, SubmitRequest
from sgl.server.extract import _CancellableBackend, _Cancelled, _run
from sgl.server.protocol import ExtractRequest
from sgl.server.streaming import until_disconnected

TIMEOUT = 60


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path, _hf = save_tiny_engine_dir(
        tmp_path_factory.mktemp("tiny-extract-cancel"), 320, max_position_embeddings=1024
    )
    with sgl.Engine(model_path=str(path), max_total_tokens=2048) as e:
        finished: list[ReqEvent] = []
        e.add_finish_listener(finished.append)
        e.test_finished = finished  # type: ignore[attr-defined]
        yield e


@pytest.fixture
def hooks():
    """Test hooks (`engine.debug_wrap`) entered on this stack stay until the test ends."""
    with contextlib.ExitStack() as stack:
        yield stack


@pytest.fixture
def watch(engine, hooks):
    """(submitted requests, finish events) from here on."""
    submitted: list = []

    def record(real_send):
        def send(msg):
            if isinstance(msg, SubmitRequest):
                submitted.append(msg.request)
            real_send(msg)

        return send

    hooks.enter_context(engine.debug_wrap("send", record))
    engine.test_finished.clear()
    return submitted, engine.test_finished


class Gate:
    """Wraps a function so that its first call blocks until `release()`."""

    def __init__(self, fn):
        self.fn = fn
        self.entered = threading.Event()
        self.released = threading.Event()
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            assert self.released.wait(TIMEOUT)
        return self.fn(*args, **kwargs)

    def release(self) -> None:
        self.released.set()


def schema(n: int) -> dict:
    """A schema no earlier test compiled (the compiler caches by spec)."""
    return {
        "type": "object",
        "properties": {f"k{n}": {"type": "string", "maxLength": 8}},
        "required": [f"k{n}"],
        "additionalProperties": False,
    }


def run_extraction(engine, backend, n: int) -> threading.Thread:
    req = ExtractRequest.model_validate(
        {"text": "Write anything.", "schema": schema(n), "max_tokens": 24}
    )
    result: dict = {}

    def target() -> None:
        try:
            result["out"] = _run(None, req, [{"role": "user", "content": req.text}], backend)
        except BaseException as e:  # checked by the test
            result["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.result = result  # type: ignore[attr-defined]
    t.start()
    return t


def wait_for(condition, timeout: float = TIMEOUT) -> bool:
    done = threading.Event()
    for _ in range(int(timeout / 0.05)):
        if condition():
            return True
        done.wait(0.05)
    return condition()


def ran_to_an_end(events: list[ReqEvent]) -> list[ReqEvent]:
    return [e for e in events if e.finish is not None and e.finish.type in ("stop", "length")]


def idle(engine) -> bool:
    info = engine.get_server_info()
    return (
        info["num_running_reqs"] == 0
        and info["num_waiting_reqs"] == 0
        and info["num_open_sessions"] == 0
    )


def gate_scheduler_compiles(engine, hooks) -> Gate:
    """Make the scheduler's next constraint compile block on a gate (thread mode: the test hook
    wraps the scheduler's constraint compiler, which a first constrained request builds)."""
    engine.generate("x", {"max_new_tokens": 1, "regex": "a"})
    gate = None

    def gated(real_compile_async):
        nonlocal gate
        gate = Gate(lambda kind, spec: real_compile_async(kind, spec).result())

        def compile_async(kind, spec):
            fut: Future = Future()

            def run() -> None:
                try:
                    fut.set_result(gate(kind, spec))
                except BaseException as e:
                    fut.set_exception(e)

            threading.Thread(target=run, daemon=True).start()
            return fut

        return compile_async

    hooks.enter_context(engine.debug_wrap("compile_async", gated))
    return gate


def test_extraction_cancelled_while_its_schema_compiles_never_runs(engine, watch, hooks):
    gate = gate_scheduler_compiles(engine, hooks)
    submitted, finished = watch
    submitted.clear()
    assert wait_for(lambda: len(finished) == 1)  # the warm-up compile's request
    finished.clear()
    backend = _CancellableBackend(EngineBackend(engine))
    t = run_extraction(engine, backend, 1)
    assert gate.entered.wait(TIMEOUT), (
        t.result
    )  # the program's gen is in the scheduler, compiling its schema
    backend.cancel()  # the client left: its request is aborted while it compiles
    gate.release()
    t.join(TIMEOUT)
    assert not t.is_alive()
    assert isinstance(t.result.get("error"), _Cancelled), t.result
    assert len(submitted) == 1  # the gen that was compiling, and nothing after the cancellation
    assert ran_to_an_end(finished) == []
    assert [e.rid for e in finished] == [submitted[0].rid] and finished[0].finish.is_abort
    assert idle(engine)  # its session was closed too


def test_extraction_cancelled_while_the_engine_builds_its_request_never_runs(
    engine, watch, monkeypatch
):
    """The cancellation comes after the backend's check, while `engine.generate` itself is
    building the request: the closed session makes the scheduler reject the turn, and the
    program's retry without a session meets the cancellation."""
    submitted, finished = watch
    gate = Gate(engine.encode)
    monkeypatch.setattr(engine, "encode", gate)
    backend = _CancellableBackend(EngineBackend(engine))
    t = run_extraction(engine, backend, 2)
    assert gate.entered.wait(TIMEOUT)
    backend.cancel()
    gate.release()
    t.join(TIMEOUT)
    assert not t.is_alive()
    assert isinstance(t.result.get("error"), _Cancelled), t.result
    assert len(submitted) == 1  # the turn that was being built, and nothing after the cancellation
    assert ran_to_an_end(finished) == []
    assert [e.rid for e in finished] == [submitted[0].rid]  # rejected: its session was closed
    assert finished[0].finish.is_abort and isinstance(finished[0].error, InvalidRequestError)
    assert idle(engine)


class _GoneClient:
    """A request whose client has disconnected."""

    async def is_disconnected(self) -> bool:
        return True


@pytest.mark.parametrize("stream", [False, True])
def test_async_generate_cancelled_while_building_submits_nothing(
    engine, watch, hooks, monkeypatch, stream
):
    """What /generate and /v1/* do when their client leaves: `until_disconnected` cancels the
    engine call; if that happens while the request is built (in a worker thread), nothing is
    ever submitted, also once the build has finished."""
    submitted, finished = watch
    gate = Gate(engine.encode)
    monkeypatch.setattr(engine, "encode", gate)
    built = threading.Event()

    def signal_built(real_build):
        def build(*args, **kwargs):
            try:
                return real_build(*args, **kwargs)
            finally:
                built.set()

        return build

    hooks.enter_context(engine.debug_wrap("build_requests", signal_built))

    async def main() -> None:
        call = engine.async_generate(
            "Hi", {"max_new_tokens": 8, "regex": f"[a-z]{{{3 + stream}}}"}, stream=stream
        )
        task = asyncio.ensure_future(call)
        assert await asyncio.to_thread(gate.entered.wait, TIMEOUT)
        assert (
            await until_disconnected(_GoneClient(), task) is None
        )  # the client is gone: cancelled
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.release()
        assert await asyncio.to_thread(
            built.wait, TIMEOUT
        )  # the build ran to its end, in its thread
        await asyncio.sleep(0.05)  # anything the loop would still run after it

    asyncio.run(main())
    assert submitted == []
    assert finished == []
    assert idle(engine)
