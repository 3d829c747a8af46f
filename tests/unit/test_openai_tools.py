"""The chat endpoint's tool-call plumbing without a model: a choice's text -> message
fields, whole and streamed (the same for any split), with calls checked against the
declared parameters (`jsonschema`): a call that fails is text, not a tool call."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from sgl.server.errors import APIError
from sgl.server.openai_tools import ChoiceOutput, parse_tools

SCHEMAS = {
    "add": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
}
VALIDATORS = {
    name: jsonschema.validators.validator_for(schema)(schema) for name, schema in SCHEMAS.items()
}

CASES = [  # (format, output, the calls, text the content must hold)
    ("pythonic", "[add(a=1, b=2)]", [("add", {"a": 1, "b": 2})], ""),
    (
        "pythonic",
        '[add(a=1, b="two")]',
        [],
        '[add(a=1, b="two")]',
    ),  # invalid (were it not constrained): text
    (
        "pythonic",
        "[add(a=1, b=2), nope(x=1), add(a=3, b=4)]",
        [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})],
        "[nope(x=1)]",
    ),
    (
        "hermes",
        'Sure.<tool_call>\n{"name": "add", "arguments": {"a": 5, "b": 6}}\n</tool_call>',
        [("add", {"a": 5, "b": 6})],
        "Sure.",
    ),
    ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 5}}\n</tool_call>', [], '{"a": 5}'),
]


def _stream(out: ChoiceOutput, text: str, rng: random.Random) -> tuple[str, list]:
    cuts = sorted(rng.sample(range(1, len(text)), min(5, len(text) - 1)))
    pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
    content, calls = "", {}
    for k, piece in enumerate(pieces):
        fields = out.feed(piece, last=k == len(pieces) - 1)
        content += fields.get("content", "")
        for d in fields.get("tool_calls", []):
            call = calls.setdefault(d["index"], {"name": None, "arguments": ""})
            call["name"] = d["function"].get("name", call["name"])
            call["arguments"] += d["function"]["arguments"]
    return content, [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())]


@pytest.mark.parametrize("parser,text,expected,kept", CASES)
def test_calls_are_checked_and_streams_equal_the_whole(parser, text, expected, kept):
    out = ChoiceOutput(parser, None, VALIDATORS)
    fields = out.whole(text)
    calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in fields.get("tool_calls", [])
    ]
    assert calls == expected and out.calls == len(expected)
    assert kept in (fields["content"] or "")
    rng = random.Random(0)
    for _ in range(20):
        s_content, s_calls = _stream(ChoiceOutput(parser, None, VALIDATORS), text, rng)
        assert (s_content, s_calls) == (fields["content"] or "", expected)


def test_invalid_parameter_schemas_are_400():
    with pytest.raises(APIError) as e:
        parse_tools(
            [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"a": 3}},
                    },
                }
            ],
            None,
            None,
        )
    assert e.value.param == "tools[0].function.parameters"
