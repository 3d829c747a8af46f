"""The schema walk: :class:`Converter` turns a (sub)schema into an :class:`Rx`, dispatching on
its keywords, following ``$ref`` (expanded up to a depth in a regex, a rule in a grammar)
and keeping the compile budget.

The walk is one recursive object: every schema area calls ``convert`` on its subschemas and
reads the same state (the ``$ref`` stack and base URI, the budget, grammar mode and its
rules). Each area's methods live in a mixin of its own module, composed here, rather than in
free functions that would all take the converter as their first argument.
"""

from __future__ import annotations

import math
from typing import Any

from sgl.constrained.errors import ConstraintTooLarge, GrammarError
from sgl.constrained.json_schema.arrays import ArraysMixin
from sgl.constrained.json_schema.combinators import CombinatorsMixin
from sgl.constrained.json_schema.conditions import Negation, conditional
from sgl.constrained.json_schema.containers import FREE_DEPTH
from sgl.constrained.json_schema.keywords import (
    _ARRAY_KW,
    _NUMBER_KW,
    _OBJECT_KW,
    _STRING_KW,
    _TYPES,
    _UNSUPPORTED,
    PARAM,
    validation_keywords,
)
from sgl.constrained.json_schema.lexical import _BOOLEAN, _NULL
from sgl.constrained.json_schema.merging import MergingMixin
from sgl.constrained.json_schema.objects import ObjectsMixin
from sgl.constrained.json_schema.proofs import ProofsMixin
from sgl.constrained.json_schema.refs import RefIndex, UnresolvedRef
from sgl.constrained.json_schema.scalars import ScalarsMixin
from sgl.constrained.json_schema.sharing import SharingMixin
from sgl.constrained.json_schema.value_filter import ValueFilter
from sgl.constrained.json_schema.values import _value_literal
from sgl.constrained.regex import Rx, rx_alt, rx_ref

MAX_TRANSLATION_CHARS = (
    4_000_000  # regex text built while translating one schema (the compile budget) ...
)
MAX_CONVERT_CALLS = 200_000  # ... and subschemas expanded
_UNDECIDED = object()  # convert_listed: no enum/const to decide by value
MAX_DECIDED_VALUES = 10_000  # enum values validated one by one, at most (a bounded compile)


class Converter(
    CombinatorsMixin,
    MergingMixin,
    ProofsMixin,
    ScalarsMixin,
    ArraysMixin,
    ObjectsMixin,
    SharingMixin,
):
    """One schema's translation (regex, or with ``grammar`` the rules of a grammar): the core
    (dispatch, ``$ref``, budget) here, each schema area in its mixin."""

    def __init__(self, root: dict | bool, max_recursion_depth: int, grammar: bool = False) -> None:
        self.root = root
        self.max_depth = max_recursion_depth
        self.ref_stack: list[str] = []
        # Grammar mode: a $ref is a rule (recursion without expansion) and a free value the
        # recursive JSON rule; the result's `node` is then read, not its regex `text`.
        self.grammar = grammar
        self.rule_of: dict[str, str] = {}  # $ref -> rule name
        self.rules: dict[str, Rx | None] = {}
        self.text_rules: dict[
            str, str
        ] = {}  # grammar mode: a constrained string's or value's regex text -> rule
        self.calls = 0  # subschemas converted, and ...
        self.chars = 0  # ... regex text produced: both bounded (the compile budget)
        self.values = ValueFilter(root)  # enum/const next to other keywords: decided per value
        self.not_in: dict[tuple[str, ...], Rx | None] = {}  # string_not_in, memoized
        self.max_text: int | None = None  # regex mode: see json_schema_to_rx
        self.part_of: dict[str, str] = {}  # grammar mode: a shared piece's regex text -> its rule
        self.refs = RefIndex(root)
        self.base = self.refs.root_base  # the base URI of the schema being translated
        self.negation = Negation(lambda ref: self.resolve(ref, "#")[0], validation_keywords)
        self.forbidden: dict[
            str, list[frozenset]
        ] = {}  # not: {required: [...]}, for the object at a path

    # -- helpers ---------------------------------------------------------------------

    def fail(self, where: str, message: str) -> GrammarError:
        return GrammarError(f"json_schema at {where}: {message}", PARAM)

    def resolve(self, ref: Any, where: str) -> tuple[Any, str]:
        """The target of ``ref`` (read against the base URI of the schema being translated)
        and its canonical key (see refs.py)."""
        try:
            return self.refs.resolve(ref, self.base)
        except UnresolvedRef as exc:
            raise self.fail(where, str(exc)) from None

    def number(self, node: dict, key: str, where: str) -> float | int | None:
        v = node.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.fail(where, f"{key} must be a finite number")
        if abs(v) >= 1e30:  # 30 digits already makes a large automaton
            raise self.fail(
                where,
                f"{key} = {v} is too large a bound to enforce; use a bound below 1e30 or none",
            )
        return v

    def count(self, node: dict, key: str, where: str) -> int | None:
        v = node.get(key)
        if v is None:
            return None
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or v < 0
            or (isinstance(v, float) and not v.is_integer())
        ):
            raise self.fail(where, f"{key} must be a non-negative integer")
        return int(v)

    # -- the walk --------------------------------------------------------------------

    def convert(self, schema: Any, where: str) -> Rx | None:
        base = self.refs.base_of.get(id(schema)) if isinstance(schema, dict) else None
        if base is None or base == self.base:
            return self.convert_in_scope(schema, where)
        saved, self.base = (
            self.base,
            base,
        )  # a subschema with its own $id: its $refs read against it
        try:
            return self.convert_in_scope(schema, where)
        finally:
            self.base = saved

    def convert_in_scope(self, schema: Any, where: str) -> Rx | None:
        if isinstance(schema, dict):
            schema = validation_keywords(schema)
            if not schema:
                schema = True
        if schema is True:
            return self.free(FREE_DEPTH)
        if schema is False:
            return None
        if not isinstance(schema, dict):
            raise self.fail(
                where, f"a schema must be an object or a boolean, got {type(schema).__name__}"
            )
        if set(schema) - {"enum", "const", "type"}:
            listed = self.convert_listed(schema, where)
            if listed is not _UNDECIDED:
                return listed
        for key in schema:
            if key in _UNSUPPORTED:
                raise self.fail(where, f"keyword '{key}' is not supported: {_UNSUPPORTED[key]}")
        self.calls += 1
        if self.calls > MAX_CONVERT_CALLS:
            raise self.too_large(f"more than {MAX_CONVERT_CALLS} subschema expansions")
        rx = self.convert_checked(schema, where)
        if rx is not None:
            self.chars += len(rx.text)
            if self.chars > MAX_TRANSLATION_CHARS:
                raise self.too_large(f"more than {MAX_TRANSLATION_CHARS} characters of regex")
            self.check_text(len(rx.text))
        return rx

    def check_text(self, size: int) -> None:
        """The ``max_text`` bound of json_schema_to_rx (regex mode only)."""
        if self.max_text is not None and size > self.max_text:
            raise ConstraintTooLarge(
                f"json_schema: a piece of its regex is over {self.max_text} characters", PARAM
            )

    def convert_listed(self, schema: dict, where: str) -> Any:
        """A schema whose conjuncts (own keywords, allOf parts, $ref targets) include an
        enum/const is the listed values it accepts, whatever the other keywords are: each
        value is checked by the reference validator. ``_UNDECIDED`` when there is no list
        or the validator cannot decide (then the keywords are translated as usual)."""
        if not {"enum", "const", "allOf", "$ref"} & set(schema):
            return _UNDECIDED
        try:
            parts = self.conjuncts(schema, where, [])
        except GrammarError:
            return _UNDECIDED
        for part in parts:
            if isinstance(part, dict) and ("enum" in part or "const" in part):
                values = part["enum"] if "enum" in part else [part["const"]]
                if not isinstance(values, list) or len(values) > MAX_DECIDED_VALUES:
                    return _UNDECIDED  # the usual path names the error (or refuses the combination)
                kept = self.values.keep(schema, values)
                if kept is None:
                    return _UNDECIDED
                self.calls += 1
                return rx_alt(*(_value_literal(v, where) for v in kept))
        return _UNDECIDED

    def too_large(self, what: str) -> GrammarError:
        return ConstraintTooLarge(
            f"json_schema is too large to compile: translating it took {what} (the compile "
            "budget); "
            "deep or wide $ref recursion is the usual cause: reduce it, or constrain fewer fields",
            PARAM,
        )

    def convert_checked(self, schema: dict, where: str) -> Rx | None:
        # Combinators first: each distributes the other keywords into its parts, so `not`
        # (and the types below) meet only plain keywords.
        if "$ref" in schema:
            return self.convert_ref(schema, where)
        if "allOf" in schema or conditional(schema):
            return self.convert_merged(schema, where)
        for comb in ("anyOf", "oneOf"):
            if comb in schema:
                return self.convert_union(schema, comb, where)
        if "not" in schema:
            return self.convert_not(schema, where)
        if "enum" in schema or "const" in schema:
            return self.convert_enum(schema, where)
        return rx_alt(*(self.convert_type(t, schema, where) for t in self.types(schema, where)))

    def convert_ref(self, schema: dict, where: str) -> Rx | None:
        if set(schema) - {"$ref"}:  # siblings of $ref apply too (2019-09+)
            return self.convert_merged(schema, where)
        ref = schema["$ref"]
        target, key = self.resolve(ref, where)
        if self.grammar:
            name = self.rule_of.get(key)
            if name is None:
                name = self.rule_of[key] = f"ref{len(self.rule_of)}"
                self.rules[name] = None  # a reference back to it while it is built is recursion
                self.rules[name] = self.convert(target, f"{where} -> {ref}")
            return rx_ref(name)
        if self.ref_stack.count(key) >= self.max_depth:
            return None  # recursion cut: this branch is dropped
        self.ref_stack.append(key)
        try:
            return self.convert(target, f"{where} -> {ref}")
        finally:
            self.ref_stack.pop()

    def types(self, schema: dict, where: str) -> list[str]:
        t = schema.get("type")
        if t is None:
            keys = set(schema)
            inferred = [
                name
                for name, kws in (
                    ("object", _OBJECT_KW),
                    ("array", _ARRAY_KW),
                    ("string", _STRING_KW),
                    ("number", _NUMBER_KW),
                )
                if keys & kws
            ]
            return inferred or list(_TYPES)
        names = [t] if isinstance(t, str) else t
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise self.fail(where, "type must be a type name or a non-empty list of them")
        for n in names:
            if n not in _TYPES:
                raise self.fail(where, f"unknown type {n!r}")
        if "number" in names and "integer" in names:
            names = [n for n in names if n != "integer"]
        return list(dict.fromkeys(names))

    def convert_type(self, t: str, schema: dict, where: str) -> Rx | None:
        if t == "null":
            return _NULL
        if t == "boolean":
            return _BOOLEAN
        if t == "string":
            return self.convert_string(schema, where)
        if t in ("integer", "number"):
            return self.convert_number(t, schema, where)
        if t == "array":
            return self.convert_array(schema, where)
        return self.convert_object(schema, where)
