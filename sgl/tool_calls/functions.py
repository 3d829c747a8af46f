"""A Python function as an OpenAI function tool: its name, docstring and a JSON schema of
its parameters from the type annotations, so a program can offer plain functions as tools
and call them with the arguments the model wrote (valid against that schema)."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

_SCALARS = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
}


def function_tool(fn: Callable[..., Any] | dict[str, Any]) -> dict[str, Any]:
    """`{"type": "function", "function": {name, description, parameters}}` for `fn`; an
    OpenAI tool dict is returned as it is. Parameters without a default are required; each
    needs an annotation from str, int, float, bool, list[...], dict, Literal[...] and
    Optional[...] (TypeError naming the parameter otherwise)."""
    if isinstance(fn, dict):
        if not isinstance(fn.get("function"), dict) or not isinstance(
            fn["function"].get("name"), str
        ):
            raise TypeError(
                "a tool dict must be {'type': 'function', 'function': {'name': ..., 'parameters': "
                "...}}"
            )
        return fn
    if not callable(fn):
        raise TypeError(f"a tool is a function or an OpenAI tool dict, got {type(fn).__name__}")
    hints = typing.get_type_hints(fn)
    properties, required = {}, []
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(f"tool {fn.__name__}: parameter {name!r} must be passable by keyword")
        if name not in hints:
            raise TypeError(f"tool {fn.__name__}: parameter {name!r} needs a type annotation")
        properties[name] = _schema(hints[name], f"{fn.__name__}({name})")
        if p.default is p.empty:
            required.append(name)
    params = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    doc = inspect.getdoc(fn) or ""
    return {
        "type": "function",
        "function": {
            "name": fn.__name__,
            "description": doc.split("\n\n")[0],
            "parameters": params,
        },
    }


def _schema(hint: Any, where: str) -> dict[str, Any]:
    if hint in _SCALARS:
        return dict(_SCALARS[hint])
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (list, tuple) and len(args) == 1:
        return {"type": "array", "items": _schema(args[0], where)}
    if hint is dict or origin is dict:
        return {"type": "object"}
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        schemas = [_schema(a, where) for a in options]
        if len(options) < len(args):
            schemas.append({"type": "null"})
        return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    raise TypeError(
        f"tool {where}: cannot describe the annotation {hint!r} as JSON (use str, int, float, "
        "bool, "
        "list[...], dict, Literal[...] or Optional[...])"
    )
