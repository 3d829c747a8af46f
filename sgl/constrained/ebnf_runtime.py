"""The EBNF recognizer and its token masks (the back half of :mod:`sgl.constrained.ebnf`).

A *configuration* is a network state that reads bytes plus the stack of return states
below it; the parse state after some text is the SET of configurations the text can
lead to (a GLR-style frontier). Stacks are hash-consed into ids, configurations are
packed into ints (``stack_id * M + state``) and every distinct set is interned as a
*dstate* id, so the recognizer becomes a DFA built lazily over dstates: a transition
is computed once and then read from a table forever after.

Token masks come from walking a byte trie of the vocabulary one level at a time
(``table[dstate, byte_class]`` for each live node); a subtree is dropped as soon as
its dstate is dead. Bytes that every edge of the grammar treats alike share one *byte
class*, which keeps the table narrow; classes a new dstate cannot read are marked dead
when it is interned, so only readable ones are ever computed. Finished masks are cached
per dstate (LRU).

Two recognizers implement this: :class:`Tables` here (Python; the walk in numpy, all live
nodes of a level at once) and ``ebnf_native.NativeTables`` (the same algorithm in C++,
``csrc/ebnf_native.cpp``, with masks by per-kernel walks), used wherever it builds; they
give the same masks, and the tests hold the C++ one to the Python one.
:func:`make_tables` picks one.

All of this is per grammar, shared by its matchers, and bounded: when the tables
grow past their limits they are replaced, and each matcher re-interns its own
history the next time it is used.
"""

from __future__ import annotations

import logging
import os
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from sgl.constrained.ebnf_automaton import Network
from sgl.constrained.ebnf_completion import INF, Completions

logger = logging.getLogger(__name__)

DEAD = 0  # the empty configuration set
MAX_CONFIGS = 4096  # stacks per parse state; a token leading past this is not allowed
MAX_DSTATES = 32_768  # tables are replaced past this many parse states ...
MAX_STACKS = 1_000_000  # ... or this many distinct stacks
MASK_CACHE_SIZE = 512
KERNEL_MASK_CACHE_BYTES = 32 << 20  # kernel walks kept per grammar (LRU past it)
KERNEL_ROUTE = True  # native masks through the kernel tables (see NativeTables.native_mask)
DENSE_SWITCH = 2048  # live trie nodes in one level beyond which whole levels are processed
FORCED_LIMIT = 256  # bytes of jump-forward text computed at most
PLAN_LIMIT = 4096  # bytes of a completion a request's state is planned with (longer: the per-state figure)
PLAN_CONFIGS = 8  # configurations of a state planned: those the per-state figure ranks best
PLANS_KEPT = 8192  # planned completions kept per grammar (LRU)


# ---------------------------------------------------------------------------
# The vocabulary as a byte trie, level by level
# ---------------------------------------------------------------------------


class VocabTrie:
    """All token byte strings as a trie in flat arrays.

    Nodes are numbered in (length, bytes) order, so node 0 is the root, the nodes of
    one depth are contiguous, and so are the children of any node.
    """

    def __init__(self, token_bytes: Sequence[bytes | None], eos_token_ids: Sequence[int], vocab_size: int) -> None:
        eos = set(eos_token_ids)
        prefixes: set[bytes] = set()
        for i, tb in enumerate(token_bytes):
            if tb and i not in eos:
                for j in range(1, len(tb) + 1):
                    prefixes.add(tb[:j])
        order = sorted(prefixes, key=lambda p: (len(p), p))
        index = {p: i + 1 for i, p in enumerate(order)}
        n = len(order) + 1
        self.n_nodes = n
        parent = np.zeros(n, dtype=np.int64)
        byte = np.zeros(n, dtype=np.uint8)
        for i, p in enumerate(order, start=1):
            parent[i] = index.get(p[:-1], 0)
            byte[i] = p[-1]
        self.byte = byte
        self.parent = parent
        depth_counts = np.bincount([len(p) for p in order], minlength=1) if order else np.zeros(1, dtype=np.int64)
        depth_counts[0] = 1  # the root
        # the nodes of depth d are [level_start[d], level_start[d + 1])
        self.level_start = np.concatenate([[0], np.cumsum(depth_counts)]).astype(np.int64)
        counts = np.bincount(parent[1:], minlength=n).astype(np.int64)
        self.child_count = counts
        # children of a node are contiguous: the first one is at the first index whose parent it is
        first = np.zeros(n, dtype=np.int64)
        if n > 1:
            nodes = np.arange(1, n)
            par = parent[1:]
            starts = np.ones(n - 1, dtype=bool)
            starts[1:] = par[1:] != par[:-1]
            first[par[starts]] = nodes[starts]
        self.child_start = first
        sentinel = n  # an extra node that is never live
        token_node = np.full(max(vocab_size, 0), sentinel, dtype=np.int64)
        for i, tb in enumerate(token_bytes[:vocab_size]):
            if tb and i not in eos:
                token_node[i] = index[tb]
        self.token_node = token_node
        # node -> the tokens whose bytes end there: toks[tok_start[u]:tok_start[u + 1]] (for the native walk)
        ids = np.flatnonzero(token_node < n)
        order = np.argsort(token_node[ids], kind="stable")
        self.toks = ids[order].astype(np.int64)
        self.tok_start = np.searchsorted(token_node[ids][order], np.arange(n + 1)).astype(np.int64)
        self.eos = np.array(sorted(i for i in eos if 0 <= i < vocab_size), dtype=np.int64)
        self.vocab_size = vocab_size
        self.n_words = (vocab_size + 31) // 32
        eos_bits = np.zeros(self.n_words * 32, dtype=bool)
        eos_bits[self.eos] = True
        self.eos_words = np.packbits(eos_bits, bitorder="little").view("<i4").astype(np.int32, copy=False)


_NATIVE_SOURCE = Path(__file__).parent / "csrc" / "ebnf_native.cpp"
_native_lock = threading.Lock()
_native: list = []  # [module or None], once tried


def native_walk():
    """The C++ recognizer and mask walks (csrc/ebnf_native.cpp), built on first use (~30 s
    once per machine, then cached); None where it cannot be built or ``SGL_NATIVE_MASKS=0``:
    grammars then run on the Python tables and the numpy walk, the same masks, slower."""
    with _native_lock:
        if not _native:
            module = None
            if os.environ.get("SGL_NATIVE_MASKS", "1") != "0":
                try:
                    from sgl import native

                    module = native.build("sgl_ebnf_native", _NATIVE_SOURCE, ["-O3", "-march=native"], python_module=True)
                except Exception as e:  # no compiler, no ninja, no torch: the numpy walk
                    logger.warning("the native EBNF recognizer could not be built (%s); using the Python one", e)
            _native.append(module)
        return _native[0]


class PerVocabulary:
    """A value built once per vocabulary object, the last few kept (vocabularies are keyed by
    identity; the object is held beside its value so a reused id never hits)."""

    def __init__(self, build: Callable[[Any], Any], keep: int = 4) -> None:
        self._build, self._keep = build, keep
        self._values: OrderedDict[int, tuple[object, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, vocab: Any) -> Any:
        with self._lock:
            hit = self._values.get(id(vocab))
            if hit is not None and hit[0] is vocab:
                self._values.move_to_end(id(vocab))
                return hit[1]
        value = self._build(vocab)  # outside the lock: builds take a while
        with self._lock:
            self._values[id(vocab)] = (vocab, value)
            while len(self._values) > self._keep:
                self._values.popitem(last=False)
        return value


# The trie of a vocabulary, built once per vocabulary object.
vocab_trie = PerVocabulary(lambda vocab: VocabTrie(vocab.token_bytes, vocab.eos_token_ids, vocab.vocab_size))


# ---------------------------------------------------------------------------
# Parse states
# ---------------------------------------------------------------------------


class TablesBase(ABC):
    """What the two recognizers share (:class:`Tables` here, ``ebnf_native.NativeTables`` in
    C++): the per-state mask cache, budget-aware masks and forced text, on top of their
    parse states (``initial``, ``transition``, ``advance``, ``accepting``, ``allowed_bytes``,
    ``configs``, ``stack_frame``, ``export`` / ``import_``, ``_walk``, ``_compute_mask``)."""

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

    def mask(self, did: int, trie: VocabTrie, node_class: np.ndarray, kernel_route: bool = True) -> np.ndarray:
        """Packed int32 words: bit (id % 32) of word (id // 32) set iff token id may come next.
        ``kernel_route=False``: one walk of the state (native tables; see ``native_mask``)."""
        hit = self.masks.get(did)
        if hit is not None:
            self.masks.move_to_end(did)
            return hit
        return self._cache_mask(did, self._compute_mask(did, trie, node_class, kernel_route))

    def warm(self, kernels: np.ndarray, trie: VocabTrie, node_class: np.ndarray, budget_s: float) -> int:
        """Make the kernel walks of ``kernels`` now, in order, for up to ``budget_s``; returns
        how many. Only the native tables walk kernels (``native_mask``): this walks each
        state whole, so there is nothing to make ahead here."""
        return 0

    # -- what each recognizer provides (what the shared logic below reads) ------------

    @abstractmethod
    def _compute_mask(self, did: int, trie: VocabTrie, node_class: np.ndarray, kernel_route: bool) -> np.ndarray:
        """The mask words of ``did`` (not cached): each recognizer walks the trie its own way."""

    @abstractmethod
    def _walk(self, did: int, trie: VocabTrie, node_class: np.ndarray) -> np.ndarray:
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
        if len(self.masks) > MASK_CACHE_SIZE:
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
        if len(self.plans) > PLANS_KEPT:
            self.plans.popitem(last=False)

    def _completion_texts(self, did: int) -> list[bytes]:
        """The shortest completions (bytes) of ``did``'s best configurations by the per-state
        figure; those longer than PLAN_LIMIT are left out."""
        comp = self.completions
        assert comp is not None
        M, ACCEPT = self.M, self.ACCEPT
        ranked = sorted(self.configs(did), key=lambda cfg: 0.0 if cfg % M == ACCEPT
                        else comp.tail_tokens(cfg % M) + self._stack_tokens(cfg // M))
        out = []
        for cfg in ranked[:PLAN_CONFIGS]:
            k, stack = cfg % M, cfg // M
            if k == ACCEPT:
                out.append(b"")
                continue
            states = [k]
            while stack:
                ret, stack = self.stack_frame(stack)
                states.append(ret)
            if sum(comp.dist[s] for s in states) <= PLAN_LIMIT:
                out.append(b"".join(comp.tail_bytes(s) or b"" for s in states))
        return out

    def budget_mask(self, did: int, budget: int, trie: VocabTrie, node_class: np.ndarray) -> np.ndarray | None:
        """The mask of tokens after which a completion still fits in ``budget - 1`` tokens;
        None when every allowed token does (the plain mask applies), or when none does and
        the text cannot end here (no completion fits: the output may be cut)."""
        if budget - 1 >= self.max_need_after.get(did, INF):
            return None  # every allowed token leaves room: the plain (cached) mask
        ends = self._walk(did, trie, node_class)[trie.token_node]
        targets, live = self._targets(ends)
        if did not in self.max_need_after:  # once per parse state (the walk is shared with the plain mask)
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
        while len(buf) < FORCED_LIMIT and not self.accepting(cur):
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

class Tables(TablesBase):
    """The recognizer in Python: interned stacks and parse states, the lazy DFA table (the
    numpy walk's tables, and the reference the C++ ones are tested against)."""

    def __init__(self, net: Network, byte_class: np.ndarray, class_rep: list[int]) -> None:
        super().__init__(net, byte_class, class_rep)
        self.class_rep_arr = np.asarray(class_rep, dtype=np.int64)
        self.stack_ret: list[int] = [-1]  # stack 0 is the empty stack
        self.stack_parent: list[int] = [-1]
        self.stack_ids: dict[tuple[int, int], int] = {}
        self.popinto: dict[int, frozenset[int]] = {}
        self.dstates: list[frozenset[int]] = [frozenset()]
        self.dstate_ids: dict[frozenset[int], int] = {frozenset(): DEAD}
        self.table = np.full((64, len(class_rep)), -1, dtype=np.int32)
        self.table[DEAD] = DEAD
        self.groups: dict[int, np.ndarray] = {}  # dstate -> byte class -> group (see _class_groups)
        self.kernel_groups: dict[frozenset[int], np.ndarray] = {}
        self.edge_signatures: dict[int, np.ndarray] = {}
        self.overflowed = False

    def n_dstates(self) -> int:
        return len(self.dstates)

    def configs(self, did: int):
        return self.dstates[did]

    def stack_frame(self, stack: int) -> tuple[int, int]:
        return self.stack_ret[stack], self.stack_parent[stack]

    def too_big(self) -> bool:
        return len(self.dstates) > MAX_DSTATES or len(self.stack_ret) > MAX_STACKS

    # -- stacks --------------------------------------------------------------------

    def push(self, stack: int, frames: tuple[int, ...]) -> int:
        ids = self.stack_ids
        for ret in frames:
            key = (ret, stack)
            sid = ids.get(key)
            if sid is None:
                sid = len(self.stack_ret)
                ids[key] = sid
                self.stack_ret.append(ret)
                self.stack_parent.append(stack)
            stack = sid
        return stack

    def _pop_into(self, stack: int) -> frozenset[int]:
        """Configurations after the rule on top of `stack` returns (to the frame on top)."""
        hit = self.popinto.get(stack)
        if hit is not None:
            return hit
        out: set[int] = set()
        s = stack
        M, closure, push = self.M, self.net.closure, self.push
        while True:
            if s == 0:
                out.add(self.ACCEPT)
                break
            ret, parent = self.stack_ret[s], self.stack_parent[s]
            kernels, pops = closure(ret)
            for k, frames in kernels:
                out.add((push(parent, frames) if frames else parent) * M + k)
            if not pops:
                break
            s = parent
        result = frozenset(out)
        self.popinto[stack] = result
        return result

    # -- dstates -------------------------------------------------------------------

    def intern(self, configs: frozenset[int]) -> int:
        did = self.dstate_ids.get(configs)
        if did is None:
            did = len(self.dstates)
            self.dstates.append(configs)
            self.dstate_ids[configs] = did
            if did >= self.table.shape[0]:
                grown = np.full((self.table.shape[0] * 2, self.table.shape[1]), -1, dtype=np.int32)
                grown[: self.table.shape[0]] = self.table
                self.table = grown
            # Classes no configuration can read lead to DEAD: known now, so only the few
            # readable ones ever take the Python step (a mask's first walk tries every class).
            self.table[did, ~self._readable_classes(did)] = DEAD
        return did

    def _readable_classes(self, did: int) -> np.ndarray:
        bits = self.allowed_bytes(did)
        readable = np.unpackbits(np.frombuffer(bits.to_bytes(32, "little"), dtype=np.uint8), bitorder="little")
        return readable[self.class_rep_arr].astype(bool)

    def initial(self) -> int:
        net = self.net
        kernels, pops = net.closure(net.rule_start[net.root])
        out = {self.push(0, frames) * self.M + k for k, frames in kernels}
        if pops:
            out.add(self.ACCEPT)
        return self.intern(frozenset(out))

    def transition(self, did: int, cls: int) -> int:
        nxt = int(self.table[did, cls])
        if nxt >= 0:
            return nxt
        byte = self.class_rep[cls]
        M, ACCEPT, step, push = self.M, self.ACCEPT, self.net.step, self.push
        byte_bits, bit = self.net.byte_bits, 1 << byte
        out: set[int] = set()
        for cfg in self.dstates[did]:
            k = cfg % M
            if k == ACCEPT or not byte_bits[k] & bit:  # most configurations cannot read this byte
                continue
            stack = cfg // M
            kernels, pops = step(k, byte)
            for kk, frames in kernels:
                out.add((push(stack, frames) if frames else stack) * M + kk)
            if pops:
                out.update(self._pop_into(stack))
        if len(out) > MAX_CONFIGS:
            if not self.overflowed:
                logger.warning(
                    "EBNF grammar is too ambiguous: a parse state would hold %d stacks (limit %d); "
                    "text leading there is treated as not allowed",
                    len(out),
                    MAX_CONFIGS,
                )
                self.overflowed = True
            out = set()
        nxt = self.intern(frozenset(out))
        groups = self._class_groups(did)
        self.table[did, groups == groups[cls]] = nxt  # the classes this state reads alike: same successor
        return nxt

    def _class_groups(self, did: int) -> np.ndarray:
        """A group id per byte class: classes that every kernel of ``did`` reads with the
        same edge targets lead to the same parse state, so one transition computed fills its
        whole group. (Byte classes are global: a grammar with many literals has ~100, while
        a state inside a string tells apart a handful.)"""
        hit = self.groups.get(did)
        if hit is not None:
            return hit
        M, ACCEPT = self.M, self.ACCEPT
        kernels = frozenset(cfg % M for cfg in self.dstates[did]) - {ACCEPT}
        groups = self.kernel_groups.get(kernels)  # they depend on the kernels only, not the stacks
        if groups is None:
            distinct = {sig.tobytes(): sig for sig in map(self._edge_signature, kernels)}
            groups = np.zeros(len(self.class_rep), dtype=np.int64)
            for sig in distinct.values():  # mixed radix: equal iff equal in every signature
                radix = int(sig.max()) + 1
                if int(groups.max()) * radix >= 1 << 62:
                    groups = np.unique(groups, return_inverse=True)[1].reshape(-1)
                groups = groups * radix + sig
            self.kernel_groups[kernels] = groups
        self.groups[did] = groups
        return groups

    def _edge_signature(self, k: int) -> np.ndarray:
        """Per byte class, an id of the set of targets kernel ``k``'s edges reach on it."""
        hit = self.edge_signatures.get(k)
        if hit is None:
            bc = self.byte_class
            hit = np.zeros(len(self.class_rep), dtype=np.int64)  # 0: no edge
            edges = sorted(self.net.byte_edges[k])
            if all(a[1] < b[0] for a, b in zip(edges, edges[1:])):  # disjoint ranges (the usual case)
                ids: dict = {}
                for lo, hi, t in edges:
                    hit[bc[lo]: bc[hi] + 1] = ids.setdefault(t, len(ids) + 1)
            else:
                targets: dict[int, list[int]] = {}
                for lo, hi, t in edges:
                    for c in range(int(bc[lo]), int(bc[hi]) + 1):
                        targets.setdefault(c, []).append(t)
                ids = {}
                for c, ts in targets.items():
                    hit[c] = ids.setdefault(tuple(sorted(set(ts))), len(ids) + 1)
            self.edge_signatures[k] = hit
        return hit

    def advance(self, did: int, data: bytes) -> int:
        cls = self.byte_class
        for b in data:
            did = self.transition(did, int(cls[b]))
            if did == DEAD:
                return DEAD
        return did

    def accepting(self, did: int) -> bool:
        return self.ACCEPT in self.dstates[did]

    def allowed_bytes(self, did: int) -> int:
        """Bit b set iff byte b can come next."""
        bits = 0
        M, byte_bits = self.M, self.net.byte_bits
        ACCEPT = self.ACCEPT
        for cfg in self.dstates[did]:
            k = cfg % M
            if k != ACCEPT:
                bits |= byte_bits[k]
        return bits

    # -- moving a parse state between tables ----------------------------------------

    def export(self, did: int) -> frozenset[tuple[int, tuple[int, ...]]]:
        out = set()
        for cfg in self.dstates[did]:
            k, s = cfg % self.M, cfg // self.M
            frames = []
            while s:
                frames.append(self.stack_ret[s])
                s = self.stack_parent[s]
            out.add((k, tuple(reversed(frames))))
        return frozenset(out)

    def import_(self, portable: frozenset[tuple[int, tuple[int, ...]]]) -> int:
        return self.intern(frozenset(self.push(0, frames) * self.M + k for k, frames in portable))

    # -- masks ---------------------------------------------------------------------

    def _compute_mask(self, did: int, trie: VocabTrie, node_class: np.ndarray, kernel_route: bool) -> np.ndarray:
        return self._pack(did, self._walk(did, trie, node_class)[trie.token_node] != DEAD, trie)

    def _walk(self, did: int, trie: VocabTrie, node_class: np.ndarray) -> np.ndarray:
        """The parse state after each trie node's bytes (DEAD where they are not allowed);
        index ``n_nodes`` (the sentinel of tokens without bytes) is DEAD."""
        node_ds = np.zeros(trie.n_nodes + 1, dtype=np.int32)
        node_ds[0] = did  # the root (no token ends there)
        live = np.zeros(1, dtype=np.int64)  # the root
        live_ds = np.full(1, did, dtype=np.int32)
        child_count, child_start = trie.child_count, trie.child_start
        depth = 0
        # Sparse phase: expand only the children of live nodes (cheap while few are alive).
        while live.size and live.size <= DENSE_SWITCH:
            cnt = child_count[live]
            has = cnt > 0
            if not has.all():
                live, live_ds, cnt = live[has], live_ds[has], cnt[has]
                if not live.size:
                    break
            total = int(cnt.sum())
            ends = np.cumsum(cnt)
            nodes = np.repeat(child_start[live] - (ends - cnt), cnt) + np.arange(total)
            nxt = self._step_nodes(np.repeat(live_ds, cnt), node_class[nodes])
            ok = nxt != DEAD
            live, live_ds = nodes[ok], nxt[ok]
            node_ds[live] = live_ds
            depth += 1
        if live.size:
            # Dense phase: many nodes alive (e.g. inside a string): walk whole levels, whose
            # nodes are contiguous, so parents and classes are plain slices.
            parent, level_start = trie.parent, trie.level_start
            for d in range(depth + 1, len(level_start) - 1):
                a, b = int(level_start[d]), int(level_start[d + 1])
                cur = node_ds[parent[a:b]]
                if not cur.any():
                    break
                node_ds[a:b] = self._step_nodes(cur, node_class[a:b])
        return node_ds

    def _step_nodes(self, cur: np.ndarray, classes: np.ndarray) -> np.ndarray:
        """table[cur, classes], computing the transitions not known yet."""
        nxt = self.table[cur, classes]
        unknown = nxt < 0
        if unknown.any():
            keys = np.unique(cur[unknown].astype(np.int64) * 65536 + classes[unknown])
            for key in keys.tolist():
                self.transition(key >> 16, key & 0xFFFF)
            nxt[unknown] = self.table[cur[unknown], classes[unknown]]
        return nxt


def byte_classes(net: Network) -> tuple[np.ndarray, list[int]]:
    """Partition bytes 0..255 into classes no edge of `net` tells apart."""
    cuts = {0, 256}
    for edges in net.byte_edges:
        for lo, hi, _ in edges:
            cuts.add(lo)
            cuts.add(hi + 1)
    bounds = sorted(cuts)
    byte_class = np.zeros(256, dtype=np.int32)
    reps: list[int] = []
    for c, (a, b) in enumerate(zip(bounds, bounds[1:])):
        byte_class[a:b] = c
        reps.append(a)
    return byte_class, reps


def make_tables(net: Network, byte_class: np.ndarray, class_rep: list[int]) -> TablesBase:
    """A grammar's recognizer: the C++ one where it builds, else the Python one."""
    if native_walk() is not None:
        from sgl.constrained.ebnf_native import NativeTables

        return NativeTables(net, byte_class, class_rep)
    return Tables(net, byte_class, class_rep)
