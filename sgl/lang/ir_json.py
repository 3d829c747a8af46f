"""The program IR as JSON, to ship a traced program to a server (`POST /run_program`).

    {"format_version": 1, "nodes": [node, ...]}

A node is an object with a "type": `text` {text}, `gen` {name, sampling, logprobs, dtype},
`select` {name, choices, temperature, choices_method}, `role_begin` / `role_end` {role},
`var_scope_begin` / `var_scope_end` {name}, `set_var` {name, value (JSON)}, `fork`
{fork_id, branches: [[node, ...], ...]}, `join` {mode}, `variable` {name, source: null or
[[fork_id, branch], ...], the state it was read from}, `argument` {name}. `choices_method`
is one of the built-in methods by name; a program with a custom one cannot be shipped.

`program_from_json` checks everything a node holds except what the engine validates itself
(sampling values, at run time) and raises `IRFormatError` naming the node's path
(`nodes[3].branches[1][0].choices`) and the fix.
"""

from __future__ import annotations

import json
from typing import Any

from sgl.lang import ir
from sgl.lang.choices import (
    ChoicesMethod,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from sgl.tool_calls import PARSERS

FORMAT_VERSION = 1
CHOICES_METHODS: dict[str, ChoicesMethod] = {
    "token_length_normalized": token_length_normalized,
    "greedy_token_selection": greedy_token_selection,
    "unconditional_likelihood_normalized": unconditional_likelihood_normalized,
}
JOIN_MODES = ("gather_variable", "concate_and_append")
ROLES = ("system", "user", "assistant")


class IRFormatError(ValueError):
    """A shipped program that cannot be read; `path` names the node or field."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path, self.detail = path, message


# ---------------------------------------------------------------------- to JSON


def program_to_json(nodes: list[ir.Expr]) -> dict[str, Any]:
    """The IR as plain JSON data; IRFormatError where a node holds something JSON cannot
    carry (a custom choices method, a non-JSON set_var value)."""
    return {"format_version": FORMAT_VERSION, "nodes": _nodes_to_json(nodes, "nodes")}


def _nodes_to_json(nodes: list[ir.Expr], path: str) -> list[dict[str, Any]]:
    return [_node_to_json(n, f"{path}[{i}]") for i, n in enumerate(nodes)]


def _node_to_json(n: ir.Expr, path: str) -> dict[str, Any]:
    if isinstance(n, ir.Text):
        return {"type": "text", "text": n.text}
    if isinstance(n, ir.Gen):
        _check_json(n.sampling, f"{path}.sampling")
        return {
            "type": "gen",
            "name": n.name,
            "sampling": dict(n.sampling),
            "logprobs": dict(n.logprobs),
            "dtype": n.dtype,
            **({"tool_format": n.tool_format} if n.tool_format else {}),
        }
    if isinstance(n, ir.Select):
        method = n.choices_method or token_length_normalized
        names = [k for k, v in CHOICES_METHODS.items() if v is method]
        if not names:
            raise IRFormatError(
                f"a custom choices_method ({type(method).__name__}) cannot be shipped", path
            )
        return {
            "type": "select",
            "name": n.name,
            "choices": list(n.choices),
            "temperature": n.temperature,
            "choices_method": names[0],
        }
    if isinstance(n, (ir.RoleBegin, ir.RoleEnd)):
        return {"type": "role_begin" if isinstance(n, ir.RoleBegin) else "role_end", "role": n.role}
    if isinstance(n, (ir.VarScopeBegin, ir.VarScopeEnd)):
        return {
            "type": "var_scope_begin" if isinstance(n, ir.VarScopeBegin) else "var_scope_end",
            "name": n.name,
        }
    if isinstance(n, ir.SetVar):
        _check_json(n.value, f"{path}.value")
        return {"type": "set_var", "name": n.name, "value": n.value}
    if isinstance(n, ir.Fork):
        return {
            "type": "fork",
            "fork_id": n.fork_id,
            "branches": [
                _nodes_to_json(b, f"{path}.branches[{i}]") for i, b in enumerate(n.branches)
            ],
        }
    if isinstance(n, ir.Join):
        return {"type": "join", "mode": n.mode}
    if isinstance(n, ir.Variable):
        return {
            "type": "variable",
            "name": n.name,
            "source": [list(p) for p in n.source] if n.source else None,
        }
    if isinstance(n, ir.Argument):
        return {"type": "argument", "name": n.name}
    raise IRFormatError(f"{type(n).__name__} cannot be shipped", path)


def _check_json(value: Any, path: str) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise IRFormatError(f"not JSON data ({e})", path) from None


# ---------------------------------------------------------------------- from JSON


def program_from_json(data: Any) -> list[ir.Expr]:
    if not isinstance(data, dict):
        raise IRFormatError("a program is an object {format_version, nodes}", "nodes")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise IRFormatError(
            f"format_version {version!r} is not supported (this server reads {FORMAT_VERSION}); "
            "use the same sgl version on client and server",
            "format_version",
        )
    return _nodes_from_json(data.get("nodes"), "nodes", set())


def _nodes_from_json(items: Any, path: str, fork_ids: set[int]) -> list[ir.Expr]:
    if not isinstance(items, list):
        raise IRFormatError("expected a list of nodes", path)
    return [_node_from_json(x, f"{path}[{i}]", fork_ids) for i, x in enumerate(items)]


def _field(node: dict, key: str, kinds: type | tuple, path: str, optional: bool = False) -> Any:
    value = node.get(key)
    if value is None and optional:
        return None
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, kinds) or (
        isinstance(value, bool) and bool not in kinds
    ):  # true is not a number
        names = " or ".join(k.__name__ for k in kinds)
        raise IRFormatError(f"{key!r} must be {names}, got {type(value).__name__}", f"{path}.{key}")
    return value


def _node_from_json(node: Any, path: str, fork_ids: set[int]) -> ir.Expr:
    if not isinstance(node, dict) or not isinstance(node.get("type"), str):
        raise IRFormatError("a node is an object with a string 'type'", path)
    kind = node["type"]
    reader = _READERS.get(kind)
    if reader is None:
        raise IRFormatError(
            f"unknown node type {kind!r} (known: {', '.join(_READERS)})", f"{path}.type"
        )
    return reader(node, path, fork_ids)


def _gen(node: dict, path: str, fork_ids: set[int]) -> ir.Gen:
    sampling = _field(node, "sampling", dict, path, optional=True) or {}
    unknown = sorted(set(sampling) - set(ir.SAMPLING_KEYS))
    if unknown:
        raise IRFormatError(
            f"unknown sampling parameter {unknown[0]!r}", f"{path}.sampling.{unknown[0]}"
        )
    logprobs = _field(node, "logprobs", dict, path, optional=True) or {}
    unknown = sorted(set(logprobs) - set(ir.LOGPROB_KEYS))
    if unknown:
        raise IRFormatError(
            f"unknown logprob option {unknown[0]!r}", f"{path}.logprobs.{unknown[0]}"
        )
    dtype = _field(node, "dtype", str, path, optional=True)
    if dtype not in (None, "int", "float", "bool", "str"):
        raise IRFormatError(
            f"dtype must be int, float, bool or str, got {dtype!r}", f"{path}.dtype"
        )
    tool_format = _field(node, "tool_format", str, path, optional=True)
    if tool_format not in (None, *PARSERS):
        raise IRFormatError(
            f"tool_format must be one of {', '.join(PARSERS)}, got {tool_format!r}",
            f"{path}.tool_format",
        )
    return ir.Gen(
        _field(node, "name", str, path, optional=True), sampling, logprobs, dtype, tool_format
    )


def _select(node: dict, path: str, fork_ids: set[int]) -> ir.Select:
    choices = _field(node, "choices", list, path)
    if not choices or not all(isinstance(c, str) for c in choices):
        raise IRFormatError("choices must be a non-empty list of strings", f"{path}.choices")
    method = node.get("choices_method") or "token_length_normalized"
    if method not in CHOICES_METHODS:
        raise IRFormatError(
            f"unknown choices_method {method!r} (known: {', '.join(CHOICES_METHODS)})",
            f"{path}.choices_method",
        )
    temperature = _field(node, "temperature", (int, float), path, optional=True) or 0.0
    return ir.Select(
        _field(node, "name", str, path, optional=True),
        choices,
        float(temperature),
        CHOICES_METHODS[method],
    )


def _role(cls: type) -> Any:
    def read(node: dict, path: str, fork_ids: set[int]) -> ir.Expr:
        role = _field(node, "role", str, path)
        if role not in ROLES:
            raise IRFormatError(
                f"role must be one of {', '.join(ROLES)}, got {role!r}", f"{path}.role"
            )
        return cls(role)

    return read


def _fork(node: dict, path: str, fork_ids: set[int]) -> ir.Fork:
    fork_id = _field(node, "fork_id", int, path)
    if fork_id in fork_ids:
        raise IRFormatError(f"fork_id {fork_id} is used twice", f"{path}.fork_id")
    fork_ids.add(fork_id)
    branches = _field(node, "branches", list, path)
    if not branches:
        raise IRFormatError("a fork has at least one branch", f"{path}.branches")
    return ir.Fork(
        [_nodes_from_json(b, f"{path}.branches[{i}]", fork_ids) for i, b in enumerate(branches)],
        fork_id,
    )


def _join(node: dict, path: str, fork_ids: set[int]) -> ir.Join:
    mode = _field(node, "mode", str, path)
    if mode not in JOIN_MODES:
        raise IRFormatError(
            f"mode must be one of {', '.join(JOIN_MODES)}, got {mode!r}", f"{path}.mode"
        )
    return ir.Join(mode)


def _variable(node: dict, path: str, fork_ids: set[int]) -> ir.Variable:
    source = node.get("source")
    if source is not None:
        if not isinstance(source, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) for x in p)
            for p in source
        ):
            raise IRFormatError(
                "source must be null or a list of [fork_id, branch] pairs", f"{path}.source"
            )
        source = tuple(tuple(p) for p in source)
    return ir.Variable(_field(node, "name", str, path), source)


_READERS: dict[str, Any] = {
    "text": lambda n, p, f: ir.Text(_field(n, "text", str, p)),
    "gen": _gen,
    "select": _select,
    "role_begin": _role(ir.RoleBegin),
    "role_end": _role(ir.RoleEnd),
    "var_scope_begin": lambda n, p, f: ir.VarScopeBegin(_field(n, "name", str, p)),
    "var_scope_end": lambda n, p, f: ir.VarScopeEnd(_field(n, "name", str, p)),
    "set_var": lambda n, p, f: ir.SetVar(_field(n, "name", str, p), n.get("value")),
    "fork": _fork,
    "join": _join,
    "variable": _variable,
    "argument": lambda n, p, f: ir.Argument(_field(n, "name", str, p)),
}
