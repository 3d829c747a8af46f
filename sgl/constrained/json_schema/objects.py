"""Objects: declared ``properties`` and ``required`` (members in :mod:`.members`),
``additionalProperties``/``unevaluatedProperties``, ``patternProperties``, ``propertyNames``,
``dependentRequired``, ``minProperties``/``maxProperties``, and maps without declared names.

A mixin of :class:`~sgl.constrained.json_schema.converter.Converter`: member values are
converted by ``self.convert`` and shared as rules in grammar mode.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sgl.constrained.json_schema.containers import FREE_DEPTH, _map_object, _map_of
from sgl.constrained.json_schema.keywords import _STRING_KW, validation_keywords
from sgl.constrained.json_schema.lexical import _COLON, _QUOTE, _STRING
from sgl.constrained.json_schema.members import _members
from sgl.constrained.json_schema.values import _type_list
from sgl.constrained.regex import Rx, rx_alt, rx_cat, rx_lit

_VALUE_RULE_SIZE = (
    32  # grammar mode: a member's value over this many positions is a rule (see rule_of_text)
)


class ObjectsMixin:
    """The object methods of the converter."""

    def convert_object(self, schema: dict, where: str) -> Rx | None:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(props, dict):
            raise self.fail(where, "properties must be an object")
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise self.fail(where, "required must be a list of property names")
        extra = schema.get("additionalProperties", True)
        unevaluated = schema.get("unevaluatedProperties", True)
        if unevaluated not in (True, False):
            raise self.fail(
                where, "unevaluatedProperties with a schema is not supported (true/false are)"
            )
        lo = self.count(schema, "minProperties", where) or 0
        hi = self.count(schema, "maxProperties", where)
        patterns = schema.get("patternProperties") or {}
        if not isinstance(patterns, dict):
            raise self.fail(where, "patternProperties must be an object of pattern -> schema")
        key_schema = schema.get("propertyNames", True)
        deps = self.dependencies(schema, where)
        forbid = self.forbidden.pop(where, []) if names_declared(schema) else []
        names = list(props) + [r for r in dict.fromkeys(required) if r not in props]
        if key_schema is not True and names:
            names = [n for n in names if self.name_allowed(n, key_schema, where)]
            if set(required) - set(names):
                return None  # a required name that propertyNames forbids
        if not names:
            if extra is False or unevaluated is False:
                extra = False
            return self.convert_map(patterns, extra, key_schema, deps, lo, hi, where)
        tail = None
        if (
            patterns
        ):  # pattern members after the declared ones, when no declared name matches a pattern
            clash = next(
                ((n, p) for n in names for p in patterns if isinstance(p, str) and _search(p, n)),
                None,
            )
            if clash is not None:
                raise self.fail(
                    where,
                    f"patternProperties {clash[1]!r} matches the declared property {clash[0]!r}: "
                    "not supported (the property would need both schemas)",
                )
            if key_schema is not True:
                raise self.fail(
                    where, "patternProperties together with propertyNames is not supported"
                )
            tail = self.pattern_member(patterns, where)
        req = set(required)
        closed = extra is False or unevaluated is False
        if not patterns and not closed and key_schema is True:
            # undeclared members after the declared ones; never a name whose presence matters
            # elsewhere
            excluded = (
                set(names)
                | {n for k, v in deps.items() for n in [k, *v]}
                | {n for f in forbid for n in f}
            )
            tail = self.extra_member(extra, excluded, where)
        members: list[tuple[str, Rx, bool]] = []
        for name in names:
            if name not in props and closed:
                return None  # required, but additional properties are forbidden
            sub = props.get(name, extra)
            value = self.convert(sub, f"{where}/properties/{name}")
            if value is None:
                if name in req:
                    return None
                continue
            value = self.rule_of_text(value, "value") if value.size > _VALUE_RULE_SIZE else value
            members.append(
                (
                    name,
                    rx_cat(rx_lit(json.dumps(name, ensure_ascii=False)), _COLON, value),
                    name in req,
                )
            )
        if hi is not None and hi < len(req):
            return None
        if lo > len(members) and tail is None:
            raise self.fail(
                where,
                "minProperties exceeds the number of properties that may be generated "
                "(only declared ones: the object is closed, or its other keys are limited by "
                "propertyNames)",
            )
        written_ok = {m[0] for m in members}
        forbid = [f for f in forbid if f <= written_ok]  # a name never generated: never all written
        if any(f <= req for f in forbid):
            return None
        share = self.share if self.grammar else None
        self.check_text(
            sum(len(m[1].text) for m in members) + (len(tail.text) if tail is not None else 0)
        )
        return rx_cat(
            rx_lit("{"), _members(members, lo, hi, deps, share, forbid, tail), rx_lit("}")
        )

    def convert_map(
        self,
        patterns: dict,
        extra: Any,
        key_schema: Any,
        deps: dict,
        lo: int,
        hi: int | None,
        where: str,
    ) -> Rx | None:
        """An object without declared properties: keys from patternProperties (or any key
        propertyNames allows), values from their schemas."""
        if deps:
            raise self.fail(
                where,
                "dependentRequired/dependencies on an object without declared properties is not "
                "supported; declare the properties",
            )
        if key_schema is False:
            return rx_lit("{}") if lo == 0 else None
        if patterns:
            if key_schema is not True:
                raise self.fail(
                    where, "patternProperties together with propertyNames is not supported"
                )
            return _map_of(self.pattern_member(patterns, where), lo, hi)
        if extra is False:
            return rx_lit("{}") if lo == 0 else None
        key = _STRING if key_schema is True else self.convert_key(key_schema, where)
        value = (
            self.convert(extra, f"{where}/additionalProperties")
            if extra is not True
            else self.free(FREE_DEPTH - 1)
        )
        return _map_object(value, lo, hi, key)

    def pattern_member(self, patterns: dict, where: str) -> Rx | None:
        """A member whose key matches one of ``patterns`` (provably disjoint), valued by its
        schema. Keys matching no pattern fall to additionalProperties: not generated
        (stricter, still valid)."""
        keys = [
            (self.pattern_key(p, f"{where}/patternProperties"), sub) for p, sub in patterns.items()
        ]
        if len(keys) > 1:
            self.check_disjoint(
                [k for k, _ in keys if k is not None],
                f"{where}/patternProperties",
                "patternProperties",
            )
        return rx_alt(
            *(
                rx_cat(k, _COLON, self.convert(sub, f"{where}/patternProperties/{i}"))
                for i, (k, sub) in enumerate(keys)
            )
        )

    def extra_member(self, extra: Any, excluded: set[str], where: str) -> Rx | None:
        """An undeclared member, as ``additionalProperties`` allows it: a key that is none of
        ``excluded`` (declared, dependent and forbidden names), valued by that schema (any
        value where it is absent or true)."""
        value = (
            self.free(FREE_DEPTH - 1)
            if extra is True
            else self.convert(extra, f"{where}/additionalProperties")
        )
        if value is None:
            return None
        key = self.share(rx_cat(_QUOTE, self.string_not_in(excluded), _QUOTE), always=True)
        return self.share(
            rx_cat(key, _COLON, value), always=True
        )  # written up to 4 times (see _members)

    def pattern_key(self, pattern: str, where: str) -> Rx | None:
        return self.convert_string({"pattern": pattern}, where)

    def convert_key(self, key_schema: Any, where: str) -> Rx | None:
        """propertyNames as the regex of a quoted key (a string schema)."""
        ks = validation_keywords(key_schema) if isinstance(key_schema, dict) else key_schema
        if not isinstance(ks, dict) or set(ks) - (_STRING_KW | {"type", "enum", "const"}):
            raise self.fail(
                where,
                "propertyNames is supported with string keywords (pattern, minLength, maxLength, "
                "format, enum, const) only",
            )
        if "type" in ks and "string" not in _type_list(ks["type"]):
            return None  # keys are strings: no key satisfies it
        return self.convert({**ks, "type": "string"}, f"{where}/propertyNames")

    def name_allowed(self, name: str, key_schema: Any, where: str) -> bool:
        """Does a declared property name satisfy propertyNames? (decided on the regex)"""
        if key_schema is False:
            return False
        key = self.convert_key(key_schema, where)
        if key is None:
            return False
        return re.fullmatch(key.text, json.dumps(name, ensure_ascii=False)) is not None

    def dependencies(self, schema: dict, where: str) -> dict[str, list[str]]:
        """dependentRequired, and the array form of draft 4-7 dependencies: name -> names it
        requires."""
        out: dict[str, list[str]] = {}
        for key in ("dependentRequired", "dependencies"):
            spec = schema.get(key)
            if spec is None:
                continue
            if not isinstance(spec, dict):
                raise self.fail(where, f"{key} must be an object")
            for name, needs in spec.items():
                if isinstance(needs, dict) or isinstance(needs, bool):
                    if needs is True or needs == {}:
                        continue
                    raise self.fail(
                        where,
                        f"{key}: schema dependencies ({name!r} -> a schema) are not supported; "
                        "list required property names instead",
                    )
                if not isinstance(needs, list) or not all(isinstance(n, str) for n in needs):
                    raise self.fail(where, f"{key}[{name!r}] must be a list of property names")
                out[name] = list(dict.fromkeys(out.get(name, []) + [n for n in needs if n != name]))
        return {k: v for k, v in out.items() if v}


def _search(pattern: str, name: str) -> bool:
    """Does ``pattern`` (JSON Schema: search semantics) match ``name``? Unparsable: assume so."""
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return True


def names_declared(schema: dict) -> bool:
    """Does the object declare properties (the member form, not the map form)?"""
    return bool(schema.get("properties") or schema.get("required"))
