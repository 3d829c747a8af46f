"""Pythonic tool calls as a grammar: `[get_weather(city="Paris", days=3), get_time()]`.

The format of Llama 3.2 / Llama 4's pythonic tool calling: the whole output is a Python
list of calls with keyword arguments. The constraint (`{"type": "pythonic_calls",
"functions": [{"name", "parameters"}], "free_text", "max_calls", "start_after"}`, passed as a
structural tag) makes every call name a declared function and give its parameters as
keywords, in declared order, required ones always, each value a Python literal built from
the parameter's JSON schema: the schema's JSON grammar (`json_schema_to_rules`) with JSON's
`true` / `false` / `null` written as `True` / `False` / `None` (JSON numbers, strings,
arrays and objects are Python literals already). With `free_text`, the output is either
such a list or text that does not start with `[`.
"""

from __future__ import annotations

import re
from typing import Any

from sgl.constrained import ebnf_parse as ast
from sgl.constrained.errors import GrammarError
from sgl.constrained.structural import after_marker, renamed

PARAM = "structural_tag"
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CALL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
MAX_FUNCTIONS = 64
MAX_LEADING_SPACE = 8
_JSON_WORDS = re.compile(r"\b(true|false|null)\b")
_PY_WORDS = {"true": "True", "false": "False", "null": "None"}


def pythonic_rules(spec: dict[str, Any]) -> dict[str, ast.RuleDef]:
    """The constraint's EBNF rules, `root` first; GrammarError naming the field."""
    from sgl.constrained.json_schema import json_schema_to_rules

    functions = spec.get("functions")
    if not isinstance(functions, list) or not functions or len(functions) > MAX_FUNCTIONS:
        raise GrammarError(
            f"pythonic_calls.functions must be a list of 1 to {MAX_FUNCTIONS} functions",
            f"{PARAM}.functions",
        )
    body: dict[str, ast.Expr] = {}
    rules: dict[str, ast.RuleDef] = {}
    calls = []
    for i, fn in enumerate(functions):
        where = f"{PARAM}.functions[{i}]"
        name, params = _function(fn, where)
        props = params.get("properties") or {}
        required = set(params.get("required") or [])
        for j, (key, schema) in enumerate(props.items()):
            prefix = f"f{i}_{j}_"
            try:
                value_rules = json_schema_to_rules(schema)
            except GrammarError as e:
                raise GrammarError(
                    f"{where}.parameters.properties.{key}: {e.message}", f"{where}.parameters"
                ) from None
            for rule_name, rule in value_rules.items():  # JSON's words as Python's
                rules[prefix + rule_name] = ast.RuleDef(
                    prefix + rule_name, renamed(rule.expr, prefix, _python_words), 0, 0
                )
        body.update(_keywords(f"f{i}", list(props), required))
        calls.append(ast.Seq((ast.Lit(name + "("), _ref(f"f{i}_a0"), ast.Lit(")"))))
    limit = spec.get("max_calls")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise GrammarError(
            "pythonic_calls.max_calls must be a positive integer", f"{PARAM}.max_calls"
        )
    body["call"] = ast.Alt(tuple(calls))
    more = ast.Repeat(
        ast.Seq((ast.Lit(", "), _ref("call"))), 0, None if limit is None else limit - 1
    )
    body["calls"] = ast.Seq((ast.Lit("["), _ref("call"), more, ast.Lit("]")))
    space = ast.Repeat(ast.CharSet(((9, 10), (13, 13), (32, 32))), 0, MAX_LEADING_SPACE)
    if spec.get("free_text", False):
        not_list = ast.CharSet(ast.complement_ranges(((9, 10), (13, 13), (32, 32), (91, 91))))
        text = ast.Alt(
            (ast.Lit(""), ast.Seq((not_list, ast.Repeat(ast.CharSet(((0, 0x10FFFF),)), 0, None))))
        )
        body["root"] = ast.Seq((space, ast.Alt((_ref("calls"), text))))
    else:
        body["root"] = ast.Seq((space, _ref("calls")))
    marker = spec.get("start_after")
    if marker is not None:
        if not isinstance(marker, str) or not marker:
            raise GrammarError(
                "pythonic_calls.start_after must be a non-empty string", f"{PARAM}.start_after"
            )
        after_marker(body, marker)
    defs = {name: ast.RuleDef(name, expr, 0, 0) for name, expr in body.items()}
    return {"root": defs.pop("root"), **defs, **rules}


def _function(fn: Any, where: str) -> tuple[str, dict[str, Any]]:
    if (
        not isinstance(fn, dict)
        or not isinstance(fn.get("name"), str)
        or not CALL_NAME.match(fn["name"])
    ):
        raise GrammarError(f"{where}.name must be a Python name (dots allowed)", f"{where}.name")
    params = fn.get("parameters", {})
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise GrammarError(f"{where}.parameters must be an object schema", f"{where}.parameters")
    unsupported = sorted(
        set(params) & {"anyOf", "oneOf", "allOf", "not", "if", "patternProperties", "$ref"}
    )
    if unsupported:
        raise GrammarError(
            f"{where}.parameters: {unsupported[0]!r} at the top cannot be written as keyword "
            "arguments",
            f"{where}.parameters",
        )
    for key in params.get("properties") or {}:
        if not IDENTIFIER.match(key):
            raise GrammarError(
                f"{where}.parameters: property {key!r} is not a Python identifier, so it cannot "
                "be a "
                "keyword argument",
                f"{where}.parameters",
            )
    return fn["name"], params


def _keywords(fn: str, keys: list[str], required: set[str]) -> dict[str, ast.Expr]:
    """<fn>_a<j>: the keywords from the j-th on, none written yet; <fn>_b<j>: some were
    (so each starts with ", "). Required keywords must appear, in declared order."""
    out: dict[str, ast.Expr] = {
        f"{fn}_a{len(keys)}": ast.Lit(""),
        f"{fn}_b{len(keys)}": ast.Lit(""),
    }
    for j in reversed(range(len(keys))):
        kwarg = ast.Seq((ast.Lit(keys[j] + "="), _ref(f"{fn}_{j}_root")))
        first = ast.Seq((kwarg, _ref(f"{fn}_b{j + 1}")))
        later = ast.Seq((ast.Lit(", "), kwarg, _ref(f"{fn}_b{j + 1}")))
        if keys[j] in required:
            out[f"{fn}_a{j}"], out[f"{fn}_b{j}"] = first, later
        else:
            out[f"{fn}_a{j}"] = ast.Alt((first, _ref(f"{fn}_a{j + 1}")))
            out[f"{fn}_b{j}"] = ast.Alt((later, _ref(f"{fn}_b{j + 1}")))
    return out


def _python_words(text: str) -> str:
    """`true` / `false` / `null` outside the string literals of a literal piece. (A piece
    that ends inside a string it did not open is read as outside: the calls' arguments are
    checked against the schema after parsing, so a rare wrong word is caught there.)"""
    if not _JSON_WORDS.search(text):
        return text
    parts = re.split(r'("(?:[^"\\]|\\.)*"?)', text)
    return "".join(
        p if p.startswith('"') else _JSON_WORDS.sub(lambda m: _PY_WORDS[m.group(1)], p)
        for p in parts
    )


def _ref(name: str) -> ast.Ref:
    return ast.Ref(name, 0, 0)
