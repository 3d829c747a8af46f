"""Attention with FlashInfer's kernels, reading the KV pool as a paged cache of page size 1.

The pool's per-layer K/V buffers [slots, kv_heads, head_dim] are, unsqueezed, FlashInfer's
"NHD" paged layout [pages, page_size=1, kv_heads, head_dim]; a request's pages are its row of
the request-to-token table, so `kv_indices` is the concatenation of the rows' first seq_len
slots and no K/V is ever copied or gathered on our side. Per step, once for all layers:

- every row decodes one token: BatchDecodeWithPagedKVCacheWrapper (tensor cores when a KV
  head serves >= 4 query heads, where the prefill-style kernel wins);
- no row has earlier context (a batch of fresh prompts): BatchPrefillWithRaggedKVCacheWrapper
  over this step's own k/v, causal, without reading the pool back;
- otherwise (prefix-cache hits, chunked prefill, jump-forward extends mixed with decodes):
  BatchPrefillWithPagedKVCacheWrapper, causal; FlashInfer aligns each row's queries to the
  end of its KV (query i sees keys <= prefix + i), which is the extend semantics here.

CUDA graphs: one decode wrapper per captured batch size, built with `use_cuda_graph=True`
over static indptr / indices / last_page_len buffers; `plan()` runs outside the graph
before capture and before every replay and copies the step's indices into those buffers.

API targeted: flashinfer-python 0.7.x (0.7.2.post1, the newest on PyPI when written), as read
from its source (flashinfer/decode.py and flashinfer/prefill.py): wrappers built as
`Wrapper(float_workspace_buffer, kv_layout, use_cuda_graph=..., paged_kv_*_buffer=...)`,
`plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
q_data_type, kv_data_type, sm_scale, causal)` (everything after the shape arguments by
keyword: 0.7 deprecates passing it positionally), `run(q, (k_cache, v_cache))` and
`run(q, k, v)` for the ragged wrapper. The same calls work with 0.2.x-0.6.x.
Written without a GPU to run it on: tests/gpu/test_gpu_attention.py checks it against a
float64 reference on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sgl.runtime.attention.base import AttentionBackend, ForwardBatch
from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool

# FlashInfer's float workspace (split-KV partial results); its docs recommend 128 MB, and
# long prefill batches use more.
WORKSPACE_BYTES = 256 << 20
# GQA group size from which the tensor-core (prefill-kernel) decode path is faster.
TENSOR_CORE_DECODE_MIN_GROUP = 4


@dataclass
class _Plan:
    """The planned wrapper for this step and how to call it."""

    kind: str  # "decode" | "paged" | "ragged"
    wrapper: Any


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"

    def __init__(self) -> None:
        import flashinfer  # ImportError here: create_attention_backend reports it

        self._fi = flashinfer
        self.kv_pool: TokenToKVPool | None = None
        self.req_to_token: ReqToTokenPool | None = None
        self.num_qo_heads = 0
        self._workspace: torch.Tensor | None = None
        self._cg_wrappers: dict[int, Any] = {}

    # ------------------------------------------------------------------ set-up

    def bind(self, kv_pool: TokenToKVPool, req_to_token: ReqToTokenPool, num_qo_heads: int) -> None:
        if kv_pool.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(
                f"the flashinfer backend needs a float16 or bfloat16 KV pool, not {kv_pool.dtype}"
            )
        if kv_pool.device.type != "cuda":
            raise ValueError(f"the flashinfer backend needs a CUDA device, not {kv_pool.device}")
        self.kv_pool, self.req_to_token, self.num_qo_heads = kv_pool, req_to_token, num_qo_heads
        self.device = kv_pool.device
        self.head_dim = kv_pool.head_dim
        self.num_kv_heads = kv_pool.num_kv_heads
        self.sm_scale = self.head_dim**-0.5
        self.use_tensor_cores = num_qo_heads // self.num_kv_heads >= TENSOR_CORE_DECODE_MIN_GROUP
        # FlashInfer: the float workspace must be zero before its first use.
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        fi = self._fi
        self._decode = fi.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace, "NHD", use_tensor_cores=self.use_tensor_cores
        )
        self._paged = fi.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._ragged = fi.BatchPrefillWithRaggedKVCacheWrapper(self._workspace, "NHD")

    def _dtypes(self) -> dict[str, Any]:
        dtype = self.kv_pool.dtype
        return {"q_data_type": dtype, "kv_data_type": dtype, "sm_scale": self.sm_scale}

    def _kv_indices(self, rows: torch.Tensor, lens: torch.Tensor, max_len: int) -> torch.Tensor:
        """Concatenated table rows, each cut to its length: the page indices (int32, on device)."""
        table = self.req_to_token.req_to_token
        cols = torch.arange(max_len, device=table.device)
        sub = table[rows.to(table.device, torch.int64), :max_len]
        return sub[cols.unsqueeze(0) < lens.to(table.device).unsqueeze(1)].to(torch.int32)

    @staticmethod
    def _indptr(lens: list[int]) -> torch.Tensor:
        out = torch.zeros(len(lens) + 1, dtype=torch.int32)
        out[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int32), 0)
        return out

    # ------------------------------------------------------------------ eager steps

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if self.kv_pool is None:
            raise RuntimeError(
                "FlashInferBackend.bind(kv_pool, req_to_token, num_qo_heads) must come before the "
                "first step"
            )
        seq_lens = batch.seq_lens
        bs = len(seq_lens)
        nq, nkv, hd = self.num_qo_heads, self.num_kv_heads, self.head_dim
        last_page_len = torch.ones(bs, dtype=torch.int32)
        if all(e == 1 for e in batch.extend_lens):
            rows = torch.tensor(batch.req_rows, dtype=torch.int64)
            indices = self._kv_indices(
                rows, torch.tensor(seq_lens, dtype=torch.int32), max(seq_lens)
            )
            self._decode.plan(
                self._indptr(seq_lens), indices, last_page_len, nq, nkv, hd, 1, **self._dtypes()
            )
            batch.metadata = _Plan("decode", self._decode)
        elif all(p == 0 for p in batch.prefix_lens):
            qo_indptr = self._indptr(batch.extend_lens)
            self._ragged.plan(qo_indptr, qo_indptr, nq, nkv, hd, causal=True, **self._dtypes())
            batch.metadata = _Plan("ragged", self._ragged)
        else:
            rows = torch.tensor(batch.req_rows, dtype=torch.int64)
            indices = self._kv_indices(
                rows, torch.tensor(seq_lens, dtype=torch.int32), max(seq_lens)
            )
            self._paged.plan(
                self._indptr(batch.extend_lens),
                self._indptr(seq_lens),
                indices,
                last_page_len,
                nq,
                nkv,
                hd,
                1,
                causal=True,
                **self._dtypes(),
            )
            batch.metadata = _Plan("paged", self._paged)

    def forward(self, q, k, v, layer_id: int, scaling: float, batch: ForwardBatch) -> torch.Tensor:
        if abs(scaling - self.sm_scale) > 1e-6 * self.sm_scale:
            raise NotImplementedError(
                f"flashinfer backend: softmax scale {scaling} != head_dim**-0.5"
            )
        pool = batch.kv_pool
        pool.set_kv(layer_id, batch.out_cache_loc, k, v)
        md: _Plan = batch.metadata
        q = q.to(pool.dtype)
        if md.kind == "ragged":
            return md.wrapper.run(q, k.to(pool.dtype), v.to(pool.dtype))
        # [slots, kv_heads, D] -> [pages, page_size=1, kv_heads, D]: a view, no copy.
        cache = (pool.k_buffers[layer_id].unsqueeze(1), pool.v_buffers[layer_id].unsqueeze(1))
        return md.wrapper.run(q, cache)

    # ------------------------------------------------------------------ CUDA graphs

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        dev = self.device
        self._cg_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self._cg_indices = torch.zeros(max_bs * max_context_len, dtype=torch.int32, device=dev)
        self._cg_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self._cg_wrappers = {}

    def init_forward_metadata_capture(
        self, bs: int, req_rows: torch.Tensor, seq_lens: torch.Tensor
    ) -> _Plan:
        wrapper = self._fi.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self.use_tensor_cores,
            paged_kv_indptr_buffer=self._cg_indptr[: bs + 1],
            paged_kv_indices_buffer=self._cg_indices,
            paged_kv_last_page_len_buffer=self._cg_last_page_len[:bs],
        )
        self._cg_wrappers[bs] = wrapper
        self._plan_graph_decode(wrapper, bs, req_rows, seq_lens)
        return _Plan("decode", wrapper)

    def init_forward_metadata_replay(
        self, bs: int, req_rows: torch.Tensor, seq_lens: torch.Tensor
    ) -> None:
        self._plan_graph_decode(self._cg_wrappers[bs], bs, req_rows, seq_lens)

    def _plan_graph_decode(
        self, wrapper: Any, bs: int, req_rows: torch.Tensor, seq_lens: torch.Tensor
    ) -> None:
        # plan() needs the lengths on the host (its split-KV schedule); one small copy.
        lens_cpu = seq_lens[:bs].cpu()
        indices = self._kv_indices(req_rows[:bs], seq_lens[:bs], int(lens_cpu.max()))
        indptr = torch.zeros(bs + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(lens_cpu.to(torch.int32), 0)
        wrapper.plan(
            indptr,
            indices,
            torch.ones(bs, dtype=torch.int32),
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            1,
            **self._dtypes(),
        )
