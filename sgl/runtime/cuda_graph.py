"""CUDA graphs for decode steps: capture the model's forward once per batch size, replay it.

A decode step of a small batch on a GPU is bound by kernel launches, not by the math: an
8B model launches hundreds of kernels per step, each costing microseconds of CPU time.
Replaying a captured graph launches them all at once. Graphs have fixed shapes and fixed
addresses, so the runner owns static input buffers (token ids, positions, KV slots, table
rows, sequence lengths), captures one graph per size in `capture_batch_sizes(max_bs)`, and
runs a batch of `bs` requests as the next captured size: the extra rows decode token 0 at
position 0 into the padding slot 0 over a reserved table row of zeros (so they read only
slot 0), and their outputs are dropped.

Only the model's forward is captured; logits and sampling stay eager. The attention
backend takes part through its CUDA-graph hooks (base.CudaGraphHooks). On a CPU the runner
runs the same buffers, padding and hooks without capturing (`use_graphs=False`), which is
how the unit tests check everything but the capture itself.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from sgl.runtime.attention.base import AttentionBackend, ForwardBatch, supports_cuda_graph
from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool

logger = logging.getLogger(__name__)

# Forward passes run before each capture, so lazy initialisations (cuBLAS handles, Triton
# autotuning and compilation) happen outside the graph.
WARMUP_RUNS = 2


def capture_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to max_bs, and max_bs itself."""
    if max_bs < 1:
        raise ValueError(f"cuda_graph_max_bs must be >= 1, got {max_bs}")
    sizes = [s for s in (1, 2, 4, 8) if s <= max_bs] + list(range(16, max_bs + 1, 8))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


def padded_batch_size(bs: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds `bs` rows; None when none does."""
    if bs < 1:
        return None
    i = bisect.bisect_left(sizes, bs)
    return sizes[i] if i < len(sizes) else None


@dataclass
class DecodeInputs:
    """One decode step, a row per request: the token fed, its position and KV slot, the
    request's table row and its length including this token."""

    input_ids: list[int]
    positions: list[int]
    out_cache_loc: list[int]
    req_rows: list[int]
    seq_lens: list[int]

    def padded(self, size: int, padding_row: int) -> DecodeInputs:
        """The rows padded to `size`: token 0 at position 0 into slot 0, over `padding_row`, length
        1."""
        n = size - len(self.input_ids)
        if n < 0:
            raise ValueError(f"cannot pad {len(self.input_ids)} rows to {size}")
        return DecodeInputs(
            self.input_ids + [0] * n,
            self.positions + [0] * n,
            self.out_cache_loc + [0] * n,
            self.req_rows + [padding_row] * n,
            self.seq_lens + [1] * n,
        )


class CudaGraphRunner:
    """Captures (at construction) and replays the model's decode forward for padded batch sizes."""

    def __init__(
        self,
        model: torch.nn.Module,
        attn_backend: AttentionBackend,
        kv_pool: TokenToKVPool,
        req_to_token: ReqToTokenPool,
        max_bs: int,
        padding_row: int,
        use_graphs: bool | None = None,
    ) -> None:
        if not supports_cuda_graph(attn_backend):
            raise ValueError(f"{type(attn_backend).__name__} offers no CUDA-graph hooks")
        self.model = model
        self.backend = attn_backend
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token
        self.padding_row = padding_row
        self.device = kv_pool.device
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self.capture_sizes = capture_batch_sizes(max_bs)
        self.max_bs = max_bs
        # The static inputs, one row each: ids, positions, KV slots, table rows, seq lens.
        # Filled on the host and sent in one copy per step.
        self._host = torch.zeros((5, max_bs), dtype=torch.int64, pin_memory=self.use_graphs)
        self._dev = torch.zeros((5, max_bs), dtype=torch.int64, device=self.device)
        self.input_ids, self.positions, self.out_cache_loc, self.req_rows = (
            self._dev[0],
            self._dev[1],
            self._dev[2],
            self._dev[3],
        )
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.metadata: dict[int, Any] = {}
        attn_backend.init_cuda_graph_state(max_bs, req_to_token.max_context_len)
        self._capture()

    def can_run(self, bs: int) -> bool:
        return 1 <= bs <= self.max_bs

    def _write(self, inputs: DecodeInputs) -> None:
        n = len(inputs.input_ids)
        self._host[:, :n] = torch.tensor(
            [
                inputs.input_ids,
                inputs.positions,
                inputs.out_cache_loc,
                inputs.req_rows,
                inputs.seq_lens,
            ],
            dtype=torch.int64,
        )
        self._dev.copy_(self._host, non_blocking=True)
        self.seq_lens.copy_(self._dev[4])

    def _batch(self, bs: int) -> ForwardBatch:
        """The batch the captured forward sees. Its list fields are placeholders: inside a
        graph, backends read only tensors (their hooks' buffers)."""
        return ForwardBatch(
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            req_rows=[self.padding_row] * bs,
            prefix_lens=[0] * bs,
            extend_lens=[1] * bs,
            kv_pool=self.kv_pool,
            req_to_token=self.req_to_token,
            attn_backend=self.backend,
            metadata=self.metadata.get(bs),
        )

    def _capture(self) -> None:
        self._write(DecodeInputs([], [], [], [], []).padded(self.max_bs, self.padding_row))
        pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        stream = torch.cuda.Stream(self.device) if self.use_graphs else None
        start = time.perf_counter()
        if self.use_graphs:
            logger.info(
                "warming up and capturing CUDA graphs for decode batch sizes %s",
                self.capture_sizes,
            )
        # Largest first: the smaller graphs then fit in the memory the larger ones freed.
        for bs in reversed(self.capture_sizes):
            self.metadata[bs] = self.backend.init_forward_metadata_capture(
                bs, self.req_rows[:bs], self.seq_lens[:bs]
            )
            if not self.use_graphs:
                continue
            batch = self._batch(bs)
            with torch.inference_mode():
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    for _ in range(WARMUP_RUNS):
                        self.model(batch.input_ids, batch.positions, batch)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                # thread_local: CUDA work of other threads (another engine in the process) may go on
                with torch.cuda.graph(
                    graph, pool=pool, stream=stream, capture_error_mode="thread_local"
                ):
                    self.outputs[bs] = self.model(batch.input_ids, batch.positions, batch)
            self.graphs[bs] = graph
        if self.use_graphs:
            torch.cuda.synchronize(self.device)
            logger.info(
                "captured %d CUDA graphs in %.1f s",
                len(self.capture_sizes),
                time.perf_counter() - start,
            )

    def replay(self, inputs: DecodeInputs) -> torch.Tensor:
        """Final hidden states [bs, hidden] of one decode step (a view of a static buffer:
        valid until the next replay)."""
        bs = len(inputs.input_ids)
        size = padded_batch_size(bs, self.capture_sizes)
        if size is None or bs > self.max_bs:
            raise ValueError(f"decode batch of {bs} exceeds cuda_graph_max_bs {self.max_bs}")
        self._write(inputs.padded(size, self.padding_row))
        self.backend.init_forward_metadata_replay(size, self.req_rows[:size], self.seq_lens[:size])
        if self.use_graphs:
            self.graphs[size].replay()
            return self.outputs[size][:bs]
        with torch.inference_mode():
            batch = self._batch(size)
            return self.model(batch.input_ids, batch.positions, batch)[:bs]
