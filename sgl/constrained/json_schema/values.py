"""JSON values written in a schema (``enum``, ``const``): their regex in our spelling,
JSON Schema equality (1 == 1.0, true != 1), and which type a value has.

Separate because the walk, the allOf merge and the oneOf proofs all compare listed values.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sgl.constrained.errors import GrammarError
from sgl.constrained.json_schema.keywords import PARAM
from sgl.constrained.json_schema.lexical import _COLON, _SEP
from sgl.constrained.regex import Rx, rx_cat, rx_lit


def _value_literal(value: Any, where: str) -> Rx:
    """The regex for one JSON value given in the schema (enum/const), in our spelling."""
    if isinstance(value, dict):
        items = [
            rx_cat(rx_lit(json.dumps(k, ensure_ascii=False)), _COLON, _value_literal(v, where))
            for k, v in value.items()
        ]
        return _joined(items, "{", "}")
    if isinstance(value, list):
        return _joined([_value_literal(v, where) for v in value], "[", "]")
    if isinstance(value, float) and not math.isfinite(value):
        raise GrammarError(f"{where}: {value} is not a JSON value", PARAM)
    return rx_lit(json.dumps(value, ensure_ascii=False))


def _joined(items: list[Rx | None], open_: str, close: str) -> Rx:
    parts: list[Rx | None] = [rx_lit(open_)]
    for i, item in enumerate(items):
        if i:
            parts.append(_SEP)
        parts.append(item)
    parts.append(rx_lit(close))
    out = rx_cat(*parts)
    assert out is not None
    return out


def _json_equal(a: Any, b: Any) -> bool:
    """JSON Schema equality: 1 == 1.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if type(a) in (int, float) and type(b) in (int, float):
        return a == b
    return type(a) is type(b) and a == b


def _listed(schema: dict) -> list | None:
    """The values an enum/const allows (both: the common ones), or None."""
    if "enum" in schema and isinstance(schema["enum"], list):
        values = schema["enum"]
        return (
            [v for v in values if _json_equal(v, schema["const"])]
            if "const" in schema
            else list(values)
        )
    return [schema["const"]] if "const" in schema else None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _type_list(t: Any) -> list:
    return [t] if isinstance(t, str) else list(t) if isinstance(t, list) else []


def _has_type(value: Any, t: str) -> bool:
    if t == "null":
        return value is None
    if t == "boolean":
        return isinstance(value, bool)
    if t == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "string":
        return isinstance(value, str)
    if t == "array":
        return isinstance(value, list)
    return isinstance(value, dict)
