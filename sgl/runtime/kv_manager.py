"""KV memory of running requests: pool slots, the request-to-token table, the prefix cache
and the sessions' pins on it.

A request's row in the table lists the pool slots of its `kv_len` tokens; the first
`prefix_len` belong to the prefix cache (locked at `last_node`), the rest to the request
until it hands them to the cache. Memory a step needs comes from the free slots, then from
evicting unlocked cached prefixes, then from unpinning idle sessions; the batch builder
retracts requests only when all of that is not enough.
"""

from __future__ import annotations

import torch

from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool
from sgl.runtime.prefix_cache import PrefixCache, create_prefix_cache
from sgl.runtime.request import Req
from sgl.runtime.session import MAX_PINNED_SHARE, SessionLocks, SessionRegistry


class KVManager:
    def __init__(
        self,
        pool: TokenToKVPool,
        req_to_token: ReqToTokenPool,
        cache_prefixes: bool,
        sessions: SessionRegistry,
    ) -> None:
        self.pool = pool
        self.req_to_token = req_to_token
        self.cache: PrefixCache = create_prefix_cache(pool, cache_prefixes)
        self.sessions = sessions
        self.session_locks = SessionLocks(self.cache)
        self.step_slots: torch.Tensor | None = None  # allocated for the step about to run

    # ------------------------------------------------------------------ memory available

    def reclaimable(self) -> int:
        """KV slots this step can have: free ones plus what the cache can evict."""
        return self.pool.available_size() + self.cache.evictable_size()

    def unpin_lru_session(self) -> bool:
        """Memory valve: unpin the least recently used session's KV (it stays open; its next
        turn recomputes what gets evicted). False when no session holds a pin."""
        pinned = self.session_locks.sessions()
        if not pinned:
            return False
        self.session_locks.release(min(pinned, key=self.sessions.last_used))
        return True

    def make_room(self, needed: int) -> bool:
        """Unpin sessions (least recently used first) until `needed` slots are reclaimable.
        Pins yield only here: to running requests that would otherwise stall or be
        retracted, and to a queue that cannot start while nothing runs."""
        while self.reclaimable() < needed:
            if not self.unpin_lru_session():
                return False
        return True

    # ------------------------------------------------------------------ a request's row

    def admit(self, req: Req, prefix_slots: torch.Tensor, node: object) -> None:
        """Give a request a table row starting with its cached prefix (already locked)."""
        row = self.req_to_token.alloc()
        assert row is not None, "admission checks the table has a free row"
        prefix = len(prefix_slots)
        req.pool_row, req.prefix_len, req.kv_len, req.last_node = row, prefix, prefix, node
        if prefix:
            self.req_to_token.write(row, 0, prefix_slots)

    def assign_step_slots(self, reqs_and_lens: list[tuple[Req, int]]) -> None:
        """Allocate this step's new tokens' slots (evicting if needed) and write them into rows."""
        total = sum(n for _, n in reqs_and_lens)
        if total == 0:
            return
        if self.pool.available_size() < total:
            self.cache.evict(total - self.pool.available_size())
        slots = self.pool.alloc(total)
        if slots is None:  # admission keeps this from happening; if it does, fail loudly
            raise RuntimeError(
                f"KV pool exhausted: need {total}, free {self.pool.available_size()}"
            )
        self.step_slots = slots
        rows, cols = [], []
        for r, n in reqs_and_lens:
            rows.extend([r.pool_row] * n)
            cols.extend(range(r.kv_len, r.kv_len + n))
        table = self.req_to_token.req_to_token
        table[torch.tensor(rows), torch.tensor(cols)] = slots.to(table.device)

    def take_step_slots(self) -> torch.Tensor | None:
        """The step ran: its slots are accounted by each request's kv_len from now on."""
        slots, self.step_slots = self.step_slots, None
        return slots

    def cache_unfinished(self, req: Req) -> None:
        """Share a running request's computed K/V through the prefix cache (a prefill chunk
        boundary) and hold the longer prefix locked."""
        row_slots = self.req_to_token.req_to_token[req.pool_row, : req.kv_len]
        slots, node = self.cache.cache_unfinished(
            req.fill_ids[: req.kv_len], row_slots.clone(), req.prefix_len, req.last_node
        )
        self.req_to_token.write(req.pool_row, 0, slots)
        req.last_node, req.prefix_len = node, len(slots)

    def release(self, req: Req) -> None:
        """Free the request's row; its computed K/V goes to the prefix cache (or the pool)."""
        if req.pool_row is None:
            return
        row_slots = self.req_to_token.req_to_token[req.pool_row, : req.kv_len].clone()
        self.cache.cache_finished(
            req.fill_ids[: req.kv_len], row_slots, req.prefix_len, req.last_node
        )
        self.req_to_token.free(req.pool_row)
        req.pool_row, req.kv_len, req.prefix_len, req.last_node = None, 0, 0, None

    def truncate(self, req: Req, seq_len: int) -> None:
        """Drop the K/V of the request's tokens from `seq_len` on (jump-forward rolled them
        back)."""
        if req.pool_row is not None and req.kv_len > seq_len:
            row = self.req_to_token.req_to_token[req.pool_row]
            self.pool.free(row[seq_len : req.kv_len].clone())
            req.kv_len = seq_len

    def free_step_slots(self) -> None:
        """After a failed step: its slots were never accounted to any request."""
        if self.step_slots is not None:
            self.pool.free(self.step_slots)
            self.step_slots = None

    # ------------------------------------------------------------------ sessions

    def pin_turn(self, session_id: str, token_ids: list[int]) -> None:
        """Pin a finished turn's KV (just handed to the cache) until its session ends, then keep
        all pins under MAX_PINNED_SHARE of the pool by unpinning the least recently used."""
        self.session_locks.pin(session_id, token_ids)
        limit = int(MAX_PINNED_SHARE * self.pool.capacity)
        # Pins are a subset of the cache's locked tokens: only count them when that could matter.
        while (
            self.cache.protected_size() > limit
            and self.session_locks.locked_tokens() > limit
            and self.unpin_lru_session()
        ):
            pass

    def unpin_session(self, session_id: str) -> None:
        self.session_locks.release(session_id)

    def flush(self) -> bool:
        """Empty the prefix cache, sessions' pins included (their histories stay)."""
        self.session_locks.release_all()
        return self.cache.flush()

    def info(self) -> dict[str, int]:
        return {
            "max_total_tokens": self.pool.capacity,
            "kv_bytes_per_token": self.pool.bytes_per_token,
            "available_kv_tokens": self.pool.available_size(),
            "radix_cache_tokens": self.cache.total_size(),
            "evictable_tokens": self.cache.evictable_size(),
            "session_locked_tokens": self.session_locks.locked_tokens(),
        }
