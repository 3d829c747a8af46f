"""Tests for sgl.runtime.radix_cache.RadixCache.

Unit tests pin down each part of the contract with hand-computed expectations; the
randomized tests (seeded `random` loops and a hypothesis state machine) drive the cache the
way the scheduler does and compare every observable against an independent reference model:
a flat dict from each cached prefix (a tuple of token ids) to the slot holding its last
token. The reference knows nothing about nodes, so it checks matches, insert return values,
sizes, lock counts, LRU eviction and slot conservation without trusting the tree.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sgl.runtime.memory import TokenToKVPool
from sgl.runtime.prefix_cache import NoPrefixCache
from sgl.runtime.radix_cache import RadixCache, TreeNode


class SpyPool(TokenToKVPool):
    """A real (tiny) KV pool that also records which slots came back through `free`."""

    def __init__(self, capacity: int) -> None:
        super().__init__(
            capacity, num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.float32, device="cpu"
        )
        self.freed: list[int] = []

    def free(self, slots: torch.Tensor) -> None:
        self.freed.extend(slots.tolist())
        super().free(slots)

    def free_slots(self) -> list[int]:
        return self._free[: self.available_size()].tolist()


def alloc(pool: TokenToKVPool, n: int) -> torch.Tensor:
    out = pool.alloc(n)
    assert out is not None
    return out


def nodes_with_paths(cache: RadixCache) -> list[tuple[TreeNode, tuple[int, ...]]]:
    """Every non-root node with the token path from the root to its end."""
    out = []
    stack = [(c, tuple(c.key)) for c in cache.root.children.values()]
    while stack:
        node, path = stack.pop()
        out.append((node, path))
        stack.extend((c, path + tuple(c.key)) for c in node.children.values())
    return out


def node_path(node: TreeNode) -> tuple[int, ...]:
    parts = []
    while node.parent is not None:
        parts.append(node.key)
        node = node.parent
    return tuple(t for part in reversed(parts) for t in part)


def check_structure(cache: RadixCache) -> None:
    """Tree shape and the O(1) counters agree with a full walk."""
    assert cache.root.lock_ref == 1 and cache.root.key == [] and cache.root.value.numel() == 0
    total = evictable = protected = 0
    for node, _ in nodes_with_paths(cache):
        assert len(node.key) > 0
        assert node.value.dtype == torch.int64 and node.value.dim() == 1
        assert node.value.numel() == len(node.key)
        assert node.parent is not None and node.parent.children[node.key[0]] is node
        assert node.lock_ref >= 0
        if node.parent is not cache.root:
            # A lock on a node is also a lock on each ancestor.
            assert node.parent.lock_ref >= node.lock_ref
        total += len(node.key)
        if node.lock_ref == 0:
            evictable += len(node.key)
        else:
            protected += len(node.key)
    assert cache.total_size() == total
    assert cache.evictable_size() == evictable
    assert cache.protected_size() == protected
    assert cache.evictable_size() + cache.protected_size() == cache.total_size()


# --------------------------------------------------------------------------- unit tests


def test_empty_cache_matches_nothing() -> None:
    cache = RadixCache(SpyPool(8))
    for ids in ([], [1, 2, 3]):
        slots, node = cache.match_prefix(ids)
        assert slots.dtype == torch.int64 and slots.shape == (0,)
        assert node is cache.root
    assert cache.total_size() == 0 and cache.root.lock_ref == 1
    assert cache.insert([], torch.empty(0, dtype=torch.int64)) == 0
    assert cache.total_size() == 0


def test_exact_and_partial_match() -> None:
    pool = SpyPool(16)
    cache = RadixCache(pool)
    slots = alloc(pool, 4)
    assert cache.insert([1, 2, 3, 4], slots) == 0

    got, node = cache.match_prefix([1, 2, 3, 4])
    assert got.tolist() == slots.tolist() and node_path(node) == (1, 2, 3, 4)

    got, node = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert got.tolist() == slots.tolist() and node_path(node) == (1, 2, 3, 4)

    got, node = cache.match_prefix((9, 1, 2))  # any sequence type
    assert got.numel() == 0 and node is cache.root
    check_structure(cache)


def test_match_inside_edge_splits_node() -> None:
    pool = SpyPool(16)
    cache = RadixCache(pool)
    slots = alloc(pool, 6)
    cache.insert([1, 2, 3, 4, 5, 6], slots)

    got, node = cache.match_prefix([1, 2, 3, 9])
    assert got.tolist() == slots[:3].tolist()
    assert node.key == [1, 2, 3] and node.parent is cache.root
    assert node.value.tolist() == slots[:3].tolist()
    (lower,) = node.children.values()
    assert (
        lower.key == [4, 5, 6]
        and lower.value.tolist() == slots[3:].tolist()
        and lower.parent is node
    )
    assert cache.total_size() == 6 and cache.evictable_size() == 6
    # The full sequence still matches across the new boundary.
    got, node = cache.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert got.tolist() == slots.tolist() and node is lower
    check_structure(cache)


def test_insert_inside_edge_splits_node() -> None:
    pool = SpyPool(16)
    cache = RadixCache(pool)
    a = alloc(pool, 4)
    cache.insert([1, 2, 3, 4], a)
    b = alloc(pool, 4)
    assert cache.insert([1, 2, 7, 8], b) == 2
    pool.free(b[:2])  # caller's duplicates of the cached [1, 2]

    (upper,) = cache.root.children.values()
    assert upper.key == [1, 2] and set(upper.children) == {3, 7}
    assert upper.children[3].key == [3, 4] and upper.children[7].key == [7, 8]
    got, _ = cache.match_prefix([1, 2, 7, 8])
    assert got.tolist() == a[:2].tolist() + b[2:].tolist()
    assert cache.total_size() == 6
    check_structure(cache)
    assert cache.flush()
    assert pool.available_size() == pool.capacity


def test_insert_returns_already_cached_length() -> None:
    pool = SpyPool(32)
    cache = RadixCache(pool)
    a = alloc(pool, 5)
    assert cache.insert([1, 2, 3, 4, 5], a) == 0

    dup = alloc(pool, 5)
    assert cache.insert([1, 2, 3, 4, 5], dup) == 5  # nothing new stored
    pool.free(dup)
    assert cache.total_size() == 5

    dup = alloc(pool, 3)
    assert cache.insert([1, 2, 3], dup) == 3  # a prefix of a cached edge: split, nothing stored
    pool.free(dup)
    assert cache.total_size() == 5

    ext = alloc(pool, 7)
    assert cache.insert([1, 2, 3, 4, 5, 6, 7], ext) == 5
    pool.free(ext[:5])
    got, _ = cache.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert got.tolist() == a.tolist() + ext[5:].tolist()
    assert cache.total_size() == 7
    check_structure(cache)
    assert cache.flush() and pool.available_size() == pool.capacity


def test_insert_copies_slots_and_checks_length() -> None:
    pool = SpyPool(8)
    cache = RadixCache(pool)
    row = torch.zeros(10, dtype=torch.int64)
    s = alloc(pool, 3)
    row[:3] = s
    cache.insert([1, 2, 3], row[:3])
    row[:] = 0  # the request row is reused by someone else
    got, _ = cache.match_prefix([1, 2, 3])
    assert got.tolist() == s.tolist()
    with pytest.raises(ValueError):
        cache.insert([4, 5], torch.tensor([1], dtype=torch.int64))


def test_lock_moves_sizes_between_evictable_and_protected() -> None:
    pool = SpyPool(16)
    cache = RadixCache(pool)
    cache.insert([1, 2, 3, 4, 5], alloc(pool, 5))
    _, node = cache.match_prefix([1, 2, 3])  # splits into [1,2,3] + [4,5]
    cache.inc_lock_ref(node)
    assert (cache.protected_size(), cache.evictable_size()) == (3, 2)
    cache.inc_lock_ref(node)  # a second holder counts once in the sizes
    assert (cache.protected_size(), cache.evictable_size()) == (3, 2)
    assert node.lock_ref == 2

    _, leaf = cache.match_prefix([1, 2, 3, 4, 5])
    cache.inc_lock_ref(leaf)
    assert (cache.protected_size(), cache.evictable_size()) == (5, 0)
    assert node.lock_ref == 3 and leaf.lock_ref == 1
    check_structure(cache)

    cache.dec_lock_ref(leaf)
    cache.dec_lock_ref(node)
    assert (cache.protected_size(), cache.evictable_size()) == (3, 2)
    cache.dec_lock_ref(node)
    assert (cache.protected_size(), cache.evictable_size()) == (0, 5)
    # Locking the root is a no-op: root is excluded and stays at 1.
    cache.inc_lock_ref(cache.root)
    cache.dec_lock_ref(cache.root)
    assert cache.root.lock_ref == 1 and cache.protected_size() == 0
    check_structure(cache)


def test_split_preserves_lock_and_sizes() -> None:
    pool = SpyPool(16)
    cache = RadixCache(pool)
    cache.insert([1, 2, 3, 4, 5, 6], alloc(pool, 6))
    _, leaf = cache.match_prefix([1, 2, 3, 4, 5, 6])
    cache.inc_lock_ref(leaf)
    _, upper = cache.match_prefix([1, 2, 3, 7])  # split a locked edge
    assert upper.lock_ref == 1 and leaf.lock_ref == 1 and leaf.parent is upper
    assert (cache.protected_size(), cache.evictable_size()) == (6, 0)
    assert (
        cache.insert([1, 2, 3, 4, 8], torch.tensor([0, 0, 0, 0, 9])) == 4
    )  # split again + new leaf
    assert (cache.protected_size(), cache.evictable_size()) == (6, 1)
    check_structure(cache)
    cache.dec_lock_ref(leaf)
    assert upper.lock_ref == 0 and leaf.lock_ref == 0
    assert (cache.protected_size(), cache.evictable_size()) == (0, 7)
    check_structure(cache)


def test_dec_lock_ref_underflow_raises_and_changes_nothing() -> None:
    pool = SpyPool(16)
    cache = RadixCache(pool)
    cache.insert([1, 2, 3, 4], alloc(pool, 4))
    _, upper = cache.match_prefix([1, 2])
    _, leaf = cache.match_prefix([1, 2, 3, 4])
    cache.inc_lock_ref(upper)
    with pytest.raises(RuntimeError):
        cache.dec_lock_ref(leaf)  # leaf itself is at 0 even though its parent is locked
    assert upper.lock_ref == 1 and leaf.lock_ref == 0
    assert (cache.protected_size(), cache.evictable_size()) == (2, 2)
    cache.dec_lock_ref(upper)
    with pytest.raises(RuntimeError):
        cache.dec_lock_ref(upper)
    check_structure(cache)


def test_evict_is_lru_and_frees_exactly_the_node_slots() -> None:
    pool = SpyPool(32)
    cache = RadixCache(pool)
    seqs = {"a": [1, 1], "b": [2, 2], "c": [3, 3]}
    slots = {}
    for name, ids in seqs.items():
        slots[name] = alloc(pool, 2)
        cache.insert(ids, slots[name])
    cache.match_prefix([1, 1])  # "a" is now the most recent
    before = pool.available_size()

    assert cache.evict(1) == 2
    assert sorted(pool.freed) == sorted(slots["b"].tolist())
    assert pool.available_size() == before + 2
    assert cache.match_prefix([2, 2])[0].numel() == 0

    pool.freed.clear()
    assert cache.evict(2) == 2
    assert sorted(pool.freed) == sorted(slots["c"].tolist())

    pool.freed.clear()
    assert cache.evict(100) == 2  # only "a" is left
    assert sorted(pool.freed) == sorted(slots["a"].tolist())
    assert cache.total_size() == 0 and pool.available_size() == pool.capacity
    assert cache.evict(5) == 0
    assert cache.evict(0) == 0


def test_evict_reaches_parents_after_their_children() -> None:
    pool = SpyPool(32)
    cache = RadixCache(pool)
    a = alloc(pool, 3)
    cache.insert([1, 2, 3], a)
    b = alloc(pool, 3)
    assert cache.insert([1, 2, 4], b) == 2
    pool.freed.clear()
    pool.free(b[:2])
    pool.freed.clear()
    cache.match_prefix([1, 2, 4])  # [1,2,3] leaf is LRU, then [1,2,4], then the shared [1,2]
    assert cache.evict(1) == 1 and pool.freed == a[2:].tolist()
    assert cache.evict(1) == 1 and pool.freed[-1:] == b[2:].tolist()
    assert cache.evict(1) == 2 and sorted(pool.freed[-2:]) == sorted(a[:2].tolist())
    assert cache.total_size() == 0 and pool.available_size() == pool.capacity


def test_locked_nodes_are_never_evicted() -> None:
    pool = SpyPool(32)
    cache = RadixCache(pool)
    a, b = alloc(pool, 4), alloc(pool, 3)
    cache.insert([1, 2, 3, 4], a)
    cache.insert([5, 6, 7], b)
    cache.match_prefix([5, 6, 7])
    _, node = cache.match_prefix([1, 2])  # lock only the first half of "a" (the LRU entry)
    cache.inc_lock_ref(node)
    # Unlocked: [3,4] (older) and [5,6,7]; the locked [1,2] must survive everything.
    assert cache.evict(100) == 5
    assert sorted(pool.freed) == sorted(a[2:].tolist() + b.tolist())
    got, _ = cache.match_prefix([1, 2, 3, 4])
    assert got.tolist() == a[:2].tolist()
    assert (cache.protected_size(), cache.evictable_size()) == (2, 0)
    check_structure(cache)


def test_evicted_or_reset_nodes_are_rejected_by_locking() -> None:
    pool = SpyPool(8)
    cache = RadixCache(pool)
    cache.insert([1, 2], alloc(pool, 2))
    _, node = cache.match_prefix([1, 2])
    cache.evict(2)
    with pytest.raises(ValueError):
        cache.inc_lock_ref(node)
    cache.insert([3], alloc(pool, 1))
    _, node = cache.match_prefix([3])
    cache.reset()
    with pytest.raises(ValueError):
        cache.dec_lock_ref(node)
    assert cache.protected_size() == 0 and cache.evictable_size() == 0


def test_reset_drops_without_freeing() -> None:
    pool = SpyPool(8)
    cache = RadixCache(pool)
    cache.insert([1, 2, 3], alloc(pool, 3))
    _, node = cache.match_prefix([1, 2, 3])
    cache.inc_lock_ref(node)
    cache.reset()
    assert pool.freed == [] and pool.available_size() == 5
    assert cache.total_size() == cache.protected_size() == cache.evictable_size() == 0
    assert cache.match_prefix([1, 2, 3])[1] is cache.root
    check_structure(cache)


def test_flush_refuses_while_locked_then_frees_everything() -> None:
    pool = SpyPool(16)
    cache = RadixCache(pool)
    a, b, c = alloc(pool, 3), alloc(pool, 1), alloc(pool, 3)
    cache.insert([1, 2, 3], a)
    cache.insert([1, 4], torch.cat([cache.match_prefix([1])[0], b]))
    cache.insert([7, 8, 9], c)
    _, node = cache.match_prefix([1, 4])
    cache.inc_lock_ref(node)
    assert cache.flush() is False
    assert pool.freed == [] and cache.total_size() == 7
    cache.dec_lock_ref(node)
    assert cache.flush() is True
    assert pool.available_size() == pool.capacity
    assert sorted(pool.freed) == sorted(a.tolist() + b.tolist() + c.tolist())
    assert cache.total_size() == 0 and not cache.root.children
    assert cache.flush() is True  # empty flush is fine


def test_no_prefix_cache_stores_nothing_and_frees_finished_kv() -> None:
    pool = SpyPool(8)
    cache = NoPrefixCache(pool)
    s = alloc(pool, 3)
    slots, node = cache.match_prefix([1, 2, 3])
    assert slots.numel() == 0 and slots.dtype == torch.int64 and node is cache.root
    kept, node2 = cache.cache_unfinished(
        [1, 2, 3], s, 0, node
    )  # a chunk boundary: the request keeps its slots
    assert kept is s and node2 is node and pool.freed == []
    assert cache.evict(10) == 0
    assert cache.total_size() == 0 and cache.evictable_size() == 0 and cache.protected_size() == 0
    cache.cache_finished([1, 2, 3], s, 0, node)  # finished: nothing is kept, the slots go back
    assert sorted(pool.freed) == sorted(s.tolist()) and pool.available_size() == 8
    assert cache.flush() is True
    assert cache.match_prefix([1, 2, 3])[0].numel() == 0


def test_radix_cache_finished_and_unfinished_hand_over() -> None:
    """cache_unfinished re-locks the longer prefix and frees duplicates; cache_finished unlocks."""
    pool = SpyPool(16)
    cache = RadixCache(pool)
    a = alloc(pool, 4)
    cache.insert([1, 2, 3, 4], a)
    prefix, node = cache.match_prefix([1, 2, 9])
    cache.inc_lock_ref(node)
    mine = torch.cat([prefix, alloc(pool, 3)])  # [1, 2] cached, [9, 8, 7] computed by this request
    slots, node2 = cache.cache_unfinished([1, 2, 9, 8, 7], mine, 2, node)
    assert slots.tolist() == mine.tolist() and cache.protected_size() == 5 and pool.freed == []
    dup = alloc(pool, 4)  # a second request computed [1, 2, 3, 4] again: its copies are freed
    cache.cache_finished([1, 2, 3, 4], dup, 0, cache.root)
    assert sorted(pool.freed) == sorted(dup.tolist())
    cache.cache_finished([1, 2, 9, 8, 7], slots, 5, node2)
    assert cache.protected_size() == 0 and cache.total_size() == 7


def test_scheduler_flow_two_requests_sharing_a_prefix() -> None:
    """Admission, chunked re-match and finish as the scheduler does them; the pool ends full."""
    pool = SpyPool(64)
    cache = RadixCache(pool)
    prompt = list(range(100, 110))
    reqs = []
    for tail in ([1, 2], [3, 4, 5]):
        ids = prompt + tail
        prefix, node = cache.match_prefix(ids)
        cache.inc_lock_ref(node)
        reqs.append([ids, prefix, node, alloc(pool, len(ids) - prefix.numel())])
    assert all(r[1].numel() == 0 for r in reqs)  # both admitted before either cached anything

    # Request 0 reaches a chunk boundary: insert, re-match, free own duplicates, move the lock.
    ids, prefix, node, own = reqs[0]
    full = torch.cat([prefix, own])
    n = cache.insert(ids, full)
    pool.free(full[prefix.numel() : n])
    new_slots, new_node = cache.match_prefix(ids)
    assert new_slots.tolist() == full.tolist()
    cache.dec_lock_ref(node)
    cache.inc_lock_ref(new_node)
    reqs[0] = [ids, new_slots, new_node, torch.empty(0, dtype=torch.int64)]
    assert cache.protected_size() == len(ids)

    # Request 1 finishes: the shared prompt is already cached by request 0.
    ids, prefix, node, own = reqs[1]
    full = torch.cat([prefix, own])
    n = cache.insert(ids, full)
    assert n == len(prompt)
    pool.free(full[prefix.numel() : n])
    cache.dec_lock_ref(node)
    got, _ = cache.match_prefix(ids)
    assert got.tolist() == reqs[0][1][: len(prompt)].tolist() + own[len(prompt) :].tolist()

    # Request 0 finishes.
    ids, prefix, node, own = reqs[0]
    n = cache.insert(ids, prefix)
    assert n == len(ids)
    cache.dec_lock_ref(node)
    check_structure(cache)
    assert cache.total_size() == len(prompt) + 2 + 3
    assert pool.available_size() + cache.total_size() == pool.capacity
    assert cache.flush() and pool.available_size() == pool.capacity


def test_long_sequences_with_many_branches() -> None:
    pool = SpyPool(40_000)
    cache = RadixCache(pool)
    base = list(range(8000))
    cache.insert(base, alloc(pool, len(base)))
    for i in range(200):
        ids = base[: 4000 + i] + [10**6 + i] * 50
        prefix, node = cache.match_prefix(ids)
        assert prefix.numel() == 4000 + i
        full = torch.cat([prefix, alloc(pool, len(ids) - prefix.numel())])
        assert cache.insert(ids, full) == 4000 + i
    check_structure(cache)
    assert cache.flush() and pool.available_size() == pool.capacity


def test_pretty_print_mentions_nodes() -> None:
    pool = SpyPool(16)
    cache = RadixCache(pool)
    cache.insert([1, 2, 3], alloc(pool, 3))
    cache.insert([1, 2, 4], torch.cat([cache.match_prefix([1, 2])[0], alloc(pool, 1)]))
    text = cache.pretty_print()
    assert "[1, 2]" in text and "[3]" in text and "[4]" in text
    assert "total=4" in text


# --------------------------------------------------------------------------- reference model


class Model:
    """Drives a RadixCache + real pool like the scheduler does, checked against a flat reference.

    Reference state: `ref` maps every cached prefix (tuple of token ids) to the slot of its last
    token; `stamp` records when each cached prefix was last touched by a match or insert;
    requests hold a lock on their matched prefix plus their own not-yet-cached slots.
    """

    ALPHABET = 3
    MAX_LEN = 10

    def __init__(self, capacity: int) -> None:
        self.pool = SpyPool(capacity)
        self.cache = RadixCache(self.pool)
        self.ref: dict[tuple[int, ...], int] = {}
        self.stamp: dict[tuple[int, ...], int] = {}
        self.clock = 0
        # Each request: ids, slots of its cached prefix, locked node, its own slots for the rest.
        self.reqs: list[dict] = []

    # ---- reference helpers

    def ref_match_len(self, ids: tuple[int, ...]) -> int:
        k = 0
        while k < len(ids) and ids[: k + 1] in self.ref:
            k += 1
        return k

    def touch(self, ids: tuple[int, ...], upto: int) -> None:
        self.clock += 1
        for j in range(1, upto + 1):
            self.stamp[ids[:j]] = self.clock

    def locked_prefixes(self) -> list[tuple[int, ...]]:
        return [r["ids"][: r["prefix"].numel()] for r in self.reqs]

    def covered(self) -> set[tuple[int, ...]]:
        out: set[tuple[int, ...]] = set()
        for lp in self.locked_prefixes():
            out.update(lp[:j] for j in range(1, len(lp) + 1))
        return out

    # ---- operations

    def match(self, ids: tuple[int, ...]) -> tuple[torch.Tensor, TreeNode]:
        k = self.ref_match_len(ids)
        slots, node = self.cache.match_prefix(list(ids))
        assert slots.dtype == torch.int64 and slots.dim() == 1
        assert slots.tolist() == [self.ref[ids[: j + 1]] for j in range(k)]
        assert node_path(node) == ids[:k]
        self.touch(ids, k)
        return slots, node

    def obtain(self, n: int) -> torch.Tensor | None:
        """Allocate like the scheduler: evict the shortfall when the pool runs dry."""
        if n > self.pool.available_size():
            self.evict(n - self.pool.available_size())
        return self.pool.alloc(n)

    def insert(self, ids: tuple[int, ...], slots: torch.Tensor) -> int:
        expected = self.ref_match_len(ids)
        n = self.cache.insert(list(ids), slots)
        assert n == expected
        for j in range(n, len(ids)):
            self.ref[ids[: j + 1]] = int(slots[j])
        self.touch(ids, len(ids))
        return n

    def insert_raw(self, ids: tuple[int, ...]) -> None:
        """Insert with entirely caller-owned slots; the cached part comes back as duplicates."""
        slots = self.obtain(len(ids))
        if slots is None:
            return
        n = self.insert(ids, slots)
        self.pool.free(slots[:n])

    def start(self, ids: tuple[int, ...]) -> None:
        prefix, node = self.match(ids)
        self.cache.inc_lock_ref(node)
        req = {"ids": ids, "prefix": prefix, "node": node, "own": torch.empty(0, dtype=torch.int64)}
        self.reqs.append(req)
        own = self.obtain(len(ids) - prefix.numel())
        if own is None:  # admission fails: give the lock back
            self.reqs.pop()
            self.cache.dec_lock_ref(node)
            return
        req["own"] = own

    def _cache_req(self, req: dict) -> int:
        full = torch.cat([req["prefix"], req["own"]])
        n = self.insert(req["ids"], full)
        assert n >= req["prefix"].numel()  # the locked prefix cannot have gone away
        self.pool.free(full[req["prefix"].numel() : n])
        return n

    def finish(self, i: int) -> None:
        req = self.reqs.pop(i)
        self._cache_req(req)
        self.cache.dec_lock_ref(req["node"])

    def chunk(self, i: int, extra: tuple[int, ...]) -> None:
        """Chunked-prefill boundary: cache what is done, move the lock, then grow the request."""
        req = self.reqs[i]
        self._cache_req(req)
        new_slots, new_node = self.match(req["ids"])
        assert new_slots.numel() == len(req["ids"])
        self.cache.dec_lock_ref(req["node"])
        self.cache.inc_lock_ref(new_node)
        req.update(prefix=new_slots, node=new_node, own=torch.empty(0, dtype=torch.int64))
        if extra and len(req["ids"]) + len(extra) <= 2 * self.MAX_LEN:
            own = self.obtain(len(extra))
            if own is not None:
                req["ids"] = req["ids"] + extra
                req["own"] = own

    def evict(self, n: int) -> None:
        before_avail = self.pool.available_size()
        covered = self.covered()
        evictable_before = len(self.ref) - len(covered)
        self.pool.freed.clear()
        freed = self.cache.evict(n)
        log = list(self.pool.freed)

        assert freed == len(log) == len(set(log))
        assert self.pool.available_size() == before_avail + freed
        assert freed >= min(n, evictable_before)
        if freed < n:
            assert freed == evictable_before
        by_slot = {s: p for p, s in self.ref.items()}
        gone = [by_slot[s] for s in log]  # KeyError: freed a slot the tree did not hold
        assert not covered.intersection(gone)
        for p in gone:
            del self.ref[p]
        # What is left must still be prefix-closed: nothing evicted from under a survivor.
        for q in self.ref:
            assert all(q[:j] in self.ref for j in range(1, len(q)))
        # LRU: nothing evicted is newer than any unlocked leaf that survived.
        if gone:
            newest_gone = max(self.stamp[p] for p in gone)
            has_child = {q[:-1] for q in self.ref}
            for q in self.ref:
                if q not in has_child and q not in covered:
                    assert self.stamp[q] >= newest_gone
        for p in gone:
            del self.stamp[p]

    # ---- invariants

    def check(self) -> None:
        cache, pool = self.cache, self.pool
        check_structure(cache)
        covered = self.covered()
        assert covered <= self.ref.keys()
        assert cache.total_size() == len(self.ref)
        assert cache.protected_size() == len(covered)
        assert cache.evictable_size() == len(self.ref) - len(covered)

        locks = self.locked_prefixes()
        tree_slots: list[int] = []
        for node, path in nodes_with_paths(cache):
            start = len(path) - len(node.key)
            assert node.value.tolist() == [self.ref[path[: j + 1]] for j in range(start, len(path))]
            assert node.lock_ref == sum(
                1 for lp in locks if lp[: len(path)] == path and len(lp) >= len(path)
            )
            tree_slots.extend(node.value.tolist())

        caller = [s for r in self.reqs for s in r["own"].tolist()]
        free = pool.free_slots()
        everything = free + tree_slots + caller
        assert len(everything) == len(set(everything)) == pool.capacity
        assert set(everything) == set(range(1, pool.capacity + 1))

    def drain(self) -> None:
        """Finish every request, then flush: the pool must be whole again."""
        if self.covered():  # a request whose match was empty pins nothing
            assert self.cache.flush() is False
            self.check()
        while self.reqs:
            self.finish(0)
        self.check()
        assert self.cache.flush() is True
        assert self.pool.available_size() == self.pool.capacity
        assert self.cache.total_size() == 0
        self.ref.clear()
        self.check()


def random_ids(rng: random.Random, model: Model) -> tuple[int, ...]:
    """Fresh sequences, or extensions/truncations of cached or running ones (to share prefixes)."""
    pool = list(model.ref) + [r["ids"] for r in model.reqs]
    fresh = tuple(rng.randrange(Model.ALPHABET) for _ in range(rng.randint(0, Model.MAX_LEN)))
    if not pool or rng.random() < 0.3:
        return fresh
    base = rng.choice(pool)
    return (base[: rng.randint(0, len(base))] + fresh)[: 2 * Model.MAX_LEN]


@pytest.mark.parametrize("seed", range(12))
def test_random_against_reference(seed: int) -> None:
    rng = random.Random(seed)
    model = Model(capacity=rng.choice([24, 40, 64]))
    for _ in range(250):
        op = rng.random()
        if op < 0.2:
            model.match(random_ids(rng, model))
        elif op < 0.35:
            model.insert_raw(random_ids(rng, model))
        elif op < 0.55 and len(model.reqs) < 6:
            model.start(random_ids(rng, model))
        elif op < 0.7 and model.reqs:
            model.finish(rng.randrange(len(model.reqs)))
        elif op < 0.82 and model.reqs:
            extra = tuple(rng.randrange(Model.ALPHABET) for _ in range(rng.randint(0, 4)))
            model.chunk(rng.randrange(len(model.reqs)), extra)
        else:
            model.evict(rng.randint(0, 20))
        model.check()
    model.drain()


ids_strategy = st.lists(st.integers(0, Model.ALPHABET - 1), max_size=Model.MAX_LEN).map(tuple)


class RadixCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model = Model(capacity=32)

    def _ids(self, base_pick: int, cut: int, tail: tuple[int, ...]) -> tuple[int, ...]:
        known = list(self.model.ref) + [r["ids"] for r in self.model.reqs]
        if not known:
            return tail
        base = known[base_pick % len(known)]
        return (base[: cut % (len(base) + 1)] + tail)[: 2 * Model.MAX_LEN]

    @rule(pick=st.integers(0, 10**6), cut=st.integers(0, 20), tail=ids_strategy)
    def match(self, pick: int, cut: int, tail: tuple[int, ...]) -> None:
        self.model.match(self._ids(pick, cut, tail))

    @rule(pick=st.integers(0, 10**6), cut=st.integers(0, 20), tail=ids_strategy)
    def insert_raw(self, pick: int, cut: int, tail: tuple[int, ...]) -> None:
        self.model.insert_raw(self._ids(pick, cut, tail))

    @precondition(lambda self: len(self.model.reqs) < 5)
    @rule(pick=st.integers(0, 10**6), cut=st.integers(0, 20), tail=ids_strategy)
    def start(self, pick: int, cut: int, tail: tuple[int, ...]) -> None:
        self.model.start(self._ids(pick, cut, tail))

    @precondition(lambda self: bool(self.model.reqs))
    @rule(i=st.integers(0, 10**6))
    def finish(self, i: int) -> None:
        self.model.finish(i % len(self.model.reqs))

    @precondition(lambda self: bool(self.model.reqs))
    @rule(
        i=st.integers(0, 10**6),
        extra=st.lists(st.integers(0, Model.ALPHABET - 1), max_size=4).map(tuple),
    )
    def chunk(self, i: int, extra: tuple[int, ...]) -> None:
        self.model.chunk(i % len(self.model.reqs), extra)

    @rule(n=st.integers(0, 40))
    def evict(self, n: int) -> None:
        self.model.evict(n)

    @invariant()
    def consistent(self) -> None:
        self.model.check()

    def teardown(self) -> None:
        self.model.drain()


RadixCacheMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_radix_cache_state_machine = RadixCacheMachine.TestCase


def test_continuation_is_a_cached_sequence_going_on_from_the_whole_query() -> None:
    """Brute force over random trees: the continuation extends the query along an inserted
    sequence (the latest used at forks), as far as `k` or the sequence allow, and is empty
    exactly when no inserted sequence strictly extends the query."""
    rng = random.Random(5)
    for trial in range(40):
        pool = SpyPool(4000)
        cache = RadixCache(pool)
        seqs = []
        for _ in range(rng.randint(1, 6)):
            base = (
                list(rng.choice(seqs)[: rng.randint(0, 6)]) if seqs and rng.random() < 0.6 else []
            )
            seq = base + [rng.randrange(3) for _ in range(rng.randint(1, 8))]
            seqs.append(seq)
            cache.insert(seq, alloc(pool, len(seq)))
        for _ in range(30):
            src = rng.choice(seqs)
            query = (
                src[: rng.randint(0, len(src))] if rng.random() < 0.8 else [rng.randrange(3)] * 3
            )
            k = rng.randint(1, 6)
            got = cache.continuation(query, k)
            extends = [s for s in seqs if len(s) > len(query) and s[: len(query)] == query]
            if not extends:
                assert got == [], (trial, query, got)
                continue
            assert 0 < len(got) <= k
            whole = query + got
            assert any(s[: len(whole)] == whole for s in seqs), (trial, query, got)
            # as long as k allows or the branch it follows ends
            assert (
                len(got) == k
                or any(s == whole for s in seqs)
                or not any(len(s) > len(whole) and s[: len(whole)] == whole for s in seqs)
            )
    assert NoPrefixCache(SpyPool(8)).continuation([1, 2], 4) == []


def test_continuation_follows_the_most_recently_used_branch_and_reads_only() -> None:
    pool = SpyPool(64)
    cache = RadixCache(pool)
    cache.insert([1, 2, 3, 4], alloc(pool, 4))
    cache.insert([1, 2, 5, 6, 7], alloc(pool, 5))
    assert cache.continuation([1, 2], 3) == [5, 6, 7]
    assert cache.continuation([1], 5) == [2, 5, 6, 7]
    cache.match_prefix([1, 2, 3])  # uses the first branch
    assert cache.continuation([1, 2], 3) == [3, 4]
    assert cache.continuation([1, 2, 5], 1) == [6]
    assert cache.continuation([1, 2, 5, 6, 7], 3) == [] and cache.continuation([9], 2) == []
    before = [(path, n.last_access_time) for n, path in nodes_with_paths(cache)]
    cache.continuation([1, 2, 5], 2)  # mid-edge: no split, no time stamp
    assert [(path, n.last_access_time) for n, path in nodes_with_paths(cache)] == before
    check_structure(cache)
