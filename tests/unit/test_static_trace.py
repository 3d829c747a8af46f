"""Which programs may ship: a program whose structure could depend on what the model
generates must be caught while tracing (and say where), and static ones must trace."""

from __future__ import annotations

import json

import pytest

import sgl
from sgl.lang import ir
from sgl.lang.tracer import DynamicProgramError, trace_static


def trace(body, *args):
    return trace_static(sgl.function(body), args, {})


def _weather_tool(
    city,
) -> str:  # a tool that keeps the value to itself: its answer is what gets added
    return "sunny"


def _answer(s):
    s += "Q: yes or no?\nA:" + sgl.gen("x", max_tokens=3)


DYNAMIC = {
    "compare": lambda s: (_answer(s), s.__iadd__("!" if s["x"] == " yes" else "?")),
    "truth test": lambda s: (_answer(s), s.__iadd__("!" if s["x"] else "?")),
    "method": lambda s: (_answer(s), s.__iadd__(s["x"].strip())),
    "len": lambda s: (_answer(s), s.__iadd__(str(len(s["x"])))),
    "int": lambda s: (_answer(s), s.__iadd__(str(int(s["x"]) + 1))),
    "index": lambda s: (_answer(s), s.__iadd__(s["x"][0])),
    "str": lambda s: (_answer(s), s.__iadd__(str(s["x"]))),
    "format spec": lambda s: (_answer(s), s.__iadd__(f"{s['x']:>10}")),
    "json": lambda s: (_answer(s), s.__iadd__(json.dumps(s["x"]))),
    "in": lambda s: (_answer(s), s.__iadd__("!" if "yes" in s["x"] else "?")),
    "meta info": lambda s: (_answer(s), s.__iadd__("!" if s.get_meta_info("x") else "?")),
    "state text": lambda s: (_answer(s), s.__iadd__("!" if s.text().endswith("yes") else "?")),
    "has var": lambda s: (_answer(s), s.__iadd__("!" if "x" in s else "?")),
    "tool call": lambda s: (_answer(s), s.__iadd__(_weather_tool(s["x"]))),
    "formatted then inspected": lambda s: (
        _answer(s),
        s.__iadd__("!" if f"{s['x']}" == "yes" else "?"),
    ),
}


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_dynamic_programs_are_caught_with_the_line(name):
    def body(s):
        DYNAMIC[name](s)

    with pytest.raises(DynamicProgramError) as e:
        trace(body)
    assert "test_static_trace.py" in e.value.where


def test_a_program_that_returns_a_value_is_not_shipped():
    def body(s):
        _answer(s)
        return s["x"]

    with pytest.raises(DynamicProgramError, match="returns a value"):
        trace(body)


def test_static_programs_trace_with_variables_in_text():
    def body(s, q):
        _answer(s)
        s += f"\nYou said{s['x']}; again: " + s["x"] + sgl.gen("y", max_tokens=2)
        forks = s.fork(2)
        forks += lambda i: sgl.gen("z", max_tokens=2)
        forks.join()
        s += forks[0]["z"] + q.upper()  # computing on arguments is fine: they are real values here

    nodes = trace(body, "question")
    variables = [n for n in nodes if isinstance(n, ir.Variable)]
    assert [(v.name, v.source) for v in variables] == [("x", None), ("x", None), ("z", ((1, 0),))]
    assert isinstance(nodes[-1], ir.Text) and nodes[-1].text == "QUESTION"


# ------------------------------------------------ a batch as one program and argument sets


def _batch(function, items):
    """batch_template over run_batch-style items (dicts), with each item's own trace."""
    from sgl.lang.ir_json import program_to_json
    from sgl.lang.shipping import batch_template

    calls = [((), dict(item)) for item in items]
    return batch_template(
        function, calls, [program_to_json(trace_static(function, a, k)) for a, k in calls]
    )


@sgl.function
def _qa(s, question, n, lang="en"):
    s += sgl.system("Answer in " + lang + ".")
    s += sgl.user(f"Q{n}: {question}")
    s += sgl.assistant(sgl.gen("a", max_tokens=4))
    forks = s.fork(2)
    forks += lambda i: f" [{question} / {i}]" + sgl.gen("b", max_tokens=2)
    forks.join()


def test_a_batch_that_differs_only_in_argument_text_is_one_program():
    items = [{"question": "Why?", "n": 1}, {"question": "How?", "n": 2.5}, {"question": "", "n": 3}]
    template, arguments = _batch(_qa, items)
    assert arguments == [
        {"n": 1, "question": "Why?"},
        {"n": 2.5, "question": "How?"},
        {"n": 3, "question": ""},
    ]
    kinds = [n["type"] for n in template["nodes"]]
    assert (
        kinds.count("argument") == 2 and "fork" in kinds
    )  # `lang` is the same everywhere: it stays text
    assert any(
        n == {"type": "argument", "name": "question"}
        for b in template["nodes"][kinds.index("fork")]["branches"]
        for n in b
    )


@sgl.function
def _tests_argument(s, lang):
    s += "Hello" if lang == "en" else "Bonjour"
    s += sgl.gen("a", max_tokens=2)


@sgl.function
def _type_decides(s, x):
    s += ("text: " if isinstance(x, str) else "number: ") + f"{x}" + sgl.gen("a", max_tokens=2)


@sgl.function
def _formats_argument(s, x):
    s += f"{x:.2f} or {x}" + sgl.gen("a", max_tokens=2)


@sgl.function
def _argument_as_parameter(s, n):
    s += "Count:" + sgl.gen("a", max_tokens=n)


@sgl.function
def _argument_in_choices(s, a, b):
    s += "Pick:" + sgl.select("c", choices=[a, b])


@pytest.mark.parametrize(
    "function,items",
    [
        (_tests_argument, [{"lang": "en"}, {"lang": "fr"}]),
        (_type_decides, [{"x": 1}, {"x": 2}]),
        (_formats_argument, [{"x": 1.0}, {"x": 2.0}]),
        (_argument_as_parameter, [{"n": 2}, {"n": 3}]),
        (_argument_in_choices, [{"a": "x", "b": "y"}, {"a": "u", "b": "v"}]),
        (_qa, [{"question": ["a list"], "n": 1}, {"question": ["b"], "n": 2}]),
        (
            _qa,
            [{"question": "Why?", "n": 1}, {"question": "How?", "n": 2, "lang": "fr"}],
        ),  # different names given
    ],
    ids=[
        "tests it",
        "its type decides",
        "format spec",
        "a gen parameter",
        "select choices",
        "not text",
        "different names",
    ],
)
def test_a_batch_whose_structure_reads_its_arguments_stays_one_program_per_item(function, items):
    assert _batch(function, items) is None
