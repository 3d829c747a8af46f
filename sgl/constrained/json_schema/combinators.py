"""``anyOf``, ``oneOf`` and ``not``: unions of branches (``oneOf`` proven exclusive in
:mod:`.proofs`), and "not S" as the rest of the schema minus types, listed values or
required names, or as the union of the cases in which S fails (:mod:`.conditions`).

A mixin of :class:`~sgl.constrained.json_schema.converter.Converter`: the methods recurse
through ``self.convert`` and read its state.
"""

from __future__ import annotations

from typing import Any

from sgl.constrained.json_schema.conditions import NotNegatable, conjoin
from sgl.constrained.json_schema.keywords import _STRING_KW, validation_keywords
from sgl.constrained.json_schema.lexical import _NULL, _QUOTE
from sgl.constrained.json_schema.values import _has_type, _is_number, _json_equal
from sgl.constrained.regex import Rx, rx_alt, rx_cat, rx_lit

MAX_EXCLUDED_NUMBERS = 16  # `not` over numbers: one range per gap between them


class CombinatorsMixin:
    """The ``anyOf`` / ``oneOf`` / ``not`` methods of the converter."""

    def convert_not(self, schema: dict, where: str) -> Rx | None:
        """``not`` over types, consts and enums: the rest of the schema minus those."""
        rest = {k: v for k, v in schema.items() if k != "not"}
        neg = schema["not"]
        neg = validation_keywords(neg) if isinstance(neg, dict) else neg
        if neg is False:
            return self.convert(rest or True, where)
        if neg is True or neg == {}:
            return None
        if not isinstance(neg, dict):
            raise self.fail(where, "not must be a schema")
        if set(neg) == {"type"}:
            excluded = set(self.types(neg, f"{where}/not"))
            if "number" in excluded:
                excluded.add("integer")
            kept = [t for t in self.types(rest, where) if t not in excluded]
            if "integer" in excluded and "number" in kept:
                raise self.fail(
                    where,
                    "not: excluding integers from numbers (non-integral numbers only) is not "
                    "supported",
                )
            return self.convert({**rest, "type": kept}, where) if kept else None
        if set(neg) <= {"enum", "const", "type"} and ("enum" in neg or "const" in neg):
            values = neg["enum"] if "enum" in neg else [neg["const"]]
            if not isinstance(values, list):
                raise self.fail(f"{where}/not", "enum must be a list")
            if "type" in neg:
                types = self.types(neg, f"{where}/not")
                values = [v for v in values if any(_has_type(v, t) for t in types)]
            return self.convert_excluding(rest, values, where)
        if set(neg) in ({"required"}, {"propertyNames"}):
            return self.convert_not_object(rest, neg, where)
        return self.convert_cases(rest, self.negated(neg, f"{where}/not"), where)

    def negated(self, schema: Any, where: str) -> list:
        """The instances ``schema`` rejects, as a union of schemas (see conditions.py)."""
        try:
            return self.negation.fails(schema)
        except NotNegatable as exc:
            raise self.fail(where, str(exc)) from None

    def convert_cases(self, rest: Any, cases: list, where: str) -> Rx | None:
        """``rest`` and one of ``cases`` (a union): each case merged into ``rest``."""
        if not cases:
            return None
        branches = [conjoin(rest, case) for case in cases]
        return self.convert_union(
            {"anyOf": [b for b in branches if b is not False] or [False]}, "anyOf", where
        )

    def convert_not_object(self, rest: dict, neg: dict, where: str) -> Rx | None:
        """``not`` over an object keyword (vacuously true for other types, so only objects
        remain): ``propertyNames: false`` means at least one member; ``required: [a, b]``
        that not all of them are written (the member automaton tracks which were)."""
        if "object" not in self.types(rest, where):
            return None
        obj = {**rest, "type": "object"}
        if "propertyNames" in neg:
            if neg["propertyNames"] is not False:
                raise self.fail(
                    where, "not: propertyNames is supported as false only (at least one member)"
                )
            return self.convert(
                {**obj, "minProperties": max(self.count(obj, "minProperties", where) or 0, 1)},
                where,
            )
        names = neg["required"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise self.fail(where, "not: required must be a list of property names")
        if not names:
            return None  # "required: []" holds for every object
        self.forbidden.setdefault(where, []).append(frozenset(names))
        try:
            rx = self.convert(obj, where)
        finally:
            unused = self.forbidden.pop(where, None)
        if unused:
            raise self.fail(
                where,
                "not: required is supported on an object with declared properties, given next to "
                "them",
            )
        return rx

    def convert_excluding(self, schema: dict, values: list, where: str) -> Rx | None:
        """``schema`` minus a finite set of values: strings, booleans, null and integral numbers
        can be excluded."""
        if "enum" in schema or "const" in schema:
            allowed = schema["enum"] if "enum" in schema else [schema["const"]]
            if not isinstance(allowed, list):
                raise self.fail(where, "enum must be a list")
            kept = [a for a in allowed if not any(_json_equal(a, v) for v in values)]
            rest = {k: v for k, v in schema.items() if k not in ("enum", "const")}
            return self.convert({**rest, "enum": kept}, where)
        numbers = sorted({int(v) for v in values if _is_number(v) and float(v).is_integer()})
        if any(
            isinstance(v, (dict, list)) or (_is_number(v) and not float(v).is_integer())
            for v in values
        ):
            raise self.fail(
                where,
                "not: excluding objects, arrays or non-integral numbers is not supported "
                "(strings, booleans, null and integers are)",
            )
        strings = [v for v in values if isinstance(v, str)]
        parts = []
        for t in self.types(schema, where):
            if t == "string" and strings:
                if set(schema) & _STRING_KW:
                    raise self.fail(
                        where,
                        "not: excluding strings from a string with pattern/format/length is not "
                        "supported",
                    )
                body = self.string_not_in(strings)
                parts.append(rx_cat(_QUOTE, body, _QUOTE))
            elif t == "boolean":
                parts.append(
                    rx_alt(
                        *(
                            rx_lit(b)
                            for b in ("true", "false")
                            if not any(v is (b == "true") for v in values)
                        )
                    )
                )
            elif t == "null":
                parts.append(None if None in values else _NULL)
            elif t in ("integer", "number") and numbers:
                parts.append(self.convert_gaps({**schema, "type": t}, numbers, where))
            else:
                parts.append(self.convert_type(t, schema, where))
        return rx_alt(*parts)

    def convert_gaps(self, schema: dict, excluded: list[int], where: str) -> Rx | None:
        """A number schema minus some integers: the open ranges between them."""
        if len(excluded) > MAX_EXCLUDED_NUMBERS:
            raise self.fail(where, f"not: at most {MAX_EXCLUDED_NUMBERS} numbers can be excluded")
        gaps = zip([None, *excluded], [*excluded, None])
        return rx_alt(
            *(
                self.convert(
                    conjoin(
                        schema,
                        {
                            k: v
                            for k, v in (("exclusiveMinimum", lo), ("exclusiveMaximum", hi))
                            if v is not None
                        },
                    ),
                    where,
                )
                for lo, hi in gaps
            )
        )

    def convert_union(self, schema: dict, comb: str, where: str) -> Rx | None:
        branches = schema[comb]
        if not isinstance(branches, list) or not branches:
            raise self.fail(where, f"{comb} must be a non-empty list of schemas")
        siblings = {k: v for k, v in schema.items() if k != comb}
        if siblings:
            # Distribute the siblings into each branch (A and (B or C) = (A and B) or (A and C)).
            branches = [{"allOf": [siblings, b]} for b in branches]  # type: ignore[list-item]
        rxs = [self.convert(b, f"{where}/{comb}/{i}") for i, b in enumerate(branches)]
        if comb == "oneOf":
            kept = [i for i, r in enumerate(rxs) if r is not None]
            self.check_disjoint([rxs[i] for i in kept], where, schemas=[branches[i] for i in kept])  # type: ignore[misc]
        return rx_alt(*rxs)
