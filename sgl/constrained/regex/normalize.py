r"""Python regex syntax -> canonical regex text (:mod:`.algebra`), the form every engine reads.

The user's pattern (:func:`normalize_regex`, :func:`translate_regex`) is parsed with
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
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sgl.constrained.errors import GrammarError
from sgl.constrained.regex.algebra import EMPTY, CharSet, Rx, rx_alt, rx_cat, rx_rep, rx_set

try:  # Python >= 3.11
    from re import _constants as _sre_c  # type: ignore[attr-defined]
    from re import _parser as _sre_p  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_c  # type: ignore[no-redef]
    import sre_parse as _sre_p  # type: ignore[no-redef]

__all__ = ["CharEmitter", "normalize_regex", "translate_regex"]

# the re.ASCII classes of \d, \w, \s, and the one character . excludes without (?s)
_DIGIT = CharSet([(0x30, 0x39)])
_WORD = CharSet([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
_SPACE = CharSet.of(" \t\n\r\f\v")
_NEWLINE = CharSet.of("\n")

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
    pattern: str,
    *,
    param: str = "regex",
    emit: CharEmitter | None = None,
    search: bool = False,
    what: str = "regex",
    length: tuple[int, int | None] | None = None,
    pad: Rx | None = None,
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
    if (
        search
        and len(items) == 1
        and items[0][0] is _OP.SUBPATTERN
        and not (items[0][1][1] | items[0][1][2])
    ):
        items = list(items[0][1][3])  # "(^...$)": the group changes nothing
    start = end = False
    if search:
        items, start, end = _strip_anchors(items)
    if (
        search
        and pad is not None
        and length is None
        and len(items) == 1
        and items[0][0] is _OP.BRANCH
    ):
        # "^a|b$", "^(A)$|^(B)$" (Python moves the shared "^" out of the branches)
        branches = [_strip_anchors(list(alt)) for alt in items[0][1][1]]
        if any(s or e for _, s, e in branches):
            try:
                parts = [
                    rx_cat(
                        EMPTY if s or start else pad,
                        _seq(ctx, alt, flags, head=False, tail=False),
                        EMPTY if e or end else pad,
                    )
                    for alt, s, e in branches
                ]
            except RecursionError:
                raise GrammarError(f"{what} is nested too deeply", param) from None
            return rx_alt(*parts), True, True
    try:
        if length is None:
            rx = _seq(ctx, items, flags, head=not search, tail=not search)
        else:
            if search and not (start and end):
                raise GrammarError(
                    f"{what}: a length bound (minLength/maxLength) needs the pattern anchored "
                    "at both ends (^...$)",
                    param,
                )
            variants = _fold_length(parsed.state, items, *length)
            if variants is None:
                raise GrammarError(
                    f"{what}: cannot combine this pattern with minLength/maxLength (supported: "
                    "one variable-length "
                    "run of single characters, plus short optional parts); put the length in the "
                    "pattern",
                    param,
                )
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
    wide = [
        i for i in variable if _char_repeat(state, items[i]) and (widths[i][1] - widths[i][0] > 8)
    ]
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
        fixed = sum(
            _sre_p.SubPattern(state, [it]).getwidth()[0] for j, it in enumerate(seq) if j != w
        )
        new_lo = max(rlo, lo - fixed)
        new_hi = rhi if hi is None else min(rhi, hi - fixed)
        if new_lo <= new_hi:
            seq[w] = (op, (new_lo, new_hi, sub))
            variants.append(seq)
    return variants


def _char_repeat(state: Any, item: tuple) -> bool:
    """A repeat of something exactly one character wide."""
    op, av = item
    return op in (_OP.MAX_REPEAT, _OP.MIN_REPEAT) and _sre_p.SubPattern(
        state, list(av[2])
    ).getwidth() == (1, 1)


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
                    raise GrammarError(
                        f"{ctx.what}: character category {sav} is not supported", ctx.param
                    )
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
                f"{ctx.what}: anchors (^, $, \\A, \\Z) are only supported as the first and last "
                "character",
                ctx.param,
            )
        raise GrammarError(
            f"{ctx.what}: anchors (^, $, \\A, \\Z) are only supported at the start and end of the "
            "pattern, "
            f"and word boundaries (\\b, \\B) not at all",
            ctx.param,
        )
    for key, desc in _UNSUPPORTED.items():
        if getattr(_OP, key, None) is op:
            raise GrammarError(f"{ctx.what}: {desc} are not supported", ctx.param)
    raise GrammarError(f"{ctx.what}: construct {name} is not supported", ctx.param)
