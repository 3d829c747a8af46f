"""Regex constraints: normalisation, and masks equal to brute force over the vocabulary.

The oracle (test_constrained_support.Oracle) is the `regex` module's partial matching on
the *original* pattern with re.ASCII, so these tests also check that normalisation
keeps the language.
"""

from __future__ import annotations

import random
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_constrained_support import (
    TOKENIZER_KINDS,
    Oracle,
    allowed_set,
    make_compiler,
    make_vocab,
    regexes,
    walk_random,
)

from sgl.constrained import GrammarError, TokenVocabulary, allocate_bitmask, normalize_regex
from sgl.constrained.regex import RegexGrammar

HYPO = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_walk(pattern: str, kind: str, rng: random.Random, steps: int = 6) -> None:
    """At every state of a random walk, the mask equals the brute-force allowed set."""
    vocab = make_vocab(kind)
    grammar = make_compiler(kind).compile("regex", pattern)
    oracle = Oracle(pattern)
    m = grammar.matcher()
    data = b""
    eos = set(vocab.eos_token_ids)
    for _ in range(steps):
        got = allowed_set(m, vocab)
        want = oracle.expected_mask(vocab, data)
        assert got == want, (pattern, data, sorted(got - want)[:5], sorted(want - got)[:5])
        text = data.decode("utf-8", errors="ignore")
        assert m.is_accepting() == (bool(got & eos))
        if m.is_accepting():
            assert oracle.full(text)
        choices = sorted(got - eos)
        if not choices:
            assert m.is_done()
            break
        tid = rng.choice(choices)
        assert m.accept(tid)
        data += vocab.token_bytes[tid]  # type: ignore[operator]


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
@HYPO
@given(pattern=regexes, rnd=st.randoms(use_true_random=False))
def test_masks_equal_brute_force(kind: str, pattern: str, rnd: random.Random) -> None:
    check_walk(pattern, kind, rnd)


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
@pytest.mark.parametrize(
    "pattern",
    [
        r"\d{3}-\d{4}",
        r"(?:[A-Z][a-z]+ ){1,3}[A-Z][a-z]+",
        r"(ab|a)(bc|c)?",
        r"a|ab|abc",
        r"[^\"\\]*",
        r"(?:中文|中|😀+)é?",
        r"\w+@\w+\.(?:com|org)",
        r"(true|false|null)",
        # exponential in outlines' unanchored DFA unless U+0002 is kept out of classes:
        r"x.{0,40}y",
        r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
        r"",
    ],
)
def test_masks_equal_brute_force_examples(kind: str, pattern: str) -> None:
    for seed in range(3):
        check_walk(pattern, kind, random.Random(seed), steps=8)


# ---------------------------------------------------------------------------
# outlines-core 0.2.14 drops tokens at match boundaries; our wrapper must not
# ---------------------------------------------------------------------------

TINY = TokenVocabulary(
    token_bytes=(
        b"a",
        b"b",
        b"c",
        b"ab",
        b"bc",
        b"abc",
        b"x",
        b"\xc3",
        b"\xa9",
        "é".encode(),
        None,
        b"",
    ),
    eos_token_ids=(10,),
    vocab_size=12,
)


def _tiny_allowed(pattern: str, prefix_ids: list[int]) -> list[int]:
    rx = normalize_regex(pattern)
    assert rx is not None
    m = RegexGrammar("regex", pattern, rx.text, TINY).matcher()
    for t in prefix_ids:
        assert m.accept(t)
    return m.allowed_token_ids()


@pytest.mark.parametrize(
    "pattern,prefix,expected",
    [
        ("a|ab", [], [0, 3]),  # leftmost-first would lose "ab"
        ("a|ab", [0], [1, 10]),  # ... and "b" after "a"
        ("a(bc)?", [0], [1, 4, 10]),  # "b" ends between matches
        ("(ab)+", [3], [0, 3, 10]),  # "a" after a complete "ab"
        ("(a|é)+", [0], [0, 7, 9, 10]),  # a partial UTF-8 token after a match
        ("a?", [], [0, 10]),  # a pattern matching "" (no universal start state in outlines)
    ],
)
def test_outlines_boundary_bugs_are_worked_around(
    pattern: str, prefix: list[int], expected: list[int]
) -> None:
    assert _tiny_allowed(pattern, prefix) == expected


# ---------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern,yes,no",
    [
        (r"\d+", ["0", "123"], ["٣", "a"]),  # ASCII digits only
        (r"\w", ["a", "Z", "_", "5"], ["é", "-"]),
        (r"(?i)ab", ["AB", "aB"], ["ac"]),
        (r"^a+$", ["a", "aaa"], ["", "b"]),
        (r"\Aab\Z", ["ab"], ["a"]),
        (r"^a|^b$", ["a", "b"], ["ab"]),
        (r".", ["x", "é"], ["\n"]),
        (r"(?s).", ["\n"], [""]),
        (r"[^\d\W]", ["a", "_"], ["1", " "]),
        (r"a{2,3}?", ["aa", "aaa"], ["a", "aaaa"]),
        (r"[\u0000-\uffff]", ["a", "\uffff"], ["😀"]),
        (r"x(?:)y", ["xy"], ["x"]),
        (r'["\\]', ['"', "\\"], ["a"]),
        (r"[<>&~-]", ["<", ">", "&", "~", "-"], ["a"]),
    ],
)
def test_normalize_keeps_the_language(pattern: str, yes: list[str], no: list[str]) -> None:
    rx = normalize_regex(pattern)
    assert rx is not None
    for s in yes:
        assert re.fullmatch(rx.text, s), (pattern, rx.text, s)
    for s in no:
        assert not re.fullmatch(rx.text, s), (pattern, rx.text, s)


@pytest.mark.parametrize(
    "pattern,words",
    [
        ("(?=a)a", "look-ahead"),
        ("(?!a)b", "look-ahead"),
        ("(a)\\1", "back-references"),
        ("a\\bb", "word boundaries"),
        ("a^b", "anchors"),
        ("(?>ab)", "atomic"),
        ("a++", "possessive"),
        ("(a", "invalid regex"),
        ("(?(1)a|b)", "invalid regex"),
    ],
)
def test_unsupported_constructs_raise(pattern: str, words: str) -> None:
    with pytest.raises(GrammarError) as info:
        make_compiler("byte_level").compile("regex", pattern)
    assert info.value.param == "regex"
    assert words in str(info.value)


def test_empty_language_size_limit_and_non_string() -> None:
    with pytest.raises(GrammarError, match="no string"):
        make_compiler("byte_level").compile("regex", "[^\\x00-\\U0010ffff]")
    with pytest.raises(GrammarError, match="no string"):
        make_compiler("byte_level").compile("regex", "\\x02")  # reserved: never generated
    with pytest.raises(GrammarError, match="too large"):
        make_compiler("byte_level").compile("regex", "(?:ab{0,100}){0,100}")
    with pytest.raises(GrammarError):
        make_compiler("byte_level").compile("regex", 5)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Matcher behaviour
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_rollback_and_copy_restore_masks_exactly(kind: str) -> None:
    vocab = make_vocab(kind)
    grammar = make_compiler(kind).compile(
        "regex", r'\{"k": \[(?:\d+, ){0,5}\d+\], "s": "[^"]{0,12}"\}'
    )
    rng = random.Random(7)
    m = grammar.matcher()
    masks = [allowed_set(m, vocab)]
    states = []
    for _ in range(25):
        before = m.copy()
        walk_random(m, vocab, rng, 1)
        if m.num_accepted == before.num_accepted:
            break
        states.append(before)
        masks.append(allowed_set(m, vocab))
        assert allowed_set(before, vocab) == masks[-2]  # the copy did not move with m
    n = m.num_accepted
    assert n >= 10
    for k in (1, 3, n - 1):
        c = m.copy()
        c.rollback(k)
        assert allowed_set(c, vocab) == masks[n - k]
        assert c.num_accepted == n - k
    assert allowed_set(m, vocab) == masks[n]
    m.rollback(n)
    assert allowed_set(m, vocab) == masks[0]
    with pytest.raises(ValueError):
        m.rollback(1)


def test_eos_special_tokens_and_done() -> None:
    vocab = make_vocab("byte_level")
    m = make_compiler("byte_level").compile("regex", "ab?").matcher()
    eos = vocab.eos_token_ids[0]
    specials = [
        i for i, b in enumerate(vocab.token_bytes) if b is None and i not in vocab.eos_token_ids
    ]
    assert specials
    assert not m.accept(eos)  # not accepting yet
    assert not any(m.accept(s) for s in specials)
    assert not m.accept(vocab.vocab_size + 3) and not m.accept(-1)
    a = vocab.token_bytes.index(b"a")
    b = vocab.token_bytes.index(b"b")
    assert not m.accept(b) and m.num_accepted == 0  # rejected: nothing changed
    assert m.accept(a)
    assert m.is_accepting() and not m.is_done()
    assert m.accept(b)
    assert m.is_accepting() and m.is_done()  # "ab" cannot be extended
    assert allowed_set(m, vocab) == set(vocab.eos_token_ids)
    assert m.accept(eos) and m.is_done() and m.is_accepting()
    assert allowed_set(m, vocab) == set(vocab.eos_token_ids)  # after EOS, only EOS
    assert not m.accept(a)
    m.rollback(1)
    assert not m.is_done() or m.is_accepting()


def test_fill_mask_ors_into_the_row_and_accept_text() -> None:
    vocab = make_vocab("sentencepiece")
    m = make_compiler("sentencepiece").compile("regex", "héllo (world|wide)").matcher()
    row = allocate_bitmask(1, vocab.vocab_size)[0]
    row[0] = 1 << 3
    m.fill_mask(row)
    assert int(row[0]) & (1 << 3)
    assert m.accept_text("hé")
    assert m.num_accepted == 1
    assert not m.accept_text("x")  # not allowed: nothing changes
    assert m.accept_text("llo w")
    assert m.forced_text() == ""  # "orld" or "ide"
    assert m.accept_text(b"or")
    assert m.forced_text() == "ld"
    m.rollback(1)
    assert m.forced_text() == ""


def test_fill_mask_to_other_dtype_device_guard() -> None:
    vocab = make_vocab("byte_level")
    m = make_compiler("byte_level").compile("regex", "[ab]").matcher()
    row = torch.zeros(vocab.num_words, dtype=torch.int32)
    m.fill_mask(row)
    assert set(m.allowed_token_ids()) == allowed_set(m, vocab)


def test_oracle_respells_negated_classes_the_regex_module_mismatches() -> None:
    """Regression (found by hypothesis): `regex` says (?:[^a]|[^0]) matches nothing."""
    import re

    from test_constrained_support import Oracle

    for pattern, text in [
        ("(?:a|(?:[^a]|[^0]))", "0"),
        ("(?:x[^a]|x[^0])", "x0"),
        ("[^\\w]|\\D", "a"),
    ]:
        assert Oracle(pattern).full(text) == bool(re.fullmatch(pattern, text, flags=re.ASCII)), (
            pattern
        )
