"""Character sets and canonical regex text: the algebra regex patterns are built in.

:class:`CharSet` is a set of Unicode scalar values kept as sorted, disjoint ranges;
:class:`Rx` is regex text in the *canonical* syntax (literal characters, explicit
character classes, ``(?:..)``, ``|`` and counted repetition) that outlines-core,
interegular and Python's ``re`` all read alike, carrying the same language as an EBNF
AST node for the grammar route. The ``rx_*`` builders treat None as the empty language.
It is apart from the parser (:mod:`.normalize`) because the JSON Schema translator writes
its patterns in this algebra directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sgl.constrained import ebnf_parse as _ast

__all__ = [
    "CharSet",
    "EMPTY",
    "MAX_CP",
    "Rx",
    "rx_alt",
    "rx_cat",
    "rx_lit",
    "rx_ref",
    "rx_rep",
    "rx_set",
]

# ---------------------------------------------------------------------------
# Character sets: sorted, disjoint, inclusive code-point ranges, never surrogates
# ---------------------------------------------------------------------------

MAX_CP = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)


class CharSet:
    """An immutable set of Unicode scalar values (surrogates are never members)."""

    __slots__ = ("ranges",)

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        merged: list[list[int]] = []
        for lo, hi in sorted(ranges):
            if lo > hi:
                continue
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        out: list[tuple[int, int]] = []
        for lo, hi in merged:  # cut the surrogate block out
            if hi < _SURROGATES[0] or lo > _SURROGATES[1]:
                out.append((lo, hi))
                continue
            if lo < _SURROGATES[0]:
                out.append((lo, _SURROGATES[0] - 1))
            if hi > _SURROGATES[1]:
                out.append((_SURROGATES[1] + 1, hi))
        self.ranges: tuple[tuple[int, int], ...] = tuple(out)

    @classmethod
    def of(cls, chars: str) -> CharSet:
        return cls((ord(c), ord(c)) for c in chars)

    @classmethod
    def full(cls) -> CharSet:
        return cls([(0, MAX_CP)])

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharSet) and self.ranges == other.ranges

    def __hash__(self) -> int:
        return hash(self.ranges)

    def __contains__(self, ch: str | int) -> bool:
        cp = ord(ch) if isinstance(ch, str) else ch
        return any(lo <= cp <= hi for lo, hi in self.ranges)

    def __or__(self, other: CharSet) -> CharSet:
        return CharSet(self.ranges + other.ranges)

    def complement(self) -> CharSet:
        out: list[tuple[int, int]] = []
        nxt = 0
        for lo, hi in self.ranges:
            if lo > nxt:
                out.append((nxt, lo - 1))
            nxt = hi + 1
        if nxt <= MAX_CP:
            out.append((nxt, MAX_CP))
        return CharSet(out)

    def __and__(self, other: CharSet) -> CharSet:
        return (self.complement() | other.complement()).complement()

    def __sub__(self, other: CharSet) -> CharSet:
        return self & other.complement()

    def single(self) -> str | None:
        """The only member, if there is exactly one."""
        if len(self.ranges) == 1 and self.ranges[0][0] == self.ranges[0][1]:
            return chr(self.ranges[0][0])
        return None

    def ascii_casefold(self) -> CharSet:
        """Add the other case of every ASCII letter (``re.ASCII | re.IGNORECASE``)."""
        extra: list[tuple[int, int]] = []
        for lo, hi in self.ranges:
            for a, b, delta in ((0x41, 0x5A, 32), (0x61, 0x7A, -32)):
                s, e = max(lo, a), min(hi, b)
                if s <= e:
                    extra.append((s + delta, e + delta))
        return CharSet(self.ranges + tuple(extra)) if extra else self

    def __repr__(self) -> str:
        return f"CharSet({self.ranges!r})"


# ---------------------------------------------------------------------------
# Canonical regex text: a tiny algebra where None is the empty language
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Rx:
    """Regex text in the canonical syntax.

    ``atom``: one character or class, safe to quantify as is; ``alt``: has a
    top-level ``|``, so it needs a group before anything is appended to it.
    ``size`` bounds the automaton's length (see :data:`MAX_POSITIONS`).
    """

    text: str
    atom: bool = False
    alt: bool = False
    size: int = 0  # character positions on the longest path, bounded repeats unrolled
    node: Any = None  # the same language as an EBNF AST expression (``ebnf_parse``), for grammars
    ref: bool = False  # contains a rule reference: grammar-only, ``text`` is not a usable regex


EMPTY = Rx("", node=_ast.Lit(""))  # matches only ""


def rx_ref(name: str) -> Rx:
    """A reference to grammar rule ``name`` (grammars only: no regex can say it)."""
    return Rx(f"\x00{name}\x00", atom=True, node=_ast.Ref(name, 0, 0), ref=True)


def _escape_char(c: str) -> str:
    """One character, spelled so that outlines-core, interegular and Python agree.

    Unprintable Latin-1 characters are ``\\xHH``; ASCII punctuation is backslash-escaped
    (valid in and out of classes for all three), except ``<`` and ``>`` which regex-automata reads
    as word boundaries when escaped; everything else, non-ASCII included, is literal.
    """
    cp = ord(c)
    if cp < 0x100 and not c.isprintable():
        return f"\\x{cp:02x}"
    if cp < 0x80 and not c.isalnum() and c not in " <>":
        return "\\" + c
    return c


def rx_lit(s: str) -> Rx:
    """A literal string."""
    if not s:
        return EMPTY
    return Rx("".join(_escape_char(c) for c in s), atom=len(s) == 1, size=len(s), node=_ast.Lit(s))


_RESERVED = CharSet.of("\x02")  # the index's start marker (see :mod:`.index`)


def rx_set(cs: CharSet) -> Rx | None:
    """One character from ``cs`` (None if ``cs`` is empty). U+0002 is never included."""
    cs = cs - _RESERVED
    if not cs:
        return None
    one = cs.single()
    if one is not None:
        return rx_lit(one)

    def body(ranges: Sequence[tuple[int, int]]) -> str:
        # Ranges that only the surrogate block separates are merged: the pattern may
        # not contain a surrogate, and no text ever does, so spanning them is free.
        joined: list[list[int]] = []
        for lo, hi in ranges:
            if joined and joined[-1][1] == _SURROGATES[0] - 1 and lo == _SURROGATES[1] + 1:
                joined[-1][1] = hi
            else:
                joined.append([lo, hi])
        parts = []
        for lo, hi in joined:
            a = _escape_char(chr(lo))
            if lo == hi:
                parts.append(a)
            elif hi == lo + 1:
                parts.append(a + _escape_char(chr(hi)))
            else:
                parts.append(f"{a}-{_escape_char(chr(hi))}")
        return "".join(parts)

    node = _ast.CharSet(cs.ranges)
    comp = cs.complement()
    if comp and len(comp.ranges) < len(cs.ranges):
        return Rx(f"[^{body(comp.ranges)}]", atom=True, size=1, node=node)
    return Rx(f"[{body(cs.ranges)}]", atom=True, size=1, node=node)


def rx_cat(*parts: Rx | None) -> Rx | None:
    """Concatenation; None (empty language) if any part is None."""
    if any(p is None for p in parts):
        return None
    real = [p for p in parts if p is not None and p.text]
    if not real:
        return EMPTY
    if len(real) == 1:
        return real[0]
    return Rx(
        "".join(f"(?:{p.text})" if p.alt else p.text for p in real),
        size=sum(p.size for p in real),
        node=_ast.Seq(tuple(p.node for p in real)),
        ref=any(p.ref for p in real),
    )


def rx_alt(*parts: Rx | None) -> Rx | None:
    """Alternation; drops empty-language branches, and folds an "" branch into ``?``."""
    seen: dict[str, Rx] = {}
    has_empty = False
    for p in parts:
        if p is None:
            continue
        if not p.text:
            has_empty = True
        else:
            seen.setdefault(p.text, p)
    if not seen:
        return EMPTY if has_empty else None
    if len(seen) == 1:
        body = next(iter(seen.values()))
    else:
        body = Rx(
            "|".join(seen),
            alt=True,
            size=max(p.size for p in seen.values()),
            node=_ast.Alt(tuple(p.node for p in seen.values())),
            ref=any(p.ref for p in seen.values()),
        )
    if has_empty:
        return rx_rep(body, 0, 1)
    return body


def _group(p: Rx) -> str:
    return p.text if p.atom else f"(?:{p.text})"


def rx_rep(p: Rx | None, lo: int, hi: int | None) -> Rx | None:
    """``p{lo,hi}`` (``hi`` None: unbounded)."""
    if hi is not None and hi < lo:
        return None
    if p is None:
        return EMPTY if lo == 0 else None
    if not p.text or hi == 0:
        return EMPTY
    if lo == 1 and hi == 1:
        return p
    g = _group(p)
    if hi is None:
        q = "*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}"
    elif lo == 0 and hi == 1:
        q = "?"
    elif lo == hi:
        q = f"{{{lo}}}"
    else:
        q = f"{{{lo},{hi}}}"
    return Rx(
        g + q,
        atom=False,
        size=p.size * (max(lo, 1) if hi is None else hi),
        node=_ast.Repeat(p.node, lo, hi),
        ref=p.ref,
    )
