"""How each tool-call format writes a call: the structural tag that constrains output to
well-formed calls (`sgl.constrained.structural`), a call written into a prompt, and the
system prompt that describes tools to a model whose chat template takes none."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CallSyntax:
    """How a format writes one call, for the constraint: `begin` (with the name) and `end`
    around the arguments object; `trigger` starts every call; `separator` joins calls."""

    trigger: str
    begin: str  # with {name} for the JSON-quoted function name
    end: str
    separator: str


SYNTAX = {
    "hermes": CallSyntax("<tool_call>", '<tool_call>\n{{"name": {name}, "arguments": ', "}\n</tool_call>", "\n"),
    "llama3_json": CallSyntax('{"name": ', '{{"name": {name}, "parameters": ', "}", "; "),
    "mistral": CallSyntax("[TOOL_CALLS]", '[TOOL_CALLS] [{{"name": {name}, "arguments": ', "}]", ""),
}


def call_text(parser: str, name: str, arguments: str) -> str:
    """One call written in the format (for rendering history the template cannot);
    `arguments` is the arguments object's JSON text."""
    if parser == "pythonic":
        try:
            args = json.loads(arguments)
        except ValueError:
            args = None
        if isinstance(args, dict):
            return f"[{name}({', '.join(f'{k}={_python_literal(v)}' for k, v in args.items())})]"
        return f"[{name}({arguments})]"
    syntax = SYNTAX.get(parser, SYNTAX["hermes"])
    return syntax.begin.format(name=json.dumps(name)) + arguments + syntax.end


def _python_literal(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_python_literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def structural_tag(functions: list[tuple[str, dict[str, Any]]], free_text: bool, one_call: bool,
                   parser: str) -> dict[str, Any]:
    """The constraint for calls to `functions` ((name, parameters schema) pairs) in the
    format: free text with calls in it (`free_text`), or calls only; at most one call
    (`one_call`) or any number. KeyError for a format without a JSON call syntax."""
    syntax = SYNTAX[parser]
    tag: dict[str, Any] = {
        "type": "structural_tag",
        "structures": [{"begin": syntax.begin.format(name=json.dumps(name)), "schema": object_schema(params, name),
                        "end": syntax.end} for name, params in functions],
        "triggers": [syntax.trigger],
        "free_text": free_text,
        "separator": syntax.separator,
    }
    if one_call:
        tag["max_structures"] = 1
    return tag


def pythonic_constraint(functions: list[tuple[str, dict[str, Any]]], free_text: bool, one_call: bool) -> dict[str, Any]:
    """The constraint for pythonic calls (`[f(a=1)]`, `sgl.constrained.pythonic`), passed
    as a structural tag: the output is such a list (or, with `free_text`, text that does not
    start with `[`)."""
    spec: dict[str, Any] = {"type": "pythonic_calls", "free_text": free_text,
                            "functions": [{"name": name, "parameters": object_schema(params, name)}
                                          for name, params in functions]}
    if one_call:
        spec["max_calls"] = 1
    return spec


def object_schema(params: dict[str, Any], name: str) -> dict[str, Any]:
    """A function's parameters schema, made to describe an object (arguments are one);
    ValueError for a schema of another type."""
    kind = params.get("type")
    if kind is None:
        return {**params, "type": "object"}
    if kind != "object":
        raise ValueError(f"the parameters of {name!r} must describe an object, not {kind!r}")
    return params


def tools_prompt(tools: list[dict[str, Any]], parser: str = "hermes") -> str:
    """OpenAI function tools described for the model, with the format's call syntax: the
    system prompt for a chat template that takes no tools."""
    lines = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    example = ("[function_name(argument=value, ...)]" if parser == "pythonic"
               else call_text(parser, "<function name>", "<arguments as a JSON object>"))
    return ("You can call functions to help answer. These are the functions, one JSON signature a line:\n"
            f"{lines}\n\nTo call a function, write exactly:\n{example}\n"
            "You may write several calls one after another. The results come back in the next message.")
