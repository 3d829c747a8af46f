"""Jump-forward text: forced exactly when every continuation agrees, and maximal.

Checked against the brute-force oracle (the `regex` module on the original pattern):
for forced text s at text t, each s[i] must be the only character that can follow
t + s[:i] (and t + s[:i] must not be complete), and after t + s either the text may
end or more than one character may follow.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_constrained_support import (
    TOKENIZER_KINDS,
    Oracle,
    make_compiler,
    make_vocab,
    regexes,
    walk_random,
)

from sgl.constrained.jump_forward import split_complete_utf8

HYPO = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_forced(pattern: str, kind: str, rng: random.Random, steps: int) -> None:
    vocab = make_vocab(kind)
    oracle = Oracle(pattern)
    m = make_compiler(kind).compile("regex", pattern).matcher()
    data = b""
    for _ in range(steps + 1):
        forced = m.forced_text()
        text, tail = split_complete_utf8(data)
        if tail:
            assert forced == "", (pattern, data)
        else:
            for i, ch in enumerate(forced):
                assert oracle.forced_char(text + forced[:i]) == ch, (pattern, text, forced, i)
            assert oracle.forced_char(text + forced) is None, (pattern, text, forced)
            assert m.copy().accept_text(forced)
        step = walk_random(m, vocab, rng, 1)
        if not step:
            break
        data += step


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
@HYPO
@given(pattern=regexes, rnd=st.randoms(use_true_random=False))
def test_forced_text_is_exact_and_maximal(kind: str, pattern: str, rnd: random.Random) -> None:
    check_forced(pattern, kind, rnd, steps=6)


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
@pytest.mark.parametrize(
    "pattern",
    [
        r"hello (world|wide) [0-9]{2}!",
        r"中文测试(一|二)",
        r"(?:abc){2}x?|abd",
        r'\{"k": "[a-z]+", "n": (?:1|2|10)\}',
        r"a{3,5}b",
    ],
)
def test_forced_text_examples(kind: str, pattern: str) -> None:
    for seed in range(4):
        check_forced(pattern, kind, random.Random(seed), steps=10)


def test_forced_text_spans_multibyte_and_waits_inside_a_character() -> None:
    vocab = make_vocab("byte_level")
    g = make_compiler("byte_level").compile("regex", "中文测试(一|二)")
    m = g.matcher()
    assert m.forced_text() == "中文测试"
    lead = vocab.token_bytes.index("中".encode()[:1])
    assert m.accept(lead)
    assert m.forced_text() == ""  # inside a character: nothing whole to offer
    assert m.accept_text("中".encode()[1:])
    assert m.forced_text() == "文测试"
    assert m.accept_text("文测试")
    assert m.forced_text() == ""  # 一 or 二: they share a lead byte, but not the character
    assert m.accept_text("二")
    assert m.forced_text() == "" and m.is_done()


def test_split_complete_utf8() -> None:
    s = "a中😀é"
    b = s.encode()
    for cut in range(len(b) + 1):
        text, tail = split_complete_utf8(b[:cut])
        assert (text.encode() + tail) == b[:cut]
        assert len(tail) < 4 and text == b[:cut].decode("utf-8", errors="ignore")
