"""Parse GBNF-style EBNF text into a small AST (the front half of :mod:`sgl.constrained.ebnf`).

The meta-syntax is lexed and parsed by lark (LALR); this module then decodes string
literals and character classes itself, so every error can point at a line and column.
See :mod:`sgl.constrained.ebnf` for the dialect.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import lru_cache
from typing import Union

from sgl.constrained.errors import GrammarError

MAX_CODEPOINT = 0x10FFFF
MAX_REPEAT = 1_000_000  # the largest m or n accepted in {m,n} (large counts are built from blocks)

# ---------------------------------------------------------------------------
# AST
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Lit:
    """A literal string (may be empty)."""

    text: str


@dataclass(frozen=True)
class CharSet:
    """A set of code points as sorted, disjoint, non-adjacent inclusive ranges."""

    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Ref:
    """A reference to a rule, with where it was written (for error messages)."""

    name: str
    line: int
    column: int


@dataclass(frozen=True)
class Seq:
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Expr, ...]


@dataclass(frozen=True)
class Repeat:
    """``item{min,max}``; ``max is None`` means unbounded (``*`` is {0,}, ``+`` is {1,})."""

    item: Expr
    min: int
    max: int | None


Expr = Union[Lit, CharSet, Ref, Seq, Alt, Repeat]  # noqa: UP007 (runtime value)


@dataclass(frozen=True)
class RuleDef:
    name: str
    expr: Expr
    line: int
    column: int


# ---------------------------------------------------------------------------
# The meta-grammar
# ---------------------------------------------------------------------------

# A rule runs until the next ``name ::=``: RULE_HEAD is one terminal (name, blanks, ``::=``)
# with a higher priority than NAME, so ``a ::= b c ::= d`` splits before ``c`` and rules
# may span lines freely, alternatives included.
_META_GRAMMAR = r"""
start: rule*
rule: RULE_HEAD alternatives
alternatives: sequence ("|" sequence)*
sequence: item*
item: atom quantifier?
?atom: STRING
     | CHARCLASS
     | NAME
     | DOT
     | LPAR alternatives RPAR
quantifier: STAR | PLUS | QMARK
          | LBRACE INT RBRACE                -> rep_exact
          | LBRACE INT COMMA RBRACE          -> rep_min
          | LBRACE INT COMMA INT RBRACE      -> rep_range
          | LBRACE COMMA INT RBRACE          -> rep_max

RULE_HEAD.2: /[A-Za-z_][A-Za-z0-9_\-]*[ \t\r\n]*::=/
NAME: /[A-Za-z_][A-Za-z0-9_\-]*/
STRING: /"(?:[^"\\\r\n]|\\[^\r\n])*"/
CHARCLASS: /\[(?:[^\]\\\r\n]|\\[^\r\n])*\]/
DOT: "."
LPAR: "("
RPAR: ")"
STAR: "*"
PLUS: "+"
QMARK: "?"
LBRACE: "{"
RBRACE: "}"
COMMA: ","
INT: /[0-9]+/
COMMENT: /#[^\n]*/
%ignore /[ \t\r\n]+/
%ignore COMMENT
"""

_TOKEN_WORDS = {
    "RULE_HEAD": "a new rule ('name ::=')",
    "NAME": "a rule name",
    "STRING": "a string literal",
    "CHARCLASS": "a character class",
    "DOT": "'.'",
    "LPAR": "'('",
    "RPAR": "')'",
    "STAR": "'*'",
    "PLUS": "'+'",
    "QMARK": "'?'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "COMMA": "','",
    "INT": "a number",
    "VBAR": "'|'",
    "$END": "the end of the grammar",
}


@lru_cache(maxsize=1)
def _lark_parser():
    import lark

    return lark.Lark(_META_GRAMMAR, parser="lalr", lexer="contextual", maybe_placeholders=False)


def _where(text: str, line: int, column: int) -> str:
    lines = text.splitlines() or [""]
    src = lines[line - 1] if 0 < line <= len(lines) else ""
    return f"line {line}, column {column}:\n    {src}\n    {' ' * max(column - 1, 0)}^"


def _error(text: str, line: int, column: int, what: str) -> GrammarError:
    return GrammarError(
        f"invalid EBNF grammar: {what} at {_where(text, line, column)}", param="ebnf"
    )


def _unclosed_paren(text: str, upto: int | None) -> tuple[int, int] | None:
    """Line/column of the last '(' left open before offset `upto` (strings, classes, comments
    skipped)."""
    opens: list[int] = []
    i, n = 0, len(text) if upto is None else min(upto, len(text))
    while i < n:
        c = text[i]
        if c in '"[':
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and text[i] not in (close, "\n"):
                i += 2 if text[i] == "\\" else 1
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif c == "(":
            opens.append(i)
        elif c == ")" and opens:
            opens.pop()
        i += 1
    if not opens:
        return None
    pos = opens[-1]
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def _offset(text: str, line: int, column: int) -> int:
    lines = text.split("\n")
    return sum(len(x) + 1 for x in lines[: line - 1]) + column - 1


def _translate_lark_error(text: str, exc: Exception) -> GrammarError:
    import lark.exceptions as le

    if isinstance(exc, le.UnexpectedCharacters):
        ch = text[exc.pos_in_stream] if 0 <= exc.pos_in_stream < len(text) else ""
        if ch == '"':
            what = "unterminated string literal (or a bad escape inside it)"
        elif ch == "[":
            what = "unterminated character class"
        elif ch == ":":
            what = "'::=' must follow a rule name"
        else:
            what = f"unexpected character {ch!r}"
        return _error(text, exc.line, exc.column, what)
    if isinstance(exc, le.UnexpectedToken):
        tok = exc.token
        expected = set(exc.expected or ())
        if tok.type == "$END" or getattr(tok, "line", None) is None:
            line = text.count("\n") + 1
            column = len(text) - (text.rfind("\n") + 1) + 1
        else:
            line, column = tok.line, tok.column
        if "RPAR" in expected and tok.type in ("RULE_HEAD", "$END"):
            opened = _unclosed_paren(
                text, None if tok.type == "$END" else _offset(text, line, column)
            )
            if opened:
                return _error(
                    text, opened[0], opened[1], "unbalanced parentheses: this '(' is never closed"
                )
        if tok.type == "RPAR":
            return _error(text, line, column, "unbalanced parentheses: ')' without a matching '('")
        if tok.type == "$END" and not text.strip():
            return GrammarError(
                "invalid EBNF grammar: it is empty; define at least 'root ::= ...'", param="ebnf"
            )
        got = _TOKEN_WORDS.get(tok.type, repr(tok.value))
        if (
            tok.type in ("NAME", "STRING", "CHARCLASS", "DOT", "LPAR")
            and line == 1
            and "RULE_HEAD" in expected
        ):
            return _error(
                text, line, column, "a grammar must start with a rule definition 'name ::= ...'"
            )
        if tok.type in ("STAR", "PLUS", "QMARK", "LBRACE"):
            what = (
                f"{got} must follow an element "
                "(a quantifier cannot follow a quantifier or start a sequence)"
            )
            return _error(text, line, column, what)
        want = sorted(_TOKEN_WORDS.get(e, e) for e in expected if not e.startswith("__"))
        hint = f" (expected {', '.join(want[:6])})" if want else ""
        return _error(text, line, column, f"unexpected {got}{hint}")
    if isinstance(exc, le.UnexpectedEOF):
        opened = _unclosed_paren(text, None)
        if opened:
            return _error(
                text, opened[0], opened[1], "unbalanced parentheses: this '(' is never closed"
            )
        return GrammarError("invalid EBNF grammar: unexpected end of the grammar", param="ebnf")
    return GrammarError(f"invalid EBNF grammar: {exc}", param="ebnf")


# ---------------------------------------------------------------------------
# Literals and classes
# ---------------------------------------------------------------------------

_SIMPLE_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "f": "\f",
    "v": "\v",
    "b": "\b",
    "0": "\0",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "[": "[",
    "]": "]",
    "-": "-",
    "^": "^",
    "/": "/",
    ".": ".",
}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


def _read_char(text: str, body: str, i: int, line: int, col0: int) -> tuple[int, int]:
    """Decode one (possibly escaped) character of `body` at `i`; returns (code point, next index).

    `col0` is the column of body[0], used for error positions.
    """
    c = body[i]
    if c != "\\":
        return ord(c), i + 1
    if i + 1 >= len(body):
        raise _error(text, line, col0 + i, "a backslash must be followed by an escape")
    e = body[i + 1]
    if e in _SIMPLE_ESCAPES:
        return ord(_SIMPLE_ESCAPES[e]), i + 2
    if e in _HEX_ESCAPES:
        n = _HEX_ESCAPES[e]
        digits = body[i + 2 : i + 2 + n]
        if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise _error(text, line, col0 + i, f"bad escape: '\\{e}' needs exactly {n} hex digits")
        cp = int(digits, 16)
        if cp > MAX_CODEPOINT:
            raise _error(text, line, col0 + i, f"bad escape: U+{cp:X} is beyond U+10FFFF")
        if 0xD800 <= cp <= 0xDFFF:
            raise _error(
                text, line, col0 + i, f"bad escape: U+{cp:04X} is a surrogate, not a character"
            )
        return cp, i + 2 + n
    known = r"\n \t \r \\ \" \[ \] \xNN \uNNNN \UNNNNNNNN ..."
    raise _error(text, line, col0 + i, f"bad escape '\\{e}' (known: {known})")


def _decode_string(text: str, tok) -> str:
    body = tok.value[1:-1]
    out, i = [], 0
    while i < len(body):
        cp, i = _read_char(text, body, i, tok.line, tok.column + 1)
        out.append(chr(cp))
    return "".join(out)


def normalize_ranges(ranges) -> tuple[tuple[int, int], ...]:
    """Sort and merge overlapping or adjacent ranges."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def complement_ranges(ranges) -> tuple[tuple[int, int], ...]:
    out, nxt = [], 0
    for lo, hi in normalize_ranges(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return tuple(out)


ANY_CHAR = CharSet(((0, MAX_CODEPOINT),))


def _decode_class(text: str, tok) -> CharSet:
    body = tok.value[1:-1]
    col0 = tok.column + 1
    negated = body.startswith("^")
    i = 1 if negated else 0
    ranges = []
    while i < len(body):
        start = i
        lo, i = _read_char(text, body, i, tok.line, col0)
        if i + 1 < len(body) and body[i] == "-":
            hi, i = _read_char(text, body, i + 1, tok.line, col0)
            if hi < lo:
                what = f"bad character range {chr(lo)!r}-{chr(hi)!r}: the end is before the start"
                raise _error(text, tok.line, col0 + start, what)
            ranges.append((lo, hi))
        else:
            ranges.append((lo, lo))
    if not ranges and not negated:
        raise _error(text, tok.line, tok.column, "empty character class '[]' matches nothing")
    ranges = normalize_ranges(ranges)
    return CharSet(complement_ranges(ranges) if negated else ranges)


# ---------------------------------------------------------------------------
# Tree -> AST
# ---------------------------------------------------------------------------


def _int(text: str, tok) -> int:
    v = int(tok.value)
    if v > MAX_REPEAT:
        raise _error(
            text, tok.line, tok.column, f"repetition bound {v} is too large (at most {MAX_REPEAT})"
        )
    return v


def _build_expr(text: str, node) -> Expr:
    from lark import Token

    if isinstance(node, Token):
        if node.type == "STRING":
            return Lit(_decode_string(text, node))
        if node.type == "CHARCLASS":
            return _decode_class(text, node)
        if node.type == "NAME":
            return Ref(str(node.value), node.line, node.column)
        if node.type == "DOT":
            return ANY_CHAR
        raise AssertionError(node)
    kind = node.data
    if kind == "atom":  # LPAR alternatives RPAR
        return _build_expr(text, node.children[1])
    if kind == "alternatives":
        options = tuple(_build_expr(text, c) for c in node.children)
        return options[0] if len(options) == 1 else Alt(options)
    if kind == "sequence":
        items = tuple(_build_expr(text, c) for c in node.children)
        return items[0] if len(items) == 1 else Seq(items)
    if kind == "item":
        expr = _build_expr(text, node.children[0])
        if len(node.children) == 1:
            return expr
        q = node.children[1]
        toks = [t for t in q.children if getattr(t, "type", None) == "INT"]
        if q.data == "quantifier":
            sym = q.children[0].type
            lo, hi = {"STAR": (0, None), "PLUS": (1, None), "QMARK": (0, 1)}[sym]
        elif q.data == "rep_exact":
            lo = hi = _int(text, toks[0])
        elif q.data == "rep_min":
            lo, hi = _int(text, toks[0]), None
        elif q.data == "rep_max":
            lo, hi = 0, _int(text, toks[0])
        else:  # rep_range
            lo, hi = _int(text, toks[0]), _int(text, toks[1])
            if hi < lo:
                t = q.children[0]
                raise _error(
                    text,
                    t.line,
                    t.column,
                    f"bad repetition {{{lo},{hi}}}: the maximum is below the minimum",
                )
        if (lo, hi) == (1, 1):
            return expr
        return Repeat(expr, lo, hi)
    raise AssertionError(kind)


def _refs(expr: Expr):
    if isinstance(expr, Ref):
        yield expr
    elif isinstance(expr, (Seq, Alt)):
        for c in expr.items if isinstance(expr, Seq) else expr.options:
            yield from _refs(c)
    elif isinstance(expr, Repeat):
        yield from _refs(expr.item)


def parse_grammar(text: str) -> dict[str, RuleDef]:
    """Parse and check GBNF text; returns rules by name (root guaranteed present)."""
    import lark.exceptions as le

    if not isinstance(text, str):
        raise GrammarError("invalid EBNF grammar: it must be a string", param="ebnf")
    try:
        tree = _lark_parser().parse(text)
    except le.LarkError as exc:
        raise _translate_lark_error(text, exc) from None
    if not tree.children:
        raise GrammarError(
            "invalid EBNF grammar: it is empty; define at least 'root ::= ...'", param="ebnf"
        )
    rules: dict[str, RuleDef] = {}
    for rnode in tree.children:
        head = rnode.children[0]
        name = head.value.split(":")[0].strip()
        if name in rules:
            first = rules[name]
            what = (
                f"rule '{name}' is defined twice (first at line {first.line}); "
                "merge the alternatives with '|'"
            )
            raise _error(text, head.line, head.column, what)
        rules[name] = RuleDef(name, _build_expr(text, rnode.children[1]), head.line, head.column)
    if "root" not in rules:
        near = difflib.get_close_matches("root", list(rules), n=1)
        hint = f" (did you mean to name '{near[0]}' root?)" if near else ""
        raise GrammarError(
            "invalid EBNF grammar: there is no 'root' rule; the grammar starts at 'root ::= "
            f"...'{hint}",
            param="ebnf",
        )
    for rule in rules.values():
        for ref in _refs(rule.expr):
            if ref.name not in rules:
                near = difflib.get_close_matches(ref.name, list(rules), n=1)
                hint = f"; did you mean '{near[0]}'?" if near else ""
                what = f"undefined rule '{ref.name}' (used in rule '{rule.name}'){hint}"
                raise _error(text, ref.line, ref.column, what)
    return rules
