"""The entry points: a schema to the regex text, to an :class:`~sgl.constrained.regex.Rx`
(with its size), or to EBNF rules for the grammar route.

Separate from the converter: what a caller gets (error when nothing can match, the shared
rules a grammar needs added) is decided here, the walk itself in :mod:`.converter`.
"""

from __future__ import annotations

from typing import Any

from sgl.constrained.errors import GrammarError
from sgl.constrained.json_schema.containers import _array_of, _map_object
from sgl.constrained.json_schema.converter import Converter
from sgl.constrained.json_schema.keywords import PARAM, load_schema
from sgl.constrained.json_schema.lexical import (
    _BOOLEAN,
    _NULL,
    _NUMBER,
    _SHARED,
    _STRING,
    _VALUE_RULE,
)
from sgl.constrained.regex import Rx, rx_alt, rx_ref


def json_schema_to_regex(spec: str | dict | bool, *, max_recursion_depth: int = 3) -> str:
    """The canonical regex of the instances we generate for ``spec`` (see the module doc)."""
    return json_schema_to_rx(spec, max_recursion_depth=max_recursion_depth).text


def json_schema_to_rx(
    spec: str | dict | bool, *, max_recursion_depth: int = 3, max_text: int | None = None
) -> Rx:
    """Like :func:`json_schema_to_regex`, keeping the size information. ``max_text``: stop
    with ConstraintTooLarge as soon as a piece of the regex is longer (the caller then takes
    the grammar route, and the rest of a regex too long for it is not built)."""
    schema = load_schema(spec)
    converter = Converter(schema, max_recursion_depth)
    converter.max_text = max_text
    rx = converter.convert(schema, "#")
    if rx is None:
        raise GrammarError(
            "json_schema: no value can satisfy this schema within the supported limits "
            "(contradictory constraints, or a required recursive field)",
            PARAM,
        )
    return rx


def json_schema_to_rules(spec: str | dict | bool, *, max_recursion_depth: int = 3) -> dict:
    """The schema as EBNF rules (``ebnf_parse.RuleDef`` by name, ``root`` first): the
    route for schemas whose regex is too large. ``$ref`` targets become rules, so
    recursion needs no expansion and repeated references cost one copy; free values are
    the recursive JSON rule (no depth limit). Same keywords, same output shape."""
    from sgl.constrained import ebnf_parse as ast

    schema = load_schema(spec)
    conv = Converter(schema, max_recursion_depth, grammar=True)
    rx = conv.convert(schema, "#")
    if rx is None:
        raise GrammarError("json_schema: no value can satisfy this schema", PARAM)
    bodies: dict[str, Rx | None] = {"root": rx, **conv.rules}
    if any(r is not None and _mentions(r.node, _VALUE_RULE) for r in bodies.values()):
        bodies.update(_value_rules())
    bodies.update(_shared_rules(bodies))
    rules = {}
    for name, body in bodies.items():
        # A rule with no member (a contradiction, or a recursion cut) can never finish: the
        # network trims it, and what needs it.
        node = body.node if body is not None else ast.Seq((ast.Lit("x"), ast.Ref(name, 0, 0)))
        rules[name] = ast.RuleDef(name, node, 0, 0)
    return rules


def _mentions(node: Any, name: str) -> bool:
    from sgl.constrained import ebnf_parse as ast

    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Ref):
            if n.name == name:
                return True
        elif isinstance(n, ast.Seq):
            stack.extend(n.items)
        elif isinstance(n, ast.Alt):
            stack.extend(n.options)
        elif isinstance(n, ast.Repeat):
            stack.append(n.item)
    return False


def _shared_rules(bodies: dict[str, Rx | None]) -> dict[str, Rx | None]:
    return {
        name: rx
        for name, rx in _SHARED.items()
        if any(b is not None and _mentions(b.node, name) for b in bodies.values())
    }


def _value_rules() -> dict[str, Rx | None]:
    value = rx_ref(_VALUE_RULE)
    return {
        _VALUE_RULE: rx_alt(
            _STRING, _NUMBER, _BOOLEAN, _NULL, rx_ref("json_object"), rx_ref("json_array")
        ),
        "json_object": _map_object(value, 0, None),
        "json_array": _array_of([], value, 0, None),
    }
