"""The vocabulary as a byte trie (what every EBNF mask walk runs over), and
:class:`PerVocabulary`, the cache that builds such a per-vocabulary value once.

Apart from the recognizers (:mod:`sgl.constrained.ebnf_tables`) because it depends on the
vocabulary only: one trie serves every grammar compiled against it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["PerVocabulary", "VocabTrie", "vocab_trie"]


class VocabTrie:
    """All token byte strings as a trie in flat arrays.

    Nodes are numbered in (length, bytes) order, so node 0 is the root, the nodes of
    one depth are contiguous, and so are the children of any node.
    """

    def __init__(
        self, token_bytes: Sequence[bytes | None], eos_token_ids: Sequence[int], vocab_size: int
    ) -> None:
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
        depth_counts = (
            np.bincount([len(p) for p in order], minlength=1)
            if order
            else np.zeros(1, dtype=np.int64)
        )
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
        # node -> the tokens whose bytes end there: toks[tok_start[u]:tok_start[u + 1]] (for the
        # native walk)
        ids = np.flatnonzero(token_node < n)
        order = np.argsort(token_node[ids], kind="stable")
        self.toks = ids[order].astype(np.int64)
        self.tok_start = np.searchsorted(token_node[ids][order], np.arange(n + 1)).astype(np.int64)
        self.eos = np.array(sorted(i for i in eos if 0 <= i < vocab_size), dtype=np.int64)
        self.vocab_size = vocab_size
        self.n_words = (vocab_size + 31) // 32
        eos_bits = np.zeros(self.n_words * 32, dtype=bool)
        eos_bits[self.eos] = True
        self.eos_words = (
            np.packbits(eos_bits, bitorder="little").view("<i4").astype(np.int32, copy=False)
        )


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
vocab_trie = PerVocabulary(
    lambda vocab: VocabTrie(vocab.token_bytes, vocab.eos_token_ids, vocab.vocab_size)
)
