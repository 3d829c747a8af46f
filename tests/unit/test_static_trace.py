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


def _weather_tool(city) -> str:  # a tool that keeps the value to itself: its answer is what gets added
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
    "formatted then inspected": lambda s: (_answer(s), s.__iadd__("!" if f"{s['x']}" == "yes" else "?")),
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
