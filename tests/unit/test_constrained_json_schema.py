"""JSON schema constraints: every generated instance validates (jsonschema is the oracle),
masks equal brute force on the produced regex, bounds are exact, and keywords that
cannot be enforced are rejected by name."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_constrained_support import TOKENIZER_KINDS, Oracle, allowed_set, make_compiler, make_vocab

from sgl.constrained import GrammarError, json_schema_to_regex
from sgl.constrained.json_schema import integer_range, json_schema_to_rx, number_range
from sgl.constrained.regex import RegexGrammar

HYPO = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


FINISH_ALPHABET = [chr(c) for c in range(0x20, 0x7F)] + ["é", "中"]


def shortest_completion(matcher) -> str:
    """The shortest text (over a small alphabet) that makes ``matcher`` accepting: a BFS
    over automaton states, used to finish walks that random tokens would not finish."""
    frontier = [(matcher, "")]
    seen = {matcher.state}
    while frontier:
        nxt = []
        for m, text in frontier:
            if m.is_accepting():
                return text
            for ch in FINISH_ALPHABET:
                c = m.copy()
                if c.accept_text(ch) and c.state not in seen:
                    seen.add(c.state)
                    nxt.append((c, text + ch))
        frontier = nxt
    raise AssertionError("no completion found")


def walk_to_done(matcher, vocab, rng: random.Random, max_steps: int = 120) -> bytes:
    """Sample a random complete member: random allowed tokens, biased towards closing
    things, sometimes taking the jump-forward text instead of a token; after
    ``max_steps`` tokens, finish along a shortest completion."""
    data = b""
    eos = set(vocab.eos_token_ids)
    for _ in range(max_steps):
        if matcher.is_done():
            return data
        forced = matcher.forced_text()
        if forced and rng.random() < 0.5:
            assert matcher.accept_text(forced)
            data += forced.encode()
            continue
        allowed = allowed_set(matcher, vocab)
        if allowed & eos and rng.random() < 0.7:
            assert matcher.accept(next(iter(allowed & eos)))
            return data
        choices = sorted(allowed - eos)
        if not choices:
            assert matcher.is_accepting()
            return data
        if rng.random() < 0.6:
            closing = [
                t for t in choices if any(c in vocab.token_bytes[t] for c in b'"]},0123456789tfn')
            ]
            choices = closing or choices
        tid = rng.choice(choices)
        assert matcher.accept(tid)
        data += vocab.token_bytes[tid]
    while data.decode("utf-8", errors="ignore").encode() != data:  # finish the last character
        b = next(b for b in range(0x80, 0xC0) if matcher.copy().accept_text(bytes([b])))
        assert matcher.accept_text(bytes([b]))
        data += bytes([b])
    rest = shortest_completion(matcher)
    assert matcher.accept_text(rest)
    return data + rest.encode()


def sample_instances(schema, kind: str, n: int, seed: int = 0) -> list:
    vocab = make_vocab(kind)
    grammar = make_compiler(kind).compile("json_schema", schema)
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        data = walk_to_done(grammar.matcher(), vocab, rng)
        out.append(json.loads(data.decode("utf-8")))
    return out


def assert_valid(schema, instances) -> None:
    for inst in instances:
        jsonschema.validate(inst, schema, format_checker=FORMATS)


# ---------------------------------------------------------------------------
# Random schemas
# ---------------------------------------------------------------------------

_names = st.sampled_from(["a", "name", "x_y", "é", "k", "id", "with space", 'q"uote'])
_scalar_values = st.one_of(
    st.integers(-50, 50),
    st.booleans(),
    st.none(),
    st.sampled_from(["", "a", "ab", "中", 'x"y', "a\\b", "line\nbreak"]),
)


@st.composite
def _string_schema(draw) -> dict:
    s: dict = {"type": "string"}
    choice = draw(st.integers(0, 3))
    if choice == 1:
        lo = draw(st.integers(0, 3))
        s["minLength"] = lo
        if draw(st.booleans()):
            s["maxLength"] = lo + draw(st.integers(0, 4))
    elif choice == 2:
        s["pattern"] = draw(
            st.sampled_from(["^[a-c]+$", "^\\d{2,3}$", 'x"', "^(ab|ba)*$", "é.", "^[^a]$", "q"])
        )
    elif choice == 3:
        s["format"] = draw(st.sampled_from(["date", "uuid", "ipv4", "date-time"]))
    return s


@st.composite
def _number_schema(draw) -> dict:
    s: dict = {"type": draw(st.sampled_from(["integer", "number"]))}
    if draw(st.booleans()):
        lo = draw(st.integers(-30, 30))
        s["exclusiveMinimum" if draw(st.booleans()) else "minimum"] = lo
        if draw(st.booleans()):
            # a gap of 2 or more: exclusive bounds one apart admit no integer (refused, rightly)
            s["exclusiveMaximum" if draw(st.booleans()) else "maximum"] = lo + draw(
                st.integers(2, 200)
            )
    elif draw(st.booleans()):
        s["maximum"] = draw(st.integers(-30, 30))
    return s


_leaf = st.one_of(
    _string_schema(),
    _number_schema(),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(_scalar_values, min_size=1, max_size=4).map(lambda vs: {"enum": vs}),
    _scalar_values.map(lambda v: {"const": v}),
)


@st.composite
def _object_schema(draw, children) -> dict:
    names = draw(st.lists(_names, min_size=1, max_size=3, unique=True))
    props = {n: draw(children) for n in names}
    required = [n for n in names if draw(st.booleans())]
    s: dict = {"type": "object", "properties": props, "required": required}
    if draw(st.booleans()):
        s["additionalProperties"] = False
    return s


@st.composite
def _array_schema(draw, children) -> dict:
    s: dict = {"type": "array", "items": draw(children)}
    lo = draw(st.integers(0, 2))
    if lo:
        s["minItems"] = lo
    if draw(st.booleans()):
        s["maxItems"] = lo + draw(st.integers(0, 2))
    return s


def _extend(children):
    return st.one_of(
        _object_schema(children),
        _array_schema(children),
        st.lists(children, min_size=2, max_size=3).map(lambda xs: {"anyOf": xs}),
    )


schemas = st.recursive(_leaf, _extend, max_leaves=5)


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
@HYPO
@given(schema=schemas, seed=st.integers(0, 2**16))
def test_random_walks_produce_valid_instances(kind: str, schema: dict, seed: int) -> None:
    assert_valid(schema, sample_instances(schema, kind, 3, seed))


@HYPO
@given(schema=schemas, rnd=st.randoms(use_true_random=False))
def test_masks_equal_brute_force_on_schema_regex(schema: dict, rnd: random.Random) -> None:
    """The regex route's masks (built directly: a schema too large for the route in the
    engine, e.g. open objects in counted arrays, goes to the grammar route, tested apart)."""
    vocab = make_vocab("byte_level")
    grammar = RegexGrammar("json_schema", json.dumps(schema), json_schema_to_rx(schema).text, vocab)
    oracle = Oracle(grammar.regex)
    m = grammar.matcher()
    data = b""
    eos = set(vocab.eos_token_ids)
    for _ in range(5):
        got = allowed_set(m, vocab)
        assert got == oracle.expected_mask(vocab, data), (schema, data)
        choices = sorted(got - eos)
        if not choices:
            break
        tid = rnd.choice(choices)
        assert m.accept(tid)
        data += vocab.token_bytes[tid]  # type: ignore[operator]


# ---------------------------------------------------------------------------
# Exact bounds (brute force over many spellings)
# ---------------------------------------------------------------------------


def _int_strings() -> list[str]:
    out = [str(i) for i in range(-1200, 1201)]
    out += [
        "-0",
        "00",
        "01",
        "-01",
        "+1",
        "1.0",
        "1e2",
        "12345678901234567890",
        "-12345678901234567890",
    ]
    return out


@given(
    lo=st.one_of(st.none(), st.integers(-1100, 1100)),
    span=st.one_of(st.none(), st.integers(0, 1500)),
)
@settings(max_examples=60, deadline=None)
def test_integer_range_is_exact(lo: int | None, span: int | None) -> None:
    hi = None if span is None else (span - 1100 if lo is None else lo + span)
    rx = integer_range(lo, hi)
    assert rx is not None
    pat = re.compile(rx.text)
    for s in _int_strings():
        canonical = re.fullmatch(r"-?(0|[1-9][0-9]*)", s) is not None and s != "-0"
        want = canonical and (lo is None or int(s) >= lo) and (hi is None or int(s) <= hi)
        assert (pat.fullmatch(s) is not None) == want, (lo, hi, s, rx.text)


def _num_strings() -> list[str]:
    out = []
    for i in range(-25, 26):
        for frac in ("", ".0", ".00", ".5", ".05", ".999", ".10"):
            out.append(f"{i}{frac}")
            if i == 0:
                out.append(f"-0{frac}")
    return out + ["1e3", "00.5", ".5", "5.", "-", "1.2.3"]


@given(
    lo=st.one_of(st.none(), st.integers(-12, 12)),
    lo_excl=st.booleans(),
    span=st.one_of(st.none(), st.integers(0, 15)),
    hi_excl=st.booleans(),
)
@settings(max_examples=80, deadline=None)
def test_number_range_is_exact(
    lo: int | None, lo_excl: bool, span: int | None, hi_excl: bool
) -> None:
    hi = None if span is None else (span - 7 if lo is None else lo + span)
    rx = number_range(lo, lo_excl, hi, hi_excl)
    pat = None if rx is None else re.compile(rx.text)
    for s in _num_strings():
        grammar_ok = re.fullmatch(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", s) is not None
        v = float(s) if grammar_ok else 0.0
        in_range = (lo is None or (v > lo if lo_excl else v >= lo)) and (
            hi is None or (v < hi if hi_excl else v <= hi)
        )
        # "-0", "-0.0" are never generated (they are 0, spelled oddly)
        want = grammar_ok and in_range and not (s.startswith("-") and v == 0)
        got = pat is not None and pat.fullmatch(s) is not None
        assert got == want, (lo, lo_excl, hi, hi_excl, s, None if rx is None else rx.text)


# ---------------------------------------------------------------------------
# Specific schemas
# ---------------------------------------------------------------------------

PERSON = {
    "title": "Person",
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
        "active": {"type": "boolean"},
        "score": {"anyOf": [{"type": "number"}, {"type": "null"}]},
    },
    "required": ["name", "age", "active"],
    "additionalProperties": False,
}


def _matches(schema, instance, **dumps) -> bool:
    return (
        re.fullmatch(
            json_schema_to_regex(schema), json.dumps(instance, ensure_ascii=False, **dumps)
        )
        is not None
    )


def test_person_schema_accepts_and_rejects() -> None:
    good = {
        "name": "Ann",
        "age": 42,
        "email": "a@b.co",
        "tags": ["x", "yz"],
        "active": True,
        "score": None,
    }
    assert _matches(PERSON, good)
    assert _matches(PERSON, good, separators=(",", ":"))
    assert _matches(PERSON, {"name": "B", "age": 0, "active": False})
    assert not _matches(PERSON, {"name": "B", "active": False})  # age required
    assert not _matches(PERSON, {"age": 1, "name": "B", "active": False})  # declared order
    assert not _matches(PERSON, {"name": "", "age": 1, "active": False})  # minLength
    assert not _matches(PERSON, {"name": "B", "age": -1, "active": False})  # minimum
    assert not _matches(PERSON, {"name": "B", "age": 131, "active": False})  # maximum
    assert not _matches(
        PERSON, {"name": "B", "age": 1, "active": False, "zz": 1}
    )  # additionalProperties
    assert not _matches(PERSON, {**good, "tags": ["a", "b", "c", "d"]})  # maxItems
    assert not re.fullmatch(json_schema_to_regex(PERSON), json.dumps(good, indent=2))  # no newlines


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_person_schema_samples_validate(kind: str) -> None:
    assert_valid(PERSON, sample_instances(PERSON, kind, 8))


def test_string_escapes_and_lengths() -> None:
    schema = {"type": "string", "minLength": 2, "maxLength": 3}
    assert _matches(schema, 'a"')  # "a\"" is two characters
    assert _matches(schema, "\n\t\\")
    assert _matches(schema, "中文")
    assert not _matches(schema, "a")
    assert not _matches(schema, "abcd")
    rx = json_schema_to_regex({"type": "string"})
    assert not re.fullmatch(rx, '"\x01"')  # documented: no raw control characters
    # json.dumps's default (ASCII) spelling: \uXXXX escapes, astral characters as surrogate pairs
    for text in ("é中😀", "\x01a", "aé", "x" * 40):
        assert re.fullmatch(rx, json.dumps(text)) is not None
        assert re.fullmatch(
            json_schema_to_regex({"type": "string", "minLength": 3}), json.dumps(text + "abc")
        )
    # ... but not under maxLength (documented: they would multiply the automaton): raw characters
    # only
    assert _matches(schema, "é中😀") and not re.fullmatch(
        json_schema_to_regex(schema), json.dumps("é中😀")
    )
    assert not re.fullmatch(rx, '"\\ud800"') and not re.fullmatch(
        rx, '"\\udc00\\ud800"'
    )  # lone surrogates


def test_pattern_is_search_and_json_escaped() -> None:
    assert _matches({"type": "string", "pattern": "ab"}, "xxabyy")
    assert not _matches({"type": "string", "pattern": "ab"}, "xxbayy")
    assert _matches({"type": "string", "pattern": "^a"}, "abc")
    assert not _matches({"type": "string", "pattern": "^a"}, "cab")
    quote = {"type": "string", "pattern": '^[a"\\\\]+$'}
    assert _matches(quote, 'a"\\a')
    assert json.loads('"a\\"\\\\"') == 'a"\\'
    assert_valid(quote, sample_instances(quote, "byte_level", 5))
    with pytest.raises(GrammarError, match="pattern"):
        json_schema_to_regex({"type": "string", "pattern": "(?=a)"})
    with pytest.raises(GrammarError, match="minLength"):
        json_schema_to_regex({"type": "string", "pattern": "a", "minLength": 2})


def test_enum_const_and_type_lists() -> None:
    schema = {"enum": ["a", "ab", 1, None, {"x": [1, 2]}, True]}
    for v in schema["enum"]:
        assert _matches(schema, v)
    assert not _matches(schema, "b")
    assert _matches({"type": "string", "enum": ["a", 1]}, "a")
    assert not _matches({"type": "string", "enum": ["a", 1]}, 1)
    assert _matches({"const": {"k": "v"}}, {"k": "v"})
    assert _matches({"type": ["string", "null"]}, None)
    assert _matches({"type": ["integer", "number"]}, 1.5)
    # Other keywords next to an enum filter its values (decided by the reference validator).
    assert _matches({"enum": ["a", "abc", 7], "minLength": 2}, "abc") and _matches(
        {"enum": ["a", 7], "minLength": 2}, 7
    )
    assert not _matches({"enum": ["a", "abc"], "minLength": 2}, "a")


def test_refs_defs_and_recursion() -> None:
    tree = {
        "$defs": {"node": {
            "type": "object",
            "properties": {"v": {"type": "integer"},
                           "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["v"],
        }},
        "$ref": "#/$defs/node",
    }  # fmt: skip
    assert _matches(tree, {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]})
    assert not _matches(
        tree,
        {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3, "kids": [{"v": 4, "kids": [{"v": 5}]}]}]}]},
    )
    assert_valid(tree, sample_instances(tree, "byte_level", 5))
    legacy = {
        "definitions": {"a~b/c": {"type": "boolean"}},
        "properties": {"f": {"$ref": "#/definitions/a~0b~1c"}},
        "required": ["f"],
    }
    assert _matches(legacy, {"f": True})
    with pytest.raises(GrammarError, match="required recursive"):
        json_schema_to_regex(
            {
                "$defs": {
                    "n": {
                        "type": "object",
                        "properties": {"n": {"$ref": "#/$defs/n"}},
                        "required": ["n"],
                    }
                },
                "$ref": "#/$defs/n",
            }
        )
    with pytest.raises(GrammarError, match="does not resolve"):
        json_schema_to_regex({"$ref": "#/$defs/missing"})
    with pytest.raises(GrammarError, match="names another document"):
        json_schema_to_regex({"$ref": "http://example.com/schema.json"})
    with pytest.raises(GrammarError, match="no \\$anchor"):
        json_schema_to_regex({"$ref": "#nothere"})


def test_combinators() -> None:
    assert _matches({"oneOf": [{"type": "string"}, {"type": "integer"}]}, 3)
    with pytest.raises(GrammarError, match="oneOf"):
        json_schema_to_regex({"oneOf": [{"type": "number"}, {"type": "integer"}]})
    tagged = {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
         "required": ["kind", "x"]},
        {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}},
         "required": ["kind", "y"]},
    ]}  # fmt: skip
    assert _matches(tagged, {"kind": "b", "y": "q"})
    merged = {
        "allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]
    }
    assert _matches(merged, {"a": 1}) and not _matches(merged, {})
    with pytest.raises(
        GrammarError, match="no value can satisfy"
    ):  # the types intersect to nothing
        json_schema_to_regex({"allOf": [{"type": "string"}, {"type": "integer"}]})
    narrowed = {"allOf": [{"type": ["object", "null"]}, {"type": "object"}]}
    assert _matches(narrowed, {}) and not _matches(narrowed, None)
    assert _matches({"allOf": [{"type": "number"}, {"type": "integer"}]}, 3)
    assert not _matches({"allOf": [{"type": "number"}, {"type": "integer"}]}, 3.5)
    two_maps = {
        "allOf": [
            {"properties": {"a": {"type": "integer"}}},
            {"properties": {"a": {"minimum": 2}, "b": {}}},
        ]
    }
    assert _matches(two_maps, {"a": 2, "b": 1}) and not _matches(two_maps, {"a": 1})
    closed_elsewhere = {
        "allOf": [{"properties": {"a": {}}}, {"additionalProperties": False}]
    }  # `a` is extra in part 2
    assert _matches(closed_elsewhere, {}) and not _matches(closed_elsewhere, {"a": 1})
    with pytest.raises(GrammarError, match="interact"):
        json_schema_to_regex(
            {"allOf": [{"patternProperties": {"^x": {}}}, {"additionalProperties": False}]}
        )
    distributed = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "anyOf": [{"required": ["a"]}, {"maxProperties": 5}],
    }
    assert _matches(distributed, {"a": 1})


def test_optional_members_every_subset_in_order() -> None:
    names = ["a", "b", "c", "d"]
    schema = {
        "type": "object",
        "properties": {n: {"type": "integer"} for n in names},
        "additionalProperties": False,
    }
    for mask in range(16):
        inst = {n: i for i, n in enumerate(names) if mask >> i & 1}
        assert _matches(schema, inst) and _matches(schema, inst, separators=(",", ":"))
    assert not _matches(schema, {"b": 1, "a": 2})
    assert not re.fullmatch(json_schema_to_regex(schema), '{,"a": 1}')
    assert not re.fullmatch(json_schema_to_regex(schema), '{"a": 1,}')
    # Shared tails keep the regex quadratic in the number of optional properties, not exponential.
    many = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(24)}}
    assert len(json_schema_to_regex({**many, "additionalProperties": False})) < 20_000
    # Undeclared members are written once per end state of the declared ones, not once per path.
    assert len(json_schema_to_regex(many)) < 60_000


def test_size_limit_of_the_regex_route_sends_the_schema_to_the_grammar_route() -> None:
    from sgl.constrained.ebnf import EbnfGrammar
    from sgl.constrained.errors import ConstraintTooLarge
    from sgl.constrained.json_schema import json_schema_to_rx
    from sgl.constrained.regex import check_size

    for schema in (
        {"type": "string", "maxLength": 5000},
        {"type": "array", "items": {"type": "string", "maxLength": 100}, "maxItems": 100},
    ):
        with pytest.raises(ConstraintTooLarge, match="too large") as info:
            check_size(json_schema_to_rx(schema), "json_schema", "the JSON schema")
        assert info.value.param == "json_schema"
        assert isinstance(make_compiler("byte_level").compile("json_schema", schema), EbnfGrammar)


def test_free_form_and_maps() -> None:
    assert _matches({}, {"a": [1, "x"], "c": {"d": None}})
    assert _matches(True, [1, "x", [True]])
    assert not _matches({}, {"a": {"b": {"c": 1}}})  # FREE_DEPTH = 2 levels of containers
    m = {
        "type": "object",
        "additionalProperties": {"type": "integer"},
        "minProperties": 1,
        "maxProperties": 2,
    }
    assert _matches(m, {"x": 1}) and _matches(m, {"x": 1, "y": 2})
    assert (
        not _matches(m, {})
        and not _matches(m, {"x": 1, "y": 2, "z": 3})
        and not _matches(m, {"x": "s"})
    )
    assert _matches(
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
        [1, "a"],
    )
    assert not _matches(
        {"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, [1, 2]
    )
    assert _matches(
        {"type": "array", "items": [{"type": "integer"}], "additionalItems": {"type": "string"}},
        [1, "a", "b"],
    )
    assert _matches({"type": "array", "uniqueItems": True, "maxItems": 1}, [3])


@pytest.mark.parametrize("fmt", ["date", "time", "date-time", "uuid", "ipv4", "email"])
def test_formats_validate(fmt: str) -> None:
    schema = {"type": "string", "format": fmt}
    assert_valid(schema, sample_instances(schema, "byte_level", 6, seed=3))
    rx = json_schema_to_regex(schema)
    if fmt == "date":
        assert re.fullmatch(rx, '"2024-02-29"') and not re.fullmatch(rx, '"2023-02-29"')
        assert re.fullmatch(rx, '"2000-02-29"') and not re.fullmatch(rx, '"1900-02-29"')
        assert not re.fullmatch(rx, '"2023-04-31"') and not re.fullmatch(rx, '"0000-01-01"')


@pytest.mark.parametrize(
    "schema,keyword",
    [
        (
            {"type": "object", "properties": {"xa": {}}, "patternProperties": {"^x": {}}},
            "patternProperties",
        ),
        ({"type": "object", "propertyNames": {"anyOf": [{"pattern": "a"}]}}, "propertyNames"),
        ({"if": {"type": "string", "pattern": "^a"}, "then": {"minLength": 1}}, "pattern"),
        ({"not": {"type": "string", "pattern": "a"}}, "pattern"),
        ({"not": {"type": "array", "items": {"type": "string"}}}, "items"),
        ({"type": "number", "not": {"const": 3.5}}, "non-integral"),
        ({"type": "array", "contains": {"type": "integer"}}, "contains"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
        ({"type": "number", "minimum": 0.5}, "minimum"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
        ({"type": "string", "format": "regex"}, "regex"),
        ({"type": "object", "unevaluatedProperties": {"type": "string"}}, "unevaluatedProperties"),
        (
            {
                "type": "object",
                "properties": {"a": {}},
                "minProperties": 2,
                "propertyNames": {"maxLength": 3},
            },
            "minProperties",
        ),
        ({"type": "strin"}, "strin"),
    ],
)
def test_unsupported_keywords_are_named(schema: dict, keyword: str) -> None:
    with pytest.raises(GrammarError) as info:
        make_compiler("byte_level").compile("json_schema", schema)
    assert info.value.param == "json_schema"
    assert keyword in str(info.value)


def test_bad_json_and_annotations() -> None:
    with pytest.raises(GrammarError, match="not valid JSON"):
        make_compiler("byte_level").compile("json_schema", '{"type": ')
    with pytest.raises(GrammarError):
        make_compiler("byte_level").compile("json_schema", "[1, 2]")
    annotated = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x",
                 "title": "T", "description": "d", "examples": [1], "default": 1,
                 "$comment": "c", "deprecated": False, "type": "integer"}  # fmt: skip
    assert _matches(annotated, 5)
    # Unknown keywords are annotations (JSON Schema: no effect on validity), misspellings included.
    unknown = {"type": "object",
               "properties": {"a": {"type": "string", "minLenght": 2, "x-kubernetes-kind": "k"}},
               "readonly": True, "id": "urn:x", "links": [{"rel": "self"}]}  # fmt: skip
    assert _matches(unknown, {"a": "q"}) and not _matches(unknown, {"a": 1})
    assert _matches(
        {"type": "string", "format": "chickenbutt"}, "anything"
    )  # not a format of the drafts
    # A schema given as text compiles to the same (cached) grammar as the dict
    comp = make_compiler("byte_level")
    assert comp.compile("json_schema", json.dumps(PERSON)) is comp.compile("json_schema", PERSON)


def test_forced_keys_after_brace() -> None:
    vocab = make_vocab("byte_level")
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    m = make_compiler("byte_level").compile("json_schema", schema).matcher()
    assert m.forced_text() == '{"name":'
    assert m.accept_text("{")
    assert m.forced_text() == '"name":'
    assert m.accept_text('"na')
    assert m.forced_text() == 'me":'
    assert m.accept_text('me": "Bo", ')  # optional space: nothing forced before it
    assert m.forced_text() == '"age":'
    assert m.accept_text('"age":7')
    assert m.forced_text() == ""  # more digits or "}"
    assert m.accept_text("}")
    assert m.is_done() and allowed_set(m, vocab) == set(vocab.eos_token_ids)


# ---------------------------------------------------------------------------
# Keywords of real-world schemas: patternProperties, propertyNames, dependentRequired,
# min/maxProperties over declared properties, not, and the uri/hostname/ipv6 formats
# ---------------------------------------------------------------------------


def _hostname_ok(s: str) -> bool:  # RFC 1123, the reference for `format: hostname`
    labels = s.split(".")
    return len(s) <= 253 and all(
        re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", lab) for lab in labels
    )


def _uri_ok(
    s: str, reference: bool, iri: bool = False
) -> bool:  # RFC 3986 appendix B split + character rules
    m = re.fullmatch(r"(?:([A-Za-z][A-Za-z0-9+.-]*):)?(//[^/?#]*)?([^?#]*)(\?[^#]*)?(#.*)?", s)
    ucschar = (
        "\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef\U00010000-\U0001fffd" if iri else ""
    )  # RFC 3987
    allowed = rf"[A-Za-z0-9\-._~!$&'()*+,;=:@/?#%\[\]{ucschar}]*"
    if not m or not re.fullmatch(allowed, s) or re.search(r"%(?![0-9A-Fa-f]{2})", s):
        return False
    if m.group(1) is None and not reference:
        return False
    if m.group(2) and not re.fullmatch(r"//([^@]*@)?[^:]*(:[0-9]*)?", m.group(2)):
        return False
    return not (
        m.group(1) is None and ":" in m.group(3).split("/")[0]
    )  # a relative path's first segment has no ':'


EXTRA_CHECKS = {
    "hostname": _hostname_ok,
    "uri": lambda s: _uri_ok(s, False),
    "uri-reference": lambda s: _uri_ok(s, True),
    "iri": lambda s: _uri_ok(s, False, iri=True),
    "iri-reference": lambda s: _uri_ok(s, True, iri=True),
}

KEYWORD_CASES = [  # (schema, must accept, must reject)
    # undeclared members, after the declared ones, where additionalProperties allows them
    (
        {"type": "object", "properties": {"a": {"type": "integer"}}},
        [{"a": 1, "zz": [1, "x"], "y": {"b": None}}, {"zz": "s"}, {}, {"a": 1, "": 2, "aa": 3}],
        [{"a": "s"}, {"a": 1.5, "b": {"a": "s"}, "c": []}],
    ),
    (
        {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
        [{"a": "s", "b": 1}, {"b": 1, "c": 2}],
        [{"a": 1, "b": "s"}, {"b": None}],
    ),
    (
        {"type": "object", "properties": {"a": {}}, "minProperties": 2, "maxProperties": 3},
        [{"a": 1, "b": 2}, {"x": 1, "y": 2}, {"a": 1, "x": 1, "y": 2}],
        [{"a": 1}, {}, {"a": 1, "w": 1, "x": 1, "y": 2}],
    ),
    (
        {"type": "object", "properties": {"a": {}}, "dependentRequired": {"b": ["a"]}},
        [{"a": 1, "c": 2}, {"c": 2}],
        [{"b": 1}, {"c": 1, "b": 2}],
    ),
    (
        {
            "type": "object",
            "patternProperties": {"^x_[a-z]+$": {"type": "integer"}},
            "additionalProperties": False,
        },
        [{"x_ab": 1}, {}, {"x_a": 1, "x_b": 2}],
        [{"x_ab": "s"}, {"y": 1}, {"x_": 1}],
    ),
    (
        {
            "type": "object",
            "patternProperties": {"^a": {"type": "integer"}, "^b": {"type": "string"}},
            "maxProperties": 2,
        },
        [{"a1": 1, "b": "s"}],
        [{"a": "s"}, {"a": 1, "b": "s", "a2": 3}],
    ),
    (
        {
            "type": "object",
            "propertyNames": {"pattern": "^[a-z]{1,3}$"},
            "additionalProperties": {"type": "boolean"},
        },
        [{"abc": True}, {}],
        [{"abcd": True}, {"A": True}, {"ab": 1}],
    ),
    (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {}},
            "dependentRequired": {"a": ["b"]},
        },
        [{"b": 1}, {"a": 1, "b": 2}, {}],
        [{"a": 1}, {"a": 1, "c": 2}],
    ),
    (
        {"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "dependencies": {"c": ["a"]}},
        [{"a": 1, "c": 2}, {"b": 1}],
        [{"b": 1, "c": 2}],
    ),
    (
        {
            "type": "object",
            "properties": {"a": {}, "b": {}, "c": {}},
            "minProperties": 2,
            "maxProperties": 2,
        },
        [{"a": 1, "c": 2}, {"b": 1, "c": 2}],
        [{"a": 1}, {"a": 1, "b": 2, "c": 3}, {}],
    ),
    ({"not": {"type": "string"}}, [1, None, {"a": 1}, [True]], ["s"]),
    (
        {"type": "string", "not": {"enum": ["red", "green"]}},
        ["blue", "re", "redd", "", "gree"],
        ["red", "green"],
    ),
    ({"enum": ["a", "b", "c"], "not": {"const": "b"}}, ["a", "c"], ["b"]),
    ({"type": ["boolean", "null"], "not": {"const": True}}, [False, None], [True]),
    (
        {"type": "string", "format": "ipv6"},
        ["::1", "fe80::1", "1:2:3:4:5:6:7:8", "::"],
        ["1:2:3:4:5:6:7:8:9", "::g", "1.2.3.4", "1:::2"],
    ),
    (
        {"type": "string", "format": "hostname"},
        ["example.com", "a-b.c", "x"],
        ["-a.com", "a..b", "a_b", ""],
    ),
    (
        {"type": "string", "format": "uri"},
        ["https://example.com/a?b=1#f", "urn:isbn:0451450523", "mailto:x@y.z"],
        ["example.com", "/relative", "http://a b", "1http://x"],
    ),
    (
        {"type": "string", "format": "uri-reference"},
        ["/relative/path?q", "../x", "https://a.b", ""],
        ["a b", "%zz", "a:b:c d"],
    ),
    (
        {"type": "string", "format": "iri"},
        ["https://例え.jp/パス?q=値#f", "urn:isbn:0451450523", "http://ü.de"],
        ["/relative", "http://a b", "例://x"],
    ),
    (
        {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
            "patternProperties": {"^X-": {"type": "integer"}},
            "additionalProperties": False,
            "maxProperties": 2,
        },
        [{"name": "a"}, {"name": "a", "X-b": 1}],
        [
            {"X-b": 1},
            {"name": "a", "X-b": "s"},
            {"name": "a", "Y": 1},
            {"name": "a", "X-b": 1, "X-c": 2},
        ],
    ),
    (
        {
            "type": "object",
            "properties": {"body": {}, "bodyValue": {}, "id": {"type": "string"}},
            "not": {"required": ["body", "bodyValue"]},
        },
        [{"body": 1}, {"bodyValue": 2, "id": "x"}, {}],
        [{"body": 1, "bodyValue": 2}, {"body": 1, "bodyValue": 2, "id": "x"}],
    ),
    (
        {"properties": {"a": {"type": "integer"}}, "not": {"propertyNames": False}},
        [{"a": 1}],
        [{}, 3, "s"],
    ),
    (
        {"type": "string", "format": "iri-reference"},
        ["/chemin/é", "../ü", "https://a.b", ""],
        ["a b", "%zz"],
    ),
    # if/then/else: (if and then) or (not if and else), "not if" pushed down the keywords
    (
        {
            "type": "object",
            "properties": {"kind": {"enum": ["a", "b"]}, "x": {"type": "integer"}},
            "if": {"properties": {"kind": {"const": "a"}}},
            "then": {"required": ["x"]},
            "else": {"properties": {"x": False}},
        },
        [{"kind": "a", "x": 1}, {"kind": "b"}, {"x": 2}],
        [{"kind": "a"}, {"kind": "b", "x": 1}, {}],
    ),
    (
        {
            "type": "object",
            "properties": {"t": {"enum": ["x", "y", "z"]}, "v": {}},
            "allOf": [
                {
                    "if": {"properties": {"t": {"const": "x"}}},
                    "then": {"properties": {"v": {"type": "integer"}}},
                },
                {
                    "if": {"properties": {"t": {"const": "y"}}},
                    "then": {"properties": {"v": {"type": "string"}}},
                },
                {
                    "if": {"properties": {"t": {"const": "z"}}, "required": ["t"]},
                    "then": {"required": ["v"]},
                },
            ],
        },
        [{"t": "x", "v": 1}, {"t": "y", "v": "s"}, {"t": "z", "v": None}, {}],
        [{"t": "x", "v": "s"}, {"t": "z"}, {"v": 1}],
    ),
    (
        {
            "type": "object",
            "properties": {"b": {"type": ["string", "null"]}, "t": {"type": ["string", "null"]}},
            "allOf": [
                {
                    "if": {"not": {"properties": {"b": {"const": None}}}},
                    "then": {"properties": {"t": {"const": None}}},
                },
                {
                    "if": {"not": {"properties": {"t": {"const": None}}}},
                    "then": {"properties": {"b": {"const": None}}},
                },
            ],
        },
        [{}, {"b": "x"}, {"t": "y"}, {"b": "x", "t": None}, {"b": None, "t": None}],
        [{"b": "x", "t": "y"}],
    ),
    (
        {
            "type": "string",
            "if": {"maxLength": 2},
            "then": {"pattern": "^a.*$"},
            "else": {"pattern": "^b.*$"},
        },
        ["a", "ab", "bcd"],
        ["b", "acd"],
    ),
    (
        {"type": ["integer", "string"], "if": {"minimum": 10}, "then": {"maximum": 100}},
        [20, 3, "s", -5],
        [150],
    ),
    # not over anything whose failure is a union of schemas
    ({"not": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, [1, True, {}], ["s", None]),
    ({"type": "integer", "not": {"minimum": 5}}, [4, -3], [5, 7]),
    ({"type": "number", "not": {"enum": [0, 3]}}, [1, -2, 0.5, 3.25, 2.9, 30], [0, 3, 3.0, -0.0]),
    ({"type": "integer", "minimum": -5, "not": {"const": 0}}, [1, -1, -5], [0, -6]),
    (
        {
            "type": "object",
            "properties": {"a": {}, "b": {}},
            "not": {"required": ["a"], "properties": {"b": {"const": 1}}},
        },
        [{"b": 1}, {"a": 1, "b": 2}, {}],
        [{"a": 0, "b": 1}, {"a": 0}],
    ),
    # `not` next to a union: the union's branches are not dropped (they were, before not)
    (
        {"type": ["string", "null"], "not": {"const": None}, "anyOf": [{"maxLength": 2}]},
        ["ab", ""],
        ["abc", None],
    ),
    # $ref by $anchor, by a draft 7 "$id": "#name", by a subschema's $id (relative to the root's),
    # and a pointer read in the resource of the nested $id it is under
    (
        {
            "$defs": {"a": {"$anchor": "pos", "type": "integer", "minimum": 0}},
            "type": "object",
            "properties": {"n": {"$ref": "#pos"}},
            "required": ["n"],
            "additionalProperties": False,
        },
        [{"n": 1}],
        [{"n": -1}],
    ),
    (
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {"a": {"$id": "#pos", "type": "integer", "minimum": 0}},
            "type": "object",
            "properties": {"n": {"$ref": "#pos"}},
            "required": ["n"],
            "additionalProperties": False,
        },
        [{"n": 1}],
        [{"n": -1}],
    ),
    (
        {
            "$id": "https://example.com/root.json",
            "$defs": {"item": {"$id": "item.json", "type": "string", "maxLength": 3}},
            "type": "array",
            "items": {"$ref": "item.json"},
        },
        [["ab"], []],
        [["abcd"], [1]],
    ),
    (
        {
            "$id": "https://example.com/s/root.json",
            "$ref": "https://example.com/t/item.json",
            "$defs": {
                "item": {
                    "$id": "https://example.com/t/item.json",
                    "$defs": {"n": {"type": "integer"}},
                    "type": "array",
                    "items": {"$ref": "#/$defs/n"},
                }
            },
        },
        [[1, 2]],
        [["x"]],
    ),
    (
        {
            "$id": "urn:example:root",
            "$defs": {"a": {"type": "integer"}},
            "type": "object",
            "properties": {"n": {"$ref": "#/$defs/a"}},
        },
        [{"n": 1}],
        [{"n": "x"}],
    ),  # a fragment under a URN base
    # dependentSchemas and schema-form dependencies (draft 7)
    (
        {
            "type": "object",
            "properties": {"a": {}, "b": {}},
            "dependentSchemas": {"a": {"required": ["b"]}},
        },
        [{"a": 1, "b": 2}, {"b": 1}, {}],
        [{"a": 1}],
    ),
    (
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
            "dependencies": {"a": {"properties": {"b": {"minimum": 3}}}, "b": ["a"]},
        },
        [{"a": "x", "b": 3}, {"a": "x"}, {}],
        [{"a": "x", "b": 2}, {"b": 5}],
    ),
    # allOf parts with properties and additionalProperties: each part's additionalProperties
    # values the names the other parts declare
    (
        {
            "allOf": [
                {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}},
                    "additionalProperties": False,
                },
                {"properties": {"b": {"type": "string"}}},
            ]
        },
        [{"a": 1}, {}],
        [{"b": "x"}, {"a": "s"}, {"c": 1}],
    ),
    (
        {
            "type": "object",
            "allOf": [
                {
                    "properties": {"a": {"type": "integer"}},
                    "additionalProperties": {"type": "string"},
                },
                {"properties": {"b": {"type": "string"}}, "additionalProperties": {"maxLength": 2}},
            ],
        },
        [{"a": 1, "b": "xyz"}, {"c": "ab"}],
        [{"b": 1}, {"c": "abc"}, {"a": "s"}, {"c": 1}],
    ),
]


def _oracle_valid(schema: dict, inst) -> bool:
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    if not validator(schema, format_checker=FORMATS).is_valid(inst):
        return False
    check = EXTRA_CHECKS.get(schema.get("format", ""))
    return check is None or check(inst)


@pytest.mark.parametrize("schema,accept,reject", KEYWORD_CASES)
def test_real_world_keywords_exact_on_examples(schema: dict, accept: list, reject: list) -> None:
    for inst in accept:
        assert _oracle_valid(schema, inst), inst  # the case list itself is right
        assert _matches(schema, inst), inst
    for inst in reject:
        assert not _matches(schema, inst), inst


@pytest.mark.parametrize("schema,accept,reject", KEYWORD_CASES)
def test_real_world_keywords_samples_validate(schema: dict, accept: list, reject: list) -> None:
    for inst in sample_instances(schema, "byte_level", 12):
        assert _oracle_valid(schema, inst), inst


def test_string_exclusion_covers_escaped_spellings() -> None:
    rx = json_schema_to_regex({"type": "string", "not": {"enum": ["red", "a/b"]}})
    for spelled in ['"red"', '"r\\u0065d"', '"\\u0072ed"', '"a\\/b"', '"a/b"']:
        assert re.fullmatch(rx, spelled) is None, spelled
    assert (
        re.fullmatch(rx, '"réd"')
        and re.fullmatch(rx, '"a\\\\b"')
        and re.fullmatch(rx, '"reé\\u00e9"')
    )
    # Stricter, by design: a value may leave the excluded words' trie by a raw character only.
    assert re.fullmatch(rx, '"r\\u00e9d"') is None


def test_translation_budget_refuses_exponential_schemas() -> None:
    # Each level references the previous one four times: 4**12 expansions if inlined.
    defs = {"d0": {"type": "integer"}}
    for i in range(1, 13):
        defs[f"d{i}"] = {
            "type": "object",
            "properties": {k: {"$ref": f"#/$defs/d{i - 1}"} for k in "abcd"},
        }
    with pytest.raises(GrammarError, match="too large") as info:
        json_schema_to_regex({"$defs": defs, "$ref": "#/$defs/d12"})
    assert info.value.param == "json_schema"


# ---------------------------------------------------------------------------
# multipleOf (decimal arithmetic), pattern with length bounds, enum/const decided per value
# ---------------------------------------------------------------------------


def _decimal_strings() -> list[str]:
    out = []
    for i in (
        0,
        1,
        2,
        5,
        7,
        8,
        10,
        15,
        16,
        24,
        25,
        40,
        99,
        100,
        125,
        1000,
        1016,
        2032,
        4096,
        123456,
    ):
        for frac in ("", ".0", ".00", ".5", ".05", ".07", ".10", ".123", ".250", ".001"):
            out += [f"{i}{frac}", f"-{i}{frac}"]
    return out + ["1e2", "00", "01", "-", ".5"]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "number", "multipleOf": 0.01},
        {"type": "number", "multipleOf": 0.1, "minimum": 0, "maximum": 100},
        {"type": "number", "multipleOf": 1, "exclusiveMinimum": -5},
        {"type": "number", "multipleOf": 8},
        {"type": "integer", "multipleOf": 16, "minimum": -2032, "maximum": 2031},
        {"type": "integer", "multipleOf": 25},
        {"type": "integer", "multipleOf": 5, "minimum": 0},
        {"type": "integer", "multipleOf": 40, "maximum": 0},
        {"type": "integer", "multipleOf": 2.5},
        {"type": "integer", "multipleOf": 0.01, "maximum": 100},
    ],
)
def test_multiple_of_is_exact_in_decimal(schema: dict) -> None:
    from decimal import Decimal

    pat = re.compile(json_schema_to_regex(schema))
    step = Decimal(repr(schema["multipleOf"]))
    bounds = {
        "minimum": Decimal.__ge__,
        "maximum": Decimal.__le__,
        "exclusiveMinimum": Decimal.__gt__,
    }
    for s in _decimal_strings():
        spelled = re.fullmatch(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", s) is not None and not re.fullmatch(
            r"-0(\.0*)?", s
        )
        if schema["type"] == "integer":
            spelled = spelled and "." not in s
        v = Decimal(s) if spelled else Decimal(0)
        want = (
            spelled
            and v % step == 0
            and all(op(v, Decimal(repr(schema[k]))) for k, op in bounds.items() if k in schema)
        )
        assert (pat.fullmatch(s) is not None) == want, (schema, s)


@pytest.mark.parametrize(
    "pattern,lo,hi",
    [
        ("(^[a-z_.()-]+$)", None, 6),
        ("^[0-9a-z][0-9a-z._-]{0,8}[0-9a-z]$", 2, 64),  # the bounds cannot bind
        ("^https?://.+$", 9, 12),
        ("^[a-c]{2,4}-?[0-9]+$", 4, 7),
        ("^ab*c$", 3, 3),
    ],
)
def test_pattern_with_length_bounds_is_exact(pattern: str, lo: int | None, hi: int | None) -> None:
    schema: dict = {
        "type": "string",
        "pattern": pattern,
        **({} if lo is None else {"minLength": lo}),
        "maxLength": hi,
    }
    pat = re.compile(json_schema_to_regex(schema))
    rng = random.Random(7)
    alphabet = "abcxz_.()-09htps:/A"
    cands = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14))) for _ in range(6000)]
    cands += ["http://" + "a" * k for k in range(8)] + ["https://" + "b" * k for k in range(8)]
    cands += (
        ["a" * k for k in range(10)]
        + ["ab" + "c" * k + "-1" for k in range(6)]
        + ["ab" * k + "12" for k in range(4)]
    )
    cands += ["a" + "b" * k + "c" for k in range(4)]
    valid = 0
    for c in cands:
        want = re.search(pattern, c) is not None and (lo is None or len(c) >= lo) and len(c) <= hi
        valid += want
        assert (pat.fullmatch(json.dumps(c)) is not None) == want, (pattern, c)
    assert valid > 0


@pytest.mark.parametrize(
    "schema,message",
    [
        ({"type": "string", "pattern": "^(\\d+\\.\\d+.*)$", "maxLength": 8}, "minLength/maxLength"),
        ({"type": "string", "pattern": "a+", "maxLength": 3}, "anchored"),
        ({"type": "number", "multipleOf": 0.25}, "power of ten"),
        ({"type": "integer", "multipleOf": 7}, "multipleOf 7"),
        ({"type": "number", "multipleOf": 0}, "greater than 0"),
    ],
)
def test_unsupported_shapes_say_why(schema: dict, message: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(message)):
        json_schema_to_regex(schema)


LISTED_CASES = [  # an enum/const next to keywords the translator cannot express: each value decided
    ({"enum": [1, 2, 3, 4, 6], "not": {"multipleOf": 2}}, [1, 3], [2, 4, 6, 5]),
    (
        {
            "allOf": [
                {"enum": [[1, 2], [1, 1], [], "x"]},
                {"type": "array", "uniqueItems": True, "minItems": 1},
            ]
        },
        [[1, 2]],
        [[1, 1], [], "x"],
    ),
    (
        {"enum": ["x", "y", "zz"], "if": {"const": "x"}, "then": False, "else": {"maxLength": 1}},
        ["y"],
        ["x", "zz"],
    ),
    (
        {
            "$defs": {"small": {"maximum": 10}},
            "allOf": [{"$ref": "#/$defs/small"}, {"enum": [5, 50, "s"]}],
        },
        [5, "s"],
        [50],
    ),
    (
        {
            "allOf": [
                {"enum": [{"foo": "baz"}, {"foo": "baz", "bar": 1}]},
                {"not": {"not": {"properties": {"bar": {"type": "integer"}}, "required": ["bar"]}}},
            ]
        },
        [{"foo": "baz", "bar": 1}],
        [{"foo": "baz"}],
    ),
]


@pytest.mark.parametrize("schema,accept,reject", LISTED_CASES)
def test_enum_next_to_any_keyword_is_decided_per_value(
    schema: dict, accept: list, reject: list
) -> None:
    for inst in accept:
        assert jsonschema.Draft202012Validator(schema).is_valid(inst), (
            inst
        )  # the case list itself is right
        assert _matches(schema, inst), inst
    for inst in reject:
        assert not _matches(schema, inst), inst


ONE_OF_PROVEN = [  # oneOf as anyOf: proven exclusive from the keywords or on exact automata
    {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]},
    {
        "oneOf": [
            {
                "type": "object",
                "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
                "required": ["kind"],
            },
            {
                "type": "object",
                "properties": {"kind": {"enum": ["b", "c"]}, "y": {}},
                "required": ["kind"],
            },
        ]
    },
    {
        "oneOf": [
            {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
                "additionalProperties": False,
            },
            {"type": "object", "properties": {"src": {"type": "string"}}, "required": ["src"]},
        ]
    },
    {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "string", "minLength": 5}]},
]
ONE_OF_UNPROVEN = [  # overlaps that the generated languages alone would hide
    {
        "oneOf": [{"type": "integer"}, {"maxLength": 3}]
    },  # 5 is valid for both: maxLength ignores numbers
    {
        "oneOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "c": {}},
                "required": ["a", "c"],
            },
        ]
    },
    {
        "oneOf": [
            {"type": "array"},
            {
                "type": "array",
                "items": {"type": "array", "items": {"type": "array"}},
                "minItems": 1,
            },
        ]
    },
    # We generate URIs without userinfo: "http://a@b" is a URI the first branch accepts, not one it
    # generates.
    {"oneOf": [{"type": "string", "format": "uri"}, {"type": "string", "pattern": "^http://a@b$"}]},
]


@pytest.mark.parametrize("schema", ONE_OF_PROVEN)
def test_one_of_proven_exclusive_samples_validate(schema: dict) -> None:
    assert_valid(schema, sample_instances(schema, "byte_level", 12, seed=5))


@pytest.mark.parametrize("schema", ONE_OF_UNPROVEN)
def test_one_of_that_cannot_be_proven_is_refused(schema: dict) -> None:
    with pytest.raises(GrammarError, match="oneOf"):
        json_schema_to_regex(schema)


@pytest.mark.parametrize(
    "pattern", ["^(http)|(https)://(.*)$", "^a|b$", "^x$|yz", "(^a[0-9]$)", "^(ab)$|^(x-[a-z]*)$"]
)
def test_pattern_anchors_per_alternative_are_search_exact(pattern: str) -> None:
    pat = re.compile(json_schema_to_regex({"type": "string", "pattern": pattern}))
    rng = random.Random(11)
    cands = [
        "".join(rng.choice("abxyz0htps:/") for _ in range(rng.randint(0, 9))) for _ in range(4000)
    ]
    cands += ["http", "https://", "a", "b", "x", "yz", "a5", "za", "bz"]
    for c in cands:
        assert (pat.fullmatch(json.dumps(c)) is not None) == (re.search(pattern, c) is not None), (
            pattern,
            c,
        )


def test_huge_enum_next_to_other_keywords_is_refused_not_validated_value_by_value() -> None:
    from sgl.constrained.json_schema import MAX_DECIDED_VALUES

    values = [f"v{i}" for i in range(MAX_DECIDED_VALUES + 1)]
    with pytest.raises(GrammarError, match="enum"):
        json_schema_to_regex({"enum": values, "minLength": 3})
    assert _matches({"enum": values[:50], "minLength": 3}, "v10") and not _matches(
        {"enum": values[:50], "minLength": 3}, "v1"
    )
