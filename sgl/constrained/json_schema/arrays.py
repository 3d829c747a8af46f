"""Arrays: ``items`` (schema, or a list as in draft 4), ``prefixItems``, ``additionalItems``,
``minItems``/``maxItems``, ``uniqueItems`` where it is trivially true.

A mixin of :class:`~sgl.constrained.json_schema.converter.Converter`: each element schema is
converted by ``self.convert``.
"""

from __future__ import annotations

from typing import Any

from sgl.constrained.json_schema.containers import FREE_DEPTH, _array_of
from sgl.constrained.regex import Rx


class ArraysMixin:
    """The array method of the converter."""

    def convert_array(self, schema: dict, where: str) -> Rx | None:
        lo = self.count(schema, "minItems", where) or 0
        hi = self.count(schema, "maxItems", where)
        items = schema.get("items")
        prefix_schemas: list[Any] = []
        rest: Any
        if "prefixItems" in schema:
            if not isinstance(schema["prefixItems"], list):
                raise self.fail(where, "prefixItems must be a list of schemas")
            prefix_schemas = schema["prefixItems"]
            rest = True if items is None else items
        elif isinstance(items, list):  # draft 4-2019 tuple form
            prefix_schemas = items
            rest = schema.get("additionalItems", True)
        else:
            rest = True if items is None else items
        if schema.get("uniqueItems") is True and not (hi is not None and hi <= 1):
            raise self.fail(where, "keyword 'uniqueItems' is not supported (unless maxItems <= 1)")
        prefix = [self.convert(s, f"{where}/prefixItems/{i}") for i, s in enumerate(prefix_schemas)]
        # A prefix element that can never match ends the array before it.
        for i, p in enumerate(prefix):
            if p is None:
                prefix, rest = prefix[:i], False
                break
        if rest is True:
            rest_rx = self.free(FREE_DEPTH - 1)
        else:
            rest_rx = None if rest is False else self.convert(rest, f"{where}/items")
        return _array_of(prefix, rest_rx, lo, hi)
