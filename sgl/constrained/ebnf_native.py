"""The EBNF recognizer on C++ tables (``csrc/ebnf_native.cpp``): what grammars run on
wherever the native module builds.

The algorithm is :class:`~sgl.constrained.ebnf_python.Tables`'s (the Python reference,
which the tests hold this one to); here the GLR step, stacks, parse states, the table and
the mask walks all live in C++, so a transition costs ~1 us, not the 20-40 us of Python
set building and hashing, and a cold mask (a parse state met for the first time: most
masks of a new document) costs a walk, not dozens of Python steps.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import numpy as np

from sgl.constrained import ebnf_runtime as rt
from sgl.constrained.ebnf_automaton import Network
from sgl.constrained.ebnf_tables import TablesBase
from sgl.constrained.ebnf_trie import VocabTrie

logger = logging.getLogger(__name__)


def _csr(rows: list, width: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Row starts and, per field, the flat column of a list of lists of `width`-tuples (or of
    ints, width 1)."""
    starts = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, rows), dtype=np.int64, count=len(rows)), out=starts[1:])
    items = itertools.chain.from_iterable(rows)
    if width > 1:
        items = itertools.chain.from_iterable(items)
    flat = np.fromiter(items, dtype=np.int32, count=int(starts[-1]) * width).reshape(-1, width)
    return starts, [np.ascontiguousarray(flat[:, i]) for i in range(width)]


def native_network(net: Network, byte_class: np.ndarray, class_rep: list[int]) -> Any:
    """The network in the C++ module's flat form, made once per network (its closures and
    steps are memoized there, shared by every tables the grammar makes)."""
    hit = getattr(net, "_native_net", None)
    if hit is not None:
        return hit
    edge_start, (lo, hi, tgt) = _csr(net.byte_edges, 3)
    eps_start, (eps,) = _csr(net.eps, 1)
    call_start, (call_rule, call_ret) = _csr(net.calls, 2)
    bits = np.frombuffer(b"".join(b.to_bytes(32, "little") for b in net.byte_bits), dtype="<u8")
    made = rt.native_walk().Net(
        edge_start,
        lo,
        hi,
        tgt,
        eps_start,
        eps,
        call_start,
        call_rule,
        call_ret,
        np.asarray(net.rule_of, dtype=np.int32),
        np.asarray(net.rule_start, dtype=np.int32),
        np.asarray(net.rule_final, dtype=np.int32),
        np.asarray(net.pure_return, dtype=np.uint8),
        np.ascontiguousarray(bits),
        np.asarray(byte_class, dtype=np.int32),
        np.asarray(class_rep, dtype=np.int32),
        int(net.root),
        np.asarray(net.share, dtype=np.int32),
        int(net.share_horizon),
    )
    net._native_net = made  # type: ignore[attr-defined]
    return made


def trie_shape(trie: VocabTrie) -> Any:
    """The trie in preorder (C++), made once per vocabulary: each grammar's view adds only
    its byte classes (~3 ms, not ~10)."""
    hit = getattr(trie, "_native_shape", None)
    if hit is None:
        hit = rt.native_walk().TrieShape(
            trie.child_start, trie.child_count, trie.tok_start, trie.toks, trie.n_words
        )
        trie._native_shape = hit  # type: ignore[attr-defined]
    return hit


class NativeTables(TablesBase):
    """One grammar's parse states in C++ (``core``), behind the Tables interface."""

    def __init__(self, net: Network, byte_class: np.ndarray, class_rep: list[int]) -> None:
        super().__init__(net, byte_class, class_rep)
        self.core = rt.native_walk().Glr(native_network(net, byte_class, class_rep), rt.MAX_CONFIGS)
        self.core.set_limits(rt.MAX_DSTATES, rt.MAX_STACKS, rt.KERNEL_MASK_CACHE_BYTES)
        self._trie: tuple[Any, Any, Any] | None = None  # (VocabTrie, node_class, the C++ view)
        self._warned = False

    # -- parse states ----------------------------------------------------------------

    @property
    def overflowed(self) -> bool:
        return self.core.overflow_size() > 0

    def _check_overflow(self) -> None:
        if not self._warned and self.core.overflow_size():
            logger.warning(
                "EBNF grammar is too ambiguous: a parse state would hold %d stacks (limit %d); "
                "text leading there is treated as not allowed",
                self.core.overflow_size(),
                rt.MAX_CONFIGS,
            )
            self._warned = True

    def too_big(self) -> bool:
        return self.core.n_dstates() > rt.MAX_DSTATES or self.core.n_stacks() > rt.MAX_STACKS

    def initial(self) -> int:
        return self.core.initial()

    def transition(self, did: int, cls: int) -> int:
        nxt = self.core.transition(did, cls)
        self._check_overflow()
        return nxt

    def advance(self, did: int, data: bytes) -> int:
        nxt = self.core.advance(did, bytes(data))
        self._check_overflow()
        return nxt

    def accepting(self, did: int) -> bool:
        return self.core.accepting(did)

    def allowed_bytes(self, did: int) -> int:
        return int.from_bytes(self.core.allowed_bytes(did), "little")

    def export(self, did: int) -> frozenset[tuple[int, tuple[int, ...]]]:
        return frozenset((k, tuple(frames)) for k, frames in self.core.export(did))

    def import_(self, portable: frozenset[tuple[int, tuple[int, ...]]]) -> int:
        return self.core.import_([(k, list(frames)) for k, frames in portable])

    def n_dstates(self) -> int:
        return self.core.n_dstates()

    def configs(self, did: int) -> list[int]:
        return self.core.configs(did).tolist()

    def stack_frame(self, stack: int) -> tuple[int, int]:
        return self.core.stack_frame(stack)

    # -- masks -----------------------------------------------------------------------

    def _view(self, trie: VocabTrie, node_class: np.ndarray) -> Any:
        """The C++ view of the trie with this grammar's node classes (made once)."""
        if self._trie is None or self._trie[0] is not trie or self._trie[1] is not node_class:
            view = rt.native_walk().Trie(trie_shape(trie), node_class)
            self._trie = (trie, node_class, view)
        return self._trie[2]

    def compute_mask(
        self, did: int, trie: VocabTrie, node_class: np.ndarray, kernel_route: bool
    ) -> np.ndarray:
        return self.native_mask(did, trie, node_class, kernel_route)

    def warm(
        self, kernels: np.ndarray, trie: VocabTrie, node_class: np.ndarray, budget_s: float
    ) -> int:
        if not rt.KERNEL_ROUTE:
            return 0
        return self.core.warm(self._view(trie, node_class), kernels, int(budget_s * 1e6))

    def native_mask(
        self, did: int, trie: VocabTrie, node_class: np.ndarray, kernel_route: bool = True
    ) -> np.ndarray:
        """The mask of ``did`` (not cached).

        A parse state is a set of configurations and a token is allowed iff it is from one
        of them, so the mask is the union of its kernels' masks. Most of a token's bytes
        stay inside the rule on top of the stack, where what they allow depends on the
        kernel only, not on the stack below: each kernel is walked once in tables where
        stacks start empty (cached: the inside of a string, or of an object of one type,
        recurs at every depth and position). Only the subtrees below a return are walked
        from real states, the kernel state there lifted onto the real stacks. Past the
        MAX_CONFIGS bound the two walks could disagree (a state past it is DEAD), so where
        the bound could be reached one plain walk of the state runs (as with
        ``kernel_route=False``: the compile-time initial mask, whose many kernels walked
        one by one would cost more than one walk)."""
        view = self._view(trie, node_class)
        words = self.core.route_mask(view, did) if rt.KERNEL_ROUTE and kernel_route else None
        if words is None:
            words = self.core.mask_words(view, did)
        if self.core.accepting(did):
            words |= trie.eos_words
        self._check_overflow()
        return words

    def walk(self, did: int, trie: VocabTrie, node_class: np.ndarray) -> np.ndarray:
        return self.core.node_states(self._view(trie, node_class), did)
