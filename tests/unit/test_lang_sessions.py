"""Program states and backend sessions: one per state that generates, opened at its first
generation, passed with every generation of that state, and closed when the state ends."""

from __future__ import annotations

import time

import pytest
from lang_fakes import FakeBackend, FakeBackendError, within

import sgl


def wait_for(cond, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


@sgl.function
def two_turns(s):
    s += "Q1:" + sgl.gen("a", max_tokens=4)
    s += " Q2:" + sgl.gen("b", max_tokens=4)


@within(10)
def test_a_state_generates_in_one_session_closed_at_the_end():
    be = FakeBackend(sessions=True)
    state = two_turns.run(backend=be)
    assert state["a"] and state["b"]
    assert [c.session for c in be.gen_calls] == ["session-1", "session-1"]
    assert be.sessions_opened == 1 and not be.open_sessions


@within(10)
def test_streamed_state_uses_its_session():
    be = FakeBackend(sessions=True)
    state = two_turns.run(backend=be, stream=True)
    assert "".join(state.text_iter())
    assert {c.session for c in be.gen_calls} == {"session-1"}
    state.sync()
    assert not be.open_sessions


@within(10)
def test_each_fork_branch_has_its_own_session_and_all_close():
    @sgl.function
    def fan(s):
        s += "Base:" + sgl.gen("base", max_tokens=3)
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f" Branch {i}:" + sgl.gen("x", max_tokens=3)
        forks.join()
        s += " End:" + sgl.gen("end", max_tokens=3)

    be = FakeBackend(sessions=True)
    fan.run(backend=be)
    by_session: dict = {}
    for c in be.gen_calls:
        by_session.setdefault(c.session, []).append(c.text)
    assert len(by_session) == 4  # the parent (2 gens) and three branches (1 each)
    assert sorted(len(v) for v in by_session.values()) == [1, 1, 1, 2]
    assert not be.open_sessions


@within(10)
def test_no_generation_no_session_and_select_needs_none():
    @sgl.function
    def pick(s):
        s += "Choose:" + sgl.select("c", choices=["yes", "no"])

    be = FakeBackend(sessions=True, table={"yes": [-0.1], "no": [-3.0]})
    assert pick.run(backend=be)["c"] == "yes"
    assert be.sessions_opened == 0


@within(10)
def test_backends_without_sessions_get_no_session_argument():
    be = FakeBackend(sessions=False)
    two_turns.run(backend=be)
    assert [c.session for c in be.gen_calls] == [None, None]


@within(10)
def test_a_failing_program_still_closes_its_session():
    be = FakeBackend(
        sessions=True, fail_on=lambda c: c.kind == "generate" and c.text.endswith("Q2:")
    )
    with pytest.raises(sgl.ProgramError) as e:
        two_turns.run(backend=be)
    assert isinstance(e.value.__cause__, FakeBackendError)
    be_closed = wait_for(lambda: not be.open_sessions)
    assert be_closed and be.sessions_opened == 1 and not be.open_sessions


@within(10)
def test_a_session_that_cannot_open_is_skipped():
    be = FakeBackend(sessions=True, fail_on=lambda c: c.kind == "open_session")
    state = two_turns.run(backend=be)
    assert state["b"]
    assert [c.session for c in be.gen_calls] == [None, None]
