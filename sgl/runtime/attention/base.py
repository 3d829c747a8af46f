"""The attention backend interface and the flat batch description every backend reads.

A forward step processes a flat list of tokens from many requests: request i contributes
`extend_lens[i]` new tokens whose K/V go to `out_cache_loc`, on top of `prefix_lens[i]`
tokens already in the KV pool (cached prefix, earlier chunks, or earlier decode steps).
Decode is simply the case `extend_len == 1`.

CUDA graphs (sgl/runtime/cuda_graph.py) replay pure-decode steps. A backend takes part by
offering the three `CudaGraphHooks` methods; the graph runner then never calls
`init_forward_metadata` for those steps, and everything `forward` reads inside the graph
must live in tensors whose addresses stay fixed from capture to replay.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

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
    attn_backend: AttentionBackend
    # Per request: its row's allocation count (ReqToTokenPool.epochs), so a backend that keeps
    # per-row state across steps can tell a new occupant of a reused row. None: no such state.
    row_epochs: list[int] | None = None
    metadata: Any = field(default=None)

    @property
    def seq_lens(self) -> list[int]:
        return [p + e for p, e in zip(self.prefix_lens, self.extend_lens)]


# Per-layer attention features a model may need (`ModelConfig.attention_features`).
FEATURES = ("sliding_window", "logit_cap")


class AttentionBackend(ABC):
    """Computes causal attention for a ForwardBatch over the paged KV pool."""

    # Short name for server info and reports: the registered backends' registry names.
    name: str = "custom"
    # Which of FEATURES `forward` implements (a model needing others is refused at start-up).
    features: frozenset[str] = frozenset()

    def reserved_memory_bytes(
        self,
        max_total_tokens: int,
        num_kv_heads: int,
        head_dim: int,
        num_layers: int,
        dtype: torch.dtype,
    ) -> int:
        """The most memory this backend may keep allocated beyond a KV pool of this shape
        (state held across steps, such as torch_native's decode mirror), for the memory plan.
        Per-step temporaries, which scale with the batch like activations, are not counted.
        Called before `bind`; the default holds nothing."""
        return 0

    def bind(  # noqa: B027 (optional: the default keeps nothing)
        self, kv_pool: TokenToKVPool, req_to_token: ReqToTokenPool, num_qo_heads: int
    ) -> None:
        """Called once by the scheduler before any step, with the pools and the model's query
        head count. Backends that plan ahead of `forward` (flashinfer; CUDA-graph hooks, which
        see no ForwardBatch) keep what they need; the default keeps nothing."""

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
        **features: Any,
    ) -> torch.Tensor:
        """Store k/v at batch.out_cache_loc and return the attention output [T, heads, head_dim].

        `features` are passed only when a layer uses them (so a backend without them runs every
        model that does not): `sliding_window=W` (a query sees the last W keys, itself
        included) and `logit_cap=c` (scores -> c * tanh(scores / c), after scaling)."""


@runtime_checkable
class CudaGraphHooks(Protocol):
    """What a backend offers to have its decode steps captured in CUDA graphs.

    The runner calls `init_cuda_graph_state` once, then per captured batch size
    `init_forward_metadata_capture` before capturing the model's forward, and before every
    replay `init_forward_metadata_replay` with the same static buffers, now holding the
    step's values. `req_rows` [bs] int64 are rows of the request-to-token table (padding rows
    point at a row of zeros, i.e. the padding slot 0, with seq_len 1); `seq_lens` [bs] int32
    count each row's tokens including the one being decoded (whose slot is already written
    in the table). Both live on the model's device.

    The value returned by `init_forward_metadata_capture` becomes `ForwardBatch.metadata`
    of the captured forward (None is fine for a backend that keeps its state itself).
    Replay runs no Python forward: the replay hook must update, in place, every tensor the
    captured kernels read.
    """

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None: ...

    def init_forward_metadata_capture(
        self, bs: int, req_rows: torch.Tensor, seq_lens: torch.Tensor
    ) -> Any: ...

    def init_forward_metadata_replay(
        self, bs: int, req_rows: torch.Tensor, seq_lens: torch.Tensor
    ) -> None: ...


def supports_cuda_graph(backend: AttentionBackend) -> bool:
    """Whether the backend offers all three CUDA-graph hooks."""
    return isinstance(backend, CudaGraphHooks)
