"""The prefix-cache interface, and the implementation used when caching is off.

The KV manager hands a request's computed K/V to the cache at two moments: at a prefill
chunk boundary (`cache_unfinished`: the request keeps running on the cached slots) and when
it ends (`cache_finished`: the slots now belong to the cache, or go back to the pool).
`RadixCache` (radix_cache.py) shares them with every later request; `NoPrefixCache` keeps
nothing. The engine picks one at start-up (`disable_radix_cache`), and no other code asks
which one it has.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

import torch


class SlotPool(Protocol):
    def free(self, slots: torch.Tensor) -> None: ...


class PrefixCache(ABC):
    """Maps token-id prefixes to KV slots. `root` is the node matched by the empty prefix."""

    root: Any
    # Whether matching can ever find anything: the batch builder holds back requests that
    # share an uncached prefix only when a later step would find it cached.
    shares_prefixes: bool = True

    @abstractmethod
    def match_prefix(self, token_ids: Sequence[int]) -> tuple[torch.Tensor, Any]:
        """The longest cached prefix: its slots and the node to lock for it."""

    @abstractmethod
    def cache_unfinished(
        self, token_ids: list[int], slots: torch.Tensor, prefix_len: int, node: Any
    ) -> tuple[torch.Tensor, Any]:
        """Share a running request's K/V (`slots` for `token_ids`, the first `prefix_len` of
        them the cache's, locked at `node`). Returns the slots the request now uses and the
        node it holds locked instead of `node`."""

    @abstractmethod
    def cache_finished(
        self, token_ids: list[int], slots: torch.Tensor, prefix_len: int, node: Any
    ) -> None:
        """A request ended: take over (or free) its slots and drop its lock on `node`."""

    @abstractmethod
    def inc_lock_ref(self, node: Any) -> None: ...

    @abstractmethod
    def dec_lock_ref(self, node: Any) -> None: ...

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` unlocked slots if possible; returns how many were freed."""

    @abstractmethod
    def evictable_size(self) -> int: ...

    @abstractmethod
    def protected_size(self) -> int: ...

    @abstractmethod
    def total_size(self) -> int: ...

    @abstractmethod
    def flush(self) -> bool:
        """Return every cached slot to the pool; False (and nothing done) while any is locked."""

    def continuation(self, token_ids: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens a cached sequence continued `token_ids` with ([]: none known)."""
        return []


class NoPrefixCache(PrefixCache):
    """Caches nothing: every request computes its whole prompt; finished K/V is freed."""

    shares_prefixes = False

    def __init__(self, pool: SlotPool) -> None:
        self.pool = pool
        self.root = None

    def match_prefix(self, token_ids: Sequence[int]) -> tuple[torch.Tensor, Any]:
        return torch.empty(0, dtype=torch.int64), self.root

    def cache_unfinished(self, token_ids, slots, prefix_len, node):
        return slots, node

    def cache_finished(self, token_ids, slots, prefix_len, node) -> None:
        self.pool.free(slots)

    def inc_lock_ref(self, node: Any) -> None:
        pass

    def dec_lock_ref(self, node: Any) -> None:
        pass

    def evict(self, num_tokens: int) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def total_size(self) -> int:
        return 0

    def flush(self) -> bool:
        return True


def create_prefix_cache(pool: SlotPool, enabled: bool) -> PrefixCache:
    from sgl.runtime.radix_cache import RadixCache

    return RadixCache(pool) if enabled else NoPrefixCache(pool)
