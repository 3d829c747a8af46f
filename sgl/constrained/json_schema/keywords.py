"""The JSON Schema keyword vocabulary: which keywords validate (the rest are annotations),
which are supported, which are refused and why, and parsing a schema given as text.

Separate because every part of the translation reads these tables (the type inferred from
a keyword, the keywords an allOf may not split) and none of them owns them.
"""

from __future__ import annotations

import json

from sgl.constrained.errors import GrammarError
from sgl.constrained.json_schema.conditions import CONDITIONAL_KEYWORDS

PARAM = "json_schema"
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")

_UNSUPPORTED = {
    "contains": "array 'contains' constraints are not supported",
    "minContains": "array 'contains' constraints are not supported",
    "maxContains": "array 'contains' constraints are not supported",
    "unevaluatedItems": "unevaluatedItems is not supported",
    "$dynamicRef": "dynamic references are not supported",
    "$recursiveRef": "recursive references ($recursiveRef) are not supported; use $ref",
}
_OBJECT_KW = {
    "properties", "required", "additionalProperties", "unevaluatedProperties", "minProperties",
    "maxProperties", "patternProperties", "propertyNames", "dependentRequired", "dependencies",
}  # fmt: skip
_ARRAY_KW = {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"}
_STRING_KW = {"minLength", "maxLength", "pattern", "format"}
_NUMBER_KW = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
_COMBINATORS = {"anyOf", "oneOf", "allOf", "$ref", "not"}
_SUPPORTED = (
    _OBJECT_KW
    | _ARRAY_KW
    | _STRING_KW
    | _NUMBER_KW
    | _COMBINATORS
    | CONDITIONAL_KEYWORDS
    | {"type", "enum", "const"}
)
_VALIDATION = _SUPPORTED | set(_UNSUPPORTED)  # every validation keyword of drafts 4 to 2020-12
# The formats the drafts define; any other `format` value is an annotation (no effect).
_SPEC_FORMATS = frozenset(
    {
        "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname",
        "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template",
        "json-pointer", "relative-json-pointer", "regex",
    }
)  # fmt: skip
_MEMBER_KW = {"properties", "additionalProperties"}  # merged across allOf parts (see merge_members)
# Keywords that read each other inside one schema object: allOf may not split them (but
# _MEMBER_KW, which merge_members merges exactly).
_COUPLED = (
    {"properties", "additionalProperties", "unevaluatedProperties", "patternProperties"},
    {"items", "prefixItems", "additionalItems"},
)


def load_schema(spec: str | dict | bool) -> dict | bool:
    """Parse a schema given as JSON text (or pass a dict/bool through)."""
    if isinstance(spec, (dict, bool)):
        return spec
    if not isinstance(spec, str):
        raise GrammarError(
            f"json_schema must be a JSON object or a string, got {type(spec).__name__}", PARAM
        )
    try:
        schema = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise GrammarError(f"json_schema is not valid JSON: {exc}", PARAM) from None
    if not isinstance(schema, (dict, bool)):
        raise GrammarError("json_schema must be a JSON object (or true/false)", PARAM)
    return schema


def validation_keywords(schema: dict) -> dict:
    """The keywords of ``schema`` that constrain instances.

    JSON Schema treats every other keyword as an annotation with no effect on validity
    (``title``, ``$comment``, ``x-kubernetes-...``, ``readonly``, misspellings), so
    ignoring it is exactly honouring it. A ``format`` the drafts do not define is an
    annotation too.
    """
    out = {k: v for k, v in schema.items() if k in _VALIDATION}
    if "format" in out and out["format"] not in _SPEC_FORMATS:
        del out["format"]
    return out
