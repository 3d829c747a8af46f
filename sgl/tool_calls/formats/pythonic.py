"""pythonic: Llama 3.2 / Llama 4's calls as a Python list, `[f(a=1, b="x"), g()]`, as the whole
output (maybe inside `<|python_start|>` ... `<|python_end|>`). Not JSON, so it has its own
call text and its own constraint (sgl's `pythonic_calls` tag, `sgl.constrained.pythonic`)."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from sgl.tool_calls.base import (
    Functions,
    ToolCall,
    ToolCallDelta,
    ToolFormat,
    ToolParser,
    ToolStreamer,
    deltas,
)
from sgl.tool_calls.syntax import object_schema

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
# A call list starts `[name(`; a text that cannot grow into that start is content at once.
_PY_CALLS_START = re.compile(r"\[\s*[^\W\d][\w.]*\s*\(")
_PY_CALLS_PREFIX = re.compile(r"(?:\[\s*(?:[^\W\d][\w.]*\s*)?)?\Z")


def _py_literal_kwargs(call: ast.expr) -> tuple[str, str] | None:
    """`name(k=literal, ...)` -> (dotted name, JSON of the keywords); None for anything else."""
    if not isinstance(call, ast.Call) or call.args:
        return None
    parts, func = [], call.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    name = ".".join([func.id, *reversed(parts)])
    try:
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg is not None}
        if len(kwargs) != len(call.keywords):  # a `**mapping`
            return None
        return name, json.dumps(kwargs, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return None


def _py_unwrap(text: str) -> str:
    s = text.strip()
    if s.startswith(PYTHON_START):
        s = s[len(PYTHON_START) :]
    s = s.rstrip()
    return (s[: -len(PYTHON_END)] if s.endswith(PYTHON_END) else s).strip()


class PythonicParser(ToolParser):
    """Llama 3.2 / Llama 4 pythonic calls: the whole output is `[f(a=1, b="x"), g()]`, maybe
    inside `<|python_start|>` ... `<|python_end|>`. Keyword arguments with literal values only
    (str, numbers, bool, None, lists, dicts, nested); anything else leaves all as content."""

    name = "pythonic"

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        src = _py_unwrap(text)
        if not _PY_CALLS_START.match(src):
            return text, []
        try:
            tree = ast.parse(src, mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return text, []
        if not isinstance(tree.body, ast.List):
            return text, []
        calls = [_py_literal_kwargs(e) for e in tree.body.elts]
        if not calls or any(c is None for c in calls):
            return text, []
        return "", [ToolCall(*c) for c in calls if c is not None]

    def streamer(self) -> ToolStreamer:
        return _PythonicStreamer(self)


def _may_be_py_calls(text: str) -> bool:
    """Whether `text` (the output so far) can still grow into a pythonic call list."""
    s = text.lstrip()
    if PYTHON_START.startswith(s):  # nothing yet, or part of the tag
        return True
    if s.startswith(PYTHON_START):
        s = s[len(PYTHON_START) :].lstrip()
    return bool(_PY_CALLS_START.match(s) or _PY_CALLS_PREFIX.match(s))


class _PythonicStreamer(ToolStreamer):
    """Holds the whole output while it may be a call list (decided at the end); once it cannot
    be, sends it all as content."""

    def __init__(self, parser: PythonicParser) -> None:
        self._parser = parser
        self._held = ""
        self._through = False

    def feed(self, piece: str) -> tuple[str, list[ToolCallDelta]]:
        if self._through:
            return piece, []
        self._held += piece
        if _may_be_py_calls(self._held):
            return "", []
        self._through, out, self._held = True, self._held, ""
        return out, []

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        if self._through:
            return "", []
        content, calls = self._parser.parse(self._held)
        self._held = ""
        return content, deltas(calls)


def pythonic_constraint(functions: Functions, free_text: bool, one_call: bool) -> dict[str, Any]:
    """The constraint for pythonic calls (`[f(a=1)]`, `sgl.constrained.pythonic`), passed
    as a structural tag: the output is such a list (or, with `free_text`, text that does not
    start with `[`)."""
    spec: dict[str, Any] = {
        "type": "pythonic_calls",
        "free_text": free_text,
        "functions": [
            {"name": name, "parameters": object_schema(params, name)} for name, params in functions
        ],
    }
    if one_call:
        spec["max_calls"] = 1
    return spec


def _python_literal(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{json.dumps(k)}: {_python_literal(v)}" for k, v in value.items())
            + "}"
        )
    return json.dumps(value, ensure_ascii=False)


class PythonicFormat(ToolFormat):
    """Calls as a Python list of keyword calls; their JSON arguments written as Python literals."""

    parser = PythonicParser

    def teaches(self, chat_template: str) -> bool:
        return PYTHON_START in chat_template

    def call_text(self, name: str, arguments: str) -> str:
        try:
            args = json.loads(arguments)
        except ValueError:
            args = None
        if isinstance(args, dict):
            return f"[{name}({', '.join(f'{k}={_python_literal(v)}' for k, v in args.items())})]"
        return f"[{name}({arguments})]"

    def constraint(self, functions: Functions, free_text: bool, one_call: bool) -> dict[str, Any]:
        return pythonic_constraint(functions, free_text, one_call)

    def function_fields(self, k: int) -> dict[str, str]:
        return {f"functions[{k}].name": "name", f"functions[{k}].parameters": "parameters"}

    def prompt_example(self) -> str:
        return "[function_name(argument=value, ...)]"


FORMAT = PythonicFormat()
