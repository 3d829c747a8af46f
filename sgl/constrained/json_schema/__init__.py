r"""JSON Schema -> a regular expression whose every match is a valid instance.

We own the translation (rather than calling outlines-core's ``build_regex_from_schema``)
because the contract is "never silently weaker": every keyword is either enforced
exactly by the regex or rejected with a :class:`GrammarError` that names it, and the
regex has to be in the canonical syntax that the mask and jump-forward automata both
read. Being *stricter* than the schema is allowed where a regex cannot do better and
the output still validates; each such choice is listed here.

Output shape (stricter than JSON, by design)
--------------------------------------------
* **Whitespace**: none, except an optional single space after ``:`` and after ``,``
  (``WS = "[ ]?"``). Both ``json.dumps(x, ensure_ascii=False)`` and its
  ``separators=(",", ":")`` spelling match; newlines/indentation do not. Keeping
  ``{``, ``[`` and the key quotes tight is what lets jump-forward emit ``{"name":``
  in one go.
* **Objects** list their properties in schema order; optional ones may be left out.
  Where ``additionalProperties`` allows them (absent, ``true`` or a schema), undeclared
  members may follow the declared ones: any key that is not a declared, required,
  dependent or forbidden name, valued by that schema (a free-form value where it is
  absent or true). Next to ``patternProperties`` or ``propertyNames`` they are not
  generated (stricter, never invalid). A schema with no ``properties`` maps any string
  keys to its ``additionalProperties`` (``minProperties``/``maxProperties`` apply).
* **Strings** use raw characters plus the short escapes ``\" \\ \/ \b \f \n \r \t``,
  and, in strings without ``pattern``, ``format`` or ``maxLength`` (``minLength`` up to 16),
  ``\uXXXX`` escapes (astral characters as surrogate pairs: ``json.dumps``'s default ASCII
  spelling); no raw control characters and no U+007F-U+009F.
* **Numbers**: ``-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?``; integers without
  fraction or exponent; bounded numbers without exponent.
* **Free-form values** (``{}``, ``true``, an object with no properties, an array
  with no ``items``) nest at most ``FREE_DEPTH`` (2) containers deep.
* **Recursive** ``$ref``\ s expand at most ``max_recursion_depth`` (3) times; deeper
  branches are dropped (so a required recursive field makes the schema an error).

Keywords. Only validation keywords count: every other key (``title``, ``$comment``,
``x-kubernetes-...``, ``readonly``, a misspelling) is an annotation, which JSON Schema says
has no effect on validity, so it is ignored; so is a ``format`` the drafts do not define.
Supported: ``type`` (string or list), ``enum``, ``const``, ``properties``, ``required``,
``additionalProperties``, ``unevaluatedProperties: false``, ``patternProperties`` (keys
matching no pattern are not generated; several patterns must be provably disjoint; next to
declared properties when none of their names matches a pattern, pattern members following
the declared ones), ``propertyNames`` (string keywords),
``dependentRequired`` and array-form ``dependencies``, ``minProperties`` /
``maxProperties`` (undeclared members count), ``items`` (schema, or
list as in draft 4), ``prefixItems``, ``additionalItems``, ``minItems``, ``maxItems``,
``uniqueItems`` (false, or with ``maxItems <= 1``), ``minLength``, ``maxLength``,
``pattern`` (Python/ASCII regex syntax, search semantics; with the length keywords when
anchored and of one variable-length run of single characters plus short optional parts,
e.g. ``^[a-z]+$``, ``^https?://.+$``), ``format`` (date, time, date-time, uuid, ipv4, ipv6,
email, hostname, uri, uri-reference, iri, iri-reference), ``minimum``/``maximum``/``exclusiveMinimum``/
``exclusiveMaximum`` (any for integers; integer-valued for numbers), ``multipleOf`` in
decimal arithmetic (powers of ten like 0.01 on numbers: at most that many decimals;
integer steps that divide 1000, or any step over a range with few multiples), ``anyOf``,
``oneOf`` (when its branches are provably disjoint), ``allOf`` (parts constraining different
keywords; ``properties``/``additionalProperties`` (see ``merge_members``), ``required``,
``type``, ``not`` and unions of several parts merge), ``$ref`` by JSON pointer, ``$anchor``
or a subschema's ``$id`` (:mod:`~sgl.constrained.schema_refs`; remote documents are not
fetched); ``not``, ``if``/``then``/``else``, ``dependentSchemas`` and
schema-form ``dependencies`` as unions of cases (:mod:`~sgl.constrained.schema_conditions`:
"not S" pushed down the keywords of S, over ``type``, ``const``, ``enum``, ``required``,
``properties``, bounds, combinators and ``$ref``). An ``enum``/``const`` (own, or from an
``allOf`` part or ``$ref`` target) next to any other keywords is decided value by value with
the reference validator (``jsonschema``; see :mod:`~sgl.constrained.schema_values`): exact
whatever the keywords, ``uniqueItems`` included.

Rejected (GrammarError naming the keyword): ``not`` (or an ``if``) over a keyword whose
failure is no positive schema (``pattern``, ``format``, ``items``, ``multipleOf``, ...),
more than ``MAX_CONDITION_CASES`` cases of conditions,
``contains``/``minContains``/``maxContains``, other ``multipleOf`` steps (0.25, 7 unbounded),
``uniqueItems: true`` (unless ``maxItems <= 1``), ``unevaluatedItems``, non-integer bounds on
``number``, bounds of 1e30 or more, the drafts' formats not listed above (``regex``,
``iri``, ``duration``, ...), remote ``$ref``.

Size: recursion, free-form values and leading optional properties multiply the
automaton (k optional properties before the first required one cost k*k/2 copies of
their values); the regex module's :data:`~sgl.constrained.regex.MAX_POSITIONS`
limit applies to the result. Translation itself is budgeted
(:data:`MAX_TRANSLATION_CHARS` of regex text, :data:`MAX_CONVERT_CALLS` subschemas), so a
schema whose references multiply cannot exhaust memory before the size check.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from functools import lru_cache
from typing import Any

from sgl.constrained.errors import ConstraintTooLarge, GrammarError
from sgl.constrained.regex import CharSet, Rx, rx_alt, rx_cat, rx_lit, rx_ref, rx_rep, rx_set, translate_regex
from sgl.constrained.json_schema.conditions import (
    CONDITIONAL_KEYWORDS, Negation, NotNegatable, condition_options, conditional, conjoin, split_conditions,
)
from sgl.constrained.json_schema.refs import RefIndex, UnresolvedRef
from sgl.constrained.json_schema.value_filter import ValueFilter

__all__ = ["WS", "FREE_DEPTH", "json_schema_to_regex", "json_schema_to_rules", "json_schema_to_rx", "load_schema"]

PARAM = "json_schema"
WS = " ?"  # the only whitespace: after ':' and ','
FREE_DEPTH = 2  # container nesting allowed in free-form values
_ONEOF_PROOF_LIMIT = 400  # positions; interegular is pure Python
_SHARE_TEXT = 16384  # grammar mode: a repeated piece with more regex text than this becomes a rule
_VALUE_RULE_SIZE = 32  # grammar mode: a member's value over this many positions is a rule (see rule_of_text)

_WS = rx_rep(rx_lit(" "), 0, 1)  # WS
_SEP = rx_cat(rx_lit(","), _WS)
_COLON = rx_cat(rx_lit(":"), _WS)
_DIGIT = rx_set(CharSet([(0x30, 0x39)]))
_DIGIT19 = rx_set(CharSet([(0x31, 0x39)]))
_QUOTE = rx_lit('"')

# Characters that may appear raw inside a generated JSON string.
_JSON_RAW = CharSet([(0x20, 0x10FFFF)]) - CharSet.of('"\\') - CharSet([(0x7F, 0x9F)])
# character -> the letter of its short escape (\" \\ \/ \b \f \n \r \t)
_ESCAPE_LETTERS = {'"': '"', "\\": "\\", "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}


def json_char(cs: CharSet) -> Rx | None:
    """One *decoded* character from ``cs``, spelled as it appears inside a JSON string.

    The escapes share one backslash branch (``\\[...]``), not one branch each: in the
    grammar route each branch is a parse configuration at every character position,
    and nine of them made string masks several times slower to compute."""
    letters = "".join(letter for ch, letter in _ESCAPE_LETTERS.items() if ch in cs)
    escape = rx_cat(rx_lit("\\"), rx_set(CharSet.of(letters))) if letters else None
    return rx_alt(rx_set(cs & _JSON_RAW), escape)


_HEX_CS = CharSet.of("0123456789abcdefABCDEF")
_HEX1 = rx_set(_HEX_CS)
# After "\u": any character, astral ones as a surrogate pair (json.dumps's default ASCII output).
_U_HEX = rx_alt(
    rx_cat(rx_set(_HEX_CS - CharSet.of("dD")), rx_rep(_HEX1, 3, 3)),
    rx_cat(rx_set(CharSet.of("dD")), rx_alt(
        rx_cat(rx_set(CharSet.of("01234567")), rx_rep(_HEX1, 2, 2)),
        rx_cat(rx_set(CharSet.of("89abAB")), rx_rep(_HEX1, 2, 2),
               rx_lit("\\u"), rx_set(CharSet.of("dD")), rx_set(CharSet.of("cdefCDEF")), rx_rep(_HEX1, 2, 2)))),
)
_RAW_CHAR = json_char(CharSet.full())
# one character of an unconstrained string: raw, a short escape or \uXXXX, under one backslash
_STR_CHAR = rx_alt(rx_set(_JSON_RAW), rx_cat(rx_lit("\\"), rx_alt(rx_set(CharSet.of('"\\/bfnrt')),
                                                               rx_cat(rx_lit("u"), _U_HEX))))
# Bounded lengths count characters without \u escapes: a surrogate pair is 12 positions, so
# with escapes `maxLength: 200` would take 2400 of the automaton's positions.
_ESCAPES_UP_TO = 16
_STRING = rx_cat(_QUOTE, rx_rep(_STR_CHAR, 0, None), _QUOTE)
_UINT = rx_alt(rx_lit("0"), rx_cat(_DIGIT19, rx_rep(_DIGIT, 0, None)))
_INTEGER = rx_cat(rx_rep(rx_lit("-"), 0, 1), _UINT)
_FRACTION = rx_cat(rx_lit("."), rx_rep(_DIGIT, 1, None))
_EXPONENT = rx_cat(rx_set(CharSet.of("eE")), rx_rep(rx_set(CharSet.of("+-")), 0, 1), rx_rep(_DIGIT, 1, None))
_NUMBER = rx_cat(_INTEGER, rx_rep(_FRACTION, 0, 1), rx_rep(_EXPONENT, 0, 1))
_BOOLEAN = rx_alt(rx_lit("true"), rx_lit("false"))
_CHARS = rx_rep(_STR_CHAR, 0, None)  # the inside of an unconstrained string
_HIGH = CharSet([(0x80, 0x10FFFF)])
_HIGH_CHAR = rx_set(_HIGH & _JSON_RAW)  # a raw non-ASCII character (no escape spells one raw)
_SHARED = {"json_string": _STRING, "json_number": _NUMBER, "json_integer": _INTEGER, "json_high_char": _HIGH_CHAR,
           "json_chars": _CHARS}  # grammar rules when used
_NULL = rx_lit("null")

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
    "properties", "required", "additionalProperties", "unevaluatedProperties", "minProperties", "maxProperties",
    "patternProperties", "propertyNames", "dependentRequired", "dependencies",
}  # fmt: skip
_ARRAY_KW = {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"}
_STRING_KW = {"minLength", "maxLength", "pattern", "format"}
_NUMBER_KW = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
_COMBINATORS = {"anyOf", "oneOf", "allOf", "$ref", "not"}
_SUPPORTED = (_OBJECT_KW | _ARRAY_KW | _STRING_KW | _NUMBER_KW | _COMBINATORS | CONDITIONAL_KEYWORDS
              | {"type", "enum", "const"})
_VALIDATION = _SUPPORTED | set(_UNSUPPORTED)  # every validation keyword of drafts 4 to 2020-12
# The formats the drafts define; any other `format` value is an annotation (no effect).
_SPEC_FORMATS = frozenset(
    {
        "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4", "ipv6",
        "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer",
        "relative-json-pointer", "regex",
    }
)  # fmt: skip
MAX_TRANSLATION_CHARS = 4_000_000  # regex text built while translating one schema (the compile budget) ...
MAX_CONVERT_CALLS = 200_000  # ... and subschemas expanded
MAX_EXCLUDED_NUMBERS = 16  # `not` over numbers: one range per gap between them
MAX_CONDITION_CASES = 64  # cases of the if/then/else (and dependentSchemas) of one schema, multiplied out
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
        raise GrammarError(f"json_schema must be a JSON object or a string, got {type(spec).__name__}", PARAM)
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


def json_schema_to_regex(spec: str | dict | bool, *, max_recursion_depth: int = 3) -> str:
    """The canonical regex of the instances we generate for ``spec`` (see the module doc)."""
    return json_schema_to_rx(spec, max_recursion_depth=max_recursion_depth).text


def json_schema_to_rx(spec: str | dict | bool, *, max_recursion_depth: int = 3,
                      max_text: int | None = None) -> Rx:
    """Like :func:`json_schema_to_regex`, keeping the size information. ``max_text``: stop
    with ConstraintTooLarge as soon as a piece of the regex is longer (the caller then takes
    the grammar route, and the rest of a regex too long for it is not built)."""
    schema = load_schema(spec)
    converter = _Converter(schema, max_recursion_depth)
    converter.max_text = max_text
    rx = converter.convert(schema, "#")
    if rx is None:
        raise GrammarError(
            "json_schema: no value can satisfy this schema within the supported limits "
            "(contradictory constraints, or a required recursive field)",
            PARAM,
        )
    return rx


_UNDECIDED = object()  # convert_listed: no enum/const to decide by value
MAX_DECIDED_VALUES = 10_000  # enum values validated one by one, at most (a bounded compile)
_VALUE_RULE = "json_value"  # grammar mode: any JSON value, in our spelling


def json_schema_to_rules(spec: str | dict | bool, *, max_recursion_depth: int = 3) -> dict:
    """The schema as EBNF rules (``ebnf_parse.RuleDef`` by name, ``root`` first): the
    route for schemas whose regex is too large. ``$ref`` targets become rules, so
    recursion needs no expansion and repeated references cost one copy; free values are
    the recursive JSON rule (no depth limit). Same keywords, same output shape."""
    from sgl.constrained import ebnf_parse as ast

    schema = load_schema(spec)
    conv = _Converter(schema, max_recursion_depth, grammar=True)
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
    return {name: rx for name, rx in _SHARED.items() if any(b is not None and _mentions(b.node, name)
                                                            for b in bodies.values())}


def _value_rules() -> dict[str, Rx | None]:
    value = rx_ref(_VALUE_RULE)
    return {
        _VALUE_RULE: rx_alt(_STRING, _NUMBER, _BOOLEAN, _NULL, rx_ref("json_object"), rx_ref("json_array")),
        "json_object": _map_object(value, 0, None),
        "json_array": _array_of([], value, 0, None),
    }


# ---------------------------------------------------------------------------
# Scalars
# ---------------------------------------------------------------------------


def _digits_range(lo: str, hi: str) -> Rx | None:
    """Digit strings of one length between ``lo`` and ``hi`` (inclusive)."""
    if lo == hi:
        return rx_lit(lo)
    if len(lo) == 1:
        return rx_set(CharSet([(ord(lo), ord(hi))]))
    if lo[0] == hi[0]:
        return rx_cat(rx_lit(lo[0]), _digits_range(lo[1:], hi[1:]))
    rest = len(lo) - 1
    low_full = lo[1:] == "0" * rest  # lo[0] may join the middle block
    high_full = hi[1:] == "9" * rest
    first = ord(lo[0]) + (0 if low_full else 1)
    last = ord(hi[0]) - (0 if high_full else 1)
    parts: list[Rx | None] = []
    if not low_full:
        parts.append(rx_cat(rx_lit(lo[0]), _digits_range(lo[1:], "9" * rest)))
    if first <= last:
        parts.append(rx_cat(rx_set(CharSet([(first, last)])), rx_rep(_DIGIT, rest, rest)))
    if not high_full:
        parts.append(rx_cat(rx_lit(hi[0]), _digits_range("0" * rest, hi[1:])))
    return rx_alt(*parts)


def _uint_range(lo: int, hi: int | None) -> Rx | None:
    """Non-negative integers in ``[lo, hi]`` without leading zeros (``hi`` None: unbounded)."""
    if hi is not None and hi < lo:
        return None
    parts: list[Rx | None] = []
    if lo == 0:
        parts.append(rx_lit("0"))
        lo = 1
        if hi is not None and hi < 1:
            return rx_alt(*parts)
    width = len(str(lo))
    if hi is None:
        parts.append(_digits_range(str(lo), "9" * width))
        parts.append(rx_cat(_DIGIT19, rx_rep(_DIGIT, width, None)))
    else:
        for n in range(width, len(str(hi)) + 1):
            a, b = max(lo, 10 ** (n - 1)), min(hi, 10**n - 1)
            if a <= b:
                parts.append(_digits_range(str(a), str(b)))
    return rx_alt(*parts)


def integer_range(lo: int | None, hi: int | None) -> Rx | None:
    """Integers in ``[lo, hi]`` (either end may be None), in canonical JSON spelling."""
    if lo is not None and hi is not None and hi < lo:
        return None
    parts: list[Rx | None] = []
    if hi is None or hi >= 0:
        parts.append(_uint_range(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        top = -1 if hi is None else min(hi, -1)
        ylo, yhi = -top, None if lo is None else -lo
        if yhi is None or ylo <= yhi:
            parts.append(rx_cat(rx_lit("-"), _uint_range(ylo, yhi)))
    return rx_alt(*parts)


_FRAC_ANY = rx_rep(_FRACTION, 0, 1)
_FRAC_ZERO = rx_rep(rx_cat(rx_lit("."), rx_rep(rx_lit("0"), 1, None)), 0, 1)
_FRAC_NONZERO = rx_cat(rx_lit("."), rx_rep(_DIGIT, 0, None), _DIGIT19, rx_rep(_DIGIT, 0, None))
_ZEROS = rx_rep(rx_lit("0"), 0, None)


def _fractions(places: int | None) -> tuple[Rx | None, Rx | None]:
    """(any fraction, a non-zero fraction) with at most ``places`` significant decimals
    (trailing zeros are free: 1.50 is a multiple of 0.01); None: unlimited."""
    if places is None:
        return _FRAC_ANY, _FRAC_NONZERO
    if places == 0:
        return _FRAC_ZERO, None
    any_ = rx_rep(rx_cat(rx_lit("."), rx_rep(_DIGIT, 1, places), _ZEROS), 0, 1)
    return any_, rx_cat(rx_lit("."), rx_rep(_DIGIT, 0, places - 1), _DIGIT19, _ZEROS)


def _magnitude(lo: int, lo_excl: bool, hi: int | None, hi_excl: bool, places: int | None = None) -> Rx | None:
    """Decimals ``y >= 0`` (no sign, no exponent) with ``lo <(=) y <(=) hi``, integer bounds,
    at most ``places`` significant decimals."""
    frac_any, frac_nonzero = _fractions(places)
    parts: list[Rx | None] = []
    n_lo = lo + 1 if lo_excl else lo
    n_hi = None if hi is None else hi - 1
    # Integer part strictly inside the bounds: any fraction.
    if n_hi is None or n_lo <= n_hi:
        parts.append(rx_cat(_uint_range(n_lo, n_hi), frac_any))
    # y = lo + f with f > 0, when y must exceed lo.
    if lo_excl and (hi is None or lo < hi):
        parts.append(rx_cat(_uint_range(lo, lo), frac_nonzero))
    # y == hi exactly, when hi is allowed.
    if hi is not None and not hi_excl and (hi > lo if lo_excl else hi >= lo):
        parts.append(rx_cat(_uint_range(hi, hi), _FRAC_ZERO))
    return rx_alt(*parts)


def number_range(lo: int | None, lo_excl: bool, hi: int | None, hi_excl: bool, places: int | None = None) -> Rx | None:
    """JSON numbers between integer bounds (either may be None), without exponents, with at
    most ``places`` significant decimals (None: any)."""
    parts: list[Rx | None] = []
    # x >= 0
    if hi is None or hi > 0 or (hi == 0 and not hi_excl):
        if lo is None or lo < 0:
            parts.append(_magnitude(0, False, hi, hi_excl, places))
        else:
            parts.append(_magnitude(lo, lo_excl, hi, hi_excl, places))
    # x < 0, written -y with y > 0
    if lo is None or lo < 0:
        if hi is None or hi >= 0:
            ylo, ylo_excl = 0, True
        else:
            ylo, ylo_excl = -hi, hi_excl
        yhi, yhi_excl = (None, False) if lo is None else (-lo, lo_excl)
        mag = _magnitude(ylo, ylo_excl, yhi, yhi_excl, places)
        if mag is not None:
            parts.append(rx_cat(rx_lit("-"), mag))
    return rx_alt(*parts)


MAX_LISTED_MULTIPLES = 1024  # multipleOf over a bounded range: the multiples are listed up to this many


def integer_multiples(step: int, lo: int | None, hi: int | None) -> Rx | str:
    """Integers in ``[lo, hi]`` divisible by ``step`` > 1, or a message saying why not:
    listed when the range holds few; else, when ``step`` divides 1000, by their last
    digits (any sign, or one sign when the bound is 0)."""
    if lo is not None and hi is not None:
        first, last = -(-lo // step) * step, (hi // step) * step
        if first > last:
            return rx_alt()
        if (last - first) // step < MAX_LISTED_MULTIPLES:
            return rx_alt(*(rx_lit(str(v)) for v in range(first, last + 1, step)))
    places = next((j for j in (1, 2, 3) if 10**j % step == 0), None)
    if places is None:
        return f"multipleOf {step} on a range with more than {MAX_LISTED_MULTIPLES} multiples (only divisors of 1000 are)"
    nonneg = lo is not None and -step < lo <= 0 and hi is None
    nonpos = hi is not None and 0 <= hi < step and lo is None
    if (lo is not None or hi is not None) and not (nonneg or nonpos):
        return f"multipleOf {step} with bounds other than 0 on a range with more than {MAX_LISTED_MULTIPLES} multiples"
    suffix = rx_alt(*(rx_lit(f"{v:0{places}d}") for v in range(0, 10**places, step)))
    positive = rx_alt(*(rx_lit(str(v)) for v in range(step, 10**places, step)),
                      rx_cat(_DIGIT19, rx_rep(_DIGIT, 0, None), suffix))
    negative = rx_cat(rx_lit("-"), positive)  # never "-0"
    return rx_alt(rx_lit("0"), None if nonpos else positive, None if nonneg else negative)


def _lit_seq(*items: Rx | str | None) -> Rx | None:
    return rx_cat(*(rx_lit(i) if isinstance(i, str) else i for i in items))


_D = _DIGIT
_MONTH31 = rx_alt(*(rx_lit(m) for m in ("01", "03", "05", "07", "08", "10", "12")))
_MONTH30 = rx_alt(*(rx_lit(m) for m in ("04", "06", "09", "11")))
_DAY28 = rx_alt(_lit_seq(rx_set(CharSet.of("0")), _DIGIT19), _lit_seq(rx_set(CharSet.of("1")), _D), _lit_seq("2", rx_set(CharSet([(0x30, 0x38)]))))
_YEAR = rx_alt(  # 0001-9999 (Python's date range)
    _lit_seq(_D, _D, _D, _DIGIT19), _lit_seq(_D, _D, _DIGIT19, "0"), _lit_seq(_D, _DIGIT19, "00"), _lit_seq(_DIGIT19, "000")
)
_LEAP_TAIL = rx_alt(*(rx_lit(f"{n:02d}") for n in range(4, 100, 4)))  # 04..96
_LEAP_CENTURY = rx_alt(*(rx_lit(f"{n:02d}") for n in range(4, 100, 4)))  # 04..96 -> 0400..9600
_LEAP_YEAR = rx_alt(_lit_seq(_D, _D, _LEAP_TAIL), _lit_seq(_LEAP_CENTURY, "00"))
_DATE = rx_alt(
    _lit_seq(_YEAR, "-", _MONTH31, "-", rx_alt(_DAY28, rx_lit("29"), rx_lit("30"), rx_lit("31"))),
    _lit_seq(_YEAR, "-", _MONTH30, "-", rx_alt(_DAY28, rx_lit("29"), rx_lit("30"))),
    _lit_seq(_YEAR, "-02-", _DAY28),
    _lit_seq(_LEAP_YEAR, "-02-29"),
)
_HOUR = rx_alt(_lit_seq(rx_set(CharSet.of("01")), _D), _lit_seq("2", rx_set(CharSet.of("0123"))))
_MINSEC = _lit_seq(rx_set(CharSet([(0x30, 0x35)])), _D)
_TIME = _lit_seq(
    _HOUR, ":", _MINSEC, ":", _MINSEC,
    rx_rep(_lit_seq(".", rx_rep(_D, 1, 6)), 0, 1),
    rx_alt(rx_lit("Z"), _lit_seq(rx_set(CharSet.of("+-")), _HOUR, ":", _MINSEC)),
)  # fmt: skip
_HEX = _HEX1
_OCTET = integer_range(0, 255)
_ALNUM = CharSet([(0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A)])
_PCT = _lit_seq("%", _HEX1, _HEX1)
_UNRESERVED_SUB = _ALNUM | CharSet.of("-._~!$&'()*+,;=")  # RFC 3986 unreserved / sub-delims
_UCSCHAR = CharSet([(0xA0, 0xD7FF), (0xF900, 0xFDCF), (0xFDF0, 0xFFEF), (0x10000, 0x1FFFD)])  # RFC 3987 (plane 1)


def _uri_forms(extra: CharSet) -> tuple[Rx | None, Rx | None]:
    """(absolute URI, relative reference) of RFC 3986; with ``extra`` = ucschar, the IRIs of
    RFC 3987. Authority without userinfo or IP literals (stricter, still valid): host[:port]."""
    unreserved = _UNRESERVED_SUB | extra
    reg_name = rx_rep(rx_alt(rx_set(unreserved), _PCT), 0, None)
    pchar = rx_alt(rx_set(unreserved | CharSet.of(":@")), _PCT)
    pchar_nc = rx_alt(rx_set(unreserved | CharSet.of("@")), _PCT)  # no ':' (a relative path's first segment)
    segments = rx_rep(_lit_seq("/", rx_rep(pchar, 0, None)), 0, None)
    tail = rx_rep(rx_alt(pchar, rx_set(CharSet.of("/?"))), 0, None)
    query_frag = _lit_seq(rx_rep(_lit_seq("?", tail), 0, 1), rx_rep(_lit_seq("#", tail), 0, 1))
    authority_path = _lit_seq("//", reg_name, rx_rep(_lit_seq(":", rx_rep(_D, 0, None)), 0, 1), segments)
    absolute_path = _lit_seq("/", rx_rep(_lit_seq(rx_rep(pchar, 1, None), segments), 0, 1))
    uri = _lit_seq(_SCHEME, ":", rx_alt(authority_path, absolute_path, _lit_seq(rx_rep(pchar, 1, None), segments),
                                        rx_lit("")), query_frag)
    relative = _lit_seq(
        rx_alt(authority_path, absolute_path, _lit_seq(rx_rep(pchar_nc, 1, None), segments), rx_lit("")), query_frag)
    return uri, relative


_SCHEME = _lit_seq(rx_set(CharSet([(0x41, 0x5A), (0x61, 0x7A)])), rx_rep(rx_set(_ALNUM | CharSet.of("+-.")), 0, None))
_URI, _RELATIVE_REF = _uri_forms(CharSet())
_IRI, _IRELATIVE_REF = _uri_forms(_UCSCHAR)
_LABEL = _lit_seq(rx_set(_ALNUM), rx_rep(_lit_seq(rx_rep(rx_set(_ALNUM | CharSet.of("-")), 0, 61), rx_set(_ALNUM)), 0, 1))
_HOSTNAME = _lit_seq(_LABEL, rx_rep(_lit_seq(".", _LABEL), 0, 3))  # <= 4 labels of <= 63: under 253 characters
_H16 = rx_rep(_HEX1, 1, 4)


def _ipv6() -> Rx | None:
    """RFC 4291 text forms without an embedded IPv4 tail: 8 groups, or "::" for a run of zeros."""
    def groups(n: int) -> Rx | None:  # exactly n >= 1 groups
        return _lit_seq(_H16, rx_rep(_lit_seq(":", _H16), n - 1, n - 1))

    forms = [groups(8)]
    for before in range(0, 8):
        head = rx_lit("") if before == 0 else groups(before)
        room = 7 - before  # groups after "::" (it stands for at least one)
        tail = rx_rep(_lit_seq(_H16, rx_rep(_lit_seq(":", _H16), 0, room - 1)), 0, 1) if room else rx_lit("")
        forms.append(_lit_seq(head, "::", tail))
    return rx_alt(*forms)


_FORMATS: dict[str, Rx | None] = {
    "uri": _URI,
    "uri-reference": rx_alt(_URI, _RELATIVE_REF),
    "iri": _IRI,
    "iri-reference": rx_alt(_IRI, _IRELATIVE_REF),
    "hostname": _HOSTNAME,
    "ipv6": _ipv6(),
    "date": _DATE,
    "time": _TIME,
    "date-time": _lit_seq(_DATE, "T", _TIME),
    "uuid": _lit_seq(rx_rep(_HEX, 8, 8), "-", rx_rep(_HEX, 4, 4), "-", rx_rep(_HEX, 4, 4), "-", rx_rep(_HEX, 4, 4), "-", rx_rep(_HEX, 12, 12)),
    "ipv4": _lit_seq(_OCTET, ".", _OCTET, ".", _OCTET, ".", _OCTET),
    "email": _lit_seq(
        rx_rep(rx_set(CharSet.of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%+-")), 1, None),
        "@",
        rx_rep(rx_set(CharSet.of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")), 1, None),
        rx_rep(_lit_seq(".", rx_rep(rx_set(CharSet.of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")), 1, None)), 1, None),
    ),
}  # fmt: skip


def _value_literal(value: Any, where: str) -> Rx:
    """The regex for one JSON value given in the schema (enum/const), in our spelling."""
    if isinstance(value, dict):
        items = [rx_cat(rx_lit(json.dumps(k, ensure_ascii=False)), _COLON, _value_literal(v, where)) for k, v in value.items()]
        return _joined(items, "{", "}")
    if isinstance(value, list):
        return _joined([_value_literal(v, where) for v in value], "[", "]")
    if isinstance(value, float) and not math.isfinite(value):
        raise GrammarError(f"{where}: {value} is not a JSON value", PARAM)
    return rx_lit(json.dumps(value, ensure_ascii=False))


def _joined(items: list[Rx | None], open_: str, close: str) -> Rx:
    parts: list[Rx | None] = [rx_lit(open_)]
    for i, item in enumerate(items):
        if i:
            parts.append(_SEP)
        parts.append(item)
    parts.append(rx_lit(close))
    out = rx_cat(*parts)
    assert out is not None
    return out


def _json_equal(a: Any, b: Any) -> bool:
    """JSON Schema equality: 1 == 1.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if type(a) in (int, float) and type(b) in (int, float):
        return a == b
    return type(a) is type(b) and a == b


def _listed(schema: dict) -> list | None:
    """The values an enum/const allows (both: the common ones), or None."""
    if "enum" in schema and isinstance(schema["enum"], list):
        values = schema["enum"]
        return [v for v in values if _json_equal(v, schema["const"])] if "const" in schema else list(values)
    return [schema["const"]] if "const" in schema else None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _type_list(t: Any) -> list:
    return [t] if isinstance(t, str) else list(t) if isinstance(t, list) else []


def _has_type(value: Any, t: str) -> bool:
    if t == "null":
        return value is None
    if t == "boolean":
        return isinstance(value, bool)
    if t == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "string":
        return isinstance(value, str)
    if t == "array":
        return isinstance(value, list)
    return isinstance(value, dict)


def _free_value(depth: int) -> Rx | None:
    """Any JSON value with at most ``depth`` levels of containers."""
    scalars = [_STRING, _NUMBER, _BOOLEAN, _NULL]
    if depth <= 0:
        return rx_alt(*scalars)
    inner = _free_value(depth - 1)
    return rx_alt(*scalars, _map_object(inner, 0, None), _array_of([], inner, 0, None))


@lru_cache(maxsize=4096)
def _json_char_except(taken: str) -> tuple[Rx | None, bool]:
    """A JSON character that is none of ``taken``, and whether that is only its ASCII part
    (the caller adds its non-ASCII piece). Memoized: the nodes of a name trie exclude the
    same few letters again and again."""
    cs = CharSet.of(taken)
    if cs & _HIGH:
        return json_char(CharSet.full() - cs), False
    return json_char(CharSet([(0, 0x7F)]) - cs), True


@lru_cache(maxsize=4096)
def _json_char_of(ch: str) -> Rx | None:
    return json_char(CharSet.of(ch))


def _string_not_in(values: list[str], anything: Rx = _CHARS, high: Rx = _HIGH_CHAR) -> Rx | None:
    """The body of a JSON string whose decoded value is none of ``values`` (a trie,
    complemented; ``anything``, the rest once off the trie, and ``high``, a non-ASCII
    character, may be shared rules: each trie node then costs a few grammar states, not
    the UTF-8 automaton of a character class)."""
    trie: dict = {}
    for v in values:
        node = trie
        for ch in v:
            node = node.setdefault(ch, {})
        node[""] = {}  # end marker

    def body(node: dict) -> Rx | None:
        children = "".join(sorted(c for c in node if c))
        others, ascii_only = _json_char_except(children)
        if ascii_only:
            others = rx_alt(others, high)
        # Leaving the trie by a raw character only: a \\u escape could spell a child's character.
        parts = [rx_lit("") if "" not in node else None, rx_cat(others, anything)]
        parts += [rx_cat(_json_char_of(c), body(node[c])) for c in children]
        return rx_alt(*parts)

    return body(trie)


def _map_object(value: Rx | None, lo: int, hi: int | None, key: Rx | None = _STRING) -> Rx | None:
    """``{}``-style objects with ``key`` strings (any, by default) mapping to ``value``, ``lo..hi`` members."""
    return _map_of(rx_cat(key, _COLON, value), lo, hi)


def _map_of(member: Rx | None, lo: int, hi: int | None) -> Rx | None:
    """Objects of ``lo..hi`` comma-separated members."""
    return _array_like("{", "}", [], member, lo, hi)


def _array_of(prefix: list[Rx | None], rest: Rx | None, lo: int, hi: int | None) -> Rx | None:
    return _array_like("[", "]", prefix, rest, lo, hi)


def _array_like(open_: str, close: str, prefix: list[Rx | None], rest: Rx | None, lo: int, hi: int | None) -> Rx | None:
    """Comma-separated elements: element i matches ``prefix[i]``, later ones ``rest``
    (None: no more), between ``lo`` and ``hi`` elements."""
    k = len(prefix)
    if rest is None:
        hi = k if hi is None else min(hi, k)
    if hi is not None and hi < lo:
        return None

    def tail(i: int) -> Rx | None:
        # Elements i.. given i elements already written (so each starts with a comma).
        if hi is not None and i >= hi:
            return rx_lit("")
        sep = rx_lit("") if i == 0 else _SEP
        if i >= k:
            # Only `rest` elements remain: a closed-form counted repetition.
            need = max(lo - i, 0)
            more = None if hi is None else hi - i
            if i == 0:
                if more == 0:
                    return rx_lit("")
                body = rx_cat(rest, rx_rep(rx_cat(_SEP, rest), max(need - 1, 0), None if more is None else more - 1))
                return body if need > 0 else rx_rep(body, 0, 1)
            return rx_rep(rx_cat(_SEP, rest), need, more)
        step = rx_cat(sep, prefix[i], tail(i + 1))
        return step if i < lo else rx_alt(step, rx_lit(""))

    return rx_cat(rx_lit(open_), tail(0), rx_lit(close))


# ---------------------------------------------------------------------------
# The schema walk
# ---------------------------------------------------------------------------


class _Converter:
    def __init__(self, root: dict | bool, max_recursion_depth: int, grammar: bool = False) -> None:
        self.root = root
        self.max_depth = max_recursion_depth
        self.ref_stack: list[str] = []
        # Grammar mode: a $ref is a rule (recursion without expansion) and a free value the
        # recursive JSON rule; the result's `node` is then read, not its regex `text`.
        self.grammar = grammar
        self.rule_of: dict[str, str] = {}  # $ref -> rule name
        self.rules: dict[str, Rx | None] = {}
        self.text_rules: dict[str, str] = {}  # grammar mode: a constrained string's or value's regex text -> rule
        self.calls = 0  # subschemas converted, and ...
        self.chars = 0  # ... regex text produced: both bounded (the compile budget)
        self.values = ValueFilter(root)  # enum/const next to other keywords: decided per value
        self.not_in: dict[tuple[str, ...], Rx | None] = {}  # string_not_in, memoized
        self.max_text: int | None = None  # regex mode: see json_schema_to_rx
        self.part_of: dict[str, str] = {}  # grammar mode: a shared piece's regex text -> its rule
        self.refs = RefIndex(root)
        self.base = self.refs.root_base  # the base URI of the schema being translated
        self.negation = Negation(lambda ref: self.resolve(ref, "#")[0], validation_keywords)
        self.forbidden: dict[str, list[frozenset]] = {}  # not: {required: [...]}, for the object at a path

    # -- helpers ---------------------------------------------------------------------

    def fail(self, where: str, message: str) -> GrammarError:
        return GrammarError(f"json_schema at {where}: {message}", PARAM)

    def resolve(self, ref: Any, where: str) -> tuple[Any, str]:
        """The target of ``ref`` (read against the base URI of the schema being translated)
        and its canonical key (see schema_refs)."""
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
            raise self.fail(where, f"{key} = {v} is too large a bound to enforce; use a bound below 1e30 or none")
        return v

    def count(self, node: dict, key: str, where: str) -> int | None:
        v = node.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (isinstance(v, float) and not v.is_integer()):
            raise self.fail(where, f"{key} must be a non-negative integer")
        return int(v)

    # -- the walk --------------------------------------------------------------------

    def convert(self, schema: Any, where: str) -> Rx | None:
        base = self.refs.base_of.get(id(schema)) if isinstance(schema, dict) else None
        if base is None or base == self.base:
            return self.convert_in_scope(schema, where)
        saved, self.base = self.base, base  # a subschema with its own $id: its $refs read against it
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
            raise self.fail(where, f"a schema must be an object or a boolean, got {type(schema).__name__}")
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
            raise ConstraintTooLarge(f"json_schema: a piece of its regex is over {self.max_text} characters", PARAM)

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
            f"json_schema is too large to compile: translating it took {what} (the compile budget); "
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
                raise self.fail(where, "not: excluding integers from numbers (non-integral numbers only) is not supported")
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
        """The instances ``schema`` rejects, as a union of schemas (see schema_conditions)."""
        try:
            return self.negation.fails(schema)
        except NotNegatable as exc:
            raise self.fail(where, str(exc)) from None

    def convert_cases(self, rest: Any, cases: list, where: str) -> Rx | None:
        """``rest`` and one of ``cases`` (a union): each case merged into ``rest``."""
        if not cases:
            return None
        branches = [conjoin(rest, case) for case in cases]
        return self.convert_union({"anyOf": [b for b in branches if b is not False] or [False]}, "anyOf", where)

    def convert_not_object(self, rest: dict, neg: dict, where: str) -> Rx | None:
        """``not`` over an object keyword (vacuously true for other types, so only objects
        remain): ``propertyNames: false`` means at least one member; ``required: [a, b]``
        that not all of them are written (the member automaton tracks which were)."""
        if "object" not in self.types(rest, where):
            return None
        obj = {**rest, "type": "object"}
        if "propertyNames" in neg:
            if neg["propertyNames"] is not False:
                raise self.fail(where, "not: propertyNames is supported as false only (at least one member)")
            return self.convert({**obj, "minProperties": max(self.count(obj, "minProperties", where) or 0, 1)}, where)
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
            raise self.fail(where, "not: required is supported on an object with declared properties, given next to them")
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
        if any(isinstance(v, (dict, list)) or (_is_number(v) and not float(v).is_integer()) for v in values):
            raise self.fail(where, "not: excluding objects, arrays or non-integral numbers is not supported "
                            "(strings, booleans, null and integers are)")
        strings = [v for v in values if isinstance(v, str)]
        parts = []
        for t in self.types(schema, where):
            if t == "string" and strings:
                if set(schema) & _STRING_KW:
                    raise self.fail(where, "not: excluding strings from a string with pattern/format/length is not "
                                    "supported")
                body = self.string_not_in(strings)
                parts.append(rx_cat(_QUOTE, body, _QUOTE))
            elif t == "boolean":
                parts.append(rx_alt(*(rx_lit(b) for b in ("true", "false") if not any(v is (b == "true") for v in values))))
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
        return rx_alt(*(self.convert(conjoin(schema, {k: v for k, v in (("exclusiveMinimum", lo), ("exclusiveMaximum", hi))
                                                      if v is not None}), where) for lo, hi in gaps))

    def string_not_in(self, values: Any) -> Rx | None:
        """The body of a string that is none of ``values`` (memoized: the keys of undeclared
        members exclude the same declared names in every case of a condition)."""
        key = tuple(sorted(set(values)))
        if key not in self.not_in:
            self.not_in[key] = _string_not_in(list(key), self.shared("json_chars"), self.shared("json_high_char"))
        return self.not_in[key]

    def shared(self, name: str) -> Rx:
        """A common piece (``json_string``, ...): inline in a regex; in a grammar one rule
        that every use calls (its regex text kept, for oneOf proofs), not a copy per use."""
        rx = _SHARED[name]
        if not self.grammar:
            return rx
        return Rx(rx.text, atom=rx.atom, alt=rx.alt, size=rx.size, node=rx_ref(name).node)

    def share(self, rx: Rx | None, always: bool = False) -> Rx | None:
        """Grammar mode: a large piece used in several places (the rest of an object after
        a member) as one rule, so the grammar holds one copy, not one per use. Only pieces
        too large for a oneOf proof anyway lose their regex text, unless ``always`` (a
        piece no proof reads: the undeclared members of an open object)."""
        small = rx is not None and rx.size <= _ONEOF_PROOF_LIMIT and len(rx.text) <= _SHARE_TEXT
        if not self.grammar or rx is None or (small and not always):
            return rx
        name = self.part_of.get(rx.text)  # the same piece again (the cases of a condition): the same rule
        if name is None:
            name = self.part_of[rx.text] = f"part{len(self.rules)}"
            self.rules[name] = rx
        return Rx(f"\x00{name}\x00", atom=True, size=rx.size, node=rx_ref(name).node, ref=True)

    def free(self, depth: int) -> Rx | None:
        """Any JSON value (``depth`` containers deep; unbounded in grammar mode)."""
        if self.grammar:
            return rx_ref(_VALUE_RULE)
        return _free_value(depth)

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
        cases (see schema_conditions), multiplied out, at most MAX_CONDITION_CASES."""
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
            raise self.fail(where, f"if/then/else and dependentSchemas: {len(options)} conditions make {count} cases "
                            f"to translate; at most {MAX_CONDITION_CASES} are supported")
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
                    kept = [t for t in _type_list(merged[k]) if t in _type_list(v)
                            or (t == "integer" and "number" in _type_list(v))]
                    kept += [t for t in _type_list(v) if t == "integer" and "number" in _type_list(merged[k])]
                    if not kept:
                        return False
                    merged[k] = list(dict.fromkeys(kept))
                elif k == "not" and merged[k] != v:
                    both = _negations_merge(merged[k], v)
                    if both is not None:
                        merged[k] = both
                        continue
                    cases = self.negated(v, f"{where}/not")  # a second `not`: the union of its cases
                    if not cases:
                        return False
                    merged["anyOf"] = _union_and(merged["anyOf"], "anyOf", cases) if "anyOf" in merged else cases
                    origin.setdefault("anyOf", set()).add(i)
                elif k in ("anyOf", "oneOf") and isinstance(merged[k], list) and merged[k] != v:
                    merged[k] = _union_and(merged[k], k, v)
                elif merged[k] != v:
                    raise self.fail(
                        where,
                        f"allOf: keyword '{k}' appears in two parts with different values; only parts that "
                        "constrain different keywords can be combined",
                    )
        for group in _COUPLED:
            present = group & set(origin)
            if len(present) > 1 and present - _MEMBER_KW and len(set().union(*(origin[k] for k in present))) > 1:
                raise self.fail(
                    where, f"allOf: keywords {sorted(present)} come from different parts and interact"
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
        props = {n: _all_of([p["properties"][n] if n in p.get("properties", {}) else p.get("additionalProperties", True)
                             for p in parts]) for n in names}
        out: dict[str, Any] = {"properties": props} if props else {}
        extra = _all_of([p.get("additionalProperties", True) for p in parts])
        if extra is not True:
            out["additionalProperties"] = extra
        return out

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

    def check_disjoint(self, rxs: list[Rx], where: str, what: str = "oneOf", schemas: list | None = None) -> None:
        """oneOf = anyOf only if no value matches two branches (and several patternProperties
        apply one schema each only if no key matches two). Pairs are proven from the keywords
        first (listed values, types, a required property with disjoint values or one the other
        closed object cannot have), the rest on the automata."""
        unproven = {
            k for i in range(len(rxs)) for j in range(i + 1, len(rxs))
            if schemas is None or not self.disjoint_schemas(schemas[i], schemas[j], where)
            for k in (i, j)
        }
        if schemas is not None:
            # The automata compare what we generate; that decides only where we generate all a
            # branch accepts (else a value of one branch could be accepted, not generated, by another).
            narrow = [i for i in sorted(unproven) if not self.exact(schemas[i], where)]
            if narrow:
                raise self.fail(where, f"{what}: cannot prove branch {narrow[0]} exclusive of the others: it accepts "
                                "more than is generated (an open object, a free value, an inferred type); use anyOf, "
                                "or give the branches distinct const tags or types")
        rxs = [rxs[i] for i in sorted(unproven)]
        if len(rxs) < 2:
            return
        if any(r.ref for r in rxs):
            raise self.fail(where, f"{what}: its branches use recursive references and cannot be proven exclusive; "
                            "use anyOf if overlaps are fine")
        if sum(r.size for r in rxs) > _ONEOF_PROOF_LIMIT:
            raise self.fail(where, f"{what}: its branches are too large to prove exclusive; use anyOf if overlaps are fine")
        try:
            import interegular

            fsms = [interegular.parse_pattern(r.text).to_fsm() for r in rxs]
        except Exception:
            raise self.fail(where, f"{what}: cannot prove its branches exclusive; use anyOf if overlaps are fine") from None
        for i in range(len(fsms)):
            for j in range(i + 1, len(fsms)):
                if not fsms[i].isdisjoint(fsms[j]):
                    raise self.fail(
                        where, f"{what}: branches {i} and {j} can match the same value, and exclusivity cannot be "
                        "enforced; use anyOf, or make the branches distinct (e.g. a const tag)"
                    )

    def plain(self, schema: Any, where: str) -> Any:
        """A schema with its $ref/allOf conjunction merged (for proofs), or None."""
        if not isinstance(schema, dict):
            return schema
        try:
            merged = self.merge_all_of(schema, where, []) if {"$ref", "allOf"} & set(schema) else schema
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
        if not isinstance(s, dict) or "type" not in s or depth > 6 or conditional(s) or \
                {"not", "patternProperties", "propertyNames"} & set(s):
            return False
        for comb in ("anyOf", "oneOf"):
            if comb in s:
                rest = {k: v for k, v in s.items() if k != comb}
                return isinstance(s[comb], list) and all(
                    self.exact({"allOf": [rest, b]}, where, depth + 1) for b in s[comb])
        types = _type_list(s["type"])
        if "string" in types and ("format" in s or "maxLength" in s or (self.count(s, "minLength", where) or 0) > _ESCAPES_UP_TO):
            return False
        if "object" in types:
            closed = s.get("additionalProperties") is False or s.get("unevaluatedProperties") is False
            props = s.get("properties") or {}
            if not closed or not isinstance(props, dict) or not all(self.exact(v, where, depth + 1) for v in props.values()):
                return False
        if "array" in types:
            items = s.get("prefixItems", s.get("items"))
            parts = items if isinstance(items, list) else [items]
            tail = s.get("items") if "prefixItems" in s else s.get("additionalItems", True) if isinstance(items, list) else None
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
                return True  # no listed value is valid for the other: we generate nothing both accept
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
            lo_a, lo_b = self.count(a, "minLength", where) or 0, self.count(b, "minLength", where) or 0
            hi_a, hi_b = self.count(a, "maxLength", where), self.count(b, "maxLength", where)
            return (hi_a is not None and hi_a < lo_b) or (hi_b is not None and hi_b < lo_a)
        if ga != {"object"} or gb != {"object"}:
            return False
        for x, y in ((a, b), (b, a)):
            props_x, props_y = x.get("properties") or {}, y.get("properties") or {}
            for name in x.get("required") or []:
                if not isinstance(name, str):
                    continue
                closed_y = y.get("additionalProperties") is False or y.get("unevaluatedProperties") is False
                if closed_y and name not in props_y and not y.get("patternProperties"):
                    return True
                if name in (y.get("required") or []) and name in props_x and name in props_y:
                    if self.disjoint_schemas(props_x[name], props_y[name], where, depth + 1):
                        return True
        return False

    def convert_enum(self, schema: dict, where: str) -> Rx | None:
        values: list[Any]
        if "enum" in schema:
            if not isinstance(schema["enum"], list):
                raise self.fail(where, "enum must be a list")
            values = list(schema["enum"])
            if "const" in schema:
                values = [v for v in values if _json_equal(v, schema["const"])]
        else:
            values = [schema["const"]]
        extra = [k for k in schema if k not in ("enum", "const", "type")]
        if extra:
            raise self.fail(where, f"{extra[0]} together with enum/const is not supported; list only valid values")
        if "type" in schema:
            types = self.types(schema, where)
            values = [v for v in values if any(_has_type(v, t) for t in types)]
        return rx_alt(*(_value_literal(v, where) for v in values))

    def types(self, schema: dict, where: str) -> list[str]:
        t = schema.get("type")
        if t is None:
            keys = set(schema)
            inferred = [
                name
                for name, kws in (("object", _OBJECT_KW), ("array", _ARRAY_KW), ("string", _STRING_KW), ("number", _NUMBER_KW))
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

    def convert_string(self, schema: dict, where: str) -> Rx | None:
        rx = self.convert_string_rx(schema, where)
        return rx if rx is None or rx.text == _STRING.text else self.string_rule(rx)  # json_string: a rule already

    def string_rule(self, rx: Rx | None) -> Rx | None:
        """Grammar mode: a constrained string as one rule per distinct regex, called by every
        use (its text kept, for oneOf proofs). The same ``maxLength: 256`` string in thirty
        properties is then one automaton, and a parse state inside it is the same kernel in
        all of them: its mask walks are made once per grammar, not once per property."""
        return self.rule_of_text(rx, "string")

    def rule_of_text(self, rx: Rx | None, kind: str) -> Rx | None:
        """Grammar mode: ``rx`` as a call of one rule per distinct regex text (the text kept,
        for oneOf proofs). A member's value is written once per place the member can come
        (with and without a comma, after each subset of optional members): as a rule, its
        automaton is in the grammar once, not once per place."""
        if not self.grammar or rx is None:
            return rx
        name = self.text_rules.get(rx.text)
        if name is None:
            name = self.text_rules[rx.text] = f"{kind}{len(self.text_rules)}"
            self.rules[name] = rx
        return Rx(rx.text, atom=rx.atom, alt=rx.alt, size=rx.size, node=rx_ref(name).node)

    def convert_string_rx(self, schema: dict, where: str) -> Rx | None:
        lo = self.count(schema, "minLength", where) or 0
        hi = self.count(schema, "maxLength", where)
        fmt, pattern = schema.get("format"), schema.get("pattern")
        if fmt is not None:
            if fmt not in _FORMATS:
                raise self.fail(where, f"format {fmt!r} is not supported (supported: {', '.join(sorted(_FORMATS))})")
            if pattern is not None or "minLength" in schema or "maxLength" in schema:
                raise self.fail(where, "format cannot be combined with pattern/minLength/maxLength")
            return rx_cat(_QUOTE, _FORMATS[fmt], _QUOTE)
        if pattern is not None:
            length = (lo, hi) if "minLength" in schema or "maxLength" in schema else None
            anything = rx_rep(_STR_CHAR, 0, None)
            body, start, end = translate_regex(pattern, param=PARAM, emit=json_char, search=True,
                                               what=f"json_schema at {where}: pattern", length=length, pad=anything)
            if body is None:
                return None
            return rx_cat(_QUOTE, rx_lit("") if start else anything, body, rx_lit("") if end else anything, _QUOTE)
        char = _STR_CHAR if hi is None and lo <= _ESCAPES_UP_TO else _RAW_CHAR
        if lo == 0 and hi is None:
            return self.shared("json_string")
        return rx_cat(_QUOTE, rx_rep(char, lo, hi), _QUOTE)

    def convert_number(self, t: str, schema: dict, where: str) -> Rx | None:
        step, places = self.multiple_of(t, schema, where)
        if step == 1 and places == 0:
            t = "integer" if t == "integer" else "integral"
        lo = self.number(schema, "minimum", where)
        hi = self.number(schema, "maximum", where)
        lo_excl = hi_excl = False
        ex_lo, ex_hi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
        if isinstance(ex_lo, bool):  # draft 4: a flag on minimum
            lo_excl = ex_lo and lo is not None
        elif ex_lo is not None:
            v = self.number(schema, "exclusiveMinimum", where)
            if lo is None or v >= lo:  # type: ignore[operator]
                lo, lo_excl = v, True
        if isinstance(ex_hi, bool):
            hi_excl = ex_hi and hi is not None
        elif ex_hi is not None:
            v = self.number(schema, "exclusiveMaximum", where)
            if hi is None or v <= hi:  # type: ignore[operator]
                hi, hi_excl = v, True
        if t in ("integer", "integral") or places == 0:
            ilo = None if lo is None else (math.floor(lo) + 1 if lo_excl else math.ceil(lo))
            ihi = None if hi is None else (math.ceil(hi) - 1 if hi_excl else math.floor(hi))
            if step > 1:
                ints = integer_multiples(step, ilo, ihi)
                if isinstance(ints, str):
                    raise self.fail(where, ints)
            else:
                ints = self.shared("json_integer") if ilo is None and ihi is None else integer_range(ilo, ihi)
            return ints if t == "integer" else rx_cat(ints, _FRAC_ZERO)  # a number: 5.0 is integral
        if lo is None and hi is None and places is None:
            return self.shared("json_number")
        for key, v in (("minimum", lo), ("maximum", hi)):
            if v is not None and not float(v).is_integer():
                raise self.fail(
                    where, f"a non-integer bound ({key}/exclusive{key.capitalize()} = {v}) on a number is not supported; "
                    "integer-valued bounds are"
                )
        return number_range(
            None if lo is None else int(lo), lo_excl, None if hi is None else int(hi), hi_excl, places
        )

    def multiple_of(self, t: str, schema: dict, where: str) -> tuple[int, int | None]:
        """multipleOf as ``step * 10**-places`` (decimal arithmetic, as the drafts define it:
        0.07 is a multiple of 0.01). (1, None): none. Steps of one significant digit block:
        integers (any divisor of 1000, or few multiples in range) and 10**-k."""
        mult = schema.get("multipleOf")
        if mult is None:
            return 1, None
        if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not math.isfinite(mult) or mult <= 0:
            raise self.fail(where, "multipleOf must be a number greater than 0")
        from decimal import Decimal

        sign, digits, exp = Decimal(repr(mult)).normalize().as_tuple()
        step = int("".join(map(str, digits)))
        if exp >= 0:
            return step * 10**exp, 0
        if t == "integer":  # n * 10**-exp divisible by step
            return step // math.gcd(step, 10**-exp), 0
        if step != 1:
            raise self.fail(where, f"multipleOf {mult} is not supported: a fractional step must be a power of ten "
                            "(0.1, 0.01, ...), or the step an integer")
        return 1, -exp

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
            raise self.fail(where, "unevaluatedProperties with a schema is not supported (true/false are)")
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
        if patterns:  # pattern members after the declared ones, when no declared name matches a pattern
            clash = next(((n, p) for n in names for p in patterns if isinstance(p, str) and _search(p, n)), None)
            if clash is not None:
                raise self.fail(where, f"patternProperties {clash[1]!r} matches the declared property {clash[0]!r}: "
                                "not supported (the property would need both schemas)")
            if key_schema is not True:
                raise self.fail(where, "patternProperties together with propertyNames is not supported")
            tail = self.pattern_member(patterns, where)
        req = set(required)
        closed = extra is False or unevaluated is False
        if not patterns and not closed and key_schema is True:
            # undeclared members after the declared ones; never a name whose presence matters elsewhere
            excluded = set(names) | {n for k, v in deps.items() for n in [k, *v]} | {n for f in forbid for n in f}
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
            members.append((name, rx_cat(rx_lit(json.dumps(name, ensure_ascii=False)), _COLON, value), name in req))
        if hi is not None and hi < len(req):
            return None
        if lo > len(members) and tail is None:
            raise self.fail(where, "minProperties exceeds the number of properties that may be generated "
                            "(only declared ones: the object is closed, or its other keys are limited by "
                            "propertyNames)")
        written_ok = {m[0] for m in members}
        forbid = [f for f in forbid if f <= written_ok]  # a name never generated: never all written
        if any(f <= req for f in forbid):
            return None
        share = self.share if self.grammar else None
        self.check_text(sum(len(m[1].text) for m in members) + (len(tail.text) if tail is not None else 0))
        return rx_cat(rx_lit("{"), _members(members, lo, hi, deps, share, forbid, tail), rx_lit("}"))

    def convert_map(self, patterns: dict, extra: Any, key_schema: Any, deps: dict, lo: int, hi: int | None,
                    where: str) -> Rx | None:
        """An object without declared properties: keys from patternProperties (or any key
        propertyNames allows), values from their schemas."""
        if deps:
            raise self.fail(where, "dependentRequired/dependencies on an object without declared properties is not "
                            "supported; declare the properties")
        if key_schema is False:
            return rx_lit("{}") if lo == 0 else None
        if patterns:
            if key_schema is not True:
                raise self.fail(where, "patternProperties together with propertyNames is not supported")
            return _map_of(self.pattern_member(patterns, where), lo, hi)
        if extra is False:
            return rx_lit("{}") if lo == 0 else None
        key = _STRING if key_schema is True else self.convert_key(key_schema, where)
        value = self.convert(extra, f"{where}/additionalProperties") if extra is not True else self.free(FREE_DEPTH - 1)
        return _map_object(value, lo, hi, key)

    def pattern_member(self, patterns: dict, where: str) -> Rx | None:
        """A member whose key matches one of ``patterns`` (provably disjoint), valued by its
        schema. Keys matching no pattern fall to additionalProperties: not generated
        (stricter, still valid)."""
        keys = [(self.pattern_key(p, f"{where}/patternProperties"), sub) for p, sub in patterns.items()]
        if len(keys) > 1:
            self.check_disjoint([k for k, _ in keys if k is not None], f"{where}/patternProperties", "patternProperties")
        return rx_alt(*(rx_cat(k, _COLON, self.convert(sub, f"{where}/patternProperties/{i}"))
                        for i, (k, sub) in enumerate(keys)))

    def extra_member(self, extra: Any, excluded: set[str], where: str) -> Rx | None:
        """An undeclared member, as ``additionalProperties`` allows it: a key that is none of
        ``excluded`` (declared, dependent and forbidden names), valued by that schema (any
        value where it is absent or true)."""
        value = self.free(FREE_DEPTH - 1) if extra is True else self.convert(extra, f"{where}/additionalProperties")
        if value is None:
            return None
        key = self.share(rx_cat(_QUOTE, self.string_not_in(excluded), _QUOTE), always=True)
        return self.share(rx_cat(key, _COLON, value), always=True)  # written up to 4 times (see _members)

    def pattern_key(self, pattern: str, where: str) -> Rx | None:
        return self.convert_string({"pattern": pattern}, where)

    def convert_key(self, key_schema: Any, where: str) -> Rx | None:
        """propertyNames as the regex of a quoted key (a string schema)."""
        ks = validation_keywords(key_schema) if isinstance(key_schema, dict) else key_schema
        if not isinstance(ks, dict) or set(ks) - (_STRING_KW | {"type", "enum", "const"}):
            raise self.fail(where, "propertyNames is supported with string keywords (pattern, minLength, maxLength, "
                            "format, enum, const) only")
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
        """dependentRequired, and the array form of draft 4-7 dependencies: name -> names it requires."""
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
                    raise self.fail(where, f"{key}: schema dependencies ({name!r} -> a schema) are not supported; "
                                    "list required property names instead")
                if not isinstance(needs, list) or not all(isinstance(n, str) for n in needs):
                    raise self.fail(where, f"{key}[{name!r}] must be a list of property names")
                out[name] = list(dict.fromkeys(out.get(name, []) + [n for n in needs if n != name]))
        return {k: v for k, v in out.items() if v}


MAX_DEPENDENT_NAMES = 10  # properties in dependentRequired: the member automaton tracks which were written


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


def _search(pattern: str, name: str) -> bool:
    """Does ``pattern`` (JSON Schema: search semantics) match ``name``? Unparsable: assume so."""
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return True


def names_declared(schema: dict) -> bool:
    """Does the object declare properties (the member form, not the map form)?"""
    return bool(schema.get("properties") or schema.get("required"))


def _members(members: list[tuple[str, Rx, bool]], lo: int = 0, hi: int | None = None,
             deps: dict[str, list[str]] | None = None, share: Any = None,
             forbid: list[frozenset] | None = None, tail: Rx | None = None) -> Rx | None:
    """Members in order, optional ones skippable, then any number of ``tail`` members
    (pattern keys, or undeclared members), commas only between written members; between ``lo`` and ``hi`` of them
    written, each written name of ``deps`` with the names it requires written too, and no
    set of ``forbid`` written whole. ``share`` turns a continuation used twice into one rule
    (grammar mode)."""
    deps, forbid = deps or {}, forbid or []
    tracked = {n for k, v in deps.items() for n in [k, *v]} | {n for f in forbid for n in f}
    relevant = sorted(tracked & {m[0] for m in members})
    if len(relevant) > MAX_DEPENDENT_NAMES:
        raise GrammarError(f"json_schema: dependentRequired (and not-required) involve {len(relevant)} properties; at most "
                           f"{MAX_DEPENDENT_NAMES} are supported", PARAM)
    n = len(members)
    cap = max(lo, hi or 0)  # counts past this are all alike
    memo: dict[tuple, Rx | None] = {}

    def done(count: int, written: frozenset) -> Rx | None:
        if count < lo or any(k in written and not set(v) <= written for k, v in deps.items()):
            return None
        if any(f <= written for f in forbid):
            return None
        return rx_lit("")

    def more(first: bool, count: int, written: frozenset) -> Rx | None:
        """After the declared members: stop here, or another tail member."""
        if done(max(count, lo), written) is None:
            return None  # a dependency unmet: tail members cannot meet it
        lead = rx_lit("") if first else _SEP
        if hi is None and count >= lo:  # any number more
            return rx_rep(rx_cat(lead, tail, rx_rep(rx_cat(_SEP, tail), 0, None)), 0, 1)
        again = None if hi is not None and count >= hi else rx_cat(lead, tail, build(n, False, min(count + 1, cap), written))
        return rx_alt(done(count, written), again)

    def build(i: int, first: bool, count: int, written: frozenset, goal: tuple | None = None) -> Rx | None:
        """Members ``i..`` from this state; with ``goal``, only the paths that end the
        declared members in that state (and nothing after them)."""
        key = (i, first, count, written, goal)
        if key in memo:
            return memo[key]
        if i == n:
            if goal is not None:
                out = rx_lit("") if (first, count, written) == goal else None
            else:
                out = done(count, written) if tail is None else more(first, count, written)
        else:
            name, member, is_required = members[i]
            take: Rx | None = None
            if hi is None or count < hi:
                w = written | {name} if name in relevant else written
                take = rx_cat(rx_lit("") if first else _SEP, member, build(i + 1, False, min(count + 1, cap), w, goal))
            skip = None if is_required else build(i + 1, first, count, written, goal)
            if not first and take is not None and skip is not None and take.text == rx_cat(_SEP, member, skip).text:
                out = rx_cat(rx_rep(rx_cat(_SEP, member), 0, 1), skip)  # the tail is shared: quadratic, not exponential
            else:
                out = rx_alt(take, skip)
        if share is not None and i > 0:
            out = share(out)
        memo[key] = out
        return out

    def ends() -> list[tuple]:
        """The states the declared members can end in, in order."""
        level = {(True, 0, frozenset()): None}
        for name, _, is_required in members:
            nxt: dict = {}
            for first, count, written in level:
                if hi is None or count < hi:
                    nxt[(False, min(count + 1, cap), written | {name} if name in relevant else written)] = None
                if not is_required:
                    nxt[(first, count, written)] = None
            level = nxt
        return list(level)

    if tail is not None and share is None:
        # A regex cannot share text: the tail members written once per end state of the
        # declared ones, not once per path (open objects would grow quadratically in text).
        return rx_alt(*(rx_cat(build(0, True, 0, frozenset(), goal), more(*goal)) for goal in ends()))
    return build(0, True, 0, frozenset())
