"""The shipped IR's JSON form: every node kind round-trips, and malformed programs are
refused naming the node path."""

from __future__ import annotations

import json

import pytest

import sgl
from sgl.lang import ir
from sgl.lang.ir_json import IRFormatError, program_from_json, program_to_json
from sgl.lang.tracer import trace_static

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _lookup(word: str) -> str:
    """Look a word up."""
    return word


@sgl.function
def every_kind(s, topic):
    s += sgl.system("Be brief.")
    with s.user():
        s += "About " + topic
    with s.var_scope("scoped"):
        s += "scoped text"
    s["note"] = {"k": [1, 2]}
    s += sgl.assistant(
        sgl.gen("a", max_tokens=4, stop=["\n"], regex=r"[a-z]+", return_logprob=True)
    )
    s += sgl.gen("j", json_schema=SCHEMA) + sgl.gen("i", dtype=int)
    s += sgl.select("c", ["x", "y"], choices_method=sgl.greedy_token_selection)
    s += sgl.gen("call", tools=[_lookup], tool_choice="required", max_tokens=30)
    forks = s.fork(2)
    forks += lambda i: f"branch {i}: " + sgl.gen("b", max_tokens=3)
    inner = forks[0].fork(2)
    inner += sgl.gen("deep", max_tokens=2)
    inner.join("concate_and_append")
    forks.join()
    s += f"A was {s['a']}, b0 was " + forks[1]["b"]


def test_every_node_kind_round_trips_through_json():
    nodes = trace_static(every_kind, ("cats",), {})
    kinds = set()

    def walk(ns):
        for n in ns:
            kinds.add(type(n).__name__)
            if isinstance(n, ir.Fork):
                for b in n.branches:
                    walk(b)

    walk(nodes)
    assert kinds >= {
        "Text",
        "RoleBegin",
        "RoleEnd",
        "VarScopeBegin",
        "VarScopeEnd",
        "SetVar",
        "Gen",
        "Select",
        "Fork",
        "Join",
        "Variable",
    }
    data = json.loads(json.dumps(program_to_json(nodes)))  # through real JSON text
    back = program_from_json(data)
    assert program_to_json(back) == data
    assert repr(back) == repr(nodes)
    assert back[-1].source == ((1, 1),)  # forks[1]["b"], added to the parent
    call = next(n for n in back if isinstance(n, ir.Gen) and n.name == "call")
    assert call.tool_format == "hermes" and call.sampling["structural_tag"]["free_text"] is False
    arg = program_from_json({"format_version": 1, "nodes": [{"type": "argument", "name": "q"}]})
    assert isinstance(arg[0], ir.Argument) and arg[0].name == "q"


@pytest.mark.parametrize(
    "data,path",
    [
        ({"format_version": 2, "nodes": []}, "format_version"),
        ({"format_version": 1, "nodes": {}}, "nodes"),
        ({"format_version": 1, "nodes": [{"type": "teleport"}]}, "nodes[0].type"),
        ({"format_version": 1, "nodes": [{"type": "text", "text": 5}]}, "nodes[0].text"),
        (
            {
                "format_version": 1,
                "nodes": [{"type": "gen", "name": "a", "sampling": {"temprature": 0}}],
            },
            "nodes[0].sampling.temprature",
        ),
        (
            {"format_version": 1, "nodes": [{"type": "select", "name": "a", "choices": []}]},
            "nodes[0].choices",
        ),
        (
            {"format_version": 1, "nodes": [{"type": "role_begin", "role": "robot"}]},
            "nodes[0].role",
        ),
        (
            {
                "format_version": 1,
                "nodes": [
                    {"type": "fork", "fork_id": 1, "branches": [[{"type": "join", "mode": "x"}]]}
                ],
            },
            "nodes[0].branches[0][0].mode",
        ),
        (
            {"format_version": 1, "nodes": [{"type": "variable", "name": "v", "source": [[1]]}]},
            "nodes[0].source",
        ),
        (
            {"format_version": 1, "nodes": [{"type": "gen", "name": "a", "dtype": "complex"}]},
            "nodes[0].dtype",
        ),
    ],
)
def test_malformed_programs_name_the_node_path(data, path):
    with pytest.raises(IRFormatError) as e:
        program_from_json(data)
    assert e.value.path == path


def test_what_json_cannot_carry_is_refused_with_its_path():
    class Custom(sgl.lang.choices.ChoicesMethod):
        def __call__(self, scores):
            raise AssertionError

    with pytest.raises(IRFormatError, match="custom choices_method") as e:
        program_to_json([ir.Text("x"), ir.Select("c", ["a", "b"], 0.0, Custom())])
    assert e.value.path == "nodes[1]"
    with pytest.raises(IRFormatError, match="not JSON") as e:
        program_to_json([ir.SetVar("v", object())])
    assert e.value.path == "nodes[0].value"
