"""Proofs that ``oneOf`` branches (and several ``patternProperties``) cannot both match: from
the keywords first (listed values, types, lengths, a required property that tells objects
apart), the rest by intersecting the branches' automata (``interegular``).

A mixin of :class:`~sgl.constrained.json_schema.converter.Converter`: proofs read merged
conjunctions and the generated types through the converter.
"""

from __future__ import annotations

from typing import Any

from sgl.constrained.errors import GrammarError
from sgl.constrained.json_schema.conditions import conditional
from sgl.constrained.json_schema.keywords import _TYPES, validation_keywords
from sgl.constrained.json_schema.lexical import _ESCAPES_UP_TO
from sgl.constrained.json_schema.values import _json_equal, _listed, _type_list
from sgl.constrained.regex import Rx

_ONEOF_PROOF_LIMIT = 400  # positions; interegular is pure Python


class ProofsMixin:
    """The ``oneOf`` exclusivity proofs of the converter."""

    def check_disjoint(
        self, rxs: list[Rx], where: str, what: str = "oneOf", schemas: list | None = None
    ) -> None:
        """oneOf = anyOf only if no value matches two branches (and several patternProperties
        apply one schema each only if no key matches two). Pairs are proven from the keywords
        first (listed values, types, a required property with disjoint values or one the other
        closed object cannot have), the rest on the automata."""
        unproven = {
            k
            for i in range(len(rxs))
            for j in range(i + 1, len(rxs))
            if schemas is None or not self.disjoint_schemas(schemas[i], schemas[j], where)
            for k in (i, j)
        }
        if schemas is not None:
            # The automata compare what we generate; that decides only where we generate all a
            # branch accepts (else a value of one branch could be accepted, not generated, by
            # another).
            narrow = [i for i in sorted(unproven) if not self.exact(schemas[i], where)]
            if narrow:
                raise self.fail(
                    where,
                    f"{what}: cannot prove branch {narrow[0]} exclusive of the others: it accepts "
                    "more than is generated (an open object, a free value, an inferred type); use "
                    "anyOf, "
                    "or give the branches distinct const tags or types",
                )
        rxs = [rxs[i] for i in sorted(unproven)]
        if len(rxs) < 2:
            return
        if any(r.ref for r in rxs):
            raise self.fail(
                where,
                f"{what}: its branches use recursive references and cannot be proven exclusive; "
                "use anyOf if overlaps are fine",
            )
        if sum(r.size for r in rxs) > _ONEOF_PROOF_LIMIT:
            raise self.fail(
                where,
                f"{what}: its branches are too large to prove exclusive; use anyOf if overlaps "
                "are fine",
            )
        try:
            import interegular

            fsms = [interegular.parse_pattern(r.text).to_fsm() for r in rxs]
        except Exception:
            raise self.fail(
                where,
                f"{what}: cannot prove its branches exclusive; use anyOf if overlaps are fine",
            ) from None
        for i in range(len(fsms)):
            for j in range(i + 1, len(fsms)):
                if not fsms[i].isdisjoint(fsms[j]):
                    raise self.fail(
                        where,
                        f"{what}: branches {i} and {j} can match the same value, and exclusivity "
                        "cannot be "
                        "enforced; use anyOf, or make the branches distinct (e.g. a const tag)",
                    )

    def plain(self, schema: Any, where: str) -> Any:
        """A schema with its $ref/allOf conjunction merged (for proofs), or None."""
        if not isinstance(schema, dict):
            return schema
        try:
            merged = (
                self.merge_all_of(schema, where, []) if {"$ref", "allOf"} & set(schema) else schema
            )
        except GrammarError:
            return None
        return validation_keywords(merged) if isinstance(merged, dict) else merged

    def exact(self, schema: Any, where: str, depth: int = 0) -> bool:
        """Do we generate every value ``schema`` accepts (up to spelling)? Conservatively:
        listed values, or an explicit type whose objects are closed, with no free values,
        inferred types or depth cuts anywhere inside; strings without ``format`` (its forms
        are a subset) or ``maxLength`` (raw characters only, no ``\\u`` escapes)."""
        s = self.plain(schema, where)
        if s is False or (isinstance(s, dict) and _listed(s) is not None):
            return True
        if (
            not isinstance(s, dict)
            or "type" not in s
            or depth > 6
            or conditional(s)
            or {"not", "patternProperties", "propertyNames"} & set(s)
        ):
            return False
        for comb in ("anyOf", "oneOf"):
            if comb in s:
                rest = {k: v for k, v in s.items() if k != comb}
                return isinstance(s[comb], list) and all(
                    self.exact({"allOf": [rest, b]}, where, depth + 1) for b in s[comb]
                )
        types = _type_list(s["type"])
        if "string" in types and (
            "format" in s
            or "maxLength" in s
            or (self.count(s, "minLength", where) or 0) > _ESCAPES_UP_TO
        ):
            return False
        if "object" in types:
            closed = (
                s.get("additionalProperties") is False or s.get("unevaluatedProperties") is False
            )
            props = s.get("properties") or {}
            if (
                not closed
                or not isinstance(props, dict)
                or not all(self.exact(v, where, depth + 1) for v in props.values())
            ):
                return False
        if "array" in types:
            items = s.get("prefixItems", s.get("items"))
            parts = items if isinstance(items, list) else [items]
            tail = (
                s.get("items")
                if "prefixItems" in s
                else s.get("additionalItems", True)
                if isinstance(items, list)
                else None
            )
            if tail is not None and tail is not False:
                parts = [*parts, tail]
            if not all(p is not None and self.exact(p, where, depth + 1) for p in parts):
                return False
        return True

    def disjoint_schemas(self, a: Any, b: Any, where: str, depth: int = 0) -> bool:
        """No value we generate for ``a`` is valid for ``b`` and vice versa, proven from the
        keywords: listed values that differ, types that differ, or two objects told apart
        by a required property (values disjoint, or absent from the other closed object)."""
        a, b = self.plain(a, where), self.plain(b, where)
        if a is False or b is False:
            return True
        if not isinstance(a, dict) or not isinstance(b, dict) or depth > 4:
            return False
        va, vb = _listed(a), _listed(b)
        if va is not None and vb is not None:
            return not any(_json_equal(x, y) for x in va for y in vb)
        for listed, other in ((va, b), (vb, a)):
            if listed is not None and self.values.keep(other, listed) == []:
                return (
                    True  # no listed value is valid for the other: we generate nothing both accept
                )
        try:  # the types we generate, and the types each accepts (all, unless stated)
            ga, gb = set(self.types(a, where)), set(self.types(b, where))
            ta = set(self.types({"type": a["type"]}, where)) if "type" in a else set(_TYPES)
            tb = set(self.types({"type": b["type"]}, where)) if "type" in b else set(_TYPES)
        except GrammarError:
            return False
        for t in (ga, gb, ta, tb):
            if "number" in t:
                t.add("integer")
        if not ga & tb and not gb & ta:
            return True
        if ga == gb == {"string"}:  # lengths that cannot meet
            lo_a, lo_b = (
                self.count(a, "minLength", where) or 0,
                self.count(b, "minLength", where) or 0,
            )
            hi_a, hi_b = self.count(a, "maxLength", where), self.count(b, "maxLength", where)
            return (hi_a is not None and hi_a < lo_b) or (hi_b is not None and hi_b < lo_a)
        if ga != {"object"} or gb != {"object"}:
            return False
        for x, y in ((a, b), (b, a)):
            props_x, props_y = x.get("properties") or {}, y.get("properties") or {}
            for name in x.get("required") or []:
                if not isinstance(name, str):
                    continue
                closed_y = (
                    y.get("additionalProperties") is False
                    or y.get("unevaluatedProperties") is False
                )
                if closed_y and name not in props_y and not y.get("patternProperties"):
                    return True
                if name in (y.get("required") or []) and name in props_x and name in props_y:
                    if self.disjoint_schemas(props_x[name], props_y[name], where, depth + 1):
                        return True
        return False
