r"""Regular expressions -> exact token-level matchers, on outlines-core's Rust index.

Two halves:

1. **Normalisation** (:func:`normalize_regex`). The user's pattern is parsed with
   Python's own regex parser and re-emitted in a small *canonical* syntax: literal
   characters, explicit character classes, ``(?:..)``, ``|`` and counted repetition.
   Three engines read that one string (outlines-core's byte DFA for masks,
   interegular for JSON Schema ``oneOf`` proofs, and Python's ``re`` for tests), and
   they disagree on the rest of regex syntax (``\d`` is Unicode in one and ASCII in
   another, ``\u00e9`` is an error in one). Semantics are Python's ``re`` with
   ``re.ASCII``: ``\d \w \s`` and case-insensitivity are ASCII-only, ``.`` excludes
   ``\n`` unless ``(?s)``. Anchors (``^ $ \A \Z``) are accepted at the ends, where
   they mean nothing under full-match semantics. Look-around, back-references,
   word boundaries, atomic groups and possessive repeats are rejected.

2. **Token index** (:class:`RegexGrammar`). outlines-core 0.2.14 builds the map
   ``state -> {token: next state}`` in Rust, but its walk has two bugs that make
   masks too strict: it drops a token whose last byte leaves an accepting position
   without completing a new match (after ``a`` in ``a(bc)?`` the token ``b`` is
   missing), and its leftmost-first DFA abandons longer alternatives once a shorter
   one has matched (``a|ab`` never allows ``ab``). Both come from match states
   appearing *inside* a token. We compile ``\x02(?:R)\z`` instead: ``\z`` moves every
   match to the end of input, so no token ever sees a match state, and the ``\x02``
   marker (fed once through a private token id) gives the DFA a start state that the
   look-ahead does not split. Acceptance is then exactly outlines' final states.
   outlines also determinises the *unanchored* search DFA, which is exponential for
   patterns like ``x.{0,30}`` once matches cannot end early; because U+0002 is
   removed from every character class (it is never generated), a search can only
   start at the marker and that DFA stays as small as the anchored one.

Masks are packed per automaton state (at compile time for grammars of up to
:data:`EAGER_MASK_STATES` states, else on first use) and cached on the grammar, so
``fill_mask`` is one 6 KB OR for a 49k vocabulary.

Size: outlines keeps a token map per automaton state (about 0.5 MB and 7 ms per
state of a broad class at 49k tokens), so a constraint may have at most
:data:`MAX_POSITIONS` character positions on its longest path, bounded repetitions
unrolled (``.{0,1000}`` has 1000). Larger ones are rejected with a GrammarError
that says so, instead of taking seconds and gigabytes.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np
import torch

from sgl.constrained import ebnf_parse as _ast
from sgl.constrained.errors import ConstraintTooLarge, GrammarError
from sgl.constrained.jump_forward import ByteJumpForward, single_byte_tokens, split_complete_utf8

if TYPE_CHECKING:
    from sgl.constrained.isolation import IndexBuilder
    from sgl.constrained.vocab import TokenVocabulary

try:  # Python >= 3.11
    from re import _constants as _sre_c  # type: ignore[attr-defined]
    from re import _parser as _sre_p  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_c  # type: ignore[no-redef]
    import sre_parse as _sre_p  # type: ignore[no-redef]

__all__ = [
    "CharSet",
    "MAX_POSITIONS",
    "Rx",
    "RegexGrammar",
    "RegexMatcher",
    "check_size",
    "normalize_regex",
    "translate_regex",
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
    def of(cls, chars: str) -> "CharSet":
        return cls((ord(c), ord(c)) for c in chars)

    @classmethod
    def full(cls) -> "CharSet":
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

    def __or__(self, other: "CharSet") -> "CharSet":
        return CharSet(self.ranges + other.ranges)

    def complement(self) -> "CharSet":
        out: list[tuple[int, int]] = []
        nxt = 0
        for lo, hi in self.ranges:
            if lo > nxt:
                out.append((nxt, lo - 1))
            nxt = hi + 1
        if nxt <= MAX_CP:
            out.append((nxt, MAX_CP))
        return CharSet(out)

    def __and__(self, other: "CharSet") -> "CharSet":
        return (self.complement() | other.complement()).complement()

    def __sub__(self, other: "CharSet") -> "CharSet":
        return self & other.complement()

    def single(self) -> str | None:
        """The only member, if there is exactly one."""
        if len(self.ranges) == 1 and self.ranges[0][0] == self.ranges[0][1]:
            return chr(self.ranges[0][0])
        return None

    def ascii_casefold(self) -> "CharSet":
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


_DIGIT = CharSet([(0x30, 0x39)])
_WORD = CharSet([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
_SPACE = CharSet.of(" \t\n\r\f\v")
_NEWLINE = CharSet.of("\n")

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
    (valid in and out of classes for all three), except ``<`` and ``>`` which regex-automata reads as word
    boundaries when escaped; everything else, non-ASCII included, is literal.
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


_RESERVED = CharSet.of("\x02")  # the start marker (see the module docstring)


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
    return Rx("".join(f"(?:{p.text})" if p.alt else p.text for p in real), size=sum(p.size for p in real),
              node=_ast.Seq(tuple(p.node for p in real)), ref=any(p.ref for p in real))


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
        body = Rx("|".join(seen), alt=True, size=max(p.size for p in seen.values()),
                  node=_ast.Alt(tuple(p.node for p in seen.values())), ref=any(p.ref for p in seen.values()))
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
    return Rx(g + q, atom=False, size=p.size * (max(lo, 1) if hi is None else hi), node=_ast.Repeat(p.node, lo, hi),
              ref=p.ref)


# ---------------------------------------------------------------------------
# Python regex syntax -> canonical regex
# ---------------------------------------------------------------------------

CharEmitter = Callable[[CharSet], "Rx | None"]

_OP = _sre_c  # opcode constants live in the constants module
_CATEGORIES = {
    _OP.CATEGORY_DIGIT: _DIGIT,
    _OP.CATEGORY_WORD: _WORD,
    _OP.CATEGORY_SPACE: _SPACE,
}
_NOT_CATEGORIES = {
    _OP.CATEGORY_NOT_DIGIT: _DIGIT,
    _OP.CATEGORY_NOT_WORD: _WORD,
    _OP.CATEGORY_NOT_SPACE: _SPACE,
}
_START_ANCHORS = {_OP.AT_BEGINNING, _OP.AT_BEGINNING_STRING}
_END_ANCHORS = {_OP.AT_END, _OP.AT_END_STRING}
_UNSUPPORTED = {
    "ASSERT": "look-ahead/look-behind assertions",
    "ASSERT_NOT": "negative look-ahead/look-behind assertions",
    "GROUPREF": "back-references",
    "GROUPREF_EXISTS": "conditional groups",
    "ATOMIC_GROUP": "atomic groups",
    "POSSESSIVE_REPEAT": "possessive repeats",
}


@dataclass
class _Ctx:
    emit: CharEmitter
    param: str
    what: str  # how to name the pattern in errors
    search: bool  # JSON Schema `pattern`: anchors only at the outermost ends


def translate_regex(
    pattern: str, *, param: str = "regex", emit: CharEmitter | None = None, search: bool = False, what: str = "regex",
    length: tuple[int, int | None] | None = None, pad: Rx | None = None,
) -> tuple[Rx | None, bool, bool]:
    """Parse a Python-syntax regex and re-emit it in canonical syntax.

    ``emit`` turns each character set into regex text (JSON Schema uses it to spell
    characters the way they appear inside a JSON string). Returns
    ``(rx, anchored_start, anchored_end)``; the anchor flags matter only for
    ``search=True`` (JSON Schema patterns, which match anywhere unless anchored).
    ``length`` (min, max characters) intersects the language with those lengths, for
    the patterns :func:`_fold_length` can rewrite; others raise GrammarError. ``pad`` (any
    text, in the caller's spelling) lets a search pattern whose top-level alternatives carry
    their own anchors (``^a|b$``) be padded branch by branch: it then comes back anchored.
    """
    if not isinstance(pattern, str):
        raise GrammarError(f"{what} must be a string, got {type(pattern).__name__}", param)
    try:
        with warnings.catch_warnings():  # "possible set intersection" and friends
            warnings.simplefilter("ignore", FutureWarning)
            parsed = _sre_p.parse(pattern, 0)
    except Exception as exc:  # re.error, RecursionError, OverflowError
        raise GrammarError(f"invalid {what} {pattern!r}: {exc}", param) from None
    flags = parsed.state.flags
    if flags & _OP.SRE_FLAG_LOCALE:
        raise GrammarError(f"{what}: the LOCALE flag is not supported", param)
    ctx = _Ctx(emit=emit or rx_set, param=param, what=what, search=search)
    items = list(parsed)
    if search and len(items) == 1 and items[0][0] is _OP.SUBPATTERN and not (items[0][1][1] | items[0][1][2]):
        items = list(items[0][1][3])  # "(^...$)": the group changes nothing
    start = end = False
    if search:
        items, start, end = _strip_anchors(items)
    if search and pad is not None and length is None and len(items) == 1 and items[0][0] is _OP.BRANCH:
        # "^a|b$", "^(A)$|^(B)$" (Python moves the shared "^" out of the branches)
        branches = [_strip_anchors(list(alt)) for alt in items[0][1][1]]
        if any(s or e for _, s, e in branches):
            try:
                parts = [rx_cat(EMPTY if s or start else pad, _seq(ctx, alt, flags, head=False, tail=False),
                                EMPTY if e or end else pad) for alt, s, e in branches]
            except RecursionError:
                raise GrammarError(f"{what} is nested too deeply", param) from None
            return rx_alt(*parts), True, True
    try:
        if length is None:
            rx = _seq(ctx, items, flags, head=not search, tail=not search)
        else:
            if search and not (start and end):
                raise GrammarError(f"{what}: a length bound (minLength/maxLength) needs the pattern anchored "
                                  "at both ends (^...$)", param)
            variants = _fold_length(parsed.state, items, *length)
            if variants is None:
                raise GrammarError(
                    f"{what}: cannot combine this pattern with minLength/maxLength (supported: one variable-length "
                    "run of single characters, plus short optional parts); put the length in the pattern", param)
            rx = rx_alt(*(_seq(ctx, v, flags, head=not search, tail=not search) for v in variants))
    except RecursionError:
        raise GrammarError(f"{what} is nested too deeply", param) from None
    return rx, start, end


def _strip_anchors(items: list) -> tuple[list, bool, bool]:
    """``items`` without a leading ^ / \\A and a trailing $ / \\Z, and whether each was there."""
    start = end = False
    if items and items[0][0] is _OP.AT and items[0][1] in _START_ANCHORS:
        items, start = items[1:], True
    if items and items[-1][0] is _OP.AT and items[-1][1] in _END_ANCHORS:
        items, end = items[:-1], True
    return items, start, end


_FOLD_VARIANTS = 64  # length fold: combinations of the short variable parts' lengths


def _fold_length(state: Any, items: list, lo: int, hi: int | None) -> list[list] | None:
    """The sequence ``items`` restricted to lengths ``lo..hi``, as a few sequences of
    which each has at most one variable-length part, a repeat of one character: fixing
    the counts of the other (short) variable repeats, its bounds absorb the rest. None
    when the pattern has another shape. Exact: it rewrites the language, never guesses."""
    widths = [_sre_p.SubPattern(state, [it]).getwidth() for it in items]
    wmin, wmax = sum(w[0] for w in widths), sum(w[1] for w in widths)
    if wmin >= lo and (hi is None or (wmax < _OP.MAXREPEAT and wmax <= hi)):
        return [items]  # the bounds cannot bind
    variable = [i for i, w in enumerate(widths) if w[0] != w[1]]
    wide = [i for i in variable if _char_repeat(state, items[i]) and (widths[i][1] - widths[i][0] > 8)]
    if len(wide) > 1:
        return None
    if not wide:  # all short: the widest single-character repeat absorbs
        wide = [i for i in variable if _char_repeat(state, items[i])][-1:]
        if not wide:
            return None
    w = wide[0]
    short = [i for i in variable if i != w]
    choices: list[list[int]] = []
    for i in short:
        op, (rlo, rhi, sub) = items[i]
        if op not in (_OP.MAX_REPEAT, _OP.MIN_REPEAT) or rhi - rlo > 8:
            return None
        sw = _sre_p.SubPattern(state, list(sub)).getwidth()
        if sw[0] != sw[1]:
            return None
        choices.append(list(range(rlo, rhi + 1)))
    combos = [[]]
    for c in choices:
        combos = [x + [n] for x in combos for n in c]
        if len(combos) > _FOLD_VARIANTS:
            return None
    op, (rlo, rhi, sub) = items[w]
    variants = []
    for combo in combos:
        seq = list(items)
        for i, n in zip(short, combo):
            seq[i] = (items[i][0], (n, n, items[i][1][2]))
        fixed = sum(_sre_p.SubPattern(state, [it]).getwidth()[0] for j, it in enumerate(seq) if j != w)
        new_lo = max(rlo, lo - fixed)
        new_hi = rhi if hi is None else min(rhi, hi - fixed)
        if new_lo <= new_hi:
            seq[w] = (op, (new_lo, new_hi, sub))
            variants.append(seq)
    return variants


def _char_repeat(state: Any, item: tuple) -> bool:
    """A repeat of something exactly one character wide."""
    op, av = item
    return op in (_OP.MAX_REPEAT, _OP.MIN_REPEAT) and _sre_p.SubPattern(state, list(av[2])).getwidth() == (1, 1)


def normalize_regex(pattern: str, *, param: str = "regex") -> Rx | None:
    """A user regex (full-match semantics) in canonical syntax; None if it matches nothing."""
    return translate_regex(pattern, param=param)[0]


def _seq(ctx: _Ctx, items: list, flags: int, head: bool, tail: bool) -> Rx | None:
    # An element is at the head (tail) if only start (end) anchors separate it from that end.
    last_body = len(items) - 1
    while last_body >= 0 and items[last_body][0] is _OP.AT and items[last_body][1] in _END_ANCHORS:
        last_body -= 1
    parts: list[Rx | None] = []
    for i, (op, av) in enumerate(items):
        parts.append(_item(ctx, op, av, flags, head, tail and i >= last_body))
        if parts[-1] is None:
            return None
        head = head and op is _OP.AT and av in _START_ANCHORS
    return rx_cat(*parts)


def _charset_of(ctx: _Ctx, op, av, flags: int) -> CharSet:
    if op is _OP.LITERAL:
        cs = CharSet([(av, av)])
    elif op is _OP.NOT_LITERAL:
        cs = CharSet([(av, av)])
        if flags & _OP.SRE_FLAG_IGNORECASE:
            cs = cs.ascii_casefold()
        return cs.complement()
    elif op is _OP.ANY:
        return CharSet.full() if flags & _OP.SRE_FLAG_DOTALL else _NEWLINE.complement()
    else:  # IN
        negate = False
        ranges: list[CharSet] = []
        for sop, sav in av:
            if sop is _OP.NEGATE:
                negate = True
            elif sop is _OP.LITERAL:
                ranges.append(CharSet([(sav, sav)]))
            elif sop is _OP.RANGE:
                ranges.append(CharSet([sav]))
            elif sop is _OP.CATEGORY:
                if sav in _CATEGORIES:
                    ranges.append(_CATEGORIES[sav])
                elif sav in _NOT_CATEGORIES:
                    ranges.append(_NOT_CATEGORIES[sav].complement())
                else:
                    raise GrammarError(f"{ctx.what}: character category {sav} is not supported", ctx.param)
            else:
                raise GrammarError(f"{ctx.what}: class item {sop} is not supported", ctx.param)
        cs = CharSet()
        for r in ranges:
            cs = cs | r
        if flags & _OP.SRE_FLAG_IGNORECASE:
            cs = cs.ascii_casefold()
        return cs.complement() if negate else cs
    if flags & _OP.SRE_FLAG_IGNORECASE:
        cs = cs.ascii_casefold()
    return cs


def _item(ctx: _Ctx, op, av, flags: int, head: bool, tail: bool) -> Rx | None:
    name = str(op)
    if op in (_OP.LITERAL, _OP.NOT_LITERAL, _OP.ANY, _OP.IN):
        return ctx.emit(_charset_of(ctx, op, av, flags))
    if op is _OP.BRANCH:
        return rx_alt(*(_seq(ctx, list(alt), flags, head, tail) for alt in av[1]))
    if op is _OP.SUBPATTERN:
        _group_id, add, delete, sub = av
        if (add | delete) & _OP.SRE_FLAG_LOCALE:
            raise GrammarError(f"{ctx.what}: the LOCALE flag is not supported", ctx.param)
        return _seq(ctx, list(sub), (flags | add) & ~delete, head, tail)
    if op in (_OP.MAX_REPEAT, _OP.MIN_REPEAT):  # laziness does not change the language
        lo, hi, sub = av
        body = _seq(ctx, list(sub), flags, head=False, tail=False)
        return rx_rep(body, lo, None if hi is _OP.MAXREPEAT else hi)
    if op is _OP.AT:
        if (av in _START_ANCHORS and head) or (av in _END_ANCHORS and tail):
            return EMPTY
        if ctx.search and (av in _START_ANCHORS or av in _END_ANCHORS):
            raise GrammarError(
                f"{ctx.what}: anchors (^, $, \\A, \\Z) are only supported as the first and last character", ctx.param
            )
        raise GrammarError(
            f"{ctx.what}: anchors (^, $, \\A, \\Z) are only supported at the start and end of the pattern, "
            f"and word boundaries (\\b, \\B) not at all",
            ctx.param,
        )
    for key, desc in _UNSUPPORTED.items():
        if getattr(_OP, key, None) is op:
            raise GrammarError(f"{ctx.what}: {desc} are not supported", ctx.param)
    raise GrammarError(f"{ctx.what}: construct {name} is not supported", ctx.param)


# ---------------------------------------------------------------------------
# Token index over outlines-core
# ---------------------------------------------------------------------------

MAX_POSITIONS = 2048
EAGER_MASK_STATES = 4096  # grammars up to this many states get all masks at compile time (6 KB each at 49k)


def check_size(rx: Rx, param: str, what: str) -> None:
    """Reject constraints whose automaton would be too big to build quickly."""
    if rx.size > MAX_POSITIONS:
        raise ConstraintTooLarge(
            f"{what} is too large to compile: {rx.size} character positions on its longest path after "
            f"expanding bounded repetitions (the limit is {MAX_POSITIONS}); lower the repetition bounds "
            "(maxLength, maxItems, {m,n})",
            param,
        )


_MARK = b"\x02"  # start marker fed through a private token id (see the module docstring)
_DONE = -1  # automaton state after EOS


@dataclass(frozen=True, eq=False)
class _IndexVocab:
    """outlines-core's view of a vocabulary, with the facts jump-forward and budgets use."""

    vocabulary: object  # outlines_core.Vocabulary
    by_bytes: dict[bytes, list[int]]  # what it was built from (an isolated builder rebuilds it)
    mark_id: int  # private id of the start marker (>= vocab_size: never in a mask)
    byte_tokens: dict[int, int]  # byte -> id of a token that is exactly that byte
    orphan_tokens: dict[int, list[int]]  # first byte -> tokens, for bytes without a single-byte token

    @property
    def token_set(self) -> set[bytes]:
        return self.by_bytes.keys()  # type: ignore[return-value]

    @functools.cached_property
    def max_token_len(self) -> int:
        return max((len(b) for b in self.by_bytes), default=1)


_IVOCAB_CACHE: "weakref.WeakKeyDictionary[TokenVocabulary, _IndexVocab]" = weakref.WeakKeyDictionary()
_IVOCAB_LOCK = threading.Lock()


def index_vocab(vocab: "TokenVocabulary") -> _IndexVocab:
    """outlines-core's Vocabulary for ``vocab`` (built once per vocabulary)."""
    with _IVOCAB_LOCK:
        hit = _IVOCAB_CACHE.get(vocab)
        if hit is not None:
            return hit
        from outlines_core import Vocabulary

        eos = set(vocab.eos_token_ids)
        texts = [(tid, data) for tid, data in enumerate(vocab.token_bytes) if data and tid not in eos]
        by_bytes: dict[bytes, list[int]] = {}
        for tid, data in texts:
            by_bytes.setdefault(data, []).append(tid)
        mark_id = vocab.vocab_size
        by_bytes.setdefault(_MARK, []).append(mark_id)
        singles, orphans = single_byte_tokens(texts)
        # outlines wants an EOS id of its own; give it a private one it never reports to us.
        ivocab = _IndexVocab(Vocabulary(vocab.vocab_size + 1, by_bytes), by_bytes, mark_id, singles, orphans)
        _IVOCAB_CACHE[vocab] = ivocab
        return ivocab


class RegexGrammar:
    """A regex compiled against one vocabulary: immutable, shared by all its requests."""

    def __init__(self, kind: str, spec: str, regex: str, vocab: "TokenVocabulary", *, param: str = "regex",
                 builder: "IndexBuilder | None" = None, build_timeout_s: float | None = None) -> None:
        """``builder``: build the index in its capped child process (the engine's choice;
        ``build_timeout_s`` lowers its time limit); None builds it here, unbounded (tests,
        trusted constraints)."""
        from outlines_core import Index

        self.kind = kind
        self.spec = spec
        self.regex = regex  # canonical form (what the automata were built from)
        self.vocab = vocab
        ivocab = index_vocab(vocab)
        self._ivocab = ivocab
        pattern = f"\\x02(?:{regex})\\z"
        try:
            if builder is not None:
                self._index = builder.build(pattern, param, timeout_s=build_timeout_s)
            else:
                self._index = Index(pattern, ivocab.vocabulary)
        except GrammarError:
            raise
        except ValueError as exc:
            msg = str(exc)
            if "incompatible" in msg:
                raise GrammarError(
                    f"{param}: this model's vocabulary cannot spell text the constraint requires ({msg})", param
                ) from None
            raise GrammarError(f"{param}: cannot compile the constraint: {msg}", param) from None
        start = self._index.get_next_state(self._index.get_initial_state(), ivocab.mark_id)
        if start is None:  # pragma: no cover - the marker is always a token
            raise GrammarError(f"{param}: cannot compile the constraint", param)
        self._start: int = start
        self._eos = frozenset(vocab.eos_token_ids)
        self._eos_list = np.array(sorted(self._eos), dtype=np.int64)
        self._num_words = vocab.num_words
        self._masks: dict[int, torch.Tensor] = {}
        self._has_text: dict[int, bool] = {}
        self._finals = frozenset(self._index.get_final_states())
        bits = np.zeros(self._num_words * 32, dtype=bool)
        bits[self._eos_list] = True
        self._eos_mask = torch.from_numpy(_pack(bits))
        self.jump = ByteJumpForward(
            self._index.get_next_state, self._finals.__contains__, ivocab.byte_tokens, ivocab.orphan_tokens
        )
        # Every state reachable by bytes; with single-byte tokens for all bytes, that is
        # every state a request can be in.
        self._states = frozenset(self.jump.explore(self._start))
        self.num_states = len(self._states)
        dist = self.jump.distance
        self._need_max = max(dist.values(), default=0) + 1  # tokens a completion can need, at most
        self._budget_masks: dict[tuple[int, int], torch.Tensor | None] = {}
        self._needs: dict[int, float] = {}
        self._next_need_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if self.num_states <= EAGER_MASK_STATES:
            self.warm()  # ~0.1 ms a state, here in the compiler's thread rather than mid-decode

    # -- per-state facts, computed on first use ------------------------------------

    def _allowed_ids(self, state: int) -> np.ndarray:
        ids = np.asarray(self._index.get_allowed_tokens(state), dtype=np.int64)
        return ids[ids < self.vocab.vocab_size]

    def _packed(self, state: int, ids: np.ndarray) -> torch.Tensor:
        """The mask allowing ``ids`` (and EOS where ``state`` accepts)."""
        bits = np.zeros(self._num_words * 32, dtype=bool)
        bits[ids] = True
        if state in self._finals:
            bits[self._eos_list] = True
        return torch.from_numpy(_pack(bits))

    def _mask(self, state: int) -> torch.Tensor:
        m = self._masks.get(state)
        if m is None:
            ids = self._allowed_ids(state)
            m = self._packed(state, ids)
            self._has_text[state] = bool(ids.size)
            self._masks[state] = m
        return m

    def _can_continue(self, state: int) -> bool:
        if state not in self._has_text:
            self._mask(state)
        return self._has_text[state]

    def _need(self, state: int) -> float:
        """Tokens that finish the text from ``state``, at most: the shortest completing
        bytes covered greedily by the longest vocabulary tokens (each one a valid step,
        being a piece of a valid text), then EOS unless the match is then complete."""
        hit = self._needs.get(state)
        if hit is not None:
            return hit
        path = self.jump.shortest_completion(state)
        if path is None:
            need = float("inf")
        else:
            data, final = path
            need = _cover(data, self._ivocab.token_set, self._ivocab.max_token_len) + (1 if self._can_continue(final) else 0)
        self._needs[state] = need
        return need

    def budget_mask(self, state: int, remaining: int) -> torch.Tensor | None:
        """The mask of tokens after which a completion still fits in ``remaining - 1``
        tokens; None when every allowed token does, or when none does (no completion
        fits at all: the plain mask applies and the output may be cut)."""
        if remaining - 1 >= self._need_max:
            return None
        key = (state, remaining)
        if key in self._budget_masks:
            return self._budget_masks[key]
        ids, needs = self._next_needs(state)
        keep = ids[needs <= remaining - 1]
        out: torch.Tensor | None = None
        if keep.size or state in self._finals:
            packed = self._packed(state, keep)
            out = None if keep.size == ids.size else packed
        if len(self._budget_masks) >= 8192:
            self._budget_masks.clear()
        self._budget_masks[key] = out
        return out

    def _next_needs(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """The allowed ids of ``state`` and the need of the state each leads to (once per state:
        every budget below the roomy one reuses them)."""
        hit = self._next_need_cache.get(state)
        if hit is None:
            ids = self._allowed_ids(state)
            nxt = self._index.get_next_state
            hit = (ids.astype(np.int32), np.array([self._need(nxt(state, t)) for t in ids.tolist()], dtype=np.float32))
            if len(self._next_need_cache) >= 128:  # up to 8 bytes a token each: bounded
                self._next_need_cache.clear()
            self._next_need_cache[state] = hit
        return hit

    def warm(self) -> None:
        """Compute every state's mask now (e.g. in a worker thread) instead of on first use."""
        for state in self._states:
            self._mask(state)

    def matcher(self) -> "RegexMatcher":
        return RegexMatcher(self, [(self._start, b"")])

    def __repr__(self) -> str:
        return f"RegexGrammar(kind={self.kind!r}, regex={self.regex[:60]!r})"


def _cover(data: bytes, tokens: "set[bytes] | frozenset[bytes]", longest: int) -> int:
    """Tokens in a greedy longest-match cover of ``data`` (bytes without any token: inf)."""
    i, n = 0, 0
    while i < len(data):
        for k in range(min(longest, len(data) - i), 0, -1):
            if data[i : i + k] in tokens:
                i += k
                n += 1
                break
        else:
            return float("inf")  # type: ignore[return-value]
    return n


def _pack(bits: np.ndarray) -> np.ndarray:
    """bool[32*W] -> int32[W], bit (i % 32) of word (i // 32) = bits[i]."""
    return np.packbits(bits, bitorder="little").view("<i4").astype(np.int32, copy=False)


_Step = tuple[int, bytes]  # (automaton state, bytes of an unfinished trailing character)


class RegexMatcher:
    """One request's position in a :class:`RegexGrammar`, with history for rollback."""

    __slots__ = ("_g", "_hist")

    def __init__(self, grammar: RegexGrammar, history: list[_Step]) -> None:
        self._g = grammar
        self._hist = history

    # -- the contract -----------------------------------------------------------------

    def fill_mask(self, row: torch.Tensor, budget: int | None = None) -> None:
        """OR the allowed-token bits into ``row`` (int32 words, zeroed by the caller).
        ``budget``: tokens left to generate, this one included; only tokens after which a
        complete match still fits are allowed (when one fits at all)."""
        state = self._hist[-1][0]
        src = self._g._eos_mask if state == _DONE else None
        if src is None and budget is not None:
            src = self._g.budget_mask(state, budget)
        if src is None:
            src = self._g._eos_mask if state == _DONE else self._g._mask(state)
        if row.device != src.device:
            src = src.to(row.device, non_blocking=True)
        row.bitwise_or_(src)

    def completion_fits(self, budget: int) -> bool:
        state, pending = self._hist[-1]
        if state == _DONE or pending:  # done, or mid-character (no distance known): no objection
            return True
        return self._g._need(state) <= budget

    def accept(self, token_id: int) -> bool:
        """Advance by one token; returns False (and changes nothing) if it is not allowed."""
        token_id = int(token_id)
        g = self._g
        state, pending = self._hist[-1]
        if token_id in g._eos:
            if state == _DONE or state in g._finals:
                self._hist.append((_DONE, pending))
                return True
            return False
        if state == _DONE or not 0 <= token_id < g.vocab.vocab_size:
            return False
        nxt = g._index.get_next_state(state, token_id)
        if nxt is None:
            return False
        self._hist.append((nxt, _unfinished(pending, g.vocab.token_bytes[token_id])))
        return True

    def accept_text(self, text: str | bytes) -> bool:
        """Advance by raw text (jump-forward) instead of tokens; one step for rollback.

        Walks one byte at a time through single-byte tokens; False (and no change) if
        the text is not allowed or a byte has no single-byte token in this vocabulary.
        """
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        g = self._g
        state, pending = self._hist[-1]
        if state == _DONE:
            return not data
        for b in data:
            tid = g._ivocab.byte_tokens.get(b)
            nxt = None if tid is None else g._index.get_next_state(state, tid)
            if nxt is None:
                return False
            state = nxt
        self._hist.append((state, _unfinished(pending, data)))
        return True

    def is_accepting(self) -> bool:
        """The text so far is a complete match (or EOS was accepted)."""
        state = self._hist[-1][0]
        return state == _DONE or state in self._g._finals

    def is_done(self) -> bool:
        """EOS was accepted, or the text is a complete match that nothing can extend."""
        state = self._hist[-1][0]
        return state == _DONE or (state in self._g._finals and not self._g._can_continue(state))

    def forced_text(self) -> str:
        """The text every continuation must start with (whole characters), "" if none."""
        state, pending = self._hist[-1]
        if state == _DONE or pending:  # inside a character: nothing whole to offer yet
            return ""
        return self._g.jump.forced_text(state)

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens (or ``accept_text`` calls)."""
        if n < 0 or n > len(self._hist) - 1:
            raise ValueError(f"rollback({n}): only {len(self._hist) - 1} steps were accepted")
        if n:
            del self._hist[-n:]

    def copy(self) -> "RegexMatcher":
        """An independent matcher at the same position (n > 1 sampling, forks)."""
        return RegexMatcher(self._g, list(self._hist))

    # -- extras for the engine and tests ----------------------------------------------

    @property
    def num_accepted(self) -> int:
        return len(self._hist) - 1

    @property
    def state(self) -> int:
        """The automaton state id (-1 after EOS): equal ids mean equal futures."""
        return self._hist[-1][0]

    def allowed_token_ids(self) -> list[int]:
        row = torch.zeros(self._g._num_words, dtype=torch.int32)
        self.fill_mask(row)
        bits = np.unpackbits(row.numpy().view(np.uint8), bitorder="little")
        return np.flatnonzero(bits[: self._g.vocab.vocab_size]).tolist()


def _unfinished(pending: bytes, data: bytes) -> bytes:
    """The bytes of the character still being spelled after ``data`` (b"" at a boundary)."""
    if not pending and (not data or data[-1] < 0x80):
        return b""
    return split_complete_utf8(pending + data)[1]
