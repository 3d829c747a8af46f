"""stop_regex's matcher against Python's `re.search`, over random texts cut into random
pieces (a piece is one token's text): it stops after the first piece whose text so far has
a match, the output is the text before the leftmost match, and nothing it emitted while
streaming is later taken back."""

from __future__ import annotations

import random
import re

import pytest

from sgl.runtime.errors import InvalidRequestError
from sgl.runtime.stop_regex import StopRegexMatcher, check_stop_regex

PATTERNS = [
    r"^ab",
    r"\n\n",
    r"END[0-9]{2,3}",
    r"a+b",
    r"(ab|b)c",
    r"x.{0,3}y",
    r"[A-Z][a-z]*\.",
    r"abc|c",
    r"xbcd|c",
    r"(a|b)*abb",
    r"\d+\s",
    r"(?i)end",
]
ALPHABET = "abcdxyENDAe.\n 0123"


def pieces_of(text: str, rng: random.Random) -> list[str]:
    if len(text) < 2:
        return [text] if text else []
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 8))))
    return [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]


def oracle(patterns: list[str], pieces: list[str]) -> tuple[int | None, str]:
    so_far = ""
    for k, piece in enumerate(pieces):
        so_far += piece
        hits = [m for m in (re.search(p, so_far, re.ASCII) for p in patterns) if m]
        if hits:
            return k, so_far[: min(m.start() for m in hits)]
    return None, so_far


@pytest.mark.parametrize("seed", range(4))
def test_matches_re_search_after_every_piece(seed):
    rng = random.Random(seed)
    for _ in range(800):
        patterns = rng.sample(PATTERNS, rng.randint(1, 2))
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 30)))
        pieces = pieces_of(text, rng)
        matcher, out, stopped = StopRegexMatcher(patterns), "", None
        for k, piece in enumerate(pieces):
            emitted, matched = matcher.feed(piece)
            out += emitted
            if matched:
                stopped = k
                break
        if stopped is None:
            out += matcher.flush()
        want_stop, want_out = oracle(patterns, pieces)
        assert (stopped, out) == (want_stop, want_out), (patterns, pieces)
        if matcher.matched:
            assert any(re.fullmatch(p, matcher.matched_text, re.ASCII) for p in patterns)


def test_no_stop_trim_keeps_the_whole_text_and_held_text_is_released():
    m = StopRegexMatcher([r"END[0-9]+"], no_stop_trim=True)
    assert m.feed("abc EN") == ("abc ", False)  # "EN" might begin a match: held back
    assert m.feed("D4 more") == ("END4 more", True) and m.matched_text == "END4"
    m = StopRegexMatcher([r"END[0-9]+"])
    assert m.feed("x EN") == ("x ", False)
    assert m.flush() == "EN"  # the request ended: nothing can match any more


@pytest.mark.parametrize(
    "pattern,why",
    [
        ("a*", "empty string"),
        ("x$", "end anchor"),
        ("(?<=a)b", "look"),
        (r"\bword", "boundar"),
        ("[", "invalid"),
        ("a{0,5000}", "too large"),
    ],
)
def test_patterns_it_cannot_run_are_refused(pattern, why):
    with pytest.raises(InvalidRequestError, match=why) as e:
        check_stop_regex(pattern)
    assert e.value.param == "stop_regex"
