r"""The lexicon of generated JSON: whitespace and separators, string characters (raw, short
escapes, ``\uXXXX``), numbers, literals, and strings that are none of a set of names.

Separate from the schema walk: these are fixed pieces of regex that do not depend on a
schema, shared by every module that builds values. The underscored names are internal to
the ``json_schema`` package (its modules share them), not part of its API.
"""

from __future__ import annotations

from functools import lru_cache

from sgl.constrained.regex import CharSet, Rx, rx_alt, rx_cat, rx_lit, rx_rep, rx_set

WS = " ?"  # the only whitespace: after ':' and ','
_WS = rx_rep(rx_lit(" "), 0, 1)  # WS
_SEP = rx_cat(rx_lit(","), _WS)
_COLON = rx_cat(rx_lit(":"), _WS)
_DIGIT = rx_set(CharSet([(0x30, 0x39)]))
_DIGIT19 = rx_set(CharSet([(0x31, 0x39)]))
_QUOTE = rx_lit('"')

# Characters that may appear raw inside a generated JSON string.
_JSON_RAW = CharSet([(0x20, 0x10FFFF)]) - CharSet.of('"\\') - CharSet([(0x7F, 0x9F)])
# character -> the letter of its short escape (\" \\ \/ \b \f \n \r \t)
_ESCAPE_LETTERS = {
    '"': '"',
    "\\": "\\",
    "/": "/",
    "\b": "b",
    "\f": "f",
    "\n": "n",
    "\r": "r",
    "\t": "t",
}


def json_char(cs: CharSet) -> Rx | None:
    """One *decoded* character from ``cs``, spelled as it appears inside a JSON string.

    The escapes share one backslash branch (``\\[...]``), not one branch each: in the
    grammar route each branch is a parse configuration at every character position,
    and nine of them made string masks several times slower to compute."""
    letters = "".join(letter for ch, letter in _ESCAPE_LETTERS.items() if ch in cs)
    escape = rx_cat(rx_lit("\\"), rx_set(CharSet.of(letters))) if letters else None
    return rx_alt(rx_set(cs & _JSON_RAW), escape)


_HEX_CS = CharSet.of("0123456789abcdefABCDEF")
_HEX1 = rx_set(_HEX_CS)
# After "\u": any character, astral ones as a surrogate pair (json.dumps's default ASCII output).
_U_HEX = rx_alt(
    rx_cat(rx_set(_HEX_CS - CharSet.of("dD")), rx_rep(_HEX1, 3, 3)),
    rx_cat(
        rx_set(CharSet.of("dD")),
        rx_alt(
            rx_cat(rx_set(CharSet.of("01234567")), rx_rep(_HEX1, 2, 2)),
            rx_cat(
                rx_set(CharSet.of("89abAB")),
                rx_rep(_HEX1, 2, 2),
                rx_lit("\\u"),
                rx_set(CharSet.of("dD")),
                rx_set(CharSet.of("cdefCDEF")),
                rx_rep(_HEX1, 2, 2),
            ),
        ),
    ),
)
_RAW_CHAR = json_char(CharSet.full())
# one character of an unconstrained string: raw, a short escape or \uXXXX, under one backslash
_STR_CHAR = rx_alt(
    rx_set(_JSON_RAW),
    rx_cat(rx_lit("\\"), rx_alt(rx_set(CharSet.of('"\\/bfnrt')), rx_cat(rx_lit("u"), _U_HEX))),
)
# Bounded lengths count characters without \u escapes: a surrogate pair is 12 positions, so
# with escapes `maxLength: 200` would take 2400 of the automaton's positions.
_ESCAPES_UP_TO = 16
_STRING = rx_cat(_QUOTE, rx_rep(_STR_CHAR, 0, None), _QUOTE)
_UINT = rx_alt(rx_lit("0"), rx_cat(_DIGIT19, rx_rep(_DIGIT, 0, None)))
_INTEGER = rx_cat(rx_rep(rx_lit("-"), 0, 1), _UINT)
_FRACTION = rx_cat(rx_lit("."), rx_rep(_DIGIT, 1, None))
_EXPONENT = rx_cat(
    rx_set(CharSet.of("eE")), rx_rep(rx_set(CharSet.of("+-")), 0, 1), rx_rep(_DIGIT, 1, None)
)
_NUMBER = rx_cat(_INTEGER, rx_rep(_FRACTION, 0, 1), rx_rep(_EXPONENT, 0, 1))
_BOOLEAN = rx_alt(rx_lit("true"), rx_lit("false"))
_CHARS = rx_rep(_STR_CHAR, 0, None)  # the inside of an unconstrained string
_HIGH = CharSet([(0x80, 0x10FFFF)])
_HIGH_CHAR = rx_set(_HIGH & _JSON_RAW)  # a raw non-ASCII character (no escape spells one raw)
_SHARED = {
    "json_string": _STRING,
    "json_number": _NUMBER,
    "json_integer": _INTEGER,
    "json_high_char": _HIGH_CHAR,
    "json_chars": _CHARS,
}  # grammar rules when used
_NULL = rx_lit("null")
_VALUE_RULE = "json_value"  # grammar mode: any JSON value, in our spelling


@lru_cache(maxsize=4096)
def _json_char_except(taken: str) -> tuple[Rx | None, bool]:
    """A JSON character that is none of ``taken``, and whether that is only its ASCII part
    (the caller adds its non-ASCII piece). Memoized: the nodes of a name trie exclude the
    same few letters again and again."""
    cs = CharSet.of(taken)
    if cs & _HIGH:
        return json_char(CharSet.full() - cs), False
    return json_char(CharSet([(0, 0x7F)]) - cs), True


@lru_cache(maxsize=4096)
def _json_char_of(ch: str) -> Rx | None:
    return json_char(CharSet.of(ch))


def _string_not_in(values: list[str], anything: Rx = _CHARS, high: Rx = _HIGH_CHAR) -> Rx | None:
    """The body of a JSON string whose decoded value is none of ``values`` (a trie,
    complemented; ``anything``, the rest once off the trie, and ``high``, a non-ASCII
    character, may be shared rules: each trie node then costs a few grammar states, not
    the UTF-8 automaton of a character class)."""
    trie: dict = {}
    for v in values:
        node = trie
        for ch in v:
            node = node.setdefault(ch, {})
        node[""] = {}  # end marker

    def body(node: dict) -> Rx | None:
        children = "".join(sorted(c for c in node if c))
        others, ascii_only = _json_char_except(children)
        if ascii_only:
            others = rx_alt(others, high)
        # Leaving the trie by a raw character only: a \\u escape could spell a child's character.
        parts = [rx_lit("") if "" not in node else None, rx_cat(others, anything)]
        parts += [rx_cat(_json_char_of(c), body(node[c])) for c in children]
        return rx_alt(*parts)

    return body(trie)
