"""What the two EBNF recognizers share (:class:`TablesBase`): the per-parse-state mask
cache, budget-aware masks (each state's need, the plan of the state a request is in) and
forced text, on top of the parse states each recognizer provides:
:class:`~sgl.constrained.ebnf_python.Tables` (Python and numpy) and
``ebnf_native.NativeTables`` (C++). The limits they read live in
:mod:`sgl.constrained.ebnf_runtime`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict

import numpy as np

from sgl.constrained import ebnf_runtime as rt
from sgl.constrained.ebnf_automaton import Network
from sgl.constrained.ebnf_completion import INF, Completions
from sgl.constrained.ebnf_runtime import DEAD
from sgl.constrained.ebnf_trie import VocabTrie

__all__ = ["TablesBase"]


class TablesBase(ABC):
    """What the two recognizers share (:class:`~sgl.constrained.ebnf_python.Tables` in Python,
    ``ebnf_native.NativeTables`` in C++): the per-state mask cache, budget-aware masks and
    forced text, on top of their parse states (``initial``, ``transition``, ``advance``,
    ``accepting``, ``allowed_bytes``, ``configs``, ``stack_frame``, ``export`` / ``import_``,
    ``walk``, ``compute_mask``)."""

    def __init__(self, net: Network, byte_class: np.ndarray, class_rep: list[int]) -> None:
        self.net = net
        self.M = net.n_states + 1
        self.ACCEPT = net.n_states  # the configuration "root finished, stack empty"
        self.byte_class = byte_class
        self.class_rep = class_rep
        self.masks: OrderedDict[int, np.ndarray] = OrderedDict()
        self.forced: dict[int, str] = {}
        # Budget-aware masks: tokens each parse state needs to finish, the most any allowed
        # token leads to (a budget above it changes nothing), the tokens of each stack's frames.
        self.completions: Completions | None = None
        self.needs: dict[int, float] = {}
        self.max_need_after: dict[int, float] = {}
        self.stack_tokens: dict[int, float] = {0: 0.0}
        # A completion known to finish each planned parse state: (its tokens, EOS included
        # where needed; its bytes; its first token's length; whether it needs EOS); see settle.
        self.plans: OrderedDict[int, tuple[float, bytes, int, bool]] = OrderedDict()
        self.planned: set[int] = set()

    def mask(
        self, did: int, trie: VocabTrie, node_class: np.ndarray, kernel_route: bool = True
    ) -> np.ndarray:
        """Packed int32 words: bit (id % 32) of word (id // 32) set iff token id may come next.
        ``kernel_route=False``: one walk of the state (native tables; see ``native_mask``)."""
        hit = self.masks.get(did)
        if hit is not None:
            self.masks.move_to_end(did)
            return hit
        return self._cache_mask(did, self.compute_mask(did, trie, node_class, kernel_route))

    def warm(
        self, kernels: np.ndarray, trie: VocabTrie, node_class: np.ndarray, budget_s: float
    ) -> int:
        """Make the kernel walks of ``kernels`` now, in order, for up to ``budget_s``; returns
        how many. Only the native tables walk kernels (``native_mask``): this walks each
        state whole, so there is nothing to make ahead here."""
        return 0

    # -- what each recognizer provides (what the shared logic below reads) ------------

    @abstractmethod
    def compute_mask(
        self, did: int, trie: VocabTrie, node_class: np.ndarray, kernel_route: bool
    ) -> np.ndarray:
        """The mask words of ``did`` (not cached): each recognizer walks the trie its own way."""

    @abstractmethod
    def walk(self, did: int, trie: VocabTrie, node_class: np.ndarray) -> np.ndarray:
        """The parse state after each trie node's bytes (DEAD where not allowed)."""

    @abstractmethod
    def n_dstates(self) -> int:
        """Parse states interned so far."""

    @abstractmethod
    def configs(self, did: int):
        """The configurations (stack * M + state) of ``did``."""

    @abstractmethod
    def stack_frame(self, stack: int) -> tuple[int, int]:
        """(the return state on top of ``stack``, the stack below it)."""

    @abstractmethod
    def transition(self, did: int, cls: int) -> int:
        """The parse state after ``did`` reads a byte of class ``cls``."""

    @abstractmethod
    def accepting(self, did: int) -> bool:
        """The text so far is a sentence."""

    @abstractmethod
    def allowed_bytes(self, did: int) -> int:
        """Bit b set iff byte b can come next."""

    def _plain(self, did: int, ends: np.ndarray, trie: VocabTrie) -> np.ndarray:
        return self._cache_mask(did, self._pack(did, ends != DEAD, trie))

    def _cache_mask(self, did: int, words: np.ndarray) -> np.ndarray:
        self.masks[did] = words
        if len(self.masks) > rt.MASK_CACHE_SIZE:
            self.masks.popitem(last=False)
        return words

    def _pack(self, did: int, allowed_tokens: np.ndarray, trie: VocabTrie) -> np.ndarray:
        allowed = np.zeros(trie.n_words * 32, dtype=bool)
        allowed[: trie.vocab_size] = allowed_tokens
        words = np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32, copy=False)
        if self.accepting(did):
            words |= trie.eos_words
        return words

    def need(self, did: int) -> float:
        """Tokens that finish the text from parse state ``did``, at most: EOS included, unless
        the text is done (a sentence nothing can extend: the request stops there by itself)."""
        hit = self.needs.get(did)
        if hit is not None:
            return hit
        comp = self.completions
        assert comp is not None
        best = INF
        M, ACCEPT = self.M, self.ACCEPT
        for cfg in self.configs(did):
            k, stack = cfg % M, cfg // M
            if k == ACCEPT:
                cost = 0.0 if self.allowed_bytes(did) == 0 else 1.0
            else:
                cost = comp.tail_tokens(k) + self._stack_tokens(stack) + 1  # + EOS
            best = min(best, cost)
        self.needs[did] = best
        return best

    def _stack_tokens(self, stack: int) -> float:
        memo, chain = self.stack_tokens, []
        while stack not in memo:
            chain.append(stack)
            stack = self.stack_frame(stack)[1]
        total = memo[stack]
        comp = self.completions
        for s in reversed(chain):
            total += comp.tail_tokens(self.stack_frame(s)[0])  # type: ignore[union-attr]
            memo[s] = total
        return total

    def settle(self, did: int) -> float:
        """need(did), made tight for a state a request is in, and kept consistent along its way.

        The per-state figure covers each rule's tail apart, so it overcounts where a token
        would span two rules (and a budget that fits gets no help); here whole completions of
        the best configurations are covered. The plan's first token leads to a state that is
        offered the rest of the plan, so that state's need is at most this one's minus one:
        a request whose budget fits its state's need always has a token that keeps it fitting,
        and the masks never lead into a state where none does."""
        if did not in self.planned:
            self.planned.add(did)
            for data in self._completion_texts(did):
                end = self.advance(did, data)
                if end != DEAD and self.accepting(end):
                    self._offer(did, data, self.allowed_bytes(end) != 0)
        plan = self.plans.get(did)
        if plan is not None:
            self.plans.move_to_end(did)
            _, data, first, eos = plan
            if first:
                nxt = self.advance(did, data[:first])
                if nxt != DEAD:
                    self._offer(nxt, data[first:], eos)
        return self.need(did)

    def _offer(self, did: int, data: bytes, eos: bool) -> None:
        """``data`` (then EOS if ``eos``) finishes ``did``: keep it as the state's plan if it
        takes fewer tokens."""
        count, first = self.completions.cover.plan(data)  # type: ignore[union-attr]
        cost = count + eos
        known = self.plans.get(did)
        if cost == INF or (known is not None and known[0] <= cost):
            return
        self.plans[did] = (cost, data, first, eos)
        self.needs[did] = min(self.need(did), cost)
        if len(self.plans) > rt.PLANS_KEPT:
            self.plans.popitem(last=False)

    def _completion_texts(self, did: int) -> list[bytes]:
        """The shortest completions (bytes) of ``did``'s best configurations by the per-state
        figure; those longer than PLAN_LIMIT are left out."""
        comp = self.completions
        assert comp is not None
        M, ACCEPT = self.M, self.ACCEPT
        ranked = sorted(
            self.configs(did),
            key=lambda cfg: (
                0.0
                if cfg % M == ACCEPT
                else comp.tail_tokens(cfg % M) + self._stack_tokens(cfg // M)
            ),
        )
        out = []
        for cfg in ranked[: rt.PLAN_CONFIGS]:
            k, stack = cfg % M, cfg // M
            if k == ACCEPT:
                out.append(b"")
                continue
            states = [k]
            while stack:
                ret, stack = self.stack_frame(stack)
                states.append(ret)
            if sum(comp.dist[s] for s in states) <= rt.PLAN_LIMIT:
                out.append(b"".join(comp.tail_bytes(s) or b"" for s in states))
        return out

    def budget_mask(
        self, did: int, budget: int, trie: VocabTrie, node_class: np.ndarray
    ) -> np.ndarray | None:
        """The mask of tokens after which a completion still fits in ``budget - 1`` tokens;
        None when every allowed token does (the plain mask applies), or when none does and
        the text cannot end here (no completion fits: the output may be cut)."""
        if budget - 1 >= self.max_need_after.get(did, INF):
            return None  # every allowed token leaves room: the plain (cached) mask
        ends = self.walk(did, trie, node_class)[trie.token_node]
        targets, live = self._targets(ends)
        if (
            did not in self.max_need_after
        ):  # once per parse state (the walk is shared with the plain mask)
            self.max_need_after[did] = max((self.need(int(d)) for d in targets), default=0.0)
            if did not in self.masks:
                self._plain(did, ends, trie)
            if budget - 1 >= self.max_need_after[did]:
                return None
        self.settle(did)  # the state's plan lowers its successor's need (before the needs are read)
        need_of = np.zeros(self.n_dstates(), dtype=np.float64)
        need_of[targets] = [self.need(int(d)) for d in targets]
        keep = live & (need_of[ends] <= budget - 1)
        if keep.sum() == live.sum() or not (keep.any() or self.accepting(did)):
            return None
        return self._pack(did, keep, trie)

    def _targets(self, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The distinct live parse states in ``ends`` (a scatter, cheaper than a sort), and
        which entries are live."""
        live = ends != DEAD
        present = np.zeros(self.n_dstates(), dtype=bool)
        present[ends[live]] = True
        return np.flatnonzero(present), live

    def forced_text(self, did: int) -> str:
        hit = self.forced.get(did)
        if hit is not None:
            return hit
        buf = bytearray()
        cur = did
        while len(buf) < rt.FORCED_LIMIT and not self.accepting(cur):
            bits = self.allowed_bytes(cur)
            if bits == 0 or bits & (bits - 1):
                break
            b = bits.bit_length() - 1
            buf.append(b)
            cur = self.transition(cur, int(self.byte_class[b]))
        # only whole characters can be forced text
        for cut in range(len(buf), max(len(buf) - 4, -1), -1):
            try:
                text = bytes(buf[:cut]).decode("utf-8")
                break
            except UnicodeDecodeError:
                continue
        else:
            text = ""
        self.forced[did] = text
        return text
