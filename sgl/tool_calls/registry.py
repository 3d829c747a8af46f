"""The tool-call formats by name: the one table (`FORMATS`) that the server, the DSL and the
CLI's `--tool-call-parser` choices and aliases read, the chat-template detection, and the
by-name calls (`call_text`, `structural_tag`, `tools_prompt`) that defer to the format.

A new format is a module under `sgl.tool_calls.formats` declaring its `FORMAT`, listed here.
"""

from __future__ import annotations

import json
from typing import Any

from sgl.tool_calls.base import Functions, ToolFormat, ToolParser
from sgl.tool_calls.formats import hermes, llama3_json, mistral, pythonic
from sgl.tool_calls.syntax import CallSyntax, JsonCallFormat

FORMATS: dict[str, ToolFormat] = {
    m.FORMAT.name: m.FORMAT for m in (hermes, llama3_json, mistral, pythonic)
}
DEFAULT_FORMAT = (
    "hermes"  # when a chat template names none, and for a name we do not know in `call_text`
)
# The order templates are tested in: pythonic before llama3_json, as Llama 4 templates also mention
# ipython.
DETECTION_ORDER = ("hermes", "mistral", "pythonic", "llama3_json")

PARSERS: dict[str, type[ToolParser]] = {name: f.parser for name, f in FORMATS.items()}
SYNTAX: dict[str, CallSyntax] = {
    name: f.syntax for name, f in FORMATS.items() if isinstance(f, JsonCallFormat)
}


def parser_names() -> dict[str, str]:
    """Every name `--tool-call-parser` takes (ours, then SGLang's aliases) -> the format's name."""
    return {
        **{name: name for name in FORMATS},
        **{a: name for name, f in FORMATS.items() for a in f.aliases},
    }


def get_format(name: str) -> ToolFormat:
    """A format by its name; ValueError naming the known ones otherwise."""
    fmt = FORMATS.get(name)
    if fmt is None:
        raise ValueError(
            f"unknown tool-call parser {name!r}; known parsers: {', '.join(sorted(FORMATS))}"
        )
    return fmt


def get_parser(name: str) -> ToolParser:
    """A parser by its name; ValueError naming the known ones otherwise."""
    return get_format(name).parser()


def detect_parser(chat_template: str | None) -> str:
    """The tool-call format a chat template teaches the model, from its markers; "hermes" if
    unknown."""
    t = chat_template or ""
    return next((name for name in DETECTION_ORDER if FORMATS[name].teaches(t)), DEFAULT_FORMAT)


def call_text(parser: str, name: str, arguments: str) -> str:
    """One call written in the format (for rendering history the template cannot);
    `arguments` is the arguments object's JSON text."""
    return FORMATS.get(parser, FORMATS[DEFAULT_FORMAT]).call_text(name, arguments)


def structural_tag(
    functions: Functions, free_text: bool, one_call: bool, parser: str
) -> dict[str, Any]:
    """The constraint for calls to `functions` ((name, parameters schema) pairs) in the
    format: free text with calls in it (`free_text`), or calls only; at most one call
    (`one_call`) or any number. KeyError for a format without a JSON call syntax."""
    return SYNTAX[parser].structural_tag(functions, free_text, one_call)


def tools_prompt(tools: list[dict[str, Any]], parser: str = DEFAULT_FORMAT) -> str:
    """OpenAI function tools described for the model, with the format's call syntax: the
    system prompt for a chat template that takes no tools."""
    lines = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    example = FORMATS.get(parser, FORMATS[DEFAULT_FORMAT]).prompt_example()
    return (
        "You can call functions to help answer. These are the functions, one JSON signature a "
        "line:\n"
        f"{lines}\n\nTo call a function, write exactly:\n{example}\n"
        "You may write several calls one after another. The results come back in the next message."
    )
