"""Pythonic tool calls as a grammar (`[f(a=1, b="x")]`), checked with an oracle that shares
no code with it: Python's `ast` (through the pythonic parser) and `jsonschema` on the
arguments. Random walks over the masks end in texts the oracle accepts; hand-written texts
are accepted or refused as it says."""

from __future__ import annotations

import json
import random
import string

import jsonschema
import pytest

from sgl.constrained.compiler import GrammarCompiler
from sgl.constrained.errors import GrammarError
from sgl.constrained.matcher import allocate_bitmask, bitmask_to_bool
from sgl.constrained.vocab import TokenVocabulary
from sgl.tool_calls import get_parser, pythonic_constraint

EOS = 0
PIECES = list(string.printable) + [
    "get_weather(",
    "get_time(",
    "city=",
    "days=",
    "unit=",
    "True",
    "False",
    "None",
    '"Paris"',
    '"celsius"',
    ", ",
    ")]",
    "[get",
    "12",
    "true",
    "null",
    "\u00e9",
]
VOCAB = TokenVocabulary(
    token_bytes=(None,) + tuple(dict.fromkeys(p.encode() for p in PIECES)),
    eos_token_ids=(EOS,),
    vocab_size=1 + len(dict.fromkeys(PIECES)),
)
ID = {b.decode(): i for i, b in enumerate(VOCAB.token_bytes) if b is not None}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "unit": {"enum": ["celsius", "fahrenheit", None]},
        "exact": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
    },
    "required": ["city"],
    "additionalProperties": False,
}
FUNCTIONS = [("get_weather", WEATHER), ("get_time", {"type": "object", "properties": {}})]
SCHEMAS = dict(FUNCTIONS)


def oracle(text: str, free_text: bool, one_call: bool) -> bool:
    content, calls = get_parser("pythonic").parse(text)
    if not calls:
        return free_text and not text.strip().startswith("[")
    if content or (one_call and len(calls) > 1):
        return False
    for c in calls:
        if c.name not in SCHEMAS:
            return False
        args = json.loads(c.arguments)
        try:
            jsonschema.validate(args, SCHEMAS[c.name])
        except jsonschema.ValidationError:
            return False
        if list(args) != [k for k in SCHEMAS[c.name]["properties"] if k in args]:
            # the grammar writes keywords in the declared order (as the JSON route its members)
            return False
    return True


def allowed(m):
    row = allocate_bitmask(1, VOCAB.vocab_size)[0]
    m.fill_mask(row)
    return bitmask_to_bool(row, VOCAB.vocab_size)


def grammar(free_text: bool, one_call: bool):
    return GrammarCompiler(VOCAB).compile(
        "structural_tag", pythonic_constraint(FUNCTIONS, free_text, one_call)
    )


def feeds(g, text: str) -> bool:
    m = g.matcher()
    return all(m.accept(ID[ch]) for ch in text) and bool(allowed(m)[EOS])


@pytest.mark.parametrize("free_text,one_call", [(False, False), (False, True), (True, False)])
def test_random_walks_end_in_valid_calls(free_text, one_call):
    g, rng, done = grammar(free_text, one_call), random.Random(3), 0
    for _ in range(60):
        m, out = g.matcher(), []
        for _ in range(120):
            ids = allowed(m).nonzero().flatten().tolist()
            assert ids, "".join(out)
            tid = EOS if EOS in ids and rng.random() < 0.3 else rng.choice(ids)
            assert m.accept(tid)
            if tid == EOS:
                text = "".join(out)
                assert oracle(text, free_text, one_call), text
                done += 1
                break
            out.append(VOCAB.token_bytes[tid].decode())
    assert done >= 10


@pytest.mark.parametrize(
    "text",
    [
        '[get_weather(city="Paris")]',
        '[get_weather(city="Rome", days=3, unit=None, exact=True, tags=["a", "b"])]',
        "[get_time()]",
        '[get_time(), get_weather(city="x", unit="celsius")]',
        "  [get_time()]",
        "[get_weather(days=3)]",
        '[get_weather(city="Paris", exact=true)]',
        '[get_weather(days=3, city="x")]',
        '[get_weather(city="Paris", days=10)]',
        "[nope()]",
        '[get_weather("Paris")]',
        "Hello [get_time()]",
        "Just text.",
        "[1, 2]",
    ],
)
def test_texts_are_accepted_exactly_when_the_oracle_accepts_them(text):
    for free_text in (False, True):
        assert feeds(grammar(free_text, False), text) == oracle(text, free_text, False), (
            text,
            free_text,
        )


def test_functions_that_cannot_be_keyword_calls_are_refused_naming_them():
    bad = [("f", {"type": "object", "properties": {"not-an-identifier": {"type": "string"}}})]
    with pytest.raises(GrammarError) as e:
        GrammarCompiler(VOCAB).compile("structural_tag", pythonic_constraint(bad, False, False))
    assert e.value.param == "structural_tag.functions[0].parameters"
