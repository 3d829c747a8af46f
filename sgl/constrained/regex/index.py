r"""Canonical regex -> exact token-level matcher, on outlines-core's Rust index.

outlines-core 0.2.14 builds the map ``state -> {token: next state}`` of
:class:`RegexGrammar` in Rust, but its walk has two bugs that make
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
removed from every character class (it is never generated, see
:func:`~sgl.constrained.regex.algebra.rx_set`), a search can only
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
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from sgl.constrained.errors import ConstraintTooLarge, GrammarError
from sgl.constrained.jump_forward import ByteJumpForward, single_byte_tokens, split_complete_utf8
from sgl.constrained.regex.algebra import Rx

if TYPE_CHECKING:
    from sgl.constrained.isolation import IndexBuilder
    from sgl.constrained.vocab import TokenVocabulary

__all__ = [
    "EAGER_MASK_STATES",
    "MAX_POSITIONS",
    "RegexGrammar",
    "RegexMatcher",
    "check_size",
    "index_vocab",
]

MAX_POSITIONS = 2048
EAGER_MASK_STATES = (
    4096  # grammars up to this many states get all masks at compile time (6 KB each at 49k)
)


def check_size(rx: Rx, param: str, what: str) -> None:
    """Reject constraints whose automaton would be too big to build quickly."""
    if rx.size > MAX_POSITIONS:
        raise ConstraintTooLarge(
            f"{what} is too large to compile: {rx.size} character positions on its longest path "
            "after "
            f"expanding bounded repetitions (the limit is {MAX_POSITIONS}); lower the repetition "
            "bounds "
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
    orphan_tokens: dict[
        int, list[int]
    ]  # first byte -> tokens, for bytes without a single-byte token

    @property
    def token_set(self) -> set[bytes]:
        return self.by_bytes.keys()  # type: ignore[return-value]

    @functools.cached_property
    def max_token_len(self) -> int:
        return max((len(b) for b in self.by_bytes), default=1)


_IVOCAB_CACHE: weakref.WeakKeyDictionary[TokenVocabulary, _IndexVocab] = weakref.WeakKeyDictionary()
_IVOCAB_LOCK = threading.Lock()


def index_vocab(vocab: TokenVocabulary) -> _IndexVocab:
    """outlines-core's Vocabulary for ``vocab`` (built once per vocabulary)."""
    with _IVOCAB_LOCK:
        hit = _IVOCAB_CACHE.get(vocab)
        if hit is not None:
            return hit
        from outlines_core import Vocabulary

        eos = set(vocab.eos_token_ids)
        texts = [
            (tid, data) for tid, data in enumerate(vocab.token_bytes) if data and tid not in eos
        ]
        by_bytes: dict[bytes, list[int]] = {}
        for tid, data in texts:
            by_bytes.setdefault(data, []).append(tid)
        mark_id = vocab.vocab_size
        by_bytes.setdefault(_MARK, []).append(mark_id)
        singles, orphans = single_byte_tokens(texts)
        # outlines wants an EOS id of its own; give it a private one it never reports to us.
        ivocab = _IndexVocab(
            Vocabulary(vocab.vocab_size + 1, by_bytes), by_bytes, mark_id, singles, orphans
        )
        _IVOCAB_CACHE[vocab] = ivocab
        return ivocab


class RegexGrammar:
    """A regex compiled against one vocabulary: immutable, shared by all its requests."""

    def __init__(
        self,
        kind: str,
        spec: str,
        regex: str,
        vocab: TokenVocabulary,
        *,
        param: str = "regex",
        builder: IndexBuilder | None = None,
        build_timeout_s: float | None = None,
    ) -> None:
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
                    f"{param}: this model's vocabulary cannot spell text the constraint requires "
                    f"({msg})",
                    param,
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
            self._index.get_next_state,
            self._finals.__contains__,
            ivocab.byte_tokens,
            ivocab.orphan_tokens,
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
            need = _cover(data, self._ivocab.token_set, self._ivocab.max_token_len) + (
                1 if self._can_continue(final) else 0
            )
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
            hit = (
                ids.astype(np.int32),
                np.array([self._need(nxt(state, t)) for t in ids.tolist()], dtype=np.float32),
            )
            if len(self._next_need_cache) >= 128:  # up to 8 bytes a token each: bounded
                self._next_need_cache.clear()
            self._next_need_cache[state] = hit
        return hit

    def warm(self) -> None:
        """Compute every state's mask now (e.g. in a worker thread) instead of on first use."""
        for state in self._states:
            self._mask(state)

    def matcher(self) -> RegexMatcher:
        return RegexMatcher(self, [(self._start, b"")])

    def __repr__(self) -> str:
        return f"RegexGrammar(kind={self.kind!r}, regex={self.regex[:60]!r})"


def _cover(data: bytes, tokens: set[bytes] | frozenset[bytes], longest: int) -> int:
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

    def copy(self) -> RegexMatcher:
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
