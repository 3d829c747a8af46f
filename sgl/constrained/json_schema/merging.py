"""``allOf``, ``$ref`` with siblings, and conditions (``if``/``then``/``else``,
``dependentSchemas``): the conjuncts gathered and merged into one schema, or multiplied out
into the cases of the conditions.

A mixin of :class:`~sgl.constrained.json_schema.converter.Converter`: the merge follows
``$ref``\\ s (onto the converter's stack) and recurses through ``self.convert``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from sgl.constrained.json_schema.conditions import (
    NotNegatable,
    condition_options,
    conditional,
    conjoin,
    split_conditions,
)
from sgl.constrained.json_schema.keywords import (
    _COUPLED,
    _MEMBER_KW,
    _UNSUPPORTED,
    validation_keywords,
)
from sgl.constrained.json_schema.values import _json_equal, _listed, _type_list
from sgl.constrained.regex import Rx

MAX_CONDITION_CASES = (
    64  # cases of the if/then/else (and dependentSchemas) of one schema, multiplied out
)


class MergingMixin:
    """The ``allOf`` / condition methods of the converter."""

    def convert_merged(self, schema: dict, where: str) -> Rx | None:
        """allOf / $ref-with-siblings / conditions: merge (or split into the cases of the
        conditions), then convert with the references it used on the stack."""
        refs: list[str] = []
        parts = self.conjuncts(schema, where, refs)
        if any(self.ref_stack.count(r) >= self.max_depth for r in refs):
            return None
        self.ref_stack.extend(refs)
        try:
            if any(isinstance(p, dict) and conditional(p) for p in parts):
                return self.convert_conditions(parts, where)
            return self.convert(self.merge_parts(parts, where), where)
        finally:
            del self.ref_stack[len(self.ref_stack) - len(refs) :]

    def convert_conditions(self, parts: list, where: str) -> Rx | None:
        """Conjuncts with conditions (if/then/else, dependentSchemas): the union of their
        cases (see conditions.py), multiplied out, at most MAX_CONDITION_CASES."""
        rest: list[Any] = []
        conditions: list = []
        for part in parts:
            if not (isinstance(part, dict) and conditional(part)):
                rest.append(part)
                continue
            try:
                plain, found = split_conditions(part)
                rest.append(plain)
                conditions += found
            except NotNegatable as exc:
                raise self.fail(where, str(exc)) from None
        try:
            options = condition_options(conditions, self.negation, validation_keywords)
        except NotNegatable as exc:
            raise self.fail(f"{where}/if", str(exc)) from None
        count = math.prod(len(o) for o in options)
        if count > MAX_CONDITION_CASES:
            raise self.fail(
                where,
                f"if/then/else and dependentSchemas: {len(options)} conditions make {count} cases "
                f"to translate; at most {MAX_CONDITION_CASES} are supported",
            )
        base = conjoin(*rest)
        cases = [conjoin(*choice) for choice in itertools.product(*options)]
        return self.convert_cases(base, [c for c in cases if c is not False], where)

    def conjuncts(self, schema: Any, where: str, refs: list[str], depth: int = 0) -> list[Any]:
        """The schemas that must all hold: own keywords, $ref target and allOf parts, flattened."""
        if not isinstance(schema, dict):
            return [schema]
        if depth > 32:
            raise self.fail(where, "allOf/$ref nesting is too deep (a reference cycle?)")
        own = {k: v for k, v in validation_keywords(schema).items() if k not in ("allOf", "$ref")}
        out: list[Any] = [own] if own else []
        if "$ref" in schema:
            target, key = self.resolve(schema["$ref"], where)
            refs.append(key)
            out += self.conjuncts(target, where, refs, depth + 1)
        if "allOf" in schema:
            parts = schema["allOf"]
            if not isinstance(parts, list) or not parts:
                raise self.fail(where, "allOf must be a non-empty list of schemas")
            for part in parts:
                out += self.conjuncts(part, where, refs, depth + 1)
        return out

    def merge_all_of(self, schema: dict, where: str, refs: list[str]) -> dict | bool:
        """A conjunction (allOf, or $ref with siblings) as one schema."""
        return self.merge_parts(self.conjuncts(schema, where, refs), where)

    def merge_parts(self, parts: list, where: str) -> dict | bool:
        """Conjuncts as one schema, when they constrain different keywords (equal values,
        `required` lists, `type`s, `not`s, unions and members also merge)."""
        merged: dict[str, Any] = {}
        origin: dict[str, set[int]] = {}
        members: dict[int, dict] = {}  # part -> its properties / additionalProperties
        for i, part in enumerate(parts):
            if part is True:
                continue
            if part is False:
                return False
            if not isinstance(part, dict):
                raise self.fail(where, "allOf items must be schemas")
            for k, v in part.items():
                if k in _UNSUPPORTED:
                    raise self.fail(where, f"keyword '{k}' is not supported: {_UNSUPPORTED[k]}")
                if k in _MEMBER_KW:
                    members.setdefault(i, {})[k] = v
                    origin.setdefault(k, set()).add(i)
                    continue
                if k not in merged:
                    merged[k], origin[k] = v, {i}
                    continue
                origin[k].add(i)
                if k == "required" and isinstance(v, list) and isinstance(merged[k], list):
                    merged[k] = list(dict.fromkeys(merged[k] + v))
                elif k == "type":
                    kept = [
                        t
                        for t in _type_list(merged[k])
                        if t in _type_list(v) or (t == "integer" and "number" in _type_list(v))
                    ]
                    kept += [
                        t
                        for t in _type_list(v)
                        if t == "integer" and "number" in _type_list(merged[k])
                    ]
                    if not kept:
                        return False
                    merged[k] = list(dict.fromkeys(kept))
                elif k == "not" and merged[k] != v:
                    both = _negations_merge(merged[k], v)
                    if both is not None:
                        merged[k] = both
                        continue
                    cases = self.negated(
                        v, f"{where}/not"
                    )  # a second `not`: the union of its cases
                    if not cases:
                        return False
                    merged["anyOf"] = (
                        _union_and(merged["anyOf"], "anyOf", cases) if "anyOf" in merged else cases
                    )
                    origin.setdefault("anyOf", set()).add(i)
                elif k in ("anyOf", "oneOf") and isinstance(merged[k], list) and merged[k] != v:
                    merged[k] = _union_and(merged[k], k, v)
                elif merged[k] != v:
                    raise self.fail(
                        where,
                        f"allOf: keyword '{k}' appears in two parts with different values; only "
                        "parts that "
                        "constrain different keywords can be combined",
                    )
        for group in _COUPLED:
            present = group & set(origin)
            if (
                len(present) > 1
                and present - _MEMBER_KW
                and len(set().union(*(origin[k] for k in present))) > 1
            ):
                raise self.fail(
                    where,
                    f"allOf: keywords {sorted(present)} come from different parts and interact",
                )
        merged.update(self.merge_members(list(members.values()), where))
        return merged

    def merge_members(self, parts: list[dict], where: str) -> dict:
        """The ``properties`` and ``additionalProperties`` of several conjuncts as one pair:
        a name declared by one part is valued, in each other part, by that part's
        additionalProperties (that is what the part says of a name it does not declare),
        so ``{properties: {a}}`` and ``{additionalProperties: false}`` from different parts
        make ``a`` impossible, exactly as the two schemas do together."""
        if len(parts) == 1:
            return parts[0]
        for part in parts:
            if not isinstance(part.get("properties", {}), dict):
                raise self.fail(where, "properties must be an object")
        names = dict.fromkeys(n for part in parts for n in part.get("properties", {}))
        props = {
            n: _all_of(
                [
                    p["properties"][n]
                    if n in p.get("properties", {})
                    else p.get("additionalProperties", True)
                    for p in parts
                ]
            )
            for n in names
        }
        out: dict[str, Any] = {"properties": props} if props else {}
        extra = _all_of([p.get("additionalProperties", True) for p in parts])
        if extra is not True:
            out["additionalProperties"] = extra
        return out


def _all_of(schemas: list) -> Any:
    """``allOf`` of ``schemas``, repeated ones once."""
    distinct: list = []
    for sch in schemas:
        if not any(_json_equal(sch, d) for d in distinct):
            distinct.append(sch)
    return conjoin(*distinct)


def _union_and(branches: list, comb: str, other: Any) -> list:
    """``{comb: branches}`` and ``{comb: other}`` as branches of ``comb`` (anyOf or oneOf):
    (A1 or A2) and B = (A1 and B) or (A2 and B); and exactly one of (Ai and B) holds iff
    exactly one Ai holds, where B does."""
    return [{"allOf": [a, {comb: other}]} for a in branches]


def _negations_merge(a: Any, b: Any) -> dict | None:
    """``not a`` and ``not b`` as one ``not`` where both are over types only, or over listed
    values only (then it is ``not`` over the union); None otherwise."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    a, b = validation_keywords(a), validation_keywords(b)
    if set(a) == set(b) == {"type"}:
        return {"type": list(dict.fromkeys(_type_list(a["type"]) + _type_list(b["type"])))}
    values = [_listed(x) for x in (a, b)]
    if set(a) | set(b) <= {"enum", "const"} and all(isinstance(v, list) for v in values):
        return {"enum": values[0] + values[1]}
    return None
