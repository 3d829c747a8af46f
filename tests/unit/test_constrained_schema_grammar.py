"""The grammar route for JSON schemas: rules instead of one regex. Checked against the
regex route (an independent engine: outlines-core's DFA) where both apply, and against
jsonschema where only the grammar can go (recursion, sizes past the regex limit)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from test_constrained_json_schema import walk_to_done
from test_constrained_support import allowed_set, make_compiler, make_vocab

from sgl.constrained import GrammarError
from sgl.constrained.ebnf import EbnfGrammar
from sgl.constrained.json_schema import json_schema_to_rules
from sgl.constrained.regex import MAX_POSITIONS

TREE = {
    "$defs": {"node": {
        "type": "object",
        "properties": {"v": {"type": "integer"},
                       "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"], "additionalProperties": False,
    }},
    "$ref": "#/$defs/node",
}  # fmt: skip
SAME_LANGUAGE = [  # no free values and no $ref: both routes generate exactly the same language
    {"type": "object",
     "properties": {"name": {"type": "string", "maxLength": 5},
                    "n": {"type": "integer", "minimum": -3},
                    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
     "required": ["name"], "additionalProperties": False},
    {"anyOf": [{"type": "string", "format": "date"}, {"type": "number", "maximum": 100},
               {"type": "null"}]},
    {"type": "object",
     "properties": {"a": {"type": "boolean"}, "b": {"type": "boolean"}, "c": {"type": "boolean"}},
     "minProperties": 1, "dependentRequired": {"c": ["a"]}, "additionalProperties": False},
    # undeclared members (keys: any but the declared names, spelled with escapes too)
    {"type": "object",
     "properties": {"a": {"type": "integer"}, "ab": {"type": "boolean"}, "é": {"type": "null"}},
     "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}, "maxProperties": 3},
    # conditions: a union of cases, with "not if" pushed down the keywords
    {"type": "object",
     "properties": {"t": {"enum": ["x", "y"]}, "v": {"type": ["integer", "string"]}},
     "if": {"properties": {"t": {"const": "x"}}, "required": ["t"]},
     "then": {"properties": {"v": {"type": "integer"}}},
     "else": {"properties": {"v": {"type": "string", "maxLength": 3}}},
     "additionalProperties": False},
]  # fmt: skip


def grammar_of(schema, vocab) -> EbnfGrammar:
    return EbnfGrammar(
        json.dumps(schema), vocab, rules=json_schema_to_rules(schema), kind="json_schema"
    )


@pytest.mark.parametrize("schema", SAME_LANGUAGE)
def test_grammar_route_masks_equal_the_regex_route(schema) -> None:
    vocab = make_vocab("byte_level")
    regex_grammar = make_compiler("byte_level").compile("json_schema", schema)
    assert regex_grammar.kind == "json_schema" and not isinstance(regex_grammar, EbnfGrammar)
    rule_grammar = grammar_of(schema, vocab)
    rng = random.Random(0)
    eos = set(vocab.eos_token_ids)
    for _ in range(6):
        a, b = regex_grammar.matcher(), rule_grammar.matcher()
        for _ in range(40):
            allowed = allowed_set(a, vocab)
            assert allowed == allowed_set(b, vocab)
            assert a.forced_text() == b.forced_text()
            choices = sorted(allowed - eos)
            if not choices:
                break
            tid = rng.choice(choices)
            assert a.accept(tid) and b.accept(tid)


def test_recursion_is_not_cut() -> None:
    vocab = make_vocab("byte_level")
    g = grammar_of(TREE, vocab)
    deep: dict = {"v": 0}
    for i in range(1, 8):  # seven levels: the regex route expands a recursion three times
        deep = {"v": i, "kids": [deep, {"v": -i}]}
    assert g.matcher().accept_text(json.dumps(deep)) and _accepting(g, json.dumps(deep))
    assert not _accepting(g, json.dumps({"v": 1, "kids": [{"w": 2}]}))
    rng = random.Random(1)
    for _ in range(10):
        jsonschema.validate(json.loads(walk_to_done(g.matcher(), vocab, rng).decode()), TREE)


def _accepting(g: EbnfGrammar, text: str) -> bool:
    m = g.matcher()
    return m.accept_text(text) and m.is_accepting()


def test_compiler_takes_the_grammar_route_past_the_regex_limit() -> None:
    schema = {
        "type": "object",
        "properties": {"note": {"type": "string", "maxLength": MAX_POSITIONS + 500}},
        "required": ["note"],
        "additionalProperties": False,
    }
    g = make_compiler("byte_level").compile("json_schema", schema)
    assert isinstance(g, EbnfGrammar) and g.kind == "json_schema"
    assert _accepting(g, json.dumps({"note": "x" * (MAX_POSITIONS + 500)}))
    assert not _accepting(g, json.dumps({"note": "x" * (MAX_POSITIONS + 501)}))


def test_free_values_are_any_depth_in_the_grammar_route() -> None:
    g = grammar_of(
        {"type": "object", "properties": {"meta": {}}, "required": ["meta"]},
        make_vocab("byte_level"),
    )
    assert _accepting(g, json.dumps({"meta": [[[[{"a": [1, {"b": None}]}]]]]}))
    assert not _accepting(g, '{"meta": [1,]}')


def test_too_large_for_both_routes_names_json_schema_and_both_limits(monkeypatch) -> None:
    from sgl.constrained import ebnf_automaton

    # Long counts are built from blocks (a few hundred states here): a small state limit stands in.
    monkeypatch.setattr(ebnf_automaton, "MAX_STATES", 300)
    with pytest.raises(
        GrammarError, match="as a grammar"
    ) as info:  # 1.1M bounded positions: past both limits
        make_compiler("byte_level").compile(
            "json_schema", {"type": "string", "maxLength": 1_100_000}
        )
    assert info.value.param == "json_schema" and "too large" in str(info.value)
