"""Tensor-parallel scheduler ranks in lockstep.

Every rank runs the same scheduler over the same requests and builds the same batches; only
its model holds a shard (model/parallel.py) and only rank 0 talks to the engine. What could
make two ranks decide differently is decided by rank 0 and shared, once per loop turn:

- the messages that arrived (rank 0 drains its inbox; the others have none of their own),
- which requests' constraints are compiled and may start (compiles finish at different times
  on each rank: the others wait for theirs), and which idle sessions expire (clocks differ),
- after each step, the sampled tokens (the others take rank 0's instead of sampling, so an
  unseeded sampler's random state can never drift).

Each share is a broadcast of a pickled payload over a gloo (CPU) group: first its length,
then, when there is anything, its bytes (as mini-sglang's `scheduler/io.py`). `SingleRank`
is the same interface at tp_size 1, where sharing is the identity.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Turn:
    """What rank 0 decided at the start of one loop turn."""

    messages: list[Any] = field(default_factory=list)
    compiled: list[tuple[str, bool]] = field(
        default_factory=list
    )  # (rid, compiled without error), in start order
    expired_sessions: list[str] = field(default_factory=list)


class SingleRank:
    """tp_size 1: this rank decides alone."""

    is_leader = True

    def share_turn(self, turn: Turn | None) -> Turn:
        return turn if turn is not None else Turn()

    def share_tokens(self, token_ids: list[int] | None) -> list[int]:
        return token_ids  # type: ignore[return-value]

    def agree_min(self, value: int) -> int:
        return value


class RankGroup:
    """tp_size > 1: rank 0 broadcasts its decisions over `group` (gloo), the others take them."""

    def __init__(self, rank: int, group: Any) -> None:
        self.rank = rank
        self.group = group
        self.is_leader = rank == 0

    def share_turn(self, turn: Turn | None) -> Turn:
        empty = turn is None or not (turn.messages or turn.compiled or turn.expired_sessions)
        return self._broadcast(None if empty or not self.is_leader else turn) or Turn()

    def share_tokens(self, token_ids: list[int] | None) -> list[int]:
        return self._broadcast(token_ids if self.is_leader else None)

    def agree_min(self, value: int) -> int:
        """The smallest of the ranks' `value`s, on every rank (e.g. the KV pool size: each
        rank plans from its own free memory, but all must run the same pool)."""
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def _broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank: its pickled length, then (if not empty) its bytes."""
        import torch.distributed as dist

        payload = pickle.dumps(obj) if self.is_leader and obj is not None else b""
        size = torch.tensor([len(payload)], dtype=torch.int64)
        dist.broadcast(size, src=0, group=self.group)
        n = int(size.item())
        if n == 0:
            return None
        data = (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            if self.is_leader
            else torch.empty(n, dtype=torch.uint8)
        )
        dist.broadcast(data, src=0, group=self.group)
        return obj if self.is_leader else pickle.loads(data.numpy().tobytes())
