r"""JSON Schema -> a regular expression (or EBNF rules) whose every match is a valid instance.

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
email, hostname, uri, uri-reference, iri, iri-reference),
``minimum``/``maximum``/``exclusiveMinimum``/ ``exclusiveMaximum`` (any for integers; integer-valued
for numbers), ``multipleOf`` in decimal arithmetic (powers of ten like 0.01 on numbers: at most that
many decimals; integer steps that divide 1000, or any step over a range with few multiples),
``anyOf``, ``oneOf`` (when its branches are provably disjoint), ``allOf`` (parts constraining
different keywords; ``properties``/``additionalProperties`` (see ``merge_members``), ``required``,
``type``, ``not`` and unions of several parts merge), ``$ref`` by JSON pointer, ``$anchor``
or a subschema's ``$id`` (:mod:`.refs`; remote documents are not
fetched); ``not``, ``if``/``then``/``else``, ``dependentSchemas`` and
schema-form ``dependencies`` as unions of cases (:mod:`.conditions`:
"not S" pushed down the keywords of S, over ``type``, ``const``, ``enum``, ``required``,
``properties``, bounds, combinators and ``$ref``). An ``enum``/``const`` (own, or from an
``allOf`` part or ``$ref`` target) next to any other keywords is decided value by value with
the reference validator (``jsonschema``; see :mod:`.value_filter`): exact
whatever the keywords, ``uniqueItems`` included.

Rejected (GrammarError naming the keyword): ``not`` (or an ``if``) over a keyword whose
failure is no positive schema (``pattern``, ``format``, ``items``, ``multipleOf``, ...),
more than ``MAX_CONDITION_CASES`` cases of conditions,
``contains``/``minContains``/``maxContains``, other ``multipleOf`` steps (0.25, 7 unbounded),
``uniqueItems: true`` (unless ``maxItems <= 1``), ``unevaluatedItems``, non-integer bounds on
``number``, bounds of 1e30 or more, the drafts' formats not listed above (``regex``,
``idn-hostname``, ``duration``, ...), remote ``$ref``.

Size: recursion, free-form values and leading optional properties multiply the
automaton (k optional properties before the first required one cost k*k/2 copies of
their values); the regex module's :data:`~sgl.constrained.regex.MAX_POSITIONS`
limit applies to the result. Translation itself is budgeted
(:data:`MAX_TRANSLATION_CHARS` of regex text, :data:`MAX_CONVERT_CALLS` subschemas), so a
schema whose references multiply cannot exhaust memory before the size check.

Modules: :mod:`.translate` (the entry points), :mod:`.converter` (the walk: dispatch,
``$ref``, budget) with one mixin per schema area (:mod:`.scalars`, :mod:`.arrays`,
:mod:`.objects`, :mod:`.combinators`, :mod:`.merging`, :mod:`.proofs`, and :mod:`.sharing`
for grammar mode); the pieces they build from: :mod:`.keywords`, :mod:`.lexical`,
:mod:`.numbers`, :mod:`.formats`, :mod:`.values`, :mod:`.containers`, :mod:`.members`; and
:mod:`.refs`, :mod:`.conditions`, :mod:`.value_filter`. This package re-exports the names
the rest of sgl imports.
"""

from __future__ import annotations

from sgl.constrained.json_schema.combinators import MAX_EXCLUDED_NUMBERS
from sgl.constrained.json_schema.containers import FREE_DEPTH
from sgl.constrained.json_schema.converter import (
    MAX_CONVERT_CALLS,
    MAX_DECIDED_VALUES,
    MAX_TRANSLATION_CHARS,
)
from sgl.constrained.json_schema.keywords import PARAM, load_schema, validation_keywords
from sgl.constrained.json_schema.lexical import WS, json_char
from sgl.constrained.json_schema.members import MAX_DEPENDENT_NAMES
from sgl.constrained.json_schema.merging import MAX_CONDITION_CASES
from sgl.constrained.json_schema.numbers import (
    MAX_LISTED_MULTIPLES,
    integer_multiples,
    integer_range,
    number_range,
)
from sgl.constrained.json_schema.objects import names_declared
from sgl.constrained.json_schema.translate import (
    json_schema_to_regex,
    json_schema_to_rules,
    json_schema_to_rx,
)

__all__ = [
    "FREE_DEPTH",
    "MAX_CONDITION_CASES",
    "MAX_CONVERT_CALLS",
    "MAX_DECIDED_VALUES",
    "MAX_DEPENDENT_NAMES",
    "MAX_EXCLUDED_NUMBERS",
    "MAX_LISTED_MULTIPLES",
    "MAX_TRANSLATION_CHARS",
    "PARAM",
    "WS",
    "integer_multiples",
    "integer_range",
    "json_char",
    "json_schema_to_regex",
    "json_schema_to_rules",
    "json_schema_to_rx",
    "load_schema",
    "names_declared",
    "number_range",
    "validation_keywords",
]
