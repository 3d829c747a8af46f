"""EBNF grammars -> token masks, checked against oracles that share no code with the matcher.

* Exactness: a language enumerator written here (the sentences and the prefixes of
  sentences up to a length bound, computed as fixed points over a grammar given as
  plain Python data) says which texts are prefixes; token t must be allowed iff
  text + bytes(t) is one, and EOS iff text is a sentence. Hand-written grammars and
  random ones (hypothesis) are checked. Vocabularies are small and hand-made, with
  multi-character tokens, partial UTF-8 bytes and junk.
* Outputs of mask-guided random walks are parsed by independent parsers: Python's
  ``json`` and ``ast`` modules, and lark Earley parsers written in lark's own syntax.
* Masks come from the C++ trie walk where it builds (a C++ compiler is present) and
  from the numpy walk otherwise; the enumerated-language test runs on both, and a
  differential test checks them against each other on random grammars, their sparse
  and dense phases and their lazily computed transitions included.
"""

from __future__ import annotations

import ast
import itertools
import json
import random
import shutil

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sgl.constrained import ebnf_runtime
from sgl.constrained.ebnf import JSON_GRAMMAR, EbnfMatcher, compile_ebnf
from sgl.constrained.ebnf_python import Tables
from sgl.constrained.errors import GrammarError
from sgl.constrained.vocab import TokenVocabulary

# ---------------------------------------------------------------------------
# Vocabularies and helpers
# ---------------------------------------------------------------------------

EOS = 0


def make_vocab(pieces, extra_none: int = 2) -> TokenVocabulary:
    """Id 0 is EOS, then `extra_none` special ids (None), then the distinct byte pieces."""
    seen: dict[bytes, None] = {}
    for p in pieces:
        b = p.encode("utf-8") if isinstance(p, str) else bytes(p)
        if b:
            seen.setdefault(b)
    token_bytes = (None,) * (1 + extra_none) + tuple(seen)
    return TokenVocabulary(
        token_bytes=token_bytes, eos_token_ids=(EOS,), vocab_size=len(token_bytes)
    )


def alphabet_vocab(
    chars: str,
    *,
    max_len: int = 2,
    extra=(),
    seed: int = 0,
    n_long: int = 40,
    long_len: tuple[int, int] = (3, 6),
    junk: bool = True,
) -> TokenVocabulary:
    """All strings over `chars` up to `max_len`, some random longer ones, `extra`, and junk."""
    rng = random.Random(seed)
    pieces = ["".join(p) for n in range(1, max_len + 1) for p in itertools.product(chars, repeat=n)]
    pieces += [
        "".join(rng.choice(chars) for _ in range(rng.randint(*long_len))) for _ in range(n_long)
    ]
    if junk:  # never or rarely allowed: other letters, control bytes, invalid UTF-8, non-ASCII
        pieces += ["Z", "zz", " \n", "\x00", b"\xff", b"\xc0\x80", "\u00e9"]
    return make_vocab(list(pieces) + list(extra))


def split_utf8(ch: str) -> list[bytes]:
    """The single bytes, leading parts and trailing parts of a character's UTF-8 encoding."""
    enc = ch.encode()
    return (
        [bytes([b]) for b in enc]
        + [enc[:k] for k in range(1, len(enc))]
        + [enc[k:] for k in range(1, len(enc))]
    )


def formable_chars(vocab: TokenVocabulary) -> str:
    """Every character whose UTF-8 bytes all occur in the vocabulary: the universe a negated
    class can match through these tokens (so the oracle can spell "[^...]" as a finite set)."""
    present = sorted({b for tb in vocab.token_bytes if tb for b in tb})
    conts = [b for b in present if 0x80 <= b <= 0xBF]
    out = []
    for lead in present:
        n = (
            1
            if lead < 0x80
            else 2
            if 0xC0 <= lead < 0xE0
            else 3
            if 0xE0 <= lead < 0xF0
            else 4
            if lead < 0xF8
            else 0
        )
        if n == 0 or 0x80 <= lead < 0xC0:
            continue
        for tail in itertools.product(conts, repeat=n - 1):
            try:
                out.append(bytes([lead, *tail]).decode("utf-8"))
            except UnicodeDecodeError:
                pass
    return "".join(sorted(set(out)))


def allowed_ids(m: EbnfMatcher, vocab: TokenVocabulary) -> set[int]:
    row = torch.zeros((vocab.vocab_size + 31) // 32, dtype=torch.int32)
    m.fill_mask(row)
    bits = np.unpackbits(row.numpy().view(np.uint8), bitorder="little")
    assert not bits[vocab.vocab_size :].any(), "bits set past vocab_size"
    return set(np.flatnonzero(bits).tolist())


def feed_text(m: EbnfMatcher, vocab: TokenVocabulary, data: bytes) -> bool:
    """Accept `data` through single-byte tokens (every test vocabulary has the ones needed)."""
    ids = {tb: i for i, tb in enumerate(vocab.token_bytes) if tb is not None}
    return all(m.accept(ids[bytes([b])]) for b in data)


# ---------------------------------------------------------------------------
# The independent oracle: languages and prefix languages up to a length bound
# ---------------------------------------------------------------------------
# A grammar is {name: expr}; expr is ("lit", str) | ("cls", str of chars) | ("ref", name)
# | ("seq", [expr...]) | ("alt", [expr...]) | ("rep", expr, min, max|None).
# Sets hold UTF-8 byte strings of at most `n` bytes. Prefixes are computed directly
# (Pref(Y1..Yk) = L(Y1..Yi-1) Pref(Yi) when Yi+1..Yk can all produce something), so
# they are exact up to `n` bytes however long the completions have to be.


def _concat(a: set[bytes], b: set[bytes], n: int) -> set[bytes]:
    """{x + y} with at most n bytes; `b` is bucketed by length so only fitting pairs are formed."""
    if not a or not b:
        return set()
    buckets: dict[int, list[bytes]] = {}
    for y in b:
        if len(y) <= n:
            buckets.setdefault(len(y), []).append(y)
    out: set[bytes] = set()
    for x in a:
        room = n - len(x)
        for length, ys in buckets.items():
            if length <= room:
                out.update([x + y for y in ys])
    return out


def _byte_prefixes(s: bytes, n: int) -> set[bytes]:
    return {s[:i] for i in range(min(len(s), n) + 1)}


def _productive(expr, good: set[str]) -> bool:
    kind = expr[0]
    if kind == "lit":
        return True
    if kind == "cls":
        return bool(expr[1])
    if kind == "ref":
        return expr[1] in good
    if kind == "seq":
        return all(_productive(e, good) for e in expr[1])
    if kind == "alt":
        return any(_productive(e, good) for e in expr[1])
    return expr[2] == 0 or _productive(expr[1], good)


def _iterate(item: set[bytes], lo: int, hi, n: int):
    """Yield (k, item^k) for k = 0, 1, ... while new strings can appear (or up to hi)."""
    cur, seen, k = {b""}, set(), 0
    while True:
        yield k, cur
        if hi is not None and k == hi:
            return
        if k >= lo:  # only powers that count: a string of a lower power may still be new up here
            seen |= cur
        cur = _concat(cur, item, n)
        k += 1
        if k > lo and cur <= seen:  # every later power is made of strings already seen
            return


def _lang(expr, env: dict[str, set[bytes]], n: int) -> set[bytes]:
    kind = expr[0]
    if kind == "lit":
        s = expr[1].encode("utf-8")
        return {s} if len(s) <= n else set()
    if kind == "cls":
        return {c.encode("utf-8") for c in expr[1] if len(c.encode("utf-8")) <= n}
    if kind == "ref":
        return env[expr[1]]
    if kind == "seq":
        out = {b""}
        for item in expr[1]:
            out = _concat(out, _lang(item, env, n), n)
        return out
    if kind == "alt":
        return set().union(*(_lang(e, env, n) for e in expr[1]))
    item, lo, hi = _lang(expr[1], env, n), expr[2], expr[3]
    return set().union(*(cur for k, cur in _iterate(item, lo, hi, n) if k >= lo))


def _pref(expr, env: dict, penv: dict, good: set[str], n: int) -> set[bytes]:
    kind = expr[0]
    if not _productive(expr, good):
        return set()
    if kind == "lit":
        return _byte_prefixes(expr[1].encode("utf-8"), n)
    if kind == "cls":
        return set().union(*(_byte_prefixes(c.encode("utf-8"), n) for c in expr[1]))
    if kind == "ref":
        return penv[expr[1]]
    if kind == "seq":
        out, left = set(), {b""}
        items = expr[1]
        for item in items:
            out |= _concat(left, _pref(item, env, penv, good, n), n)  # the rest is productive
            left = _concat(left, _lang(item, env, n), n)
        return out
    if kind == "alt":
        return set().union(*(_pref(e, env, penv, good, n) for e in expr[1]))
    item, lo, hi = expr[1], expr[2], expr[3]
    if hi == 0 or not _productive(item, good):
        return {b""}
    p_item, l_item = _pref(item, env, penv, good, n), _lang(item, env, n)
    out = set()
    for k, cur in _iterate(l_item, lo, hi, n):
        if hi is None or k < hi:
            out |= _concat(cur, p_item, n)
    return out


def oracle_sets(grammar: dict, n: int) -> tuple[set[bytes], set[bytes]]:
    """(sentences, prefixes of sentences) of `grammar`, each of at most `n` bytes."""
    good: set[str] = set()
    while True:
        new = {name for name, expr in grammar.items() if _productive(expr, good)}
        if new == good:
            break
        good = new
    env = {name: set() for name in grammar}
    while True:
        new_env = {name: _lang(expr, env, n) for name, expr in grammar.items()}
        if new_env == env:
            break
        env = new_env
    penv = {name: set() for name in grammar}
    while True:
        new_penv = {name: _pref(expr, env, penv, good, n) for name, expr in grammar.items()}
        if new_penv == penv:
            break
        penv = new_penv
    return env["root"], penv["root"]


L, C, R = (lambda s: ("lit", s)), (lambda s: ("cls", s)), (lambda s: ("ref", s))


def S(*items):
    return ("seq", list(items))


def A(*items):
    return ("alt", list(items))


def REP(e, lo=0, hi=None):
    return ("rep", e, lo, hi)


def check_exact(
    gbnf: str,
    oracle: dict,
    vocab: TokenVocabulary,
    *,
    text_len: int,
    walks: int = 30,
    seed: int = 0,
):
    """At reachable states (prefixes fed byte by byte, and token-level random walks), the
    mask equals the oracle's set. Texts are at most `text_len` bytes."""
    grammar = compile_ebnf(gbnf, vocab)
    max_tok = max(len(t) for t in vocab.token_bytes if t)
    lang, pre = oracle_sets(oracle, text_len + max_tok)

    def expected(text: bytes) -> set[int]:
        out = {i for i, t in enumerate(vocab.token_bytes) if t and text + t in pre}
        if text in lang:
            out.add(EOS)
        return out

    def check(m: EbnfMatcher, text: bytes) -> set[int]:
        got, want = allowed_ids(m, vocab), expected(text)
        if grammar.tables.overflowed:
            # The grammar hit the ambiguity bound (a parse state with too many stacks): the
            # continuations past it are cut off, so the mask may only be smaller, never wrong.
            assert got <= want, text
        else:
            assert got == want, text
        assert m.is_accepting() == (text in lang)
        return got

    rng = random.Random(seed)
    checked = 0
    short = sorted(p for p in pre if len(p) <= text_len)
    for text in rng.sample(short, min(len(short), 60)) + [b""]:
        m = grammar.matcher()
        if not feed_text(m, vocab, text):
            assert grammar.tables.overflowed, text
            continue
        check(m, text)
        checked += 1
    for _ in range(walks):
        m, text = grammar.matcher(), b""
        while True:
            got = check(m, text)
            checked += 1
            choices = sorted(
                i for i in got if i != EOS and len(text + vocab.token_bytes[i]) <= text_len
            )
            if not choices:
                break
            tid = rng.choice(choices)
            assert m.accept(tid)
            text += vocab.token_bytes[tid]
    return checked


# ---------------------------------------------------------------------------
# Meta-syntax
# ---------------------------------------------------------------------------

SMALL = alphabet_vocab("ab", max_len=2)


def sentences(gbnf: str, n: int, chars: str) -> set[str]:
    """All strings over `chars` up to length n that the matcher accepts as sentences."""
    g = compile_ebnf(gbnf, make_vocab(list(chars)))
    vocab = g.vocab
    ids = {tb.decode(): i for i, tb in enumerate(vocab.token_bytes) if tb is not None}
    out = set()
    for k in range(n + 1):
        for combo in itertools.product(chars, repeat=k):
            m = g.matcher()
            if all(m.accept(ids[c]) for c in combo) and m.is_accepting():
                out.add("".join(combo))
    return out


@pytest.mark.parametrize(
    "gbnf, expected",
    [
        ('root ::= "ab"', {"ab"}),
        ('root ::= "a" | "b"', {"a", "b"}),
        ('root ::= ("a" | "b") "c"', {"ac", "bc"}),
        ('root ::= "a"*', {"", "a", "aa", "aaa"}),
        ('root ::= "a"+', {"a", "aa", "aaa"}),
        ('root ::= "a"? "b"', {"b", "ab"}),
        ('root ::= "a"{2}', {"aa"}),
        ('root ::= "a"{2,}', {"aa", "aaa"}),
        ('root ::= "a"{1,2}', {"a", "aa"}),
        ('root ::= "a"{,2}', {"", "a", "aa"}),
        ("root ::= [a-b]", {"a", "b"}),
        ("root ::= [^a]", {"b", "c"}),
        ("root ::= [ac]", {"a", "c"}),
        ("root ::= .", {"a", "b", "c"}),
        ('root ::= x x\nx ::= "a" | ""', {"", "a", "aa"}),
        ('root ::= "a" | ', {"", "a"}),
        ('root ::= ( "a" | ) "b"', {"b", "ab"}),
        ('root ::= ""', {""}),
        ('root ::= "\\x61" "\\u0062"', {"ab"}),
        ("root ::= [\\x61-\\x62]{2}", {"aa", "ab", "ba", "bb"}),
        ('root ::= "a" # comment "b"\n  "c"', {"ac"}),
        ('root ::=\n  "a"\n  | "b" # continuation line starts with |\n', {"a", "b"}),
        ('root::="a"b\nb::="c"', {"ac"}),
        ('root ::= snake-case\nsnake-case ::= "b"', {"b"}),
        ('root ::= ("a" ("b" | "c"))+', {"ab", "ac"}),
    ],
)
def test_meta_syntax_features(gbnf, expected):
    assert sentences(gbnf, 3, "abc") == expected


def test_string_escapes_and_classes():
    vocab = make_vocab(['"', "\\", "\n", "\t", "é", "]", "-", "^", "a", "[", "\u2603"])
    ids = {tb: i for i, tb in enumerate(vocab.token_bytes) if tb is not None}
    g = compile_ebnf(r'root ::= "\"\\\n\t" "\u00e9" [\]\-^] [^\x00-\x7F]', vocab)
    m = g.matcher()
    for piece in ['"', "\\", "\n", "\t", "é", "-", "\u2603"]:
        assert m.accept(ids[piece.encode()]), piece
    assert m.is_accepting() and m.is_done()
    g2 = compile_ebnf(r'root ::= [\[\]^a]+ "\U00002603"', vocab)
    m = g2.matcher()
    for piece in ["[", "^", "]", "a", "\u2603"]:
        assert m.accept(ids[piece.encode()]), piece
    assert m.is_accepting()


@pytest.mark.parametrize(
    "gbnf, fragments",
    [
        ('root ::= foo "a"', ["undefined rule 'foo'", "line 1, column 10"]),
        ('root ::= "a"\nthing ::= roo', ["undefined rule 'roo'", "did you mean 'root'", "line 2"]),
        ('main ::= "a"', ["no 'root' rule"]),
        ("", ["empty"]),
        ("   \n# only a comment\n", ["empty"]),
        ('root ::= "\\q"', ["bad escape", "\\q", "column 11"]),
        ('root ::= "\\x4g"', ["bad escape", "hex digits"]),
        ('root ::= "\\ud800"', ["surrogate"]),
        ('root ::= ("a" "b"', ["unbalanced", "never closed", "column 10"]),
        ('root ::= ("a"\nnext ::= "b"', ["unbalanced", "never closed", "line 1"]),
        ('root ::= "a" "b")', ["unbalanced", "without a matching"]),
        ('root ::= "abc', ["unterminated string"]),
        ("root ::= [abc", ["unterminated character class"]),
        ("root ::= [z-a]", ["bad character range"]),
        ("root ::= []", ["empty character class"]),
        ('root ::= "a"{3,2}', ["bad repetition"]),
        ('root ::= "a"{9999999}', ["too large"]),
        ('root ::= "a" **', ["quantifier"]),
        ('root ::= "a"\nroot ::= "b"', ["defined twice"]),
        ('root := "a"', ["line 1"]),
        (
            'root ::= expr\nexpr ::= expr "+" "1" | "1"',
            ["left-recursive", "'expr'", "expr -> expr"],
        ),
        ('root ::= a\na ::= b "x"\nb ::= a | "y"', ["left-recursive", "a -> b -> a"]),
        ('root ::= a\na ::= c a "x" | "y"\nc ::= "z"?', ["left-recursive", "'a'"]),
        ('root ::= "(" root ")"', ["never produce"]),
    ],
)
def test_malformed_grammars_raise_grammar_error(gbnf, fragments):
    with pytest.raises(GrammarError) as info:
        compile_ebnf(gbnf, SMALL)
    assert info.value.param == "ebnf"
    assert isinstance(info.value, ValueError)
    for frag in fragments:
        assert frag in str(info.value), (frag, str(info.value))


def test_unproductive_alternative_is_dropped_and_unused_rules_are_fine():
    g = compile_ebnf('root ::= "a" | loop\nloop ::= "b" loop\nunused ::= "c"', SMALL)
    m = g.matcher()
    ids = {tb: i for i, tb in enumerate(SMALL.token_bytes) if tb}
    assert allowed_ids(m, SMALL) == {ids[b"a"]}  # "b..." can never finish


def test_right_recursion_and_deep_nesting():
    vocab = make_vocab(["(", ")", "a", "((", "))"])
    g = compile_ebnf(
        'root ::= list\nlist ::= "a" list | ""\n', vocab
    )  # right recursion: flat stack
    m = g.matcher()
    for _ in range(2000):
        assert m.accept(5)
    assert m.is_accepting()
    g = compile_ebnf('root ::= "(" root ")" | "a"', vocab)
    m = g.matcher()
    for _ in range(1500):
        assert m.accept(3)
    assert allowed_ids(m, vocab) == {3, 5, 6}
    m.accept(5)
    assert m.forced_text() == ")" * 1500 or len(m.forced_text()) == 256
    for _ in range(750):
        assert m.accept(7)
    assert m.is_done()


# ---------------------------------------------------------------------------
# Exactness against the enumerated oracle
# ---------------------------------------------------------------------------

PARENS_GBNF = """
root ::= ( "(" root ")" )*    # balanced parentheses
"""
PARENS_ORACLE = {"root": REP(S(L("("), R("root"), L(")")))}

ARITH_GBNF = """
root   ::= expr
expr   ::= term ("+" term)*
term   ::= factor ("*" factor)*
factor ::= [12] | "(" expr ")"
"""
ARITH_ORACLE = {
    "root": R("expr"),
    "expr": A(R("term"), S(R("term"), L("+"), R("expr"))),
    "term": A(R("factor"), S(R("factor"), L("*"), R("term"))),
    "factor": A(C("12"), S(L("("), R("expr"), L(")"))),
}

JSONLITE_GBNF = r"""
root  ::= value
value ::= obj | arr | "1" | str
obj   ::= "{" ( pair ( "," pair )* )? "}"
pair  ::= str ":" value
arr   ::= "[" ( value ( "," value )* )? "]"
str   ::= "\"" [a]* "\""
"""
JSONLITE_ORACLE = {
    "root": R("value"),
    "value": A(R("obj"), R("arr"), L("1"), R("str")),
    "obj": A(L("{}"), S(L("{"), R("pairs"), L("}"))),
    "pairs": A(R("pair"), S(R("pair"), L(","), R("pairs"))),
    "pair": S(R("str"), L(":"), R("value")),
    "arr": A(L("[]"), S(L("["), R("values"), L("]"))),
    "values": A(R("value"), S(R("value"), L(","), R("values"))),
    "str": S(L('"'), R("as"), L('"')),
    "as": A(L(""), S(L("a"), R("as"))),
}

LIST_GBNF = """
root ::= "[" ( item ( "," " "? item )* )? "]"
item ::= [a-c] [a-c]? | "x"
"""
LIST_ORACLE = {
    "root": A(L("[]"), S(L("["), R("items"), L("]"))),
    "items": A(R("item"), S(R("item"), L(","), A(L(""), L(" ")), R("items"))),
    "item": A(C("abc"), S(C("abc"), C("abc")), L("x")),
}

# Unicode: a negated class, bounded repetition, tokens that split characters into bytes.
# The vocabulary's bytes can spell few characters, so "[^...]" is a small finite set here.
UNI_GBNF = r"""
root ::= word{1,2} ("-" tail)? "!"?
word ::= [a-b\u00e9]{1,2}
tail ::= [^a-z\-!]
"""


def _uni_vocab() -> TokenVocabulary:
    pieces = list("ab1-!é日") + [
        "ab",
        "ba",
        "aé",
        "é-",
        "-1",
        "1!",
        "日!",
        "-日",
        "bé-",
        "bbb",
        "z",
    ]
    for ch in "é日":
        pieces += split_utf8(ch)
    pieces += [
        b"a\xc3",
        b"\xa9a",
        b"-\xe6\x97",
        b"\xa5!",
        b"\xed\xa0\x80",
        b"\xed",
        b"\xa0",
        b"\x80",
        b"\xff",
    ]
    return make_vocab(pieces)


UNI_VOCAB = _uni_vocab()
UNI_ORACLE = {
    "root": S(REP(R("word"), 1, 2), REP(S(L("-"), R("tail")), 0, 1), REP(L("!"), 0, 1)),
    "word": REP(C("abé"), 1, 2),
    "tail": C("".join(c for c in formable_chars(UNI_VOCAB) if not ("a" <= c <= "z" or c in "-!"))),
}

# 4-byte characters and positive classes spanning several UTF-8 lengths.
UNI4_GBNF = r"""
root ::= ( [x\u00e9\u65e5-\u65e6] | "\U0001F600" ){1,3} "."
"""
UNI4_ORACLE = {"root": S(REP(C("xé日旦😀"), 1, 3), L("."))}


def _uni4_vocab() -> TokenVocabulary:
    pieces = ["x", ".", "x.", "😀.", "é😀"]
    for ch in "é日旦😀":
        pieces += split_utf8(ch)
    pieces += [
        b"\xf0\x9f\x98\x81",
        b"\xf0\x9f\x98",
        b"\xe6\x97\xa6",
        b"\xe6\x97",
    ]  # 😁 and 旦 partials
    return make_vocab(pieces)


@pytest.mark.parametrize(
    "name, gbnf, oracle, vocab, text_len",
    [
        ("parens", PARENS_GBNF, PARENS_ORACLE, alphabet_vocab("()", max_len=3), 8),
        (
            "arith",
            ARITH_GBNF,
            ARITH_ORACLE,
            alphabet_vocab("12+*()", n_long=60, long_len=(3, 4)),
            6,
        ),
        (
            "jsonlite",
            JSONLITE_GBNF,
            JSONLITE_ORACLE,
            alphabet_vocab('{}[]":,1a', n_long=80, long_len=(3, 4)),
            6,
        ),
        ("list", LIST_GBNF, LIST_ORACLE, alphabet_vocab("[]abcx, ", long_len=(3, 4)), 6),
        ("unicode", UNI_GBNF, UNI_ORACLE, UNI_VOCAB, 9),
        ("unicode4", UNI4_GBNF, UNI4_ORACLE, _uni4_vocab(), 10),
    ],
)
def test_mask_is_exact_against_enumerated_language(name, gbnf, oracle, vocab, text_len, mask_walk):
    assert check_exact(gbnf, oracle, vocab, text_len=text_len) > 50


HAS_COMPILER = bool(shutil.which("c++") or shutil.which("g++"))


@pytest.fixture(params=["native", "numpy", "native-plain"])
def mask_walk(request, monkeypatch):
    """Masks by the C++ recognizer (as the engine runs; "-plain": one walk from the real
    parse state, no kernel route), or by the Python one and the numpy walk (where no
    compiler is present)."""
    if request.param == "numpy":
        monkeypatch.setattr(ebnf_runtime, "_native", [None])
    elif not HAS_COMPILER:
        pytest.skip("no C++ compiler: the native recognizer cannot be built here")
    else:
        assert ebnf_runtime.native_walk() is not None  # with a compiler, a failed build fails
        if request.param == "native-plain":
            monkeypatch.setattr(ebnf_runtime, "KERNEL_ROUTE", False)
    return request.param


# Random small grammars: the generator emits the GBNF text and the oracle structure side by side.


@st.composite
def random_grammar(draw):
    chars = "abc"
    n_rules = draw(st.integers(1, 3))
    names = ["root"] + [f"r{i}" for i in range(1, n_rules)]

    def expr(depth: int, rule_index: int):
        choices = ["lit", "cls"] + (["seq", "alt", "rep", "ref"] if depth < 3 else [])
        kind = draw(st.sampled_from(choices))
        if kind == "lit":
            s = draw(st.text(chars, max_size=2))
            return f'"{s}"', L(s)
        if kind == "cls":
            s = "".join(sorted(draw(st.sets(st.sampled_from(chars), min_size=1, max_size=2))))
            if draw(st.booleans()):
                return f"[{s}]", C(s)
            neg = "".join(
                c for c in chars if c not in s
            )  # the vocab only spells a, b, c (junk=False)
            return (f"[^{s}]", C(neg)) if neg else (f"[{s}]", C(s))
        if kind == "ref":
            # reference only later rules (or any rule behind a literal): no left recursion
            target = draw(st.sampled_from(names))
            if names.index(target) <= rule_index:
                return f'"a" {target}', S(L("a"), R(target))
            return target, R(target)
        if kind == "seq":
            parts = [expr(depth + 1, rule_index) for _ in range(draw(st.integers(2, 3)))]
            return "(" + " ".join(p[0] for p in parts) + ")", S(*(p[1] for p in parts))
        if kind == "alt":
            parts = [expr(depth + 1, rule_index) for _ in range(draw(st.integers(2, 3)))]
            return "(" + " | ".join(p[0] for p in parts) + ")", A(*(p[1] for p in parts))
        text, o = expr(depth + 1, rule_index)
        op = draw(st.sampled_from(["*", "+", "?", "{2}", "{1,2}", "{2,}"]))
        bounds = {
            "*": (0, None),
            "+": (1, None),
            "?": (0, 1),
            "{2}": (2, 2),
            "{1,2}": (1, 2),
            "{2,}": (2, None),
        }[op]
        return f"({text}){op}", REP(o, *bounds)

    lines, oracle = [], {}
    for i, name in enumerate(names):
        text, o = expr(0, i)
        lines.append(f"{name} ::= {text}")
        oracle[name] = o
    return "\n".join(lines), oracle


RANDOM_VOCAB = alphabet_vocab("abc", max_len=3, n_long=10, long_len=(4, 4), junk=False)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_grammar(), st.integers(0, 1000))
def test_random_grammars_are_exact(grammar, seed):
    gbnf, oracle = grammar
    try:
        compile_ebnf(gbnf, RANDOM_VOCAB)
    except GrammarError as exc:
        assert "never produce" in str(exc)  # e.g. root ::= "a" root: no finite sentence
        assert not oracle_sets(oracle, 8)[1]
        return
    check_exact(gbnf, oracle, RANDOM_VOCAB, text_len=5, walks=5, seed=seed)


WIDE_VOCAB = alphabet_vocab("abc", max_len=5, n_long=10, long_len=(6, 6), junk=False)


def python_reference(g, tables, did):
    """The Python recognizer on the same grammar, at the same parse state as the C++ one's
    ``did`` (moved over as configurations): the reference its masks are held to."""
    ref = Tables(g.network, *g.byte_classes)
    return ref, ref.import_(tables.export(did))


def assert_same_as_python(g, tables, did) -> None:
    """The C++ tables' mask, node states, accepting and next bytes at ``did`` equal the
    Python tables' (numpy walk) at the same configurations."""
    ref, ref_did = python_reference(g, tables, did)
    native = tables.native_mask(did, *g.vocab_walk)
    assert np.array_equal(native, ref.compute_mask(ref_did, *g.vocab_walk, True)), g.spec
    live = tables.walk(did, *g.vocab_walk) != ebnf_runtime.DEAD
    assert np.array_equal(live, ref.walk(ref_did, *g.vocab_walk) != ebnf_runtime.DEAD)
    assert tables.accepting(did) == ref.accepting(ref_did)
    assert tables.allowed_bytes(did) == ref.allowed_bytes(ref_did)


@pytest.mark.skipif(
    not HAS_COMPILER, reason="no C++ compiler: the native recognizer cannot be built here"
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_grammar(), st.integers(0, 1000), st.sampled_from([0, 3, 2048]), st.booleans())
def test_native_and_python_tables_give_the_same_masks(grammar, seed, dense_switch, kernel_route):
    """The C++ recognizer against the Python one along random walks: each parse state is
    new to the C++ tables when its mask is made (transitions computed inside the walk, the
    tables growing under it); the kernel route meets the same kernels under other stacks as
    the walk goes deeper; each accepted token is also fed to the Python tables, whose numpy
    walk runs with its whole-level phase from the first level, the third or never."""
    assert ebnf_runtime.native_walk() is not None
    gbnf, _ = grammar
    try:
        g = compile_ebnf(gbnf, WIDE_VOCAB)
    except GrammarError:
        return
    rng = random.Random(seed)
    m = g.matcher()
    old = ebnf_runtime.DENSE_SWITCH, ebnf_runtime.KERNEL_ROUTE
    ebnf_runtime.DENSE_SWITCH, ebnf_runtime.KERNEL_ROUTE = dense_switch, kernel_route
    try:
        for _ in range(10):
            tables, did = m.tables, m.state
            assert_same_as_python(g, tables, did)
            allowed = [i for i in m.allowed_token_ids() if i != EOS]
            if not allowed:
                break
            token = rng.choice(allowed)
            ref, ref_did = python_reference(g, tables, did)
            assert ref.advance(ref_did, WIDE_VOCAB.token_bytes[token]) != ebnf_runtime.DEAD
            assert m.accept(token)
    finally:
        ebnf_runtime.DENSE_SWITCH, ebnf_runtime.KERNEL_ROUTE = old


@pytest.mark.skipif(
    not HAS_COMPILER, reason="no C++ compiler: the native recognizer cannot be built here"
)
def test_kernel_route_reuses_kernel_walks_under_other_stacks(monkeypatch):
    """The full JSON grammar along a deeply nested document: at every token the kernel
    route's mask equals the Python tables', and the same string and object kernels, met
    again under deeper stacks, come from the cache with only their returns walked."""
    from sgl.constrained import ebnf

    assert ebnf_runtime.native_walk() is not None
    monkeypatch.setattr(ebnf, "WARM_BUDGET_S", 0.0)  # every walk made by the document's masks
    doc = {
        "a": [{"b": "xy", "c": [1, 2.5, {"d": 'é"q'}]}, {"b": "z", "c": []}],
        "e": {"f": {"g": ["h", "i"]}},
    }
    text = json.dumps(doc)
    pieces = sorted({text[i : i + n] for n in (1, 2, 3) for i in range(len(text) - n + 1)})
    vocab = make_vocab(pieces + ['"}', '"]', '",', '": ', "}]", "]}"])
    g = compile_ebnf(JSON_GRAMMAR, vocab)
    m = g.matcher()
    token_of = {tb.decode(): i for i, tb in enumerate(vocab.token_bytes) if tb}
    pos = 0
    tables = m.tables
    while pos < len(text):
        assert m.tables is tables
        assert_same_as_python(g, tables, m.state)
        assert m.accept(token_of[text[pos : pos + 1]])
        pos += 1
    assert tables.core.lifts(), "returns below the kernels were walked from real states"
    assert tables.core.kernel_walks_done() < len(text) // 3, "kernels met again came from the cache"


@pytest.mark.skipif(
    not HAS_COMPILER, reason="no C++ compiler: the native recognizer cannot be built here"
)
def test_whole_subtrees_inside_strings_match_python():
    """Inside a string most subtrees of the trie keep the state where it is and are marked
    whole, not walked: with every string of up to 4 bytes over an alphabet that has quotes,
    escapes (deep subtrees, some mixed) and some non-ASCII tokens, the masks at every parse state
    of a document with strings, escapes and nesting equal the Python tables'."""
    assert ebnf_runtime.native_walk() is not None
    vocab = alphabet_vocab(
        'a"\\:{,}',
        max_len=4,
        n_long=60,
        long_len=(5, 8),
        junk=False,
        extra=["é", "aé", "éa", 'é"', '"é', "aaé", "\\é"],
    )
    g = compile_ebnf(JSON_GRAMMAR, vocab)
    text = json.dumps({"a": 'a\\"é', "aa": {"": ["é", "a"]}}, ensure_ascii=False)
    m = g.matcher()
    for byte in text.encode():
        assert_same_as_python(g, m.tables, m.state)
        assert m.accept_text(bytes([byte]))


@pytest.mark.skipif(
    not HAS_COMPILER, reason="no C++ compiler: the native recognizer cannot be built here"
)
@pytest.mark.parametrize("bound", ["{0,5}", "{2,40}", "{70,100}"])
def test_whole_subtrees_inside_bounded_strings_match_python(bound):
    """Inside a bounded string each byte moves the count on: a subtree is marked whole only
    where the count leaves room for its longest token (and through the helper blocks of
    long bounds). At every parse state of strings that fill the bound, the masks equal the
    Python tables'."""
    assert ebnf_runtime.native_walk() is not None
    # deep subtrees of letters only (marked whole where the count allows), quotes apart
    vocab = alphabet_vocab(
        "ab",
        max_len=7,
        n_long=40,
        long_len=(8, 30),
        junk=False,
        extra=['"', 'a"', '"a', '",', ",", '","', 'ab"', '"ab', "é", "aé"],
    )
    gbnf = f'root ::= item ("," item)*\nitem ::= "\\"" [ab]{bound} "\\""'
    g = compile_ebnf(gbnf, vocab)
    lo, hi = (int(x) for x in bound.strip("{}").split(","))
    text = ",".join('"' + "ab" * (n // 2) + "a" * (n % 2) + '"' for n in (lo, hi, (lo + hi) // 2))
    m = g.matcher()
    for byte in text.encode():
        assert_same_as_python(g, m.tables, m.state)
        assert m.accept_text(bytes([byte]))
    assert m.is_accepting()


COUNTED_BODIES = {  # a counted repetition -> members that run it to each end and the middle
    "[ab]{0,300}": ["", "ab" * 150, "a" * 151],
    "[ab]{150,200}": ["a" * 150, "ab" * 100, "b" * 175],
    '("é" | [ab]){3,90}': ["éab", "é" * 45 + "ab" * 22 + "a", "aé" * 20],
    '("ab" [ab]{0,3}){2,100}': ["abab", "abbbb" * 100, "ab" * 50 + "abaa" * 25],
}


@pytest.mark.skipif(
    not HAS_COMPILER, reason="no C++ compiler: the native recognizer cannot be built here"
)
@pytest.mark.parametrize("body", list(COUNTED_BODIES))
def test_shared_kernel_walks_of_counted_copies_match_python(body, monkeypatch):
    """The copies of a counted repetition that no token of up to ``share_horizon`` bytes can
    tell apart share one kernel walk; tokens over it (here up to 41 bytes, some of "é") are
    walked from the real state. At every parse state of members that fill the count, stop
    short of it or sit between, the masks equal the Python tables' (which share nothing),
    and less than half as many kernels are walked as with no sharing (horizon past every
    count)."""
    from sgl.constrained import ebnf, ebnf_automaton

    assert ebnf_runtime.native_walk() is not None
    monkeypatch.setattr(ebnf, "WARM_BUDGET_S", 0.0)  # every walk made by the document's masks
    vocab = alphabet_vocab(
        "ab",
        max_len=7,
        n_long=40,
        long_len=(8, 30),
        junk=False,
        extra=['"', 'a"', '"a', '",', ",", '","', 'ab"', "é", "aé", "éa", "é" * 9, "a" * 40 + '"'],
    )
    gbnf = f'root ::= item ("," item)*\nitem ::= "\\"" {body} "\\""'
    text = ",".join(f'"{member}"' for member in COUNTED_BODIES[body])
    walks = {}
    for horizon in (ebnf_automaton.SHARE_HORIZON, 10**6):
        monkeypatch.setattr(ebnf_automaton, "SHARE_HORIZON", horizon)
        g = compile_ebnf(gbnf, vocab)
        m = g.matcher()
        tables = m.tables
        for byte in text.encode():
            if horizon < 10**6:
                assert_same_as_python(g, tables, m.state)
            else:
                m.allowed_token_ids()
            assert m.accept_text(bytes([byte]))
        assert m.is_accepting()
        walks[horizon] = tables.core.kernel_walks_done()
    assert 2 * walks[16] < walks[10**6], walks


def test_copies_share_a_walk_only_where_no_short_token_tells_them_apart():
    """``x{0,100}``: the copies with 17 or more after them (0..82) are one kernel walk, each
    of the last 17 its own; ``x{20,30}``: the first three mandatory copies (17 or more still
    to come after each) are one, the other 17 mandatory and the 10 optional copies each
    their own. States outside the copies stand for themselves."""
    from sgl.constrained.ebnf_automaton import SHARE_HORIZON, build_network
    from sgl.constrained.ebnf_parse import parse_grammar

    assert SHARE_HORIZON == 16
    for body, walks in (("[ab]{0,100}", 1 + 17), ("[ab]{20,30}", 1 + 17 + 10)):
        net = build_network(parse_grammar(f'root ::= "x" {body} "y"'))
        reading = [s for s in range(net.n_states) if net.byte_edges[s]]
        assert all(net.share[net.share[s]] == net.share[s] for s in range(net.n_states))
        assert len({net.share[s] for s in reading}) == walks + 2, body  # + the "x" and "y" states
        lits = [s for s in reading if net.byte_edges[s][0][0] in b"xy"]
        assert all(net.share[s] == s for s in lits)


@pytest.mark.skipif(
    not HAS_COMPILER, reason="no C++ compiler: the native recognizer cannot be built here"
)
def test_compile_walks_the_kernels_ahead(monkeypatch):
    """With the budget to do it all, the compile makes the kernel walk of every kernel in
    ``warm_order``, and a document's masks then make none: every kernel a mask meets is there."""
    from sgl.constrained import ebnf

    assert ebnf_runtime.native_walk() is not None
    monkeypatch.setattr(ebnf, "WARM_BUDGET_S", 600.0)
    text = json.dumps({"ab": ["c", {"d": 1.5e3}], "e": "f", "g": [True, None]})
    vocab = make_vocab(sorted(set(text)) + ['"}', '",', '": ', "true", "null"])
    g = compile_ebnf(JSON_GRAMMAR, vocab)
    core = g.tables.core
    assert core.kernel_walks_done() == len(ebnf.warm_order(g.network)) > 10
    m = g.matcher()
    token_of = {tb.decode(): i for i, tb in enumerate(vocab.token_bytes) if tb}
    for ch in text:
        assert token_of[ch] in m.allowed_token_ids()
        assert m.accept(token_of[ch])
    assert core.kernel_walks_done() == len(ebnf.warm_order(g.network))


def test_kernel_walk_cache_is_bounded(monkeypatch):
    """Past KERNEL_MASK_CACHE_BYTES the least recently used kernel walks are dropped (and
    walked again when met): the masks stay the Python tables'."""
    if ebnf_runtime.native_walk() is None:
        pytest.skip("no C++ compiler: the native recognizer cannot be built here")
    monkeypatch.setattr(ebnf_runtime, "KERNEL_MASK_CACHE_BYTES", 1)
    text = json.dumps({"ab": ["c", {"d": 1}], "e": "f"})
    vocab = make_vocab(sorted(set(text)) + ['"}', '",'])
    g = compile_ebnf(JSON_GRAMMAR, vocab)
    m = g.matcher()
    token_of = {tb.decode(): i for i, tb in enumerate(vocab.token_bytes) if tb}
    for ch in text:
        assert_same_as_python(g, m.tables, m.state)
        assert m.tables.core.kernel_walks() <= 1
        assert m.accept(token_of[ch])


# ---------------------------------------------------------------------------
# Walks parsed by independent parsers
# ---------------------------------------------------------------------------


def shortest_completion(m: EbnfMatcher, vocab: TokenVocabulary, max_depth: int = 400) -> list[int]:
    """Single-byte tokens that finish the sentence: BFS, states deduplicated by the matcher's
    internal parse-state id (a test-only peek: equal ids are equal configuration sets)."""
    singles = [i for i, tb in enumerate(vocab.token_bytes) if tb is not None and len(tb) == 1]
    frontier = [(m, [])]
    seen = {m.state}
    for _ in range(max_depth):
        nxt = []
        for cur, path in frontier:
            if cur.is_accepting():
                return path
            allowed = allowed_ids(cur, vocab)
            for tid in singles:
                if tid in allowed:
                    c = cur.copy()
                    assert c.accept(tid)
                    if c.state not in seen:
                        seen.add(c.state)
                        nxt.append((c, path + [tid]))
        frontier = nxt
    raise AssertionError("no completion found")


def guided_walk(grammar, vocab: TokenVocabulary, rng: random.Random, steps: int) -> bytes:
    """Random tokens from the mask for `steps` steps, then the shortest way to a sentence, then
    EOS."""
    m = grammar.matcher()
    out = b""
    for _ in range(steps):
        allowed = allowed_ids(m, vocab)
        assert allowed, "dead end on a reachable state"
        choices = sorted(allowed - {EOS}) or [EOS]
        tid = rng.choice(choices)
        if tid == EOS:
            break
        assert m.accept(tid)
        out += vocab.token_bytes[tid]
    for tid in shortest_completion(m, vocab):
        assert m.accept(tid)
        out += vocab.token_bytes[tid]
    assert EOS in allowed_ids(m, vocab)
    assert m.accept(EOS) and m.is_done()
    assert allowed_ids(m, vocab) == {EOS}
    return out


JSON_PIECES = [
    *'{}[],:"\\ \n\t0123456789-+.eEtruefalsn/bu',
    "{",
    '{"',
    '":',
    '": ',
    '",',
    ', "',
    "},",
    "],",
    "[{",
    "}]",
    "[]",
    "{}",
    "true",
    "false",
    "null",
    "\\n",
    '\\"',
    "\\u00",
    "\\u",
    "e9",
    "A",
    "Fz",
    "12",
    "3.",
    ".5",
    "-0",
    "e+",
    "E-",
    "name",
    " name",
    "\u00e9",
    "\u65e5\u672c",
    "\U0001f600",
    b"\xe6",
    b"\x97\xa5",
    "\x01",
    "  ",
    "\n  ",
    'key":',
    "abc",
    " x",
    '"a"',
    '""',
    "ab\\",
    "\\\\",
]


def test_json_grammar_walks_produce_json_objects():
    vocab = make_vocab(JSON_PIECES)
    grammar = compile_ebnf(JSON_GRAMMAR, vocab)
    rng = random.Random(7)
    kinds = set()
    for _ in range(25):
        text = guided_walk(grammar, vocab, rng, steps=rng.randint(5, 60))
        value = json.loads(text.decode("utf-8"))
        assert isinstance(value, dict)
        kinds.update(type(v).__name__ for v in value.values())
    assert len(kinds) >= 3, kinds  # the walks explored several value types


def test_json_grammar_accepts_real_documents_and_rejects_non_objects():
    vocab = make_vocab(JSON_PIECES)
    grammar = compile_ebnf(JSON_GRAMMAR, vocab)
    docs = [
        {"a": [1, -2.5e3, True, None, {"b": 'q"\\/\n\u00e9\u0001'}], "c": {}},
        {},
        {"x": [[[]], [{}]], "y": "\U0001f600 \u65e5\u672c"},
    ]
    for doc in docs:
        for indent in (None, 2):
            m = grammar.matcher()
            assert m.accept_text(json.dumps(doc, indent=indent)), doc
            assert m.is_accepting()
    for bad in ["[1]", '"s"', "1", '{"a":}', "{'a': 1}", '{"a": 01}', '{"a": 1,}', '{"a"\x01: 1}']:
        m = grammar.matcher()
        assert not (m.accept_text(bad) and m.is_accepting()), bad


ARITH_PY_GBNF = r"""
root   ::= expr
expr   ::= term ( ws [-+] ws term )*
term   ::= factor ( ws [*/%] ws factor )*
factor ::= number | "-" factor | "(" ws expr ws ")" | name ( "(" ws args? ws ")" )?
args   ::= expr ( ws "," ws expr )*
number ::= [1-9] [0-9]{0,3} ( "." [0-9]+ )?
name   ::= [a-z_] [a-z0-9_]*
ws     ::= " "?
"""


def test_arithmetic_walks_parse_as_python_expressions():
    vocab = alphabet_vocab(
        "12+-*/%() ,x_", max_len=2, n_long=60, extra=["foo(", ") * (", ".5", "0", "x1", "(-"]
    )
    grammar = compile_ebnf(ARITH_PY_GBNF, vocab)
    rng = random.Random(3)
    for _ in range(25):
        text = guided_walk(grammar, vocab, rng, steps=rng.randint(3, 40)).decode()
        tree = ast.parse(text, mode="eval")  # Python's own parser is the oracle
        assert isinstance(tree, ast.Expression), text


def test_jsonlite_walks_parse_with_lark_earley():
    import lark

    oracle = lark.Lark(
        r"""
        start: value
        value: obj | arr | "1" | STR
        obj: "{" [pair ("," pair)*] "}"
        pair: STR ":" value
        arr: "[" [value ("," value)*] "]"
        STR: /"a*"/
        """,
        parser="earley",
        lexer="dynamic",
    )
    vocab = alphabet_vocab('{}[]":,1a', max_len=2, n_long=80)
    grammar = compile_ebnf(JSONLITE_GBNF, vocab)
    rng = random.Random(5)
    for _ in range(25):
        text = guided_walk(grammar, vocab, rng, steps=rng.randint(3, 40)).decode()
        oracle.parse(text)
        for cut in range(
            len(text) - 1, 0, -1
        ):  # a proper prefix that is not a sentence is rejected
            m = grammar.matcher()
            assert m.accept_text(text[:cut])
            try:
                oracle.parse(text[:cut])
                parses = True
            except lark.exceptions.LarkError:
                parses = False
            assert m.is_accepting() == parses, text[:cut]


# ---------------------------------------------------------------------------
# Matcher behaviour
# ---------------------------------------------------------------------------


def test_rollback_and_copy():
    vocab = alphabet_vocab("12+*()", max_len=2, n_long=60)
    grammar = compile_ebnf(ARITH_GBNF, vocab)
    rng = random.Random(11)
    m = grammar.matcher()
    masks = [allowed_ids(m, vocab)]
    states = [(m.is_accepting(), m.forced_text())]
    for _ in range(30):
        choices = sorted(masks[-1] - {EOS})
        assert m.accept(rng.choice(choices))
        masks.append(allowed_ids(m, vocab))
        states.append((m.is_accepting(), m.forced_text()))
    snapshot = m.copy()
    for n in (1, 4, 2, 10):
        m.rollback(n)
        del masks[-n:], states[-n:]
        assert allowed_ids(m, vocab) == masks[-1]
        assert (m.is_accepting(), m.forced_text()) == states[-1]
    assert snapshot.num_accepted == 30 and m.num_accepted == 13
    # the copy is independent of the original in both directions
    before = allowed_ids(snapshot, vocab)
    m.accept(sorted(masks[-1] - {EOS})[0])
    assert allowed_ids(snapshot, vocab) == before
    m.rollback(m.num_accepted)
    assert allowed_ids(m, vocab) == masks[0]
    with pytest.raises(ValueError):
        m.rollback(1)
    # a rejected token leaves the state unchanged
    bad = next(i for i in range(1, vocab.vocab_size) if i not in masks[0])
    assert not m.accept(bad)
    assert allowed_ids(m, vocab) == masks[0]
    # EOS is only accepted at a sentence, and rolls back like a token
    assert not m.accept(EOS)
    one = vocab.token_bytes.index(b"1")
    assert m.accept(one) and m.is_accepting() and not m.is_done()
    assert m.accept(EOS) and m.is_done() and allowed_ids(m, vocab) == {EOS}
    assert not m.accept(one)
    m.rollback(1)
    assert not m.is_done() and EOS in allowed_ids(m, vocab)


def test_accept_agrees_with_fill_mask_on_every_token():
    vocab = UNI_VOCAB
    grammar = compile_ebnf(UNI_GBNF, vocab)
    rng = random.Random(2)
    for _ in range(20):
        m = grammar.matcher()
        for _ in range(rng.randint(0, 6)):
            allowed = allowed_ids(m, vocab)
            for tid in range(vocab.vocab_size):
                assert m.copy().accept(tid) == (tid in allowed), tid
            choices = sorted(allowed - {EOS})
            if not choices:
                break
            assert m.accept(rng.choice(choices))


def test_dead_ends_are_empty_masks_not_exceptions():
    vocab = make_vocab(["a", "b"])
    m = compile_ebnf('root ::= "a" "z"', vocab).matcher()  # no token spells "z"
    assert m.accept(3)
    assert allowed_ids(m, vocab) == set()
    assert not m.is_accepting() and not m.is_done()
    assert m.forced_text() == "z"
    # exponentially ambiguous: 2^n stacks after n "a"s. A token whose parse state would
    # pass the bound is treated as not allowed, by the mask and by accept() alike.
    amb = compile_ebnf('root ::= s\ns ::= "a" s "b" | "a" s "b" "b" | ""', vocab)
    m = amb.matcher()
    n = 0
    while m.accept(3):
        n += 1
        assert n < 40
    assert 5 < n and allowed_ids(m, vocab) == {4}
    while not m.is_accepting():
        assert allowed_ids(m, vocab) == {4} and m.accept(4)


def test_forced_text_follows_literal_chains():
    vocab = make_vocab(list('{}":, abcdefghijklmnopqrstuvwxyz0123456789') + ['{"', "é"])
    g = compile_ebnf(
        r"""
        root ::= "{" ws "\"name\":" ws "\"" [a-z]+ "\"" "," ws "\"é\"" "}"
        ws ::= " "?
        """,
        vocab,
    )
    m = g.matcher()
    assert m.forced_text() == "{"
    m.accept(vocab.token_bytes.index(b"{"))
    assert m.forced_text() == ""  # optional space or '"'
    m.accept(vocab.token_bytes.index(b'"'))
    assert m.forced_text() == 'name":'
    assert m.accept_text('name": "abc"')
    assert m.forced_text() == ","
    assert m.accept_text(", ")
    assert m.forced_text() == '"é"}'
    assert m.accept_text('"é"}') and m.is_done() and m.forced_text() == ""
    # a forced multi-byte character is never split
    g2 = compile_ebnf('root ::= "日" [ab]', vocab)
    assert g2.matcher().forced_text() == "日"
    # an optional tail: nothing is forced at a sentence
    g3 = compile_ebnf('root ::= "ab" "cd"?', vocab)
    m3 = g3.matcher()
    assert m3.forced_text() == "ab"
    m3.accept_text("ab")
    assert m3.forced_text() == ""


def test_token_ids_out_of_range_special_and_vocab_size_padding():
    base = make_vocab(["a", "b", "ab"])
    padded = TokenVocabulary(
        token_bytes=base.token_bytes + (None,) * 40,
        eos_token_ids=(EOS,),
        vocab_size=base.vocab_size + 40,
    )
    g = compile_ebnf('root ::= ("a" | "b")+', padded)
    m = g.matcher()
    assert allowed_ids(m, padded) == {3, 4, 5}
    for tid in (-1, 1, 2, padded.vocab_size - 1, padded.vocab_size, 10**9):
        assert not m.accept(tid)
    assert m.accept(5) and allowed_ids(m, padded) == {EOS, 3, 4, 5}


def test_fill_mask_ors_into_row_and_keeps_caller_bits():
    vocab = make_vocab(["a", "b"])
    m = compile_ebnf('root ::= "a"', vocab).matcher()
    row = torch.zeros(1, dtype=torch.int32)
    row[0] = 1 << 4
    m.fill_mask(row)
    assert int(row[0]) == (1 << 4) | (1 << 3)
    assert compile_ebnf('root ::= "a"', vocab).kind == "ebnf"


def test_bit_31_and_many_words():
    pieces = [f"t{i}" for i in range(100)]
    vocab = make_vocab(pieces, extra_none=0)  # ids 1..100 are t0..t99
    g = compile_ebnf('root ::= "t" [0-9]{1,2}', vocab)
    got = allowed_ids(g.matcher(), vocab)
    assert got == set(range(1, 101))
    row = torch.zeros((vocab.vocab_size + 31) // 32, dtype=torch.int32)
    g.matcher().fill_mask(row)
    assert int(row[0]) == -2  # bits 1..31 set: the sign bit is a token too


def test_tables_are_rebuilt_when_they_grow_and_matchers_survive(monkeypatch):
    from sgl.constrained import ebnf_runtime

    vocab = alphabet_vocab("()", max_len=3)
    grammar = compile_ebnf(PARENS_GBNF, vocab)
    m = grammar.matcher()
    assert feed_text(m, vocab, b"((()(")
    expected = allowed_ids(m, vocab)
    other = m.copy()
    monkeypatch.setattr(ebnf_runtime, "MAX_DSTATES", 1)
    assert feed_text(m, vocab, b"(")  # triggers a rebuild; its history is re-interned
    m.rollback(1)
    assert allowed_ids(m, vocab) == expected
    assert allowed_ids(other, vocab) == expected
    assert grammar.matcher().forced_text() == ""


def test_repetition_through_recursion_is_exact():
    """Found by the random grammars: "aaa" is a sentence (three "a" root, each root empty),
    which the oracle once missed by stopping a repetition on strings of lower powers."""
    gbnf = 'root ::= r2\nr2 ::= (("a" root){2,})*'
    oracle = {"root": R("r2"), "r2": REP(REP(S(L("a"), R("root")), 2), 0)}
    assert b"aaa" in oracle_sets(oracle, 8)[0]
    check_exact(gbnf, oracle, RANDOM_VOCAB, text_len=5, walks=5, seed=0)


@pytest.mark.parametrize(
    "gbnf, oracle",
    [
        ('root ::= [ab]{0,9} "."', {"root": S(REP(C("ab"), 0, 9), L("."))}),
        ('root ::= ("ab" | "c"){2,7}', {"root": REP(A(L("ab"), L("c")), 2, 7)}),
        ('root ::= "x"{5,} "y"', {"root": S(REP(L("x"), 5, None), L("y"))}),
        ('root ::= ([ab]{4}){0,2} "c"', {"root": S(REP(REP(C("ab"), 4, 4), 0, 2), L("c"))}),
        ("root ::= [abc]{7,8}", {"root": REP(C("abc"), 7, 8)}),
    ],
)
def test_blocked_repetition_is_exact(monkeypatch, gbnf, oracle):
    """Large counts are built from blocks in helper rules; shrunk blocks (2, past 3) put
    that construction under the brute-force check."""
    from sgl.constrained import ebnf_automaton

    monkeypatch.setattr(ebnf_automaton, "REPEAT_BLOCK", 2)
    monkeypatch.setattr(ebnf_automaton, "BLOCKED_REPEAT", 3)
    assert "~" in " ".join(
        compile_ebnf(gbnf, alphabet_vocab("abcxy.", max_len=3))._net.rule_names
    )  # blocks were used
    assert check_exact(gbnf, oracle, alphabet_vocab("abcxy.", max_len=3), text_len=10) > 20


def test_long_counted_repetition_compiles_small_and_counts_exactly():
    vocab = alphabet_vocab("ab.", max_len=3)
    grammar = compile_ebnf('root ::= [ab]{0,65535} "."', vocab)
    assert grammar.network.n_states < 20_000  # not 65535 inline copies
    bounded = compile_ebnf('root ::= [ab]{2,3000} "."', vocab)
    for n, ok in ((1, False), (2, True), (1999, True), (3000, True), (3001, False)):
        m = bounded.matcher()
        assert (m.accept_text("ab"[:1] * n + ".") and m.is_accepting()) == ok, n
