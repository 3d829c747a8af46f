"""EBNF masks on the embedded model's real vocabulary (49152 byte-level BPE tokens).

Oracles: Python's ``json`` for walks under JSON_GRAMMAR and for teacher-forced real
documents; the ``regex`` module's partial matching (is this text a prefix of some
match?) for a regular, ASCII-only grammar, over every token of the vocabulary; and
``accept()`` token by token against ``fill_mask`` (two separate code paths).
"""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch

from sgl.constrained.ebnf import JSON_GRAMMAR, compile_ebnf
from sgl.constrained.vocab import TokenVocabulary

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tok():
    from sgl.runtime.model.paths import resolve_model_path
    from sgl.runtime.tokenizer import load_tokenizer

    path = resolve_model_path("default")
    return load_tokenizer(os.path.dirname(path), gguf_file=os.path.basename(path))


@pytest.fixture(scope="module")
def vocab(tok) -> TokenVocabulary:
    return TokenVocabulary.from_tokenizer(tok)


@pytest.fixture(scope="module")
def json_grammar(vocab):
    return compile_ebnf(JSON_GRAMMAR, vocab)


def allowed(m, vocab) -> np.ndarray:
    row = torch.zeros((vocab.vocab_size + 31) // 32, dtype=torch.int32)
    m.fill_mask(row)
    return np.unpackbits(row.numpy().view(np.uint8), bitorder="little")[: vocab.vocab_size].astype(
        bool
    )


def finish(m, vocab) -> bytes:
    """The shortest completion in single-byte tokens (BFS over parse states), accepted into m."""
    singles = [i for i, tb in enumerate(vocab.token_bytes) if tb is not None and len(tb) == 1]
    frontier, seen = [(m, [])], {m.state}
    while frontier:
        nxt = []
        for cur, path in frontier:
            if cur.is_accepting():
                for tid in path:
                    assert m.accept(tid)
                return b"".join(vocab.token_bytes[t] for t in path)
            ok = allowed(cur, vocab)
            for tid in singles:
                if ok[tid]:
                    c = cur.copy()
                    assert c.accept(tid)
                    if c.state not in seen:
                        seen.add(c.state)
                        nxt.append((c, path + [tid]))
        frontier = nxt
    raise AssertionError("no completion")


def test_json_walks_on_real_vocab_are_json_objects(json_grammar, vocab):
    rng = random.Random(0)
    short = np.array([bool(tb) and len(tb) <= 3 for tb in vocab.token_bytes])
    eos = set(vocab.eos_token_ids)
    for _ in range(8):
        m = json_grammar.matcher()
        out = b""
        for _ in range(rng.randint(10, 80)):
            ok = allowed(m, vocab)
            # prefer short tokens so the walk builds structure, not just long strings
            pool = np.flatnonzero(ok & short) if rng.random() < 0.7 else np.flatnonzero(ok)
            pool = [int(t) for t in pool if int(t) not in eos] or [
                int(t) for t in np.flatnonzero(ok)
            ]
            tid = rng.choice(pool)
            if tid in eos:
                break
            assert m.accept(tid)
            out += vocab.token_bytes[tid]
        out += finish(m, vocab)
        assert all(allowed(m, vocab)[i] for i in eos)
        value = json.loads(out.decode("utf-8"))
        assert isinstance(value, dict)


def test_real_documents_tokenized_by_the_model_are_allowed_at_every_step(json_grammar, vocab, tok):
    docs = [
        {
            "name": "Alice",
            "age": 31,
            "tags": ["a", "b\n\u00e9"],
            "nested": {"x": [1, 2.5, -3e4, {"deep": [[], {}]}]},
        },
        {
            "q": 'Wie geht\'s? \u65e5\u672c\u8a9e \U0001f600 "quoted" \\ back',
            "list": list(range(12)),
            "ok": True,
        },
    ]
    for doc in docs:
        for indent in (None, 2):
            text = json.dumps(doc, indent=indent, ensure_ascii=False)
            m = json_grammar.matcher()
            for tid in tok.encode(text, add_special_tokens=False):
                assert allowed(m, vocab)[tid]
                assert m.accept(tid)
            assert m.is_accepting()
            assert allowed(m, vocab)[vocab.eos_token_ids[0]]


def test_fill_mask_agrees_with_accept_on_every_token(json_grammar, vocab):
    prefixes = [
        "",
        "{",
        '{"ke',
        '{"key": ',
        '{"key": "va\\',
        '{"a": [1, 2.',
        '{"a": {"b": [tr',
        '{"a": "\u00e9',
    ]
    for prefix in prefixes:
        m = json_grammar.matcher()
        assert m.accept_text(prefix)
        ok = allowed(m, vocab)
        for tid in range(vocab.vocab_size):
            assert m.copy().accept(tid) == bool(ok[tid]), (prefix, tid, vocab.token_bytes[tid])


def test_regular_grammar_is_exact_against_regex_partial_matching(vocab):
    regex = pytest.importorskip("regex")
    gbnf = r"""
    root  ::= "let " ident " = [" ( num ( "," " "? num ){0,3} )? "];" | "none"
    ident ::= [a-z_] [a-z0-9_]{0,7}
    num   ::= "-"? [0-9]{1,3}
    """
    pattern = regex.compile(
        r"let [a-z_][a-z0-9_]{0,7} = \[(?:-?[0-9]{1,3}(?:, ?-?[0-9]{1,3}){0,3})?\];|none"
    )
    grammar = compile_ebnf(gbnf, vocab)
    token_text = []
    for tb in vocab.token_bytes:
        try:
            token_text.append(tb.decode("utf-8") if tb else None)
        except UnicodeDecodeError:
            token_text.append(None)  # the grammar is ASCII: a partial character never fits
    rng = random.Random(1)
    eos = vocab.eos_token_ids[0]
    for _ in range(6):
        m, text = grammar.matcher(), ""
        for _ in range(12):
            ok = allowed(m, vocab)
            want = np.zeros(vocab.vocab_size, dtype=bool)
            for tid, t in enumerate(token_text):
                if t is not None and pattern.fullmatch(text + t, partial=True):
                    want[tid] = True
            want[eos] = pattern.fullmatch(text) is not None
            assert np.array_equal(ok, want), [
                vocab.token_bytes[i] for i in np.flatnonzero(ok != want)[:10]
            ]
            choices = [int(t) for t in np.flatnonzero(ok) if t != eos]
            if not choices:
                break
            tid = rng.choice(choices)
            assert m.accept(tid)
            text += token_text[tid]
