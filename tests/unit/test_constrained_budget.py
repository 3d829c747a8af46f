"""Budget-aware completion: with `budget` (tokens left) the mask admits only tokens after
which a complete member still fits, so random walks that always stop at the budget end in
the language; without it the same walks get cut. The shortest completion is found by brute
force over the vocabulary (a BFS over tokens), independently of the matcher's own estimate."""

from __future__ import annotations

import random

import pytest
from test_constrained_support import make_compiler, make_tokenizer, make_vocab

from sgl.constrained.ebnf import EbnfGrammar
from sgl.constrained.json_schema import json_schema_to_rules
from sgl.constrained.matcher import allocate_bitmask, bitmask_to_bool

ARITH = """root ::= expr "="
expr ::= term (("+" | "-") term)*
term ::= factor ("*" factor)*
factor ::= [0-9]{1,3} | "(" expr ")"
"""
RECORD = {"type": "object",
          "properties": {"id": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string"}},
                         "child": {"$ref": "#"}},
          "required": ["id", "tags"], "additionalProperties": False}  # fmt: skip

LANGUAGES = [
    ("regex", "[a-z]+@[a-z]+\\.(com|org)"),
    ("regex", "(0|[1-9][0-9]*)(\\+(0|[1-9][0-9]*))*="),
    ("json_schema", {"type": "object",
                     "properties": {"name": {"type": "string"},
                                    "tags": {"type": "array", "items": {"type": "string"}},
                                    "kind": {"enum": ["internationalization", "x"]}},
                     "required": ["name", "tags", "kind"], "additionalProperties": False}),
    ("ebnf", ARITH),
    ("json_schema_grammar", RECORD),  # the grammar route (recursive $ref: a rule)
]  # fmt: skip


def compile_for(kind: str, spec):
    if kind == "json_schema_grammar":
        import json

        vocab = make_vocab("byte_level")
        return EbnfGrammar(
            json.dumps(spec), vocab, rules=json_schema_to_rules(spec), kind="json_schema"
        )
    return make_compiler("byte_level").compile(kind, spec)


def allowed(matcher, vocab, budget=None) -> set[int]:
    row = allocate_bitmask(1, vocab.vocab_size)[0]
    matcher.fill_mask(row, budget)
    return set(bitmask_to_bool(row, vocab.vocab_size).nonzero().flatten().tolist())


def shortest_tokens(grammar, vocab, start=None) -> int:
    """Fewest tokens (EOS included, unless the match ends by itself) to a complete member."""
    eos = set(vocab.eos_token_ids)
    frontier, seen, depth = [start.copy() if start is not None else grammar.matcher()], set(), 0
    while frontier:
        nxt = []
        for m in frontier:
            if m.is_done():
                return depth
            if m.is_accepting():
                return depth + 1
            for t in allowed(m, vocab) - eos:
                c = m.copy()
                assert c.accept(t)
                if c.state not in seen:
                    seen.add(c.state)
                    nxt.append(c)
        frontier, depth = nxt, depth + 1
    raise AssertionError("no completion")


def walk(grammar, vocab, budget: int, aware: bool, rng: random.Random) -> bool:
    """Random allowed tokens (EOS when allowed, sometimes) until done or `budget` tokens."""
    m, eos = grammar.matcher(), set(vocab.eos_token_ids)
    for step in range(budget):
        a = allowed(m, vocab, budget - step if aware else None)
        if a & eos and (rng.random() < 0.3 or not a - eos):
            return m.accept(min(a & eos))
        assert m.accept(rng.choice(sorted(a - eos)))
        if m.is_done():
            return True
    return False  # cut by the budget


@pytest.mark.parametrize("kind,spec", LANGUAGES)
def test_walks_within_budget_always_complete(kind, spec) -> None:
    vocab, grammar = make_vocab("byte_level"), compile_for(kind, spec)
    shortest = shortest_tokens(grammar, vocab)
    budget = max(shortest + 1, int(1.2 * shortest))
    rng = random.Random(0)
    assert all(walk(grammar, vocab, budget, True, rng) for _ in range(60))
    # The same walks without the budget feature get cut: the test can fail.
    assert not all(walk(grammar, vocab, budget, False, rng) for _ in range(60))


@pytest.mark.parametrize("kind,spec", LANGUAGES)
def test_budget_never_adds_tokens_and_is_plain_when_roomy_or_hopeless(kind, spec) -> None:
    vocab, grammar = make_vocab("byte_level"), compile_for(kind, spec)
    m = grammar.matcher()
    plain = allowed(m, vocab)
    for budget in range(1, 80):
        assert allowed(m, vocab, budget) <= plain
    assert allowed(m, vocab, 10_000) == plain
    assert (
        allowed(m, vocab, 1) == plain
    )  # nothing fits in one token: the plain mask (a cut is reported)


@pytest.mark.parametrize(
    "kind,spec", [lang for lang in LANGUAGES if lang[0] in ("ebnf", "json_schema_grammar")]
)
def test_grammar_budget_masks_keep_a_completion_within_budget(kind, spec) -> None:
    """Brute force: whenever a budget narrows the mask, every token it admits leaves a
    completion (found by BFS over the vocabulary) that fits in what is left."""
    vocab, grammar = make_vocab("byte_level"), compile_for(kind, spec)
    eos = set(vocab.eos_token_ids)
    rng = random.Random(3)
    m, narrowed = grammar.matcher(), 0
    for _ in range(6):
        plain = allowed(m, vocab)
        shortest = shortest_tokens(grammar, vocab, m)
        for budget in range(shortest, shortest + 4):
            admitted = allowed(m, vocab, budget)
            if admitted == plain:
                continue
            narrowed += 1
            for t in sorted(admitted - eos):
                c = m.copy()
                assert c.accept(t)
                assert shortest_tokens(grammar, vocab, c) <= budget - 1, (
                    budget,
                    vocab.token_bytes[t],
                )
        choices = sorted(plain - eos)
        if not choices:
            break
        assert m.accept(rng.choice(choices))
    assert narrowed  # the budget did narrow some masks: the check above ran


# The grammar route at the tightest budgets: a hand-written shortest member, as the tokenizer
# spells it, with EOS (an upper bound of the fewest tokens, found without the code under test).
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 20},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}  # fmt: skip
ALARM = {"type": "object",
         "properties": {"hour": {"type": "integer"}, "minute": {"type": "integer"},
                        "label": {"type": "string"}},
         "required": ["hour", "minute", "label"], "additionalProperties": False}  # fmt: skip
CALLS = {
    "type": "structural_tag",
    "free_text": False,
    "separator": "\n",
    "triggers": ["<tool_call>"],
    "structures": [
        {
            "begin": '<tool_call>\n{"name": "get_weather", "arguments": ',
            "schema": WEATHER,
            "end": "}\n</tool_call>",
        },
        {
            "begin": '<tool_call>\n{"name": "set_alarm", "arguments": ',
            "schema": ALARM,
            "end": "}\n</tool_call>",
        },
    ],
}  # fmt: skip  (tool calls: tool_choice "required", parallel)
FREE_CALLS = {
    **CALLS,
    "free_text": True,
    "separator": "",
}  # tool_choice "auto": text, calls begun must close
WIDE = {"type": "object",
        "properties": {f"f{i}": {"type": ["integer", "boolean"] if i % 2 else "string"}
                       for i in range(10)},
        "required": [f"f{i}" for i in range(10)], "additionalProperties": False}  # fmt: skip
TIGHT_LANGUAGES = {  # id: (kind, spec, a shortest member)
    "arith": ("ebnf", ARITH, "0="),
    "list": ("ebnf", 'root ::= "[" item ("," item)* "]"\n'
                     'item ::= "{\\"id\\": " [0-9]+ ", \\"tags\\": [" '
                     '("\\"" [a-z]+ "\\"" ("," "\\"" [a-z]+ "\\"")*)? "]}"',
             '[{"id": 0, "tags": []}]'),
    "record": ("json_schema_grammar", RECORD, '{"id":0,"tags":[]}'),
    "wide": ("json_schema_grammar", WIDE,
             "{" + ",".join(f'"f{i}":{0 if i % 2 else chr(34) * 2}' for i in range(10)) + "}"),
    "calls": ("structural_tag", CALLS,
              '<tool_call>\n{"name": "get_weather", "arguments": {"city":"","unit":"celsius"}}\n'
              '</tool_call>'),
    "free_calls": ("structural_tag", FREE_CALLS, ""),
}  # fmt: skip


@pytest.mark.parametrize("name", TIGHT_LANGUAGES)
def test_grammar_walks_complete_whenever_a_member_fits(name) -> None:
    """Brute force at the tightest budgets: random walks (uniform over the allowed tokens,
    as temperature 1.0 on a flat model) with a budget of a shortest member's tokens and EOS,
    or one or three more, always end complete. A bound on the shortest completion that is
    loose (e.g. counting a long tail a token a byte, or tokens split at rule boundaries), or
    masks that lead into a state where nothing fits any more, fail here."""
    kind, spec, member = TIGHT_LANGUAGES[name]
    vocab, grammar = make_vocab("byte_level"), compile_for(kind, spec)
    fits = len(make_tokenizer("byte_level")(member, add_special_tokens=False).input_ids) + 1
    m = grammar.matcher()
    assert m.accept_text(member) and m.is_accepting()  # the oracle's member is one
    rng = random.Random(1)
    for budget in (fits, fits + 1, fits + 3):
        cut = sum(not walk(grammar, vocab, budget, True, rng) for _ in range(25))
        assert cut == 0, (budget, cut)
