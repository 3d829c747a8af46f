"""``not``, ``if``/``then``/``else``, ``dependentSchemas`` and schema-form ``dependencies``
as unions of positive schemas: what makes them translatable.

The translator builds unions (``anyOf``) and intersections (``allOf``) of the schemas it
can express, but a regex or grammar has no complement that stays small, so ``not S``
cannot be built from ``S``. Instead the negation is pushed down the keywords of ``S``:
``S`` is the conjunction of its keywords, so it fails exactly where one of them fails, and
each keyword's failure is a positive schema (a failed ``minimum`` is a number below it, a
failed ``required`` an object without that member, a failed ``properties`` an object with
a member whose value fails). :meth:`Negation.fails` returns that list; its union is
exactly the set of instances ``S`` rejects. The leaves are ``not`` over a type, const or
enum, which the translator enforces directly. A keyword whose failure is not a positive
schema of this kind (``pattern``, ``format``, ``items``, ``additionalProperties``,
``multipleOf``, ...) raises :class:`NotNegatable` naming it; the translator turns that
into a :class:`GrammarError` at the schema's path.

A condition ``{if: I, then: T, else: E}`` is then the union (I and T) or (not I and E), and
``dependentSchemas {a: S}`` is ``if: {type: object, required: [a]}, then: S``. Several
conditions multiply out (:func:`condition_options`), except those that test one property
against listed values (a discriminator, the usual shape: ``if: {properties: {kind:
{const: "x"}}}``): a group of those is split by the property's value instead, one case per
value, so k of them cost k + 3 cases, not 2**k.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_CASES = 64  # schemas in one failure list (products of anyOf branches multiply)
MAX_REF_DEPTH = 16  # $ref followed inside one negation (a cycle is refused, not looped)

Schema = dict | bool

# keyword -> (type it constrains, the keyword of the complementary bound, how the bound moves)
_BOUNDS = {
    "minimum": ("number", "exclusiveMaximum", 0),
    "maximum": ("number", "exclusiveMinimum", 0),
    "exclusiveMinimum": ("number", "maximum", 0),
    "exclusiveMaximum": ("number", "minimum", 0),
    "minLength": ("string", "maxLength", -1),
    "maxLength": ("string", "minLength", 1),
    "minItems": ("array", "maxItems", -1),
    "maxItems": ("array", "minItems", 1),
    "minProperties": ("object", "maxProperties", -1),
    "maxProperties": ("object", "minProperties", 1),
}


class NotNegatable(ValueError):
    """A schema whose failures cannot be written as a union of translatable schemas."""


def conjoin(*parts: Schema) -> Schema:
    """``allOf`` of ``parts``, with ``true`` dropped and ``false`` absorbing."""
    kept = [p for p in parts if p is not True and p != {}]
    if any(p is False for p in kept):
        return False
    if not kept:
        return True
    return kept[0] if len(kept) == 1 else {"allOf": kept}


class Negation:
    """Pushes ``not`` down a schema. ``resolve`` maps a ``$ref`` to its target and
    ``keywords`` strips annotations (both the translator's own)."""

    def __init__(self, resolve: Callable[[str], Any], keywords: Callable[[dict], dict]) -> None:
        self.resolve = resolve
        self.keywords = keywords

    def fails(self, schema: Any, depth: int = 0) -> list[Schema]:
        """Schemas whose union is exactly the set of instances ``schema`` rejects."""
        if schema is True:
            return []
        if schema is False:
            return [True]
        if not isinstance(schema, dict):
            raise NotNegatable(
                f"a schema must be an object or a boolean, got {type(schema).__name__}"
            )
        schema = self.keywords(schema)
        out: list[Schema] = []
        for key in schema:
            if key in ("then", "else") and "if" in schema:
                continue  # read with "if"
            out += self.keyword_fails(key, schema, depth)
            self.check_size(out)
        return [s for s in out if s is not False]

    def keyword_fails(self, key: str, schema: dict, depth: int) -> list[Schema]:
        value = schema[key]
        if key in ("type", "enum", "const"):
            return [{"not": {key: value}}]
        if key == "not":
            return [value]
        if key in _BOUNDS:
            return self.bound_fails(key, value)
        if key == "required":
            return [{"type": "object", "properties": {name: False}} for name in _names(value, key)]
        if key == "properties":
            if not isinstance(value, dict):
                raise NotNegatable("properties must be an object")
            return [
                {"type": "object", "required": [name], "properties": {name: f}}
                for name, sub in value.items()
                for f in self.fails(sub, depth)
            ]
        if key in ("dependentRequired", "dependencies", "dependentSchemas"):
            return self.dependency_fails(key, value, depth)
        if key == "allOf":
            return [f for part in _schemas(value, key) for f in self.fails(part, depth)]
        if key == "anyOf":
            return self.product([self.fails(b, depth) for b in _schemas(value, key)])
        if key == "oneOf":
            branches = _schemas(value, key)  # none holds, or two do
            pairs = [conjoin(a, b) for a, b in itertools.combinations(branches, 2)]
            return self.product([self.fails(b, depth) for b in branches]) + pairs
        if key == "$ref":
            if depth >= MAX_REF_DEPTH:
                raise NotNegatable(f"$ref chains deeper than {MAX_REF_DEPTH} (a reference cycle?)")
            return self.fails(self.resolve(value), depth + 1)
        if key == "if":  # fails where (if and not then) or (not if and not else)
            cond, then, other = value, schema.get("then", True), schema.get("else", True)
            return [conjoin(cond, f) for f in self.fails(then, depth)] + [
                conjoin(g, f) for g in self.fails(cond, depth) for f in self.fails(other, depth)
            ]
        if key in ("then", "else"):
            return []  # without "if" they have no effect
        raise NotNegatable(
            f"keyword '{key}' cannot be negated (inside not, or in an if condition); negatable "
            "keywords: type, "
            "const, enum, required, properties, bounds (minimum, minLength, minItems, "
            "minProperties, ...), "
            "dependentRequired, dependentSchemas, not, allOf, anyOf, oneOf, if/then/else, $ref"
        )

    def bound_fails(self, key: str, value: Any) -> list[Schema]:
        kind, opposite, step = _BOUNDS[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise NotNegatable(
                f"{key} must be a number (draft-4 boolean exclusive bounds cannot be negated)"
            )
        if step and value + step < 0:
            return []  # minLength 0 and the like hold everywhere
        return [{"type": kind, opposite: value + step}]

    def dependency_fails(self, key: str, value: Any, depth: int) -> list[Schema]:
        """An object with the member present and what it needs missing or failing."""
        if not isinstance(value, dict):
            raise NotNegatable(f"{key} must be an object")
        out: list[Schema] = []
        for name, needs in value.items():
            present = {"type": "object", "required": [name]}
            if isinstance(needs, list):
                out += [
                    {**present, "properties": {n: False}} for n in _names(needs, key) if n != name
                ]
            else:
                out += [conjoin(present, f) for f in self.fails(needs, depth)]
        return out

    def product(self, lists: list[list[Schema]]) -> list[Schema]:
        """The conjunctions of one schema from each list (all of them fail)."""
        out: list[Schema] = [True]
        for options in lists:
            out = [c for c in (conjoin(a, b) for a in out for b in options) if c is not False]
            self.check_size(out)
        return out

    @staticmethod
    def check_size(cases: list) -> None:
        if len(cases) > MAX_CASES:
            raise NotNegatable(
                f"the negation has more than {MAX_CASES} cases (anyOf branches multiply)"
            )


def _names(value: Any, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise NotNegatable(f"{key} must be a list of property names")
    return value


def _schemas(value: Any, key: str) -> list:
    if not isinstance(value, list) or not value:
        raise NotNegatable(f"{key} must be a non-empty list of schemas")
    return value


CONDITIONAL_KEYWORDS = frozenset(
    {"if", "then", "else", "dependentSchemas"}
)  # and schema-valued `dependencies`

Condition = tuple[Any, Any, Any]  # (if, then, else)


def schema_dependencies(schema: dict) -> dict:
    """The schema-valued entries of draft 4-7 ``dependencies`` (the list-valued ones are
    dependentRequired)."""
    deps = schema.get("dependencies")
    if not isinstance(deps, dict):
        return {}
    return {k: v for k, v in deps.items() if isinstance(v, (dict, bool))}


def conditional(schema: dict) -> bool:
    return bool(CONDITIONAL_KEYWORDS & set(schema)) or bool(schema_dependencies(schema))


def split_conditions(schema: dict) -> tuple[Schema, list[Condition]]:
    """``schema`` without its conditional keywords, and those as (if, then, else)."""
    deps = schema_dependencies(schema)
    conditions: list[Condition] = []
    if "if" in schema:  # then/else without if have no effect
        conditions.append((schema["if"], schema.get("then", True), schema.get("else", True)))
    dependent = schema.get("dependentSchemas") or {}
    if not isinstance(dependent, dict):
        raise NotNegatable("dependentSchemas must be an object of property name -> schema")
    for name, sub in [*dependent.items(), *deps.items()]:
        conditions.append(({"type": "object", "required": [name]}, sub, True))
    plain = {k: v for k, v in schema.items() if k not in CONDITIONAL_KEYWORDS}
    if deps:
        listed = {k: v for k, v in schema["dependencies"].items() if k not in deps}
        plain.pop("dependencies")
        if listed:
            plain["dependencies"] = listed
    conditions = [
        c for c in conditions if not (c[1] is True and c[2] is True)
    ]  # no effect either way
    return plain or True, conditions


def condition_options(
    conditions: list[Condition], negation: Negation, keywords: Callable[[dict], dict]
) -> list[list]:
    """The conditions as groups of cases (each case: a test and the then/else it brings): an
    instance satisfies the conditions iff in every group it satisfies some case, so they
    are the union of the conjunctions of one case per group. Conditions on one discriminator
    property form one group (split by its value); each other condition is a group of its
    own (its `if` and then, or one failure of its `if` and else)."""
    by_property: dict[str, list[tuple[Discriminator, Any, Any]]] = {}
    groups: list[list] = []
    for cond, then, other in conditions:
        test = discriminator(cond, keywords)
        if test is not None:
            by_property.setdefault(test.name, []).append((test, then, other))
            continue
        cases = [conjoin(cond, then)] + [conjoin(f, other) for f in negation.fails(cond)]
        groups.append([c for c in cases if c is not False])
    for name, tests in by_property.items():
        groups.append([c for c in discriminated_cases(name, tests) if c is not False])
    return groups


@dataclass(frozen=True)
class Discriminator:
    """A condition that tests one property against listed values: ``{properties: {name:
    {const/enum}}}``, optionally with ``required: [name]`` and ``type: object``."""

    name: str
    values: list
    required: bool  # the property absent fails the test
    typed: bool  # a non-object fails the test


def discriminator(cond: Any, keywords: Callable[[dict], dict]) -> Discriminator | None:
    if not isinstance(cond, dict):
        return None
    cond = keywords(cond)
    props, required = cond.get("properties"), cond.get("required", [])
    if (
        set(cond) - {"properties", "required", "type"}
        or not isinstance(props, dict)
        or len(props) != 1
    ):
        return None
    if cond.get("type", "object") != "object" or required not in ([], list(props)):
        return None
    ((name, test),) = props.items()
    test = keywords(test) if isinstance(test, dict) else None
    if not test or set(test) - {"const", "enum"}:
        return None
    values = test["enum"] if "enum" in test else [test["const"]]
    if not isinstance(values, list) or ("enum" in test and "const" in test):
        return None
    return Discriminator(name, values, bool(required), "type" in cond)


def discriminated_cases(name: str, tests: list[tuple[Discriminator, Any, Any]]) -> list[Schema]:
    """Conditions on one property, by its value: each listed value, any other value, the
    property absent, and not an object (where ``properties``/``required`` hold vacuously)."""
    listed: list = []
    for test, _, _ in tests:
        listed += [v for v in test.values if not any(_same(v, w) for w in listed)]
    present = {"type": "object", "required": [name]}
    cases = [
        conjoin(
            {**present, "properties": {name: {"const": v}}},
            *[then if any(_same(v, w) for w in t.values) else other for t, then, other in tests],
        )
        for v in listed
    ]
    cases.append(
        conjoin(
            {**present, "properties": {name: {"not": {"enum": listed}}}},
            *[other for _, _, other in tests],
        )
    )
    cases.append(
        conjoin(
            {"type": "object", "properties": {name: False}},
            *[other if t.required else then for t, then, other in tests],
        )
    )
    cases.append(
        conjoin(
            {"not": {"type": "object"}}, *[other if t.typed else then for t, then, other in tests]
        )
    )
    return cases


def _same(a: Any, b: Any) -> bool:
    """JSON equality for listed values (1 == 1.0, true != 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b and (type(a) in (int, float)) == (type(b) in (int, float))
