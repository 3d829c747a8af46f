"""run_batch and tracing against the fake backend."""

from __future__ import annotations

import time

import pytest
from lang_fakes import CHATML, FakeBackend, FakeBackendError, within

import sgl
from sgl.lang import ir
from sgl.lang.tracer import constant_prefix

SYSTEM_PROMPT = "You answer in one word."


@sgl.function
def qa(s, question, tag="-"):
    s += sgl.system(SYSTEM_PROMPT)
    s += sgl.user("Question: " + question + " " + tag)
    s += sgl.assistant(sgl.gen("answer", max_tokens=8))


def _echo(text, sampling):
    """Answer with the question of the prompt, so each result shows its own input."""
    question = text.split("Question: ")[-1].split("<|im_end|>")[0]
    if "bad" in question:
        raise AssertionError("unreachable: fail_on fires first")
    return "A(" + question + ")"


def _slow_first(call):
    # Earlier items finish later, so completion order is the reverse of input order.
    if call.kind == "generate":
        n = int(call.text.split("Question: q")[-1].split(" ")[0])
        time.sleep(0.005 * (10 - n))


# --------------------------------------------------------------------------- run_batch


@within(15)
def test_run_batch_dicts_and_tuples_keep_input_order():
    fake = FakeBackend(respond=_echo, on_call=_slow_first)
    items = [{"question": f"q{i}"} if i % 2 else (f"q{i}", "t") for i in range(10)]
    states = qa.run_batch(items, backend=fake, max_new_tokens=64, temperature=0.0)
    assert len(states) == 10
    for i, state in enumerate(states):
        tag = "-" if i % 2 else "t"
        assert state["answer"] == f"A(q{i} {tag})"[:8]
        assert state.error is None
    # Batch keyword arguments are the program's defaults; the gen's own max_tokens wins.
    for call in fake.gen_calls:
        assert call.sampling["temperature"] == 0.0 and call.sampling["max_new_tokens"] == 8


@within(15)
def test_run_batch_caches_the_constant_prefix_once():
    fake = FakeBackend(respond=_echo)
    states = qa.run_batch([{"question": f"q{i}"} for i in range(5)], backend=fake, num_threads=2)
    expected = f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nQuestion: "
    assert constant_prefix(qa, fake) == expected
    assert fake.prefixes == [expected]
    for state in states:
        assert state.text().startswith(expected)
    # The cache call came before any generation.
    kinds = [c.kind for c in fake.calls if c.kind != "chat_template"]
    assert kinds[0] == "cache_prefix" and kinds.count("cache_prefix") == 1


@within(15)
def test_constant_prefix_includes_the_default_system_and_bound_arguments():
    @sgl.function
    def prog(s, persona, question):
        s += sgl.user(persona + " asks: " + question)
        s += sgl.assistant(sgl.gen("a"))

    fake = FakeBackend()
    assert constant_prefix(prog, fake) == CHATML.default_system + "<|im_start|>user\n"
    bound = prog.bind(persona="Ann")
    prefix = CHATML.default_system + "<|im_start|>user\nAnn asks: "
    assert constant_prefix(bound, fake) == prefix
    states = bound.run_batch([{"question": "x"}, {"question": "y"}], backend=fake)
    assert fake.prefixes == [prefix]
    assert [s.text() for s in states] == [
        prefix + q + "<|im_end|>\n<|im_start|>assistant\nfake output<|im_end|>\n" for q in "xy"
    ]


@within(15)
def test_run_batch_failing_item_does_not_sink_the_others():
    fake = FakeBackend(
        respond=_echo, fail_on=lambda call: call.kind == "generate" and "bad" in call.text
    )

    @sgl.function
    def prog(s, question):
        if question == "raise":
            raise KeyError("body failed")
        qa.func(s, question)

    states = prog.run_batch([("q0",), ("bad",), ("q2",), ("raise",), ("q4",)], backend=fake)
    assert [s["answer"] for i, s in enumerate(states) if i in (0, 2, 4)] == [
        "A(q0 -)",
        "A(q2 -)",
        "A(q4 -)",
    ]
    assert isinstance(states[1].error, FakeBackendError)
    assert isinstance(states[3].error, KeyError)
    for bad in (states[1], states[3]):
        with pytest.raises(sgl.ProgramError) as info:
            bad.text()
        assert info.value.__cause__ is bad.error
        with pytest.raises(sgl.ProgramError):
            bad["answer"]


@within(15)
def test_run_batch_progress_bar(capsys):
    states = qa.run_batch(
        [{"question": "a"}, {"question": "b"}], backend=FakeBackend(), progress_bar=True
    )
    assert [s["answer"] for s in states] == ["fake out", "fake out"]
    assert "run_batch" in capsys.readouterr().err


@pytest.mark.parametrize("num_threads", [0, -1, "many", 1.5, None])
def test_run_batch_num_threads_validation(num_threads):
    with pytest.raises(ValueError, match="num_threads"):
        qa.run_batch([{"question": "a"}], backend=FakeBackend(), num_threads=num_threads)


@within(15)
def test_run_batch_one_thread_and_empty_batch():
    fake = FakeBackend(respond=_echo)
    states = qa.run_batch([("a",), ("b",), ("c",)], backend=fake, num_threads=1)
    assert [s["answer"] for s in states] == ["A(a -)", "A(b -)", "A(c -)"]
    fake = FakeBackend()
    assert qa.run_batch([], backend=fake) == []
    assert fake.calls == []


def test_run_batch_argument_errors():
    with pytest.raises(TypeError, match="unexpected keyword"):
        qa.run_batch([{"question": "a"}], backend=FakeBackend(), max_tokens=3)
    with pytest.raises(TypeError, match="item 1"):
        qa.run_batch([{"question": "a"}, "b"], backend=FakeBackend())
    with pytest.raises(TypeError, match="list"):
        qa.run_batch({"question": "a"}, backend=FakeBackend())


@within(15)
def test_run_batch_without_a_traceable_prefix():
    @sgl.function
    def prog(s, n):
        s += "x" * int(n) + sgl.gen("a", max_tokens=1)  # int() of a placeholder fails in tracing

    fake = FakeBackend()
    assert constant_prefix(prog, fake) == ""
    states = prog.run_batch([(2,), (3,)], backend=fake)
    assert [s.text() for s in states] == ["xxf", "xxxf"]
    assert fake.prefixes == []


# --------------------------------------------------------------------------- tracing


@sgl.function
def traced(s, question):
    s += "Intro. "
    s += sgl.user("Q: " + question)
    with s.assistant():
        s += sgl.gen("answer", max_tokens=16)
    s += "Echo: " + s["answer"]
    with s.var_scope("scope"):
        s += sgl.select("c", choices=["a", "b"])
    forks = s.fork(2)
    forks += lambda i: f"B{i}" + sgl.gen_int("n")
    forks.join()


def test_trace_graph():
    fake = FakeBackend()
    graph = traced.trace()
    text = str(graph)
    lines = text.splitlines()
    assert lines[0] == "program traced:"
    for node in (
        "Text('Intro. ')",
        "RoleBegin('user')",
        "Text('Q: ')",
        "Argument('question')",
        "RoleEnd('user')",
        "RoleBegin('assistant')",
        "Gen('answer', max_new_tokens=16)",
        "RoleEnd('assistant')",
        "Variable('answer')",
        "VarScopeBegin('scope')",
        "Select('c', ['a', 'b'])",
        "VarScopeEnd('scope')",
        "Fork(2)",
        "branch 0:",
        "branch 1:",
        "Text('B0')",
        "Text('B1')",
        "Gen('n', dtype=int)",
        "Join('gather_variable')",
    ):
        assert node in text, node
    # Order of the top-level nodes, and the branches nested under the fork.
    top = [line.strip() for line in lines if line.startswith("  ") and not line.startswith("    ")]
    assert top[:4] == [
        "Text('Intro. ')",
        "RoleBegin('user')",
        "Text('Q: ')",
        "Argument('question')",
    ]
    assert top[-2:] == ["Fork(2)", "Join('gather_variable')"]
    assert "    branch 0:" in lines and "      Text('B0')" in lines
    assert isinstance(graph.nodes[-2], ir.Fork) and len(graph.nodes[-2].branches) == 2
    assert fake.calls == []  # tracing never touches a backend


def test_trace_with_given_arguments():
    text = str(traced.trace(question="why?"))
    assert "Text('Q: why?')" in text
    assert "Argument(" not in text


def test_constant_prefix_stops_at_the_first_argument_or_generation():
    fake = FakeBackend()
    assert (
        constant_prefix(traced, fake) == "Intro. " + CHATML.default_system + "<|im_start|>user\nQ: "
    )

    @sgl.function
    def gen_first(s, x):
        s += sgl.gen("a") + "then " + x

    assert constant_prefix(gen_first, fake) == ""

    @sgl.function
    def text_then_gen(s):
        s += "Fixed text. " + sgl.gen("a") + " more"

    assert constant_prefix(text_then_gen, fake) == "Fixed text. "

    @sgl.function
    def select_first(s):
        s += "Pick: " + sgl.select("c", choices=["x", "y"]) + " tail"

    assert constant_prefix(select_first, fake) == "Pick: "


def test_program_failing_under_placeholders_has_no_prefix():
    @sgl.function
    def parses(s, data):
        s += "Items: " + ", ".join(data.split(";")[5])  # index error on a placeholder

    assert constant_prefix(parses, FakeBackend()) == ""
    with pytest.raises(IndexError):
        parses.trace()


@within(15)
def test_cache_method_uses_the_backend():
    fake = FakeBackend()
    assert traced.cache(fake) == constant_prefix(traced, fake)
    assert fake.prefixes == [constant_prefix(traced, fake)]


@within(10)
def test_run_batch_runs_every_item_when_caching_the_prefix_fails():
    @sgl.function
    def prog(s, x):
        s += "A constant prefix. " + x + sgl.gen("v", max_tokens=2)

    fake = FakeBackend(default="ok", fail_on=lambda call: call.kind == "cache_prefix")
    states = prog.run_batch([{"x": "a"}, {"x": "b"}], backend=fake)
    assert [s.text() for s in states] == ["A constant prefix. aok", "A constant prefix. bok"]
    assert [c.kind for c in fake.calls].count("cache_prefix") == 1
