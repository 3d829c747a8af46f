"""The attention backend interface and the flat batch description every backend reads.

A forward step processes a flat list of tokens from many requests: request i contributes
`extend_lens[i]` new tokens whose K/V go to `out_cache_loc`, on top of `prefix_lens[i]`
tokens already in the KV pool (cached prefix, earlier chunks, or earlier decode steps).
Decode is simply the case `extend_len == 1`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_cache_loc: torch.Tensor  # [T] int64 pool slots for the new tokens' K/V
    req_rows: list[int]  # row of each request in the request-to-token table
    prefix_lens: list[int]
    extend_lens: list[int]
    kv_pool: TokenToKVPool
    req_to_token: ReqToTokenPool
    attn_backend: "AttentionBackend"
    # Per request: its row's allocation count (ReqToTokenPool.epochs), so a backend that keeps
    # per-row state across steps can tell a new occupant of a reused row. None: no such state.
    row_epochs: list[int] | None = None
    metadata: Any = field(default=None)

    @property
    def seq_lens(self) -> list[int]:
        return [p + e for p, e in zip(self.prefix_lens, self.extend_lens)]


class AttentionBackend(ABC):
    """Computes causal attention for a ForwardBatch over the paged KV pool."""

    @abstractmethod
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Precompute per-step index tensors once, shared by all layers."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, heads, head_dim]
        k: torch.Tensor,  # [T, kv_heads, head_dim]
        v: torch.Tensor,
        layer_id: int,
        scaling: float,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """Store k/v at batch.out_cache_loc and return the attention output [T, heads, head_dim]."""
