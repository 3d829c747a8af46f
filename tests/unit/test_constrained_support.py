"""Shared fixtures for the constrained-decoding tests: tiny tokenizers and a brute-force oracle.

Nothing here depends on sgl.constrained's automata. The oracle decides membership with
the `regex` module's partial matching on Python-syntax patterns (``re.ASCII``
semantics), so masks, acceptance and jump-forward text are checked against a second,
independent regex engine, token by token over the whole vocabulary. Negated classes are
respelled as positive ranges first (:func:`oracle_pattern`): the module mis-matches
alternations of them.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
from collections.abc import Iterable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import regex as _rx  # noqa: E402
import torch  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from sgl.constrained import TokenVocabulary, allocate_bitmask, bitmask_to_bool  # noqa: E402

try:
    from re import _parser as _sre_p  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_p  # type: ignore[no-redef]

CORPUS = [
    'The quick brown fox jumps over the lazy dog. {"name": "Ann", "age": 42, "tags": ["a", "b"]}',
    "Café crème brûlée, naïve façade, résumé — déjà vu; Ångström, Zoë, Øresund. ¿Qué? ¡Sí!",
    "中文文本测试，你好世界。日本語のテキスト、こんにちは。한국어 텍스트 안녕하세요.",
    "Emoji: 😀 😃 🎉 👍🏽 🚀 and symbols ∑ ∫ √ ≤ ≥ € £ ¥. ∞ ≠ ±",
    "def f(x):\n    return x ** 2  # square\n\tindent\ttabs   spaces [1, 2, 3] {true, false, null}",
    '2024-01-31T12:30:00Z 555-123-4567 a@b.co 0.5 -17 3.14159e10 "quoted" back\\slash',
]
TEXT_ALPHABET = "".join(sorted(set("".join(CORPUS)))) + "Ωж🦀ẞ\x01\x7f"


def _corpus() -> Iterable[str]:
    for _ in range(30):
        yield from CORPUS


@functools.cache
def make_tokenizer(kind: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2 style) or a SentencePiece-style BPE with <0xNN> byte fallback."""
    if kind == "byte_level":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=900,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            show_progress=False,
        )
        tok.train_from_iterator(_corpus(), trainer)
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<|im_start|>",
            eos_token="<|im_end|>",
            unk_token="<|endoftext|>",
        )
    if kind == "sentencepiece":
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Sequence(
            [decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="always")]
        )
        trainer = trainers.BpeTrainer(
            vocab_size=400,
            limit_alphabet=60,
            special_tokens=["<unk>", "<s>", "</s>"],
            show_progress=False,
        )
        tok.train_from_iterator(_corpus(), trainer)
        data = json.loads(tok.to_str())
        vocab = data["model"]["vocab"]
        next_id = max(vocab.values()) + 1
        for b in range(256):
            vocab[f"<0x{b:02X}>"] = next_id
            next_id += 1
        tok = Tokenizer.from_str(json.dumps(data))
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
        )
    raise ValueError(kind)


TOKENIZER_KINDS = ["byte_level", "sentencepiece"]


@functools.cache
def make_vocab(kind: str) -> TokenVocabulary:
    tok = make_tokenizer(kind)
    # A model vocabulary larger than the tokenizer's, as real checkpoints have.
    return TokenVocabulary.from_tokenizer(tok, vocab_size=len(tok) + 5)


@functools.cache
def make_compiler(kind: str):
    from sgl.constrained import GrammarCompiler

    return GrammarCompiler(make_vocab(kind), cache_size=256)


def random_text(rng: random.Random, n: int) -> str:
    if rng.random() < 0.5:
        return "".join(rng.choice(TEXT_ALPHABET) for _ in range(n))
    doc = rng.choice(CORPUS)
    i = rng.randrange(len(doc))
    return doc[i : i + n]


# ---------------------------------------------------------------------------
# Masks as sets
# ---------------------------------------------------------------------------


def allowed_set(matcher, vocab: TokenVocabulary) -> set[int]:
    row = allocate_bitmask(1, vocab.vocab_size)
    matcher.fill_mask(row[0])
    return set(torch.nonzero(bitmask_to_bool(row, vocab.vocab_size)[0]).flatten().tolist())


# ---------------------------------------------------------------------------
# The brute-force oracle
# ---------------------------------------------------------------------------

_UTF8_RANGES = {2: (0x80, 0x7FF), 3: (0x800, 0xFFFF), 4: (0x10000, 0x10FFFF)}
_ASCII_CLASSES = ("0123456789", "azAZ__", " \t\n\r\f\v")


def _boundaries(pattern: str) -> list[int]:
    """Code points where the pattern's treatment of characters can change.

    Between two consecutive boundaries every character behaves alike (the pattern
    only names literals, ranges and ASCII classes), so one representative per
    interval decides "is there a character here that works".
    """
    points = {0, 2, 3, 0x80, 0x800, 0xD800, 0xE000, 0x10000, 0x110000, ord("\n"), ord("\n") + 1}
    for s in _ASCII_CLASSES:
        for c in s:
            points.update((ord(c), ord(c) + 1))
    for lo, hi in (("0", "9"), ("a", "z"), ("A", "Z")):
        points.update((ord(lo), ord(hi) + 1))

    def walk(items) -> None:
        for op, av in items:
            name = str(op)
            if name in ("LITERAL", "NOT_LITERAL"):
                points.update((av, av + 1))
                if chr(av).isascii() and chr(av).isalpha():  # case variants (IGNORECASE)
                    points.update((ord(chr(av).swapcase()), ord(chr(av).swapcase()) + 1))
            elif name == "IN":
                for sop, sav in av:
                    if str(sop) == "LITERAL":
                        points.update((sav, sav + 1))
                    elif str(sop) == "RANGE":
                        points.update((sav[0], sav[1] + 1))
            elif name == "BRANCH":
                for alt in av[1]:
                    walk(alt)
            elif name == "SUBPATTERN":
                walk(av[-1])
            elif name in ("MAX_REPEAT", "MIN_REPEAT"):
                walk(av[2])

    walk(_sre_p.parse(pattern))
    return sorted(p for p in points if p <= 0x10FFFF)


_CATEGORY_SETS = {
    "DIGIT": "0123456789",
    "WORD": "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_",
    "SPACE": " \t\n\r\f\v",
}  # ASCII semantics


def _class_ranges(op, av) -> list[tuple[int, int]] | None:
    """The code point ranges of a negated class item (None: not a negated item)."""
    chars: set[int] = set()
    if str(op) == "NOT_LITERAL":
        chars.add(av)
    elif str(op) == "IN" and av and str(av[0][0]) == "NEGATE":
        for sop, sav in av[1:]:
            name = str(sop)
            if name == "LITERAL":
                chars.add(sav)
            elif name == "RANGE":
                chars.update(range(sav[0], sav[1] + 1))
            elif name == "CATEGORY" and str(sav).split("_", 1)[1] in _CATEGORY_SETS:
                chars.update(map(ord, _CATEGORY_SETS[str(sav).split("_", 1)[1]]))
            elif name == "CATEGORY" and str(sav).startswith("CATEGORY_NOT_"):
                return None  # a negated category inside a negated class: left as it is
            else:
                return None
    elif (
        str(op) == "IN"
        and len(av) == 1
        and str(av[0][0]) == "CATEGORY"
        and str(av[0][1]).startswith("CATEGORY_NOT_")
    ):
        chars.update(map(ord, _CATEGORY_SETS[str(av[0][1])[len("CATEGORY_NOT_") :]]))
    else:
        return None
    out, start = [], 0
    for c in sorted(chars):
        if c > start:
            out.append((start, c - 1))
        start = c + 1
    if start <= 0x10FFFF:
        out.append((start, 0x10FFFF))
    return out


def _emit(items) -> str:
    """sre_parse items back to pattern text, negated classes spelled positively."""
    out = []
    for op, av in items:
        name, ranges = str(op), _class_ranges(op, av)
        if ranges is not None:
            out.append("[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges) + "]")
        elif name == "LITERAL":
            out.append(f"\\U{av:08x}")
        elif name == "ANY":
            out.append(".")
        elif name == "IN":
            parts = []
            for sop, sav in av:
                if str(sop) == "LITERAL":
                    parts.append(f"\\U{sav:08x}")
                elif str(sop) == "RANGE":
                    parts.append(f"\\U{sav[0]:08x}-\\U{sav[1]:08x}")
                else:  # a category
                    parts.append(
                        {"DIGIT": "\\d", "WORD": "\\w", "SPACE": "\\s"}[str(sav).split("_")[-1]]
                        if not str(sav).startswith("CATEGORY_NOT_")
                        else {"DIGIT": "\\D", "WORD": "\\W", "SPACE": "\\S"}[
                            str(sav).split("_")[-1]
                        ]
                    )
            out.append("[" + "".join(parts) + "]")
        elif name == "BRANCH":
            out.append("(?:" + "|".join(_emit(alt) for alt in av[1]) + ")")
        elif name == "SUBPATTERN":
            out.append("(?:" + _emit(av[-1]) + ")")
        elif name in ("MAX_REPEAT", "MIN_REPEAT"):
            lo, hi, sub = av
            out.append(
                "(?:" + _emit(sub) + ")" + f"{{{lo},{'' if hi == _sre_p.MAXREPEAT else hi}}}"
            )
        elif name == "AT":
            out.append(
                {
                    "AT_BEGINNING": "^",
                    "AT_BEGINNING_STRING": "\\A",
                    "AT_END": "$",
                    "AT_END_STRING": "\\Z",
                }[str(av)]
            )
        else:
            raise ValueError(f"oracle: construct {name} not handled")
    return "".join(out)


def oracle_pattern(pattern: str) -> str:
    """``pattern`` for the `regex` module, negated classes spelled as positive ranges: the
    module mis-matches alternations of negated classes (``(?:[^a]|[^0])`` matches nothing,
    2024.11 to 2026.11). Patterns with inline flags are kept as they are."""
    parsed = _sre_p.parse(pattern)
    if (
        parsed.state.flags
        & ~(_sre_p.SRE_FLAG_UNICODE if hasattr(_sre_p, "SRE_FLAG_UNICODE") else 0)
        & 0xFF
    ):
        return pattern
    try:
        return _emit(list(parsed))
    except (ValueError, KeyError):
        return pattern


class Oracle:
    """Membership questions about a Python-syntax regex, answered by brute force."""

    def __init__(self, pattern: str) -> None:
        self.pattern = _rx.compile(oracle_pattern(pattern), flags=_rx.ASCII)
        self.points = _boundaries(pattern)

    def reps(self, lo: int, hi: int) -> list[str]:
        """One character from each uniform interval meeting [lo, hi] (no surrogates)."""
        out = [lo] + [p for p in self.points if lo < p <= hi]
        return [chr(c) for c in out if not 0xD800 <= c <= 0xDFFF]

    # U+0002 is reserved by sgl.constrained (its automaton start marker): never generated.
    def partial(self, text: str) -> bool:
        return "\x02" not in text and self.pattern.fullmatch(text, partial=True) is not None

    def full(self, text: str) -> bool:
        return "\x02" not in text and self.pattern.fullmatch(text) is not None

    def is_prefix(self, data: bytes) -> bool:
        """Is ``data`` (bytes, maybe ending inside a character) a prefix of a member?"""
        text, tail = _split(data)
        if text is None:
            return False
        if not tail:
            return self.partial(text)
        span = _completions(tail)
        if span is None:
            return False
        return any(self.partial(text + c) for c in self.reps(*span))

    def next_chars(self, text: str) -> list[str]:
        """Representatives of the characters that can follow ``text`` in some member."""
        return [c for c in self.reps(0, 0x10FFFF) if self.partial(text + c)]

    def forced_char(self, text: str) -> str | None:
        """The only character that can follow ``text`` (None: several, none, or may stop)."""
        if self.full(text):
            return None
        nxt = self.next_chars(text)
        if len(nxt) != 1:
            return None
        c = ord(nxt[0])
        upper = next((p for p in self.points if p > c), 0x110000)
        return nxt[0] if upper == c + 1 else None  # its interval must be that one character

    def expected_mask(self, vocab: TokenVocabulary, data: bytes) -> set[int]:
        """The exact allowed set after ``data``: tokens that keep a prefix, EOS iff complete."""
        eos = set(vocab.eos_token_ids)
        out = {
            tid
            for tid, tb in enumerate(vocab.token_bytes)
            if tb and tid not in eos and self.is_prefix(data + tb)
        }
        text, tail = _split(data)
        if text is not None and not tail and self.full(text):
            out |= eos
        return out


def _split(data: bytes) -> tuple[str | None, bytes]:
    """(complete text, trailing bytes of an unfinished character); text None if invalid."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            text = data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        tail = data[cut:]
        if not tail:
            return text, b""
        need = (
            2
            if tail[0] >> 5 == 0b110
            else 3
            if tail[0] >> 4 == 0b1110
            else 4
            if tail[0] >> 3 == 0b11110
            else 0
        )
        if need > len(tail) and all(b & 0xC0 == 0x80 for b in tail[1:]):
            return text, tail
        return None, b""
    return None, b""


def _completions(tail: bytes) -> tuple[int, int] | None:
    """Code points whose UTF-8 encoding starts with ``tail`` (an unfinished sequence), as a
    range."""
    lead = tail[0]
    need = 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4
    value = lead & (0x7F >> need)
    for b in tail[1:]:
        value = (value << 6) | (b & 0x3F)
    free = 6 * (need - len(tail))
    lo, hi = value << free, (value << free) | ((1 << free) - 1)
    vlo, vhi = _UTF8_RANGES[need]
    lo, hi = max(lo, vlo), min(hi, vhi)
    if lo > hi:
        return None
    if need == 3 and 0xD800 <= lo and hi <= 0xDFFF:
        return None
    return lo, hi


def walk_random(
    matcher, vocab: TokenVocabulary, rng: random.Random, steps: int, *, prefer: bytes = b""
) -> bytes:
    """Accept up to ``steps`` random allowed non-EOS tokens; returns the bytes accepted."""
    out = b""
    eos = set(vocab.eos_token_ids)
    for _ in range(steps):
        allowed = sorted(allowed_set(matcher, vocab) - eos)
        if not allowed:
            break
        if prefer and rng.random() < 0.5:
            good = [t for t in allowed if any(c in vocab.token_bytes[t] for c in prefer)]
            allowed = good or allowed
        tid = rng.choice(allowed)
        assert matcher.accept(tid)
        out += vocab.token_bytes[tid]
    return out


# ---------------------------------------------------------------------------
# A generator of small regexes (Python syntax)
# ---------------------------------------------------------------------------

CHARS = [
    "a",
    "b",
    "c",
    "x",
    "0",
    "1",
    "9",
    " ",
    ".",
    "-",
    '"',
    "\\",
    "é",
    "ж",
    "中",
    "😀",
    "\n",
    "_",
]


def _esc(c: str) -> str:
    return re.escape(c) if c != "\n" else "\\n"


_literal = st.sampled_from(CHARS).map(_esc)
_shorthand = st.sampled_from(["\\d", "\\w", "\\s", "\\D", "."])


@st.composite
def _char_class(draw) -> str:
    items = []
    for _ in range(draw(st.integers(1, 3))):
        a, b = sorted(draw(st.sampled_from(CHARS)) for _ in range(2))
        items.append(_esc(a) if draw(st.booleans()) or a == b else f"{_esc(a)}-{_esc(b)}")
    if draw(st.integers(0, 4)) == 0:
        items.append(draw(st.sampled_from(["\\d", "\\w"])))
    neg = "^" if draw(st.integers(0, 3)) == 0 else ""
    return f"[{neg}{''.join(items)}]"


def _extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    quant = st.sampled_from(["?", "*", "+", "{2}", "{0,2}", "{1,3}", "{2,}"])
    return st.one_of(
        st.lists(children, min_size=2, max_size=3).map("".join),
        st.lists(children, min_size=2, max_size=3).map(lambda xs: "(?:" + "|".join(xs) + ")"),
        st.tuples(children, quant).map(lambda t: f"(?:{t[0]}){t[1]}"),
    )


regexes = st.recursive(
    st.one_of(_literal, _literal, _char_class(), _shorthand), _extend, max_leaves=6
)
