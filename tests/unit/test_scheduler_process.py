"""The scheduler in its own process (`Engine(scheduler_process=True)`): the same results as
the scheduler on a thread (the oracle), start-up errors raised as themselves, a step fault or
a killed child failing every caller (never a hang), and no process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import jsonschema
import pytest
from process_helpers import call_in_background, fault_env, gone
from tiny_models import save_tiny_engine_dir

import sgl
from sgl.runtime.errors import (
    EngineDeadError,
    EngineFault,
    EngineUnavailableError,
    InvalidRequestError,
)

VOCAB = 320
TIMEOUT = 120.0


def wait_for(condition, timeout: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        threading.Event().wait(0.05)
    return condition()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = save_tiny_engine_dir(
        tmp_path_factory.mktemp("tiny-proc"), VOCAB, max_position_embeddings=512
    )
    return str(path)


@pytest.fixture(scope="module")
def engines(model_dir):
    with (
        sgl.Engine(model_path=model_dir, max_total_tokens=2048) as threaded,
        sgl.Engine(model_path=model_dir, max_total_tokens=2048, scheduler_process=True) as proc,
    ):
        yield threaded, proc


def flat(entries) -> list:
    """Logprob entries (nested lists of (logprob, token id, text)) as one list of numbers."""
    if entries is None:
        return []
    if isinstance(entries, (list, tuple)):
        return [v for e in entries for v in flat(e)]
    return [] if isinstance(entries, str) else [entries]


SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}},
    "required": ["a"],
    "additionalProperties": False,
}


def test_the_process_engine_gives_the_thread_engines_results(engines):
    threaded, proc = engines
    assert proc.scheduler_pids and proc.model is None and threaded.scheduler_pids == []
    greedy = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    cases = [
        dict(
            prompt=["the quick brown", "hello world"],
            sampling_params=greedy,
            return_logprob=True,
            top_logprobs_num=2,
        ),
        dict(
            prompt="numbers:",
            sampling_params={"max_new_tokens": 6, "regex": "[0-9]{2,4}", "temperature": 0},
        ),
        dict(
            prompt="json:",
            sampling_params={
                "max_new_tokens": 24,
                "json_schema": json.dumps(SCHEMA),
                "temperature": 0,
            },
        ),
        dict(
            prompt="ebnf:",
            sampling_params={
                "max_new_tokens": 8,
                "ebnf": 'root ::= "fox" | "dog" " " [0-9]',
                "temperature": 0,
            },
        ),
        dict(
            prompt="sample",
            sampling_params={"max_new_tokens": 8, "temperature": 1.0, "seed": 11, "n": 2},
        ),
    ]
    for case in cases:
        a, b = threaded.generate(**case), proc.generate(**case)
        a, b = (a if isinstance(a, list) else [a]), (b if isinstance(b, list) else [b])
        assert [x["output_ids"] for x in a] == [x["output_ids"] for x in b], case
        assert [x["text"] for x in a] == [x["text"] for x in b]
        for x, y in zip(a, b):  # the same tokens; values within float32 reduction-order noise
            assert flat(x["meta_info"].get("output_top_logprobs")) == pytest.approx(
                flat(y["meta_info"].get("output_top_logprobs")), abs=1e-4
            )
            assert flat(x["meta_info"].get("output_token_logprobs")) == pytest.approx(
                flat(y["meta_info"].get("output_token_logprobs")), abs=1e-4
            )
    jsonschema.validate(json.loads(proc.generate(**cases[2])["text"]), SCHEMA)
    chunks = list(proc.generate("the quick brown", greedy, stream=True))
    assert (
        "".join(c["text"] for c in chunks) == threaded.generate("the quick brown", greedy)["text"]
    )


def test_sessions_queries_aborts_and_bad_constraints_through_the_process(engines):
    _, proc = engines
    sid = proc.open_session(capacity_tokens=400)
    first = proc.generate(
        "hello", {"max_new_tokens": 4, "temperature": 0}, session_params={"id": sid}
    )
    turn = proc.generate(
        " again",
        {"max_new_tokens": 4, "temperature": 0},
        session_params={"id": sid, "rid": first["meta_info"]["id"]},
    )
    assert turn["meta_info"]["prompt_tokens"] > first["meta_info"]["prompt_tokens"]
    assert proc.close_session(sid) and not proc.close_session(sid)
    with pytest.raises(InvalidRequestError) as bad:
        proc.generate("x", {"max_new_tokens": 4, "regex": "[0-9"})
    assert bad.value.param == "regex"
    with pytest.raises(InvalidRequestError):  # a stream refused before it starts
        proc.generate("x", {"max_new_tokens": 4, "json_schema": "{not json"}, stream=True)
    stream = proc.generate(
        "count", {"max_new_tokens": 400, "ignore_eos": True}, stream=True, rid="long"
    )
    next(stream)
    proc.abort("long")
    last = list(stream)[-1]
    assert (
        last["meta_info"]["finish_reason"]["type"] == "abort"
        and last["meta_info"]["completion_tokens"] < 400
    )
    assert proc.update_options(disable_jump_forward=True) == {"disable_jump_forward": True}
    assert proc.config.disable_jump_forward
    proc.update_options(disable_jump_forward=False)
    with pytest.raises(InvalidRequestError, match="cannot change"):
        proc.update_options(max_running_requests=3)
    info = proc.get_server_info()
    assert info["scheduler_process"] and info["num_running_reqs"] == info["num_waiting_reqs"] == 0


def test_start_up_errors_are_raised_as_in_thread_mode(tmp_path, model_dir):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        sgl.Engine(model_path=str(tmp_path / "missing"), scheduler_process=True)
    with pytest.raises(ValueError, match="context_length 100000 exceeds"):
        sgl.Engine(model_path=model_dir, context_length=100000, scheduler_process=True)


def test_a_killed_scheduler_process_fails_every_caller(model_dir):
    engine = sgl.Engine(model_path=model_dir, max_total_tokens=2048, scheduler_process=True)
    pid = engine.scheduler_pids[0]
    caller, outcome = call_in_background(
        lambda: engine.generate("count", {"max_new_tokens": 450, "ignore_eos": True})
    )
    assert wait_for(lambda: engine.get_server_info()["num_running_reqs"] == 1)
    os.kill(pid, signal.SIGKILL)
    caller.join(TIMEOUT)
    assert not caller.is_alive() and isinstance(outcome.get("error"), RuntimeError), outcome
    assert isinstance(engine.fault, EngineDeadError) and engine.faulted.is_set()
    assert "exited unexpectedly" in str(engine.fault)
    with pytest.raises(EngineUnavailableError):
        engine.generate("x", {"max_new_tokens": 2})
    with pytest.raises(EngineDeadError):
        engine.get_server_info()
    engine.shutdown()
    assert gone(pid)


def test_a_step_fault_in_the_process_reaches_the_caller(model_dir, tmp_path, monkeypatch):
    """A fault injected into the child's forward (a sitecustomize on its PYTHONPATH) fails the
    request with the incident and marks the engine failed, as in thread mode."""
    for name, value in fault_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    with sgl.Engine(model_path=model_dir, max_total_tokens=1024, scheduler_process=True) as engine:
        assert engine.generate("a", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2
        with pytest.raises(RuntimeError, match="engine step failed"):
            engine.generate("a", {"max_new_tokens": 2}, rid="boom")
        assert wait_for(engine.faulted.is_set)
        assert isinstance(engine.fault, EngineFault)
        with pytest.raises(EngineUnavailableError, match=engine.fault.incident):
            engine.generate("a", {"max_new_tokens": 2})
        pid = engine.scheduler_pids[0]
    assert gone(pid)


ORPHAN_PARENT = """
import sys, sgl
engine = sgl.Engine(model_path=sys.argv[1], max_total_tokens=1024, scheduler_process=True)
print(engine.scheduler_pids[0], flush=True)
sys.stdin.read()
"""


def test_no_orphan_when_the_parent_is_killed(model_dir):
    parent = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_PARENT, model_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        child = int(parent.stdout.readline())
        assert not gone(child)
        parent.kill()
        parent.wait(TIMEOUT)
        assert wait_for(lambda: gone(child), timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_rank_zeros_fault_from_a_dead_peer_is_reported_as_the_peers_exit():
    """At --tp-size 2, a rank killed inside a collective resets rank 0's socket first: rank 0's
    step fails. The transport must report the dead rank (the cause), not rank 0's fault: the
    outputs from the fault on are dropped and the dead rank named, also when its exit shows a
    little later than the fault. With every peer alive, rank 0's fault is delivered as it is."""
    from sgl.runtime.messages import EngineFaulted
    from sgl.runtime.transport import split_at_dead_peer

    class Proc:
        def __init__(self, code):
            self.code = code

        def poll(self):
            return self.code

    class ReapedLate(Proc):  # killed, but seen to exit only after rank 0's fault arrived
        def __init__(self, polls_alive):
            super().__init__(None)
            self.polls_alive = polls_alive

        def poll(self):
            self.polls_alive -= 1
            return None if self.polls_alive >= 0 else -9

    before, fault, after = object(), EngineFaulted("abc"), object()
    assert split_at_dead_peer([before, fault, after], [Proc(None), Proc(-9)]) == ([before], 1)
    assert split_at_dead_peer([before, fault, after], [Proc(None), ReapedLate(5)]) == (
        [before],
        1,
    )  # seen in a loaded CI run: the killed rank's exit showed after rank 0's fault
    assert split_at_dead_peer([before, fault, after], [Proc(None), Proc(None)], grace_s=0.1) == (
        [before, fault, after],
        None,
    )
    assert split_at_dead_peer([before, fault], [Proc(None)]) == (
        [before, fault],
        None,
    )  # tp 1: its own fault
    # no fault: nothing to attribute
    assert split_at_dead_peer([before, after], [Proc(None), Proc(-9)]) == ([before, after], None)
