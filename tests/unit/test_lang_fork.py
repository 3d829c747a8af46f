"""Forks against the fake backend: branches, joins, concurrency, errors."""

from __future__ import annotations

import threading

import pytest
from lang_fakes import FakeBackend, FakeBackendError, within

import sgl

BRANCH_REPLIES = {"Branch 0:": " zero", "Branch 1:": " one", "Branch 2:": " two"}


@within(10)
def test_fork_index_add_and_gather_join():
    seen = {}

    @sgl.function
    def prog(s):
        s += "Start. " + sgl.gen("q", max_tokens=3)
        forks = s.fork(3)
        assert len(forks) == 3
        for i in range(3):
            forks[i] += f"Branch {i}:" + sgl.gen("v")
        seen["v1"] = forks[1]["v"]  # a branch read before the join
        seen["text2"] = forks[2].text()
        forks.join()
        s += "\nEnd."

    fake = FakeBackend(replies=BRANCH_REPLIES, default="abcdef")
    state = prog.run(backend=fake)
    prefix = "Start. abc"
    assert seen == {"v1": " one", "text2": prefix + "Branch 2: two"}
    assert state["v"] == [" zero", " one", " two"]
    assert state["q"] == "abc"  # set before the fork: not gathered
    metas = state.get_meta_info("v")
    assert [m["completion_tokens"] for m in metas] == [5, 4, 4]
    # gather_variable leaves the parent's text alone.
    assert state.text() == prefix + "\nEnd."
    branch_prompts = sorted(c.text for c in fake.gen_calls[1:])
    assert branch_prompts == [prefix + f"Branch {i}:" for i in range(3)]


@within(10)
def test_fork_add_callable_and_concate_and_append():
    @sgl.function
    def prog(s):
        s += "P|"
        forks = s.fork(3)
        forks += lambda i: f"Branch {i}:" + sgl.gen("v")
        forks += "!"
        forks.join(mode="concate_and_append")
        s += "|end"

    fake = FakeBackend(replies=BRANCH_REPLIES)
    state = prog.run(backend=fake)
    assert state.text() == "P|Branch 0: zero!Branch 1: one!Branch 2: two!|end"
    assert "v" not in state  # concate_and_append moves text, not variables (as in SGLang)


@within(10)
def test_fork_branches_inherit_roles_and_variables():
    @sgl.function
    def prog(s):
        s += sgl.user("hi")
        s.set_var("k", "parent")
        forks = s.fork(2)
        for f in forks:
            f += sgl.assistant(sgl.gen("a"))
        seen.append([f.messages() for f in forks])
        seen.append([f["k"] for f in forks])
        forks.join()

    seen = []
    state = prog.run(backend=FakeBackend(default="hey"))
    assert (
        seen[0]
        == [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hey"}]] * 2
    )
    assert seen[1] == ["parent", "parent"]
    assert state["k"] == "parent"
    assert state["a"] == ["hey", "hey"]
    assert state.messages() == [{"role": "user", "content": "hi"}]


@within(10)
def test_gather_only_branches_that_set_a_variable_give_values():
    @sgl.function
    def prog(s):
        forks = s.fork(3)
        forks[0] += sgl.gen("only0")
        forks[2] += sgl.gen("only2")
        forks.join()

    state = prog.run(backend=FakeBackend(default="x"))
    assert state["only0"] == ["x", None, None]
    assert state["only2"] == [None, None, "x"]


@within(10)
def test_gather_a_variable_the_parent_already_had():
    """A branch that sets a variable the parent already holds (here to the very same string
    object: select returns one of its literal choices) must still be gathered into a list."""

    @sgl.function
    def prog(s):
        s += sgl.select("c", choices=["yes", "no"]) + " "
        forks = s.fork(2)
        forks += sgl.select("c", choices=["yes", "no"])
        forks.join()

    state = prog.run(backend=FakeBackend(table={"yes": [-0.1], "no": [-3.0]}))
    assert state["c"] == ["yes", "yes"]
    assert len(state.get_meta_info("c")) == 2


@within(10)
def test_branches_run_concurrently():
    barrier = threading.Barrier(3, timeout=5)

    def wait_for_all(call):
        if call.kind == "generate":
            barrier.wait()  # raises BrokenBarrierError unless 3 calls are in flight at once

    @sgl.function
    def prog(s):
        s += "x"
        forks = s.fork(3)
        forks += lambda i: f"Branch {i}:" + sgl.gen("v")
        forks.join()

    state = prog.run(backend=FakeBackend(replies=BRANCH_REPLIES, on_call=wait_for_all))
    assert state["v"] == [" zero", " one", " two"]


@within(10)
def test_fork_then_fork_again():
    @sgl.function
    def prog(s):
        s += "A"
        forks = s.fork(2)
        forks += lambda i: str(i)
        forks.join("concate_and_append")
        forks = s.fork(2)
        forks += lambda i: sgl.gen("w", max_tokens=i + 1)
        forks.join()

    state = prog.run(backend=FakeBackend(default="xyz"))
    assert state.text() == "A01"
    assert state["w"] == ["x", "xy"]


@within(10)
def test_branch_error_reaches_run():
    @sgl.function
    def prog(s):
        forks = s.fork(3)
        forks += lambda i: f"Branch {i}:" + sgl.gen("v")
        forks.join()
        s += "after join"

    fake = FakeBackend(replies=BRANCH_REPLIES, fail_on=lambda call: call.text.endswith("Branch 1:"))
    with pytest.raises(sgl.ProgramError) as info:
        prog.run(backend=fake)
    assert isinstance(info.value.__cause__, FakeBackendError)


@within(10)
def test_fork_and_join_argument_validation():
    @sgl.function
    def bad_size(s):
        s.fork(0)

    with pytest.raises(ValueError, match="fork size"):
        bad_size.run(backend=FakeBackend())

    @sgl.function
    def bad_mode(s):
        forks = s.fork(2)
        try:
            forks.join("append")
        finally:
            forks.join()

    with pytest.raises(ValueError, match="join mode"):
        bad_mode.run(backend=FakeBackend())

    @sgl.function
    def add_after_join(s):
        forks = s.fork(2)
        forks.join()
        forks[0] += "late"

    with pytest.raises(sgl.ProgramError, match="ended"):
        add_after_join.run(backend=FakeBackend())


@within(10)
def test_gather_set_var_to_the_parents_own_value():
    shared = {"same": "object"}

    @sgl.function
    def prog(s):
        s.set_var("k", shared)
        forks = s.fork(2)
        forks[1].set_var("k", shared)
        forks.join()

    state = prog.run(backend=FakeBackend())
    # Branch 1 set k; branch 0 still holds the value it inherited.
    assert state["k"] == [shared, shared]


@within(10)
def test_nested_forks_gather_through_both_joins():
    @sgl.function
    def prog(s):
        outer = s.fork(2)
        for i, branch in enumerate(outer):
            inner = branch.fork(2)
            inner += lambda j, i=i: f"{i}{j}:" + sgl.gen("v")
            inner.join()
        outer.join()

    state = prog.run(backend=FakeBackend(respond=lambda text, sampling: text[-3:-1]))
    assert state["v"] == [["00", "01"], ["10", "11"]]


@within(10)
def test_unjoined_fork_branches_end_with_the_program():
    """Branches never joined must not leave worker threads behind once the program ends."""

    @sgl.function
    def prog(s):
        s += "x"
        forks = s.fork(2)
        forks += sgl.gen("v", max_tokens=2)
        s += forks[0]["v"]  # read a branch, never join

    fake = FakeBackend(default="ab")
    state = prog.run(backend=fake)
    assert state.text() == "xab"
    for child in state.stream_executor.children:
        assert child.finished.wait(5)


@within(10)
def test_nested_fork_plans_run_concurrently():
    """Tree of thought: each branch generates, then forks again. A fork does not wait for its
    parent's generation (the branches start from the parent's state when its thread gets
    there), so the three plans are in flight at once, not one after the other."""
    barrier = threading.Barrier(3, timeout=5)

    def plans_together(call):
        if call.kind == "generate" and call.text.endswith("Plan:"):
            barrier.wait()  # raises BrokenBarrierError unless the 3 plans are in flight at once

    @sgl.function
    def prog(s):
        s += "Q."
        plans = s.fork(3)
        for i, p in enumerate(plans):
            p += f" {i} Plan:" + sgl.gen("plan", max_tokens=2)
            tries = p.fork(2)
            tries += lambda j: f" try {j}:" + sgl.gen("try", max_tokens=1)
            tries.join()
        plans.join()

    state = prog.run(backend=FakeBackend(default="ab", on_call=plans_together))
    assert state["plan"] == ["ab"] * 3
    assert state["try"] == [["a", "a"]] * 3


@within(10)
def test_fork_returns_before_the_parents_generation_and_branches_see_its_text():
    release = threading.Event()
    forked = threading.Event()

    def hold_parent(call):
        if call.kind == "generate" and call.text.endswith("Start:"):
            assert forked.wait(5), "fork waited for the parent's generation"
            release.wait(5)

    @sgl.function
    def prog(s):
        s += "Start:" + sgl.gen("first", max_tokens=3)
        forks = s.fork(2)
        forked.set()
        release.set()
        forks += lambda i: f" b{i}:" + sgl.gen("v", max_tokens=1)
        forks.join()

    fake = FakeBackend(default="xyz", on_call=hold_parent)
    state = prog.run(backend=fake)
    assert state["v"] == ["x", "x"]
    branch_prompts = sorted(c.text for c in fake.calls if c.kind == "generate" and " b" in c.text)
    assert branch_prompts == ["Start:xyz b0:", "Start:xyz b1:"]


@within(10)
def test_a_parent_that_fails_before_its_fork_fails_the_branches_without_hanging():
    @sgl.function
    def prog(s):
        s += "Start:" + sgl.gen("first")
        forks = s.fork(2)
        forks += lambda i: f"Branch {i}:" + sgl.gen("v")
        forks.join()

    fake = FakeBackend(replies=BRANCH_REPLIES, fail_on=lambda call: call.text.endswith("Start:"))
    with pytest.raises(sgl.ProgramError) as info:
        prog.run(backend=fake)
    assert isinstance(info.value.__cause__, FakeBackendError)
    assert not [c for c in fake.calls if "Branch" in c.text]  # the branches never generated
