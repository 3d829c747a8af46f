"""Structural tags (free text with constrained segments), checked against an oracle that
shares no code with the grammar: it scans the text for triggers, decodes each segment's
JSON with Python's `json` and validates it with `jsonschema`. Mask-guided random walks
must end in texts the oracle accepts; hand-written texts must be accepted or refused as
the oracle says."""

from __future__ import annotations

import json
import random
import string

import jsonschema
import pytest
import torch

from sgl.constrained.compiler import GrammarCompiler
from sgl.constrained.errors import GrammarError
from sgl.constrained.matcher import allocate_bitmask, bitmask_to_bool
from sgl.constrained.vocab import TokenVocabulary

EOS = 0
PIECES = list(string.printable) + [
    "<tool_call>",
    "<tool",
    "_call>",
    "</tool_call>",
    ">\n{",
    '{"name": "',
    '"arguments": ',
    "}\n</",
    "call",
    "get_weather",
    "get_time",
    '"city"',
    '"days"',
    "Paris",
    "Rome",
    "12",
    "true",
    "unit",
    "celsius",
    "\u00e9",
    "ok",
    " the",
    " tool",
    "<",
    "<<",
    "<t",
    "tool_",
    "_c",
    "all>",
    "<tool_call>\n{",
    "</t>",
]
VOCAB = TokenVocabulary(
    token_bytes=(None, None) + tuple(dict.fromkeys(p.encode() for p in PIECES)),
    eos_token_ids=(EOS,),
    vocab_size=2 + len(dict.fromkeys(PIECES)),
)
ID = {b.decode(): i for i, b in enumerate(VOCAB.token_bytes) if b is not None}

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 99},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {}, "additionalProperties": False}


def call(name: str) -> str:
    return '<tool_call>\n{"name": "' + name + '", "arguments": '


TAG = {
    "type": "structural_tag",
    "triggers": ["<tool_call>"],
    "structures": [
        {"begin": call("get_weather"), "schema": WEATHER, "end": "}\n</tool_call>"},
        {"begin": call("get_time"), "schema": TIME, "end": "}\n</tool_call>"},
    ],
}


def oracle(text: str, tag: dict) -> bool:
    """Free text without triggers, each trigger opening a structure whose JSON (any
    whitespace before it) is valid against its schema; at most max_structures of them; with
    free_text false, only segments joined by the separator."""
    free, limit = tag.get("free_text", True), tag.get("max_structures")
    if tag.get(
        "start_after"
    ):  # reasoning first: free text up to the first marker, a little whitespace
        cut = text.find(tag["start_after"])
        if cut < 0:
            return False
        rest = text[cut + len(tag["start_after"]) :]
        body = rest.lstrip(" \t\r\n")
        if len(rest) - len(body) > 8:
            return False
        return oracle(body, {k: v for k, v in tag.items() if k != "start_after"})

    def segments_from(pos: int, count: int, first: bool) -> bool:
        if free:
            triggers = [(text.find(t, pos), t) for t in tag["triggers"] if text.find(t, pos) >= 0]
            if not triggers:
                return True
            start = min(p for p, _ in triggers)
        else:
            if pos == len(text) and not first:
                return True
            sep = "" if first else tag.get("separator", "")
            if not text.startswith(sep, pos):
                return False
            start = pos + len(sep)
        if limit is not None and count >= limit:
            return False
        for s in tag["structures"]:
            if not text.startswith(s["begin"], start):
                continue
            at = start + len(s["begin"])
            while at < len(text) and text[at] in " \t\n\r":
                at += 1
            try:
                value, end = json.JSONDecoder().raw_decode(text, at)
                jsonschema.validate(value, s["schema"])
            except (ValueError, jsonschema.ValidationError):
                continue
            if text.startswith(s["end"], end) and segments_from(
                end + len(s["end"]), count + 1, False
            ):
                return True
        return False

    return segments_from(0, 0, True)


def compile_tag(tag: dict):
    return GrammarCompiler(VOCAB).compile("structural_tag", tag)


def allowed(m) -> torch.Tensor:
    row = allocate_bitmask(1, VOCAB.vocab_size)[0]
    m.fill_mask(row)
    return bitmask_to_bool(row, VOCAB.vocab_size)


def feeds(grammar, text: str) -> bool:
    """The text, one character a token, is accepted and complete (EOS allowed after it)."""
    m = grammar.matcher()
    for ch in text:
        if not m.accept(ID[ch]):
            return False
    return bool(allowed(m)[EOS])


def walk(grammar, rng: random.Random, steps: int = 160) -> str | None:
    """A random walk over the allowed tokens; its text if it ended with EOS."""
    m, out = grammar.matcher(), []
    for _ in range(steps):
        ids = allowed(m).nonzero().flatten().tolist()
        assert ids, "a state with nothing allowed: " + repr("".join(out))
        # lean towards EOS and the tool pieces now and then, so walks finish and call
        tid = EOS if EOS in ids and rng.random() < 0.15 else rng.choice(ids)
        if ID["</t>"] in ids and rng.random() < 0.05:  # the reasoning's end marker, now and then
            tid = ID["</t>"]
        assert m.accept(tid)
        if tid == EOS:
            return "".join(out)
        out.append(VOCAB.token_bytes[tid].decode())
    return None


TAGS = {
    "auto": TAG,
    "auto, one call": {**TAG, "max_structures": 1},
    "required": {**TAG, "free_text": False, "separator": "\n"},
    "required, one call": {**TAG, "free_text": False, "max_structures": 1},
    "after reasoning, required": {
        **TAG,
        "free_text": False,
        "separator": "\n",
        "start_after": "</t>",
    },
    "after reasoning, auto": {**TAG, "start_after": "</t>"},
    "two triggers": {
        "type": "structural_tag",
        "triggers": ["<t", "<<"],
        "structures": [
            {"begin": "<tool_call>", "schema": TIME, "end": "</tool_call>"},
            {"begin": "<<", "schema": {"type": "integer"}, "end": ">>"},
        ],
    },
}


@pytest.mark.parametrize("name", list(TAGS))
def test_random_walks_end_in_texts_the_oracle_accepts(name):
    grammar, rng, done = compile_tag(TAGS[name]), random.Random(7), 0
    for _ in range(60):
        text = walk(grammar, rng)
        if text is not None:
            done += 1
            assert oracle(text, TAGS[name]), text
    assert done >= 10


VALID_AUTO = [
    "",
    "No call needed.",
    "Let me check. " + call("get_weather") + '{"city": "Paris", "days": 3}' + "}\n</tool_call>",
    call("get_time")
    + "{}"
    + "}\n</tool_call>\n"
    + call("get_weather")
    + '{"city": "Rome"}'
    + "}\n</tool_call>",
    "a <tool or <tool_cal is not a call; << neither",
]
INVALID_AUTO = [
    call("get_weather") + '{"town": "Paris"}' + "}\n</tool_call>",  # not in the schema
    call("get_weather") + '{"city": "Paris", "days": 0}' + "}\n</tool_call>",  # below the minimum
    call("get_weather") + '{"city": "Paris"}' + "}</tool_call>",  # the wrong end
    '<tool_call>\n{"name": "delete_all", "arguments": {}}\n</tool_call>',  # no such function
    "<tool_call> just text",
]


@pytest.mark.parametrize("text", VALID_AUTO + INVALID_AUTO)
def test_texts_are_accepted_exactly_when_the_oracle_accepts_them(text):
    assert feeds(compile_tag(TAG), text) == oracle(text, TAG)


def test_required_and_max_structures():
    one = call("get_time") + "{}" + "}\n</tool_call>"
    required = compile_tag(TAGS["required"])
    assert not feeds(required, "") and not feeds(required, "Sure. " + one)
    assert feeds(required, one) and feeds(required, one + "\n" + one)
    assert not feeds(required, one + one)  # the separator is required
    single = compile_tag(TAGS["auto, one call"])
    assert feeds(single, "x " + one + " done") and not feeds(single, one + " " + one)
    m = single.matcher()
    for ch in one + " <tool_call":
        assert m.accept(ID[ch])
    assert not allowed(m)[ID[">"]]  # a second trigger cannot even be written


def test_start_after_leaves_the_reasoning_free():
    one = call("get_time") + "{}" + "}\n</tool_call>"
    tag = TAGS["after reasoning, required"]
    grammar = compile_tag(tag)
    for text in (
        "hmm <tool_call> maybe</t>\n\n" + one,
        "</t>" + one,
        "a</t>" + one + "\n" + one,
        "x</t>  " + one,
        "no marker " + one,
        "x</t>text",
        "x</t>" + " " * 9 + one,
        "x</t>" + one + "</t>",
    ):
        assert feeds(grammar, text) == oracle(text, tag), text


@pytest.mark.parametrize(
    "spec,field",
    [
        ("not json", "structural_tag"),
        ({"structures": []}, "structural_tag.structures"),
        (
            {"structures": [{"begin": "<a>", "end": "</a>"}], "triggers": ["<b"]},
            "structural_tag.structures[0].begin",
        ),
        (
            {"structures": [{"begin": "<a>", "end": "</a>", "schema": 3}], "triggers": ["<a"]},
            "structural_tag.structures[0].schema",
        ),
        (
            {"structures": [{"begin": "<a>", "end": "</a>"}], "triggers": []},
            "structural_tag.triggers",
        ),
        ({**TAG, "max_structures": 0}, "structural_tag.max_structures"),
        ({**TAG, "extra": 1}, "structural_tag.extra"),
        ({**TAG, "start_after": ""}, "structural_tag.start_after"),
        (
            {**TAG, "max_structures": 30},
            "structural_tag.max_structures",
        ),  # 31 copies of an 11-state automaton
        ({**TAG, "triggers": ["<" + "x" * 130]}, "structural_tag.triggers"),
        (
            {
                "structures": [{"begin": "<a>", "end": "</a>", "schema": {"type": "nonsense"}}],
                "triggers": ["<a"],
            },
            "structural_tag.structures[0].schema",
        ),
    ],
)
def test_bad_tags_name_the_field(spec, field):
    with pytest.raises(GrammarError) as e:
        compile_tag(spec)
    assert e.value.param == field, e.value
