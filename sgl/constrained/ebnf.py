r"""EBNF (GBNF) grammars -> exact token masks for constrained decoding.

``compile_ebnf(spec, vocab)`` turns grammar text into an :class:`EbnfGrammar`; each
request gets an :class:`EbnfMatcher` from ``grammar.matcher()``. Token t is allowed
exactly when the text so far followed by the bytes of t is a prefix of some sentence
of the grammar, and EOS exactly when the text so far is a sentence.

Dialect
-------
The ``::=`` dialect of llama.cpp's GBNF (also accepted by SGLang's ``ebnf`` field)::

    # a comment runs to the end of the line
    root   ::= "{" ws pair ("," ws pair)* "}"       # the grammar starts at `root`
    pair   ::= key ":" ws [0-9]+
    key    ::= "\"" [a-z_]{1,16} "\""
    ws     ::= [ \t\n]?

* Rules: ``name ::= alternatives``. Names are ``[A-Za-z_][A-Za-z0-9_-]*``. A rule runs
  until the next ``name ::=``, so rules may span lines (and continuation lines may
  start with ``|``). A rule named ``root`` is required; each rule is defined once.
* String literals in double quotes, with escapes ``\n \t \r \f \v \b \0 \\ \" \' \/
  \[ \] \- \^ \.``, ``\xNN``, ``\uNNNN`` and ``\UNNNNNNNN``. ``""`` is the empty string.
* Character classes ``[a-z0-9_]``, negated ``[^"\\]``, with the same escapes; ranges
  ``a-z``; a ``-`` first or last is literal. ``.`` is any character (newline included).
* Grouping ``( )``, alternation ``|`` (an empty alternative matches the empty string),
  postfix ``*``, ``+``, ``?`` and bounded repetition ``{m}``, ``{m,}``, ``{m,n}``,
  ``{,n}`` (bounds up to 10000).
* Characters are Unicode code points of the UTF-8 text; matching is done on bytes, so
  a token may end (or start) in the middle of a character. Surrogates never match.
* Recursion is allowed anywhere except on the left: a rule that can call itself again
  before reading any text (``expr ::= expr "+" term``) is rejected with a GrammarError
  that names the cycle; write it with repetition (``expr ::= term ("+" term)*``).
  Alternatives that can never finish are dropped; if root can never finish, that is
  an error.

Design
------
:mod:`~sgl.constrained.ebnf_parse` parses the text with lark and decodes literals and
classes; :mod:`~sgl.constrained.ebnf_automaton` builds a byte-level recursive
transition network (one NFA per rule, calls as edges, tail calls without a stack
frame) and checks and trims it; :mod:`~sgl.constrained.ebnf_runtime` runs it as a
set of stacks (a GLR-style frontier) that is interned into a lazily built DFA, and
computes masks by walking the vocabulary's byte trie, with per-state mask caching: in C++
(:mod:`~sgl.constrained.ebnf_native`, ``csrc/ebnf_native.cpp``) where it builds, else the
Python tables and a numpy walk (the same masks).

Highly ambiguous grammars can make the number of parse stacks grow exponentially
(e.g. ``s ::= "a" s "b" | "a" s "b" "b" | ""``). A parse state is bounded to
``ebnf_runtime.MAX_CONFIGS`` stacks: a token whose state would exceed it is treated as
not allowed, by the mask and by ``accept`` alike (masks stay sound and consistent; a
warning is logged), and if nothing else is left the mask is empty. Nothing raises.

Tokens whose bytes are ``None`` or empty (special tokens) are never allowed; EOS ids
are allowed exactly when the text is a sentence, and after EOS only EOS is.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from sgl.constrained.ebnf_automaton import build_network
from sgl.constrained.ebnf_completion import Completions, TokenCover
from sgl.constrained.ebnf_parse import parse_grammar
from sgl.constrained.ebnf_runtime import DEAD, byte_classes, make_tables
from sgl.constrained.ebnf_tables import TablesBase
from sgl.constrained.ebnf_trie import PerVocabulary, vocab_trie
from sgl.constrained.errors import GrammarError

if TYPE_CHECKING:
    import torch

    from sgl.constrained.ebnf_automaton import Network
    from sgl.constrained.ebnf_trie import VocabTrie
    from sgl.constrained.vocab import TokenVocabulary

__all__ = ["JSON_GRAMMAR", "EbnfGrammar", "EbnfMatcher", "compile_ebnf"]

# Any JSON object (OpenAI response_format {"type": "json_object"}). Whitespace is bounded:
# at most one newline plus 20 blanks between tokens, so a model cannot stall in it forever.
JSON_GRAMMAR = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws

array  ::= "[" ws ( value ("," ws value)* )? "]" ws

string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\"" ws

number ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]{1,15} )? ws

ws     ::= | " " | "\n" [ \t]{0,20}
"""

_DONE = -1  # history marker: EOS was accepted
# Compile time spent making kernel walks ahead (see warm_order): a document's first string,
# value or object otherwise pays them in its masks (~100 us a walk inside a string).
WARM_BUDGET_S = 0.03


def warm_order(net) -> np.ndarray:
    """The kernels worth walking at compile time, most used first: the reading states (each
    walk's start; one per share class, see Network.share) of the rules called from the
    most places (a JSON schema's shared string, value and object rules), then the rest."""
    reading = np.fromiter(map(bool, net.byte_edges), dtype=bool, count=net.n_states)
    states = np.flatnonzero(reading & (np.asarray(net.share) == np.arange(net.n_states)))
    sites = np.zeros(len(net.rule_names), dtype=np.int64)
    for calls in net.calls:
        for rule, _ in calls:
            sites[rule] += 1
    order = np.argsort(-sites[np.asarray(net.rule_of)[states]], kind="stable")
    return states[order].astype(np.int32)


class EbnfGrammar:
    """A compiled grammar bound to one vocabulary; cheap to share, makes matchers."""

    kind = "ebnf"

    def __init__(
        self, spec: str, vocab: TokenVocabulary, rules: dict | None = None, kind: str = "ebnf"
    ) -> None:
        """``rules``: an already built AST (e.g. a JSON schema's, with ``kind`` "json_schema")
        instead of parsing ``spec``."""
        self.spec = spec
        self.kind = kind
        self.vocab = vocab
        self._net = build_network(rules if rules is not None else parse_grammar(spec))
        self._byte_class, self._class_rep = byte_classes(self._net)
        self._trie = vocab_trie(vocab)
        self._node_class = self._byte_class[self._trie.byte]
        self._eos = frozenset(int(i) for i in vocab.eos_token_ids)
        self._lock = threading.RLock()
        # Budget-aware masks need every state's shortest completion: ~4 us a state, so only
        # for networks up to COMPLETIONS_MAX_STATES (larger ones decode without budgets).
        self._completions = (
            Completions(self._net, _token_cover(vocab))
            if self._net.n_states <= COMPLETIONS_MAX_STATES
            else None
        )
        self._tables = self._new_tables()
        self._initial = self._tables.initial()
        # every request needs it: made now, by one walk of the state (its kernels, walked one
        # by one, would cost a large grammar's compile more than a whole walk)
        self._tables.mask(self._initial, self._trie, self._node_class, kernel_route=False)
        self._tables.warm(warm_order(self._net), self._trie, self._node_class, WARM_BUDGET_S)
        self._eos_words = self._trie.eos_words

    def matcher(self) -> EbnfMatcher:
        with self._lock:
            return EbnfMatcher(self, self._tables, [self._initial])

    def _current_tables(self) -> TablesBase:
        """The live tables, replaced by fresh ones when they have grown past their bounds."""
        if self._tables.too_big():
            self._tables = self._new_tables()
            self._initial = self._tables.initial()
        return self._tables

    def _new_tables(self) -> TablesBase:
        tables = make_tables(self._net, self._byte_class, self._class_rep)
        tables.completions = self._completions
        return tables

    def __repr__(self) -> str:
        return f"EbnfGrammar({len(self._net.rule_names)} rules, {self._net.n_states} states)"

    # -- inspection (tests and benchmarks; read-only: nothing here is to be mutated) -------

    @property
    def network(self) -> Network:
        """The byte-level recursive transition network the recognizer runs."""
        return self._net

    @property
    def tables(self) -> TablesBase:
        """The live mask tables (replaced by fresh ones when they outgrow their bounds)."""
        return self._tables

    @property
    def byte_classes(self) -> tuple[np.ndarray, list[int]]:
        """(byte -> class id, a representative byte per class): bytes no edge tells apart."""
        return self._byte_class, self._class_rep

    @property
    def vocab_walk(self) -> tuple[VocabTrie, np.ndarray]:
        """(the vocabulary's trie, the byte class of each trie node): what a mask walks."""
        return self._trie, self._node_class


class EbnfMatcher:
    """The parse state of one request: accepted tokens so far, with history for rollback."""

    def __init__(self, grammar: EbnfGrammar, tables: TablesBase, history: list[int]) -> None:
        self._g = grammar
        self._tables = tables
        self._hist = history  # parse state (dstate id) after each accepted token; _DONE after EOS

    # -- helpers -------------------------------------------------------------------

    def _sync(self) -> TablesBase:
        """Make the history refer to the grammar's live tables (they may have been replaced)."""
        tables = self._g._current_tables()
        if tables is not self._tables:
            old = self._tables
            self._hist = [h if h == _DONE else tables.import_(old.export(h)) for h in self._hist]
            self._tables = tables
        return tables

    # -- inspection (tests and benchmarks) ------------------------------------------

    @property
    def tables(self) -> TablesBase:
        """The tables this matcher's parse states are interned in."""
        return self._tables

    # -- the contract ----------------------------------------------------------------

    def fill_mask(self, row: torch.Tensor, budget: int | None = None) -> None:
        """Set the bit of every allowed token id in `row` (int32 words, zeroed by the caller).
        With ``budget`` (tokens left, this one included), only tokens after which a
        completion still fits, when one does (distances in ``ebnf_completion``)."""
        import torch

        with self._g._lock:
            tables = self._sync()
            cur = self._hist[-1]
            if cur == _DONE:
                words = self._g._eos_words
            else:
                g = self._g
                words = (
                    None
                    if budget is None or tables.completions is None
                    else tables.budget_mask(cur, budget, g._trie, g._node_class)
                )
                if words is None:
                    words = tables.mask(cur, g._trie, g._node_class)
        src = torch.from_numpy(words)
        if row.device != src.device:
            src = src.to(row.device)
        row.bitwise_or_(src)

    def completion_fits(self, budget: int) -> bool:
        with self._g._lock:
            tables = self._sync()
            cur = self._hist[-1]
            if cur == _DONE or tables.completions is None:
                return True
            return tables.settle(cur) <= budget

    def allowed_token_ids(self) -> list[int]:
        """The allowed ids as a list (for tests and debugging)."""
        import torch

        row = torch.zeros(self._g._trie.n_words, dtype=torch.int32)
        self.fill_mask(row)
        bits = np.unpackbits(row.numpy().view(np.uint8), bitorder="little")
        return np.flatnonzero(bits[: self._g._trie.vocab_size]).tolist()

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) if the token is not allowed."""
        with self._g._lock:
            tables = self._sync()
            cur = self._hist[-1]
            if token_id in self._g._eos:
                if cur == _DONE or tables.accepting(cur):
                    self._hist.append(_DONE)
                    return True
                return False
            if cur == _DONE:
                return False
            token_bytes = self._g.vocab.token_bytes
            if not (0 <= token_id < min(len(token_bytes), self._g._trie.vocab_size)):
                return False
            data = token_bytes[token_id]
            if not data:
                return False
            nxt = tables.advance(cur, data)
            if nxt == DEAD:
                return False
            self._hist.append(nxt)
            return True

    def accept_text(self, text: str | bytes) -> bool:
        """Advance by raw text (e.g. jump-forward text) without tokens; False and unchanged if
        invalid.

        Rolls back as one step.
        """
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        with self._g._lock:
            tables = self._sync()
            cur = self._hist[-1]
            if cur == _DONE:
                return not data
            nxt = tables.advance(cur, data)
            if nxt == DEAD:
                return False
            self._hist.append(nxt)
            return True

    def is_accepting(self) -> bool:
        """The text so far is a complete sentence (or EOS was accepted)."""
        with self._g._lock:
            tables = self._sync()
            cur = self._hist[-1]
            return cur == _DONE or tables.accepting(cur)

    def is_done(self) -> bool:
        """EOS was accepted, or the text is a sentence that cannot be extended."""
        with self._g._lock:
            tables = self._sync()
            cur = self._hist[-1]
            return cur == _DONE or (tables.accepting(cur) and tables.allowed_bytes(cur) == 0)

    def forced_text(self) -> str:
        """The text every continuation must start with ("" if none), whole characters only."""
        with self._g._lock:
            tables = self._sync()
            cur = self._hist[-1]
            if cur == _DONE:
                return ""
            return tables.forced_text(cur)

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens."""
        if n < 0 or n > len(self._hist) - 1:
            raise ValueError(f"rollback({n}): only {len(self._hist) - 1} tokens were accepted")
        if n:
            del self._hist[-n:]

    def copy(self) -> EbnfMatcher:
        with self._g._lock:
            return EbnfMatcher(self._g, self._tables, list(self._hist))

    @property
    def num_accepted(self) -> int:
        return len(self._hist) - 1

    @property
    def state(self) -> int:
        """The parse state id (in the current tables; _DONE after EOS): equal ids, equal futures."""
        with self._g._lock:
            self._sync()
            return self._hist[-1]


COMPLETIONS_MAX_STATES = 100_000


def _build_token_cover(vocab: TokenVocabulary) -> TokenCover:
    """The vocabulary's :class:`TokenCover`, special and EOS tokens excluded (~0.1 s for 49k
    tokens)."""
    eos = set(vocab.eos_token_ids)
    return TokenCover(
        frozenset(
            tb for i, tb in enumerate(vocab.token_bytes[: vocab.vocab_size]) if tb and i not in eos
        )
    )


_token_cover = PerVocabulary(_build_token_cover)


def compile_ebnf(spec: str, vocab: TokenVocabulary) -> EbnfGrammar:
    """Compile GBNF text for `vocab`; raises GrammarError (param "ebnf") pointing at the problem."""
    if not isinstance(spec, str) or not spec.strip():
        raise GrammarError(
            "ebnf: the grammar is empty; define at least 'root ::= ...'", param="ebnf"
        )
    return EbnfGrammar(spec, vocab)
