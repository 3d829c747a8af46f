"""Radix tree mapping token-id prefixes to KV slot ids, for prefix reuse across requests.

Each edge holds a run of token ids (`key`) and the pool slots that hold their K/V
(`value`, int64, same length). A path from the root spells a cached prefix; the
concatenation of the values on that path is that prefix's KV. Nodes are split whenever a
match or an insert ends inside an edge, so every prefix a caller is handed (and may lock)
ends exactly at a node boundary.

Ownership: slots stored in the tree belong to the tree; they go back to the pool only via
`evict` or `flush`. Running requests pin their prefix with `inc_lock_ref` on the node that
`match_prefix` returned; a node is evictable only while no request's path runs through it.

Sizes (evictable / protected) are kept incrementally so the scheduler can read them in
O(1) every step. Time stamps come from a per-cache counter (one tick per operation), which
makes LRU order deterministic and free of clock-resolution ties.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

import torch

from sgl.runtime.prefix_cache import PrefixCache, SlotPool

__all__ = ["TreeNode", "RadixCache"]


def _empty_slots() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)


def _common_prefix_len(key: list[int], ids: list[int], start: int) -> int:
    """Length of the common prefix of `key` and `ids[start:]`.

    The full-edge case is by far the most common, so try one C-level list compare first
    and only fall back to the element-wise scan when the edge really diverges. Both are
    O(len(key)).
    """
    n = min(len(key), len(ids) - start)
    if key[:n] == ids[start : start + n]:
        return n
    i = 0
    for a, b in zip(key, itertools.islice(ids, start, start + n)):
        if a != b:
            break
        i += 1
    return i


class TreeNode:
    """One edge of the radix tree plus the node it leads to."""

    __slots__ = ("key", "value", "children", "parent", "lock_ref", "last_access_time")

    def __init__(
        self,
        key: list[int] | None = None,
        value: torch.Tensor | None = None,
        parent: TreeNode | None = None,
        lock_ref: int = 0,
        last_access_time: int = 0,
    ) -> None:
        self.key: list[int] = key if key is not None else []
        self.value: torch.Tensor = value if value is not None else _empty_slots()
        # Keyed by the first token of the child's edge: edges out of a node never share it.
        self.children: dict[int, TreeNode] = {}
        self.parent: TreeNode | None = parent
        self.lock_ref: int = lock_ref
        self.last_access_time: int = last_access_time

    def is_leaf(self) -> bool:
        return not self.children

    def __repr__(self) -> str:
        head = self.key[:8]
        more = "..." if len(self.key) > 8 else ""
        return (
            f"TreeNode(len={len(self.key)}, key={head}{more}, lock_ref={self.lock_ref}, "
            f"t={self.last_access_time}, children={len(self.children)})"
        )


class RadixCache(PrefixCache):
    """Prefix cache over token ids whose values are KV-pool slot ids."""

    def __init__(self, pool: SlotPool) -> None:
        self.pool = pool
        self._clock = itertools.count(1)
        self.reset()

    # ------------------------------------------------------------------ bookkeeping

    def reset(self) -> None:
        """Drop the whole tree without freeing: the pool has already been cleared by the caller."""
        # The root's permanent lock keeps it out of every eviction candidate set.
        self.root = TreeNode(lock_ref=1, last_access_time=next(self._clock))
        self._evictable_size = 0
        self._protected_size = 0

    def evictable_size(self) -> int:
        """Tokens the tree could give back right now (in nodes no request has locked)."""
        return self._evictable_size

    def protected_size(self) -> int:
        """Tokens pinned by running requests (nodes with lock_ref > 0)."""
        return self._protected_size

    def total_size(self) -> int:
        """All tokens held by the tree (each node counted once)."""
        return self._evictable_size + self._protected_size

    # ------------------------------------------------------------------ lookup / insert

    def match_prefix(self, token_ids: Sequence[int]) -> tuple[torch.Tensor, TreeNode]:
        """Longest cached prefix of `token_ids`: its slot ids and the node ending exactly there.

        A match ending inside an edge splits that edge so the caller can lock precisely the
        matched prefix and nothing beyond it.
        """
        ids = token_ids if isinstance(token_ids, list) else list(token_ids)
        now = next(self._clock)
        node = self.root
        node.last_access_time = now
        values: list[torch.Tensor] = []
        pos = 0
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                break
            n = _common_prefix_len(child.key, ids, pos)
            if n < len(child.key):
                # Split before stamping, so the unmatched lower part keeps its old time.
                child = self._split(child, n)
            child.last_access_time = now
            values.append(child.value)
            node = child
            pos += n
            # After a split, ids[pos] (if any) differs from the lower half's first token,
            # so the next lookup misses and the loop ends on its own.
        if not values:
            return _empty_slots(), node
        return (values[0] if len(values) == 1 else torch.cat(values)), node

    def continuation(self, token_ids: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens that followed all of `token_ids` in a cached sequence (the most
        recently used branch at each fork), or [] when the tree does not hold them all.
        Read only: no split, no time stamp (speculative decoding drafts from it)."""
        ids = token_ids if isinstance(token_ids, list) else list(token_ids)
        node, pos, edge_at = self.root, 0, 0
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                return []
            n = _common_prefix_len(child.key, ids, pos)
            pos += n
            node, edge_at = child, n
            if n < len(child.key) and pos < len(ids):
                return []  # diverges inside the edge
        out = list(node.key[edge_at : edge_at + k])
        while len(out) < k and node.children:
            node = max(node.children.values(), key=lambda c: c.last_access_time)
            out.extend(node.key[: k - len(out)])
        return out

    def insert(self, token_ids: Sequence[int], slots: torch.Tensor) -> int:
        """Store `token_ids -> slots`; return how many leading tokens were already cached.

        Only the slots of the new suffix (`slots[returned:]`) are taken over by the tree; the
        caller still owns `slots[:returned]` and must free whichever of those are its own
        duplicates of the tree's slots.
        """
        ids = token_ids if isinstance(token_ids, list) else list(token_ids)
        if int(slots.numel()) != len(ids):
            raise ValueError(f"insert: {len(ids)} token ids but {int(slots.numel())} slots")
        now = next(self._clock)
        node = self.root
        node.last_access_time = now
        pos = 0
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                # Clone: the caller's tensor is often a view of a request row that gets reused.
                value = slots.reshape(-1)[pos:].to(device="cpu", dtype=torch.int64, copy=True)
                leaf = TreeNode(key=ids[pos:], value=value, parent=node, last_access_time=now)
                node.children[ids[pos]] = leaf
                self._evictable_size += len(leaf.key)
                return pos
            n = _common_prefix_len(child.key, ids, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access_time = now
            node = child
            pos += n
        return pos

    def cache_unfinished(
        self, token_ids: list[int], slots: torch.Tensor, prefix_len: int, node: TreeNode
    ) -> tuple[torch.Tensor, TreeNode]:
        already = self.insert(token_ids, slots)
        if already > prefix_len:  # another request cached these meanwhile: ours are duplicates
            self.pool.free(slots[prefix_len:already].clone())
        new_slots, new_node = self.match_prefix(token_ids)
        self.inc_lock_ref(new_node)
        self.dec_lock_ref(node)
        return new_slots, new_node

    def cache_finished(
        self, token_ids: list[int], slots: torch.Tensor, prefix_len: int, node: TreeNode
    ) -> None:
        already = self.insert(token_ids, slots)
        if already > prefix_len:
            self.pool.free(slots[prefix_len:already])
        self.dec_lock_ref(node)

    def _split(self, node: TreeNode, at: int) -> TreeNode:
        """Cut `node`'s edge after `at` tokens; return the new upper node (the old one becomes its
        child).

        The upper node is an ancestor of everything the old node was, so it inherits the same
        lock_ref; both halves keep the same lock state, which leaves the size counters exact.
        """
        assert 0 < at < len(node.key)
        parent = node.parent
        assert parent is not None
        upper = TreeNode(
            key=node.key[:at],
            value=node.value[:at],
            parent=parent,
            lock_ref=node.lock_ref,
            last_access_time=node.last_access_time,
        )
        parent.children[upper.key[0]] = upper
        node.key = node.key[at:]
        node.value = node.value[at:]
        node.parent = upper
        upper.children[node.key[0]] = node
        return upper

    # ------------------------------------------------------------------ locking

    def _path_to_root(self, node: TreeNode) -> list[TreeNode]:
        """Nodes from `node` up to (excluding) the root; raises for nodes no longer in this tree.

        Catching a stale node (evicted, or from before `reset`) here is what keeps a scheduler
        bug from silently corrupting the size counters.
        """
        path: list[TreeNode] = []
        cur: TreeNode | None = node
        while cur is not self.root:
            if cur is None:
                raise ValueError("node is not attached to this RadixCache (evicted or reset)")
            path.append(cur)
            cur = cur.parent
        return path

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Pin `node` and its ancestors so the prefix a running request reads can't be evicted."""
        for cur in self._path_to_root(node):
            if cur.lock_ref == 0:
                n = len(cur.key)
                self._evictable_size -= n
                self._protected_size += n
            cur.lock_ref += 1

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Release one pin taken by `inc_lock_ref(node)`; raises instead of going negative."""
        path = self._path_to_root(node)
        # Validate the whole path first so an underflow leaves the tree untouched.
        for cur in path:
            if cur.lock_ref <= 0:
                raise RuntimeError(f"dec_lock_ref underflow at {cur!r}")
        for cur in path:
            cur.lock_ref -= 1
            if cur.lock_ref == 0:
                n = len(cur.key)
                self._protected_size -= n
                self._evictable_size += n

    # ------------------------------------------------------------------ eviction

    def _iter_nodes(self) -> list[TreeNode]:
        """All non-root nodes (iterative: deep trees must not hit the recursion limit)."""
        out: list[TreeNode] = []
        stack = list(self.root.children.values())
        while stack:
            cur = stack.pop()
            out.append(cur)
            stack.extend(cur.children.values())
        return out

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots if possible, least recently used unlocked leaves first.

        Returns the number of slots actually freed (may exceed `num_tokens` because whole
        nodes go, or fall short when too much is locked).
        """
        if num_tokens <= 0:
            return 0
        tie = itertools.count()
        heap = [
            (n.last_access_time, next(tie), n)
            for n in self._iter_nodes()
            if not n.children and n.lock_ref == 0
        ]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            self.pool.free(node.value)
            n = len(node.key)
            freed += n
            self._evictable_size -= n
            del parent.children[node.key[0]]
            node.parent = None  # lets _path_to_root reject it if a caller still holds it
            # A parent's stamp is never older than its child's, so pops stay in LRU order.
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access_time, next(tie), parent))
        return freed

    def flush(self) -> bool:
        """Return every cached slot to the pool and empty the tree, unless a request holds a
        lock."""
        # Every non-root node has a non-empty key, so "nothing locked" <=> protected size 0.
        if self._protected_size > 0:
            return False
        nodes = self._iter_nodes()
        if nodes:
            self.pool.free(torch.cat([n.value for n in nodes]))
        self.reset()
        return True

    # ------------------------------------------------------------------ debugging

    def pretty_print(self) -> str:
        """Indented dump of the tree with per-node length, lock_ref and time stamp."""
        lines = [
            f"RadixCache(total={self.total_size()}, evictable={self._evictable_size}, "
            f"protected={self._protected_size})"
        ]
        stack: list[tuple[TreeNode, int]] = [
            (c, 1) for c in reversed(list(self.root.children.values()))
        ]
        while stack:
            node, depth = stack.pop()
            head = node.key[:8]
            more = "..." if len(node.key) > 8 else ""
            lines.append(
                f"{'  ' * depth}{head}{more} len={len(node.key)} lock={node.lock_ref} "
                f"t={node.last_access_time}"
            )
            stack.extend((c, depth + 1) for c in reversed(list(node.children.values())))
        return "\n".join(lines)
