"""How a JSON tool-call format writes a call (`CallSyntax`): the structural tag that constrains
output to well-formed calls (`sgl.constrained.structural`) and a call written into a prompt.
`JsonCallFormat` is the `ToolFormat` of every format whose calls are a JSON arguments object
between a begin and an end text; `object_schema` is the parameters check all formats share."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sgl.tool_calls.base import Functions, ToolFormat, ToolParser


@dataclass(frozen=True)
class CallSyntax:
    """How a format writes one call, for the constraint: `begin` (with the name) and `end`
    around the arguments object; `trigger` starts every call; `separator` joins calls."""

    trigger: str
    begin: str  # with {name} for the JSON-quoted function name
    end: str
    separator: str

    def call_text(self, name: str, arguments: str) -> str:
        return self.begin.format(name=json.dumps(name)) + arguments + self.end

    def structural_tag(
        self, functions: Functions, free_text: bool, one_call: bool
    ) -> dict[str, Any]:
        tag: dict[str, Any] = {
            "type": "structural_tag",
            "structures": [
                {
                    "begin": self.begin.format(name=json.dumps(name)),
                    "schema": object_schema(params, name),
                    "end": self.end,
                }
                for name, params in functions
            ],
            "triggers": [self.trigger],
            "free_text": free_text,
            "separator": self.separator,
        }
        if one_call:
            tag["max_structures"] = 1
        return tag


@dataclass(frozen=True)
class JsonCallFormat(ToolFormat):
    """A format whose calls are `syntax.begin` + the arguments object + `syntax.end`."""

    parser: type[ToolParser]
    syntax: CallSyntax
    teaches_when: Callable[[str], bool]  # the chat-template test behind `teaches`
    aliases: tuple[str, ...] = ()

    def teaches(self, chat_template: str) -> bool:
        return self.teaches_when(chat_template)

    def call_text(self, name: str, arguments: str) -> str:
        return self.syntax.call_text(name, arguments)

    def constraint(self, functions: Functions, free_text: bool, one_call: bool) -> dict[str, Any]:
        return self.syntax.structural_tag(functions, free_text, one_call)

    def function_fields(self, k: int) -> dict[str, str]:
        return {f"structures[{k}].schema": "parameters"}


def object_schema(params: dict[str, Any], name: str) -> dict[str, Any]:
    """A function's parameters schema, made to describe an object (arguments are one);
    ValueError for a schema of another type."""
    kind = params.get("type")
    if kind is None:
        return {**params, "type": "object"}
    if kind != "object":
        raise ValueError(f"the parameters of {name!r} must describe an object, not {kind!r}")
    return params
