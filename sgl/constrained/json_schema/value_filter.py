"""Finite JSON-schema languages: an ``enum``/``const`` decided value by value.

A schema (or a conjunction of ``allOf`` parts and ``$ref`` targets) that contains an
``enum`` or ``const`` admits only those values, so every other keyword next to it, even one
the translator cannot express (``not`` over anything, ``if``/``then``/``else``,
``multipleOf``, ``uniqueItems``), is decided exactly by running a reference validator
(``jsonschema``) on each listed value. The language is then the values that pass: exact,
and as small as the list.
"""

from __future__ import annotations

import json
import re
from typing import Any

_DRAFT4_FLAGS = re.compile(r'"exclusiveM(?:in|ax)imum"\s*:\s*(?:true|false)')
_TUPLE_ITEMS = re.compile(r'"items"\s*:\s*\[')


class ValueFilter:
    """Validates single values against subschemas of one root schema (``$ref`` resolves
    against the root). The draft is the root's ``$schema``, else guessed from its idioms:
    boolean ``exclusiveMinimum`` is draft 4, array ``items`` draft 7, else 2020-12."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self._validator: Any = None
        self._unavailable = False

    def validator(self) -> Any:
        if self._validator is None and not self._unavailable:
            try:
                import jsonschema
            except ImportError:  # the translator then refuses, as without this module
                self._unavailable = True
                return None
            cls = _dialect(jsonschema, self.root)
            try:
                self._validator = cls(self.root, format_checker=cls.FORMAT_CHECKER)
            except Exception:
                self._unavailable = True
        return self._validator

    def keep(self, schema: Any, values: list) -> list | None:
        """The values ``schema`` accepts, or None when the validator cannot decide (not
        installed, or the schema is not one it can evaluate)."""
        v = self.validator()
        if v is None:
            return None
        try:
            check = v.evolve(schema=schema)
            return [value for value in values if check.is_valid(value)]
        except Exception:  # a malformed keyword value, an unresolvable $ref: not decidable here
            return None


def _dialect(jsonschema: Any, root: Any) -> Any:
    if isinstance(root, dict) and isinstance(root.get("$schema"), str):
        return jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)
    text = json.dumps(root)
    if _DRAFT4_FLAGS.search(text):
        return jsonschema.Draft4Validator
    if _TUPLE_ITEMS.search(text):
        return jsonschema.Draft7Validator
    return jsonschema.Draft202012Validator
