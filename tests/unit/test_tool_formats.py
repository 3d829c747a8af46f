"""The tool-call format registry (`sgl.tool_calls.registry`): each format's declarations agree
with each other (a call it writes is read back by its own parser as that call; its constraint
names each function where `function_fields` says), and names are unique across formats."""

from __future__ import annotations

import json

import pytest

from sgl.tool_calls import FORMATS, detect_parser, get_format
from sgl.tool_calls.registry import DETECTION_ORDER, parser_names

ARGUMENTS = [
    {},
    {"city": "Paris", "days": 3},
    {"q": 'a "quoted" }] text', "opts": {"n": [1, 2.5, None, True]}},
]


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("arguments", ARGUMENTS, ids=range(len(ARGUMENTS)))
def test_a_written_call_reads_back(name: str, arguments: dict) -> None:
    fmt = get_format(name)
    text = fmt.call_text("get_weather", json.dumps(arguments))
    content, calls = fmt.parser().parse(text)
    assert content == "" and len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == arguments


@pytest.mark.parametrize("name", list(FORMATS))
def test_constraint_fields_name_each_function(name: str) -> None:
    fmt = get_format(name)
    functions = [
        ("f", {"type": "object", "properties": {"a": {"type": "integer"}}}),
        ("g", {"properties": {}}),
    ]
    tag = fmt.constraint(functions, free_text=True, one_call=False)
    for k, (fn_name, params) in enumerate(functions):
        for path, part in fmt.function_fields(k).items():
            node = tag
            for step in path.replace("]", "").replace("[", ".").split("."):
                node = node[int(step)] if step.isdigit() else node[step]
            want = fn_name if part == "name" else {**params, "type": "object"}
            assert node == want, (path, part)


def test_names_are_unique_and_each_format_is_detected_in_its_turn() -> None:
    names = [n for fmt in FORMATS.values() for n in (fmt.name, *fmt.aliases)]
    assert len(names) == len(set(names)) and set(parser_names()) == set(names)
    assert all(parser_names()[a] == fmt.name for fmt in FORMATS.values() for a in fmt.aliases)
    assert sorted(DETECTION_ORDER) == sorted(FORMATS)
    for name, fmt in FORMATS.items():
        assert fmt.parser.name == name
    assert detect_parser("{{ '<|python_start|>' }} ipython") == "pythonic"  # before llama3_json


def test_unknown_format_names_the_known_ones() -> None:
    with pytest.raises(ValueError) as err:
        get_format("qwen25")  # an alias is a CLI name, not a format
    assert all(name in str(err.value) for name in FORMATS)
