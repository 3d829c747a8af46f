"""Attention with Triton kernels over the KV pool (GPU; CPU only under TRITON_INTERPRET=1).

Per step, `init_forward_metadata` moves the batch's few per-request integers to the device
once, as tensors every layer reuses. A step where every request runs one token is a decode:
the split-context decode kernel reads each context from the pool by slot. Any other step
(prefill, chunked prefill, prefix-cache hits, jump-forward extends, decodes mixed in) goes
through the extend kernel, which reads the prefix from the pool and the new tokens from
the step's k/v.

For CUDA graphs, decode metadata can instead live in static buffers (`init_cuda_graph_state`)
that a graph runner refreshes before each replay (`init_forward_metadata_replay`): the
kernels read rows and lengths from those tensors, and the launch grids depend only on the
batch size, so a captured decode stays valid for any batch of that size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sgl.runtime.attention.base import AttentionBackend, ForwardBatch

try:
    from sgl.runtime.attention import triton_kernels
except ModuleNotFoundError as e:
    if not (e.name or "").startswith("triton"):
        raise
    raise ImportError(
        "the triton attention backend needs the `triton` package: pip install triton "
        "(or install sgl with the `cuda` extra: pip install 'sgl[cuda]')"
    ) from e

DEFAULT_NUM_KV_SPLITS = 8


@dataclass
class TritonMetadata:
    """Per-step index tensors (int32, on the batch's device), shared by every layer."""

    batch_size: int
    is_decode: bool  # every request runs exactly one new token
    req_rows: torch.Tensor  # [bs] row in req_to_token
    seq_lens: torch.Tensor  # [bs] prefix + extend
    # Extend steps only (None for decode):
    prefix_lens: torch.Tensor | None = None  # [bs]
    extend_lens: torch.Tensor | None = None  # [bs]
    qo_start: torch.Tensor | None = None  # [bs] first flat token of each request
    max_extend_len: int = 1
    from_graph_buffers: bool = False  # views of the static CUDA-graph buffers


@dataclass
class _GraphState:
    """Static buffers a captured decode reads; replay overwrites them in place."""

    max_bs: int
    max_context_len: int
    req_rows: torch.Tensor  # [max_bs] int32
    seq_lens: torch.Tensor  # [max_bs] int32
    part_out: torch.Tensor | None = None  # [max_bs, heads, splits, D] float32, made on first use
    part_lse: torch.Tensor | None = None


class TritonBackend(AttentionBackend):
    """Paged decode (split-K) and extend attention in Triton; see the module docstring.

    `num_kv_splits` (a power of two) is the decode kernel's fixed split count. `block_m` and
    `block_n` are the extend tiles (queries x keys), `block_n` also the decode key tile. None
    picks 64 x 32 (decode: 64 keys) on a GPU, and 16 under the interpreter, where each
    program runs in Python and small tiles keep the tests quick.
    """

    name = "triton"
    features = frozenset({"sliding_window", "logit_cap"})

    def __init__(
        self,
        num_kv_splits: int = DEFAULT_NUM_KV_SPLITS,
        block_m: int | None = None,
        block_n: int | None = None,
    ) -> None:
        if num_kv_splits < 1 or num_kv_splits & (num_kv_splits - 1):
            raise ValueError(f"num_kv_splits must be a power of two, got {num_kv_splits}")
        small = triton_kernels.interpreting()
        self.num_kv_splits = num_kv_splits
        self.block_m = block_m or (16 if small else 64)
        self.block_n = block_n or (16 if small else 32)
        self.decode_block_n = block_n or (16 if small else 64)
        self._graph: _GraphState | None = None
        self._device: torch.device | None = None  # the KV pool's, once bound

    # ------------------------------------------------------------------ metadata

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        device = batch.out_cache_loc.device
        self._check_device(device)
        bs = len(batch.req_rows)
        seq_lens = batch.seq_lens
        if all(e == 1 for e in batch.extend_lens):
            host = torch.tensor([batch.req_rows, seq_lens], dtype=torch.int32)
            dev = host.to(device, non_blocking=True)
            batch.metadata = TritonMetadata(bs, True, dev[0], dev[1])
            return
        qo_start, start = [], 0
        for e in batch.extend_lens:
            qo_start.append(start)
            start += e
        host = torch.tensor(
            [batch.req_rows, seq_lens, batch.prefix_lens, batch.extend_lens, qo_start],
            dtype=torch.int32,
        )
        dev = host.to(device, non_blocking=True)
        batch.metadata = TritonMetadata(
            bs, False, dev[0], dev[1], prefix_lens=dev[2], extend_lens=dev[3], qo_start=dev[4],
            max_extend_len=max(batch.extend_lens),
        )  # fmt: skip

    @staticmethod
    def _check_device(device: torch.device) -> None:
        if device.type != "cuda" and not triton_kernels.interpreting():
            raise RuntimeError(
                f"the triton attention backend runs on CUDA tensors, not {device.type}; "
                "use attention_backend='torch_native' (or set TRITON_INTERPRET=1 before importing "
                "triton, for tests)"
            )

    # ------------------------------------------------------------------ CUDA-graph hooks

    def bind(self, kv_pool, req_to_token, num_qo_heads: int) -> None:
        self._device = kv_pool.device  # where the CUDA-graph buffers go

    @property
    def graph_state(self) -> _GraphState | None:
        """The static CUDA-graph buffers, None before `init_cuda_graph_state` (test hook:
        captured launches must keep using the same buffers)."""
        return self._graph

    def init_cuda_graph_state(
        self, max_bs: int, max_context_len: int, device: torch.device | str | None = None
    ) -> None:
        """Allocate the static decode metadata for graphs of up to `max_bs` requests.

        Call once before capturing (on the bound pool's device unless `device` is given).
        `max_context_len` is recorded only: the kernels take each length from `seq_lens`, so
        no launch depends on it. The split scratch is sized to `max_bs` on the first decode
        forward that uses these buffers (a warm-up run or the capture itself), so its
        address never changes afterwards.
        """
        device = device or self._device or "cuda"
        self._graph = _GraphState(
            max_bs=max_bs,
            max_context_len=max_context_len,
            req_rows=torch.zeros(max_bs, dtype=torch.int32, device=device),
            seq_lens=torch.ones(max_bs, dtype=torch.int32, device=device),
        )

    def init_forward_metadata_capture(
        self, bs: int, req_rows: torch.Tensor | None = None, seq_lens: torch.Tensor | None = None
    ) -> TritonMetadata:
        """Decode metadata for capturing a graph of batch size `bs`: views of the static buffers
        (the runner makes it the captured forward's `ForwardBatch.metadata`). `req_rows` and
        `seq_lens`, when given, are copied in first; otherwise the buffers hold padding
        requests (row 0, length 1), so a capture run reads valid slots either way.
        """
        g = self._require_graph_state(bs)
        if req_rows is not None and seq_lens is not None:
            self.init_forward_metadata_replay(bs, req_rows, seq_lens)
        return TritonMetadata(bs, True, g.req_rows[:bs], g.seq_lens[:bs], from_graph_buffers=True)

    def init_forward_metadata_replay(
        self,
        bs: int,
        req_rows: torch.Tensor | Sequence[int],
        seq_lens: torch.Tensor | Sequence[int],
    ) -> None:
        """Copy a decode batch's rows and lengths (seq_len = prefix + 1) into the static buffers.

        Give `bs` (the captured size) entries, or fewer: the rest become padding requests
        (row 0, length 1) whose outputs the runner discards.
        """
        g = self._require_graph_state(bs)
        n = len(req_rows)
        if len(seq_lens) != n or n > bs:
            raise ValueError(
                f"replay needs at most bs={bs} rows and as many seq_lens; got {n} and "
                f"{len(seq_lens)}"
            )
        g.req_rows[:n].copy_(torch.as_tensor(req_rows, dtype=torch.int32), non_blocking=True)
        g.seq_lens[:n].copy_(torch.as_tensor(seq_lens, dtype=torch.int32), non_blocking=True)
        if n < bs:
            g.req_rows[n:bs].zero_()
            g.seq_lens[n:bs].fill_(1)

    def _require_graph_state(self, bs: int) -> _GraphState:
        if self._graph is None:
            raise RuntimeError(
                "call init_cuda_graph_state(max_bs, max_context_len) before capturing or replaying"
            )
        if bs > self._graph.max_bs:
            raise ValueError(
                f"batch size {bs} exceeds the CUDA-graph state's max_bs {self._graph.max_bs}"
            )
        return self._graph

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        q,
        k,
        v,
        layer_id,
        scaling,
        batch: ForwardBatch,
        sliding_window: int = 0,
        logit_cap: float = 0.0,
    ) -> torch.Tensor:
        pool = batch.kv_pool
        pool.set_kv(layer_id, batch.out_cache_loc, k, v)
        k_buf, v_buf = pool.k_buffers[layer_id], pool.v_buffers[layer_id]
        table = batch.req_to_token.req_to_token
        md: TritonMetadata = batch.metadata
        out = torch.empty_like(q)
        if md.is_decode:
            part_out, part_lse = self._decode_scratch(md, q)
            triton_kernels.decode_attention(
                q, k_buf, v_buf, out, table, md.req_rows, md.seq_lens, scaling, part_out, part_lse,
                block_n=self.decode_block_n, window=sliding_window, logit_cap=logit_cap,
            )  # fmt: skip
        else:
            triton_kernels.extend_attention(
                q, k, v, out, k_buf, v_buf, table, md.req_rows, md.prefix_lens, md.extend_lens,
                md.qo_start, md.max_extend_len, scaling, block_m=self.block_m, block_n=self.block_n,
                window=sliding_window, logit_cap=logit_cap,
            )  # fmt: skip
        return out

    def _decode_scratch(
        self, md: TritonMetadata, q: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Split scratch: fresh per call (the caching allocator makes that cheap), except under a
        graph, whose captured launches need one fixed buffer."""
        heads, head_dim = q.shape[1], q.shape[2]
        g = self._graph
        if not md.from_graph_buffers or g is None:
            return triton_kernels.decode_partial_buffers(
                md.batch_size, heads, head_dim, self.num_kv_splits, q.device
            )
        if g.part_out is None:
            g.part_out, g.part_lse = triton_kernels.decode_partial_buffers(
                g.max_bs, heads, head_dim, self.num_kv_splits, q.device
            )
        elif g.part_out.shape[1:] != (heads, self.num_kv_splits, head_dim):
            raise RuntimeError(
                "the CUDA-graph scratch was sized for another head count or head_dim"
            )
        return g.part_out[: md.batch_size], g.part_lse[: md.batch_size]
