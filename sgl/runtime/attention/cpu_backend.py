"""CPU attention with our C++ kernel (csrc/paged_attention_cpu.cpp): per layer, one call for
every row with up to KERNEL_MAX_EXTEND new tokens (decodes, jump-forward extends, short
prompts), each reading its context from the KV pool by slot.

Against TorchNativeBackend (torch SDPA over a dense mirror of the contexts), a step costs
what its real (query, key) pairs cost: a batch mixing single-token rows with a few
multi-token rows no longer pads every row to the longest query, a batch of short prompts
no longer makes one SDPA call per row, and there is no mirror to keep up to date (nothing
is held beyond the pool). Longer rows (prefill chunks) go to the prefill kernel
(csrc/prefill_attention_cpu.cpp: blocked like a matrix multiply, AVX512-BF16 dot products)
where the CPU and the layer allow it, else to SDPA over the pool by torch_native's row routine.

The kernel takes float32 queries, a float32, bf16 or fp16 pool, and head_dim in
SUPPORTED_HEAD_DIMS. `CpuBackend` (the `cpu`
backend) decides in `bind`, from the pool, between `CpuKernelBackend` and an inner
TorchNativeBackend, which then runs every step exactly as `torch_native` would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sgl.runtime.attention.base import AttentionBackend, ForwardBatch
from sgl.runtime.attention.cpu_kernel import PREFILL_HEAD_DIMS, SUPPORTED_HEAD_DIMS
from sgl.runtime.attention.torch_native import (
    TorchNativeBackend,
    _ExtendRow,
    attend_extend_row,
    extend_row_context,
    pool_extend_row,
)

# Rows with more new tokens than this go to SDPA (the kernel's cost grows with queries x keys
# without the blocking a matrix multiply gets).
KERNEL_MAX_EXTEND = 64
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # of the KV pool


def kernel_supports(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the kernel runs on a (CPU) pool of this dtype and head_dim."""
    return dtype in KERNEL_DTYPES and head_dim in SUPPORTED_HEAD_DIMS


@dataclass
class _KernelMetadata:
    rows: torch.Tensor | None  # [B, 4] int64: (table row, first token, new tokens, context length)
    extends: list[_ExtendRow]  # the longer rows, each one SDPA call


class CpuKernelBackend(AttentionBackend):
    """The kernel for rows with <= KERNEL_MAX_EXTEND new tokens; the rest (prefill chunks) by
    the prefill kernel where it runs (`prefill`: AVX512-BF16, bf16, no window / soft-cap), else
    SDPA over the pool. Only for a CPU pool of a KERNEL_DTYPES dtype and a supported head_dim
    (`kernel_supports`)."""

    name = "cpu"
    features = frozenset({"sliding_window", "logit_cap"})

    def __init__(self, op: Callable, prefill: Callable | None = None) -> None:
        self._op = op
        self._prefill = prefill

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        table = batch.req_to_token.req_to_token
        rows: list[list[int]] = []
        extends: list[_ExtendRow] = []
        first = 0
        for prow, prefix, ext in zip(batch.req_rows, batch.prefix_lens, batch.extend_lens):
            if ext <= KERNEL_MAX_EXTEND:
                rows.append([prow, first, ext, prefix + ext])
            else:
                extends.append(pool_extend_row(table, prow, prefix, ext, first))
            first += ext
        batch.metadata = _KernelMetadata(
            torch.tensor(rows, dtype=torch.int64) if rows else None, extends
        )

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
        md: _KernelMetadata = batch.metadata
        if md.rows is not None:  # the kernel reads float32 queries (few: one row per new token)
            table = batch.req_to_token.req_to_token
            if sliding_window or logit_cap:
                out = self._op(
                    q.float().contiguous(),
                    k_buf,
                    v_buf,
                    table,
                    md.rows,
                    scaling,
                    sliding_window,
                    logit_cap,
                )
            else:
                out = self._op(q.float().contiguous(), k_buf, v_buf, table, md.rows, scaling)
            out = out.to(q.dtype)
        else:
            out = torch.empty_like(q)
        use_prefill = not (sliding_window or logit_cap) and self._prefill_takes(q, k_buf)
        for ext in md.extends:
            if use_prefill:
                ke, ve = extend_row_context(k, v, k_buf, v_buf, ext)
                out[ext.tok_start : ext.tok_end] = self._prefill(
                    q[ext.tok_start : ext.tok_end], ke, ve, scaling
                )
            else:
                attend_extend_row(
                    q,
                    k,
                    v,
                    k_buf,
                    v_buf,
                    ext,
                    scaling,
                    out,
                    sliding_window=sliding_window,
                    logit_cap=logit_cap,
                )
        return out

    def _prefill_takes(self, q: torch.Tensor, k_buf: torch.Tensor) -> bool:
        return (
            self._prefill is not None
            and q.dtype == torch.bfloat16
            and k_buf.dtype == torch.bfloat16
            and q.shape[-1] in PREFILL_HEAD_DIMS
        )


class CpuBackend(AttentionBackend):
    """The `cpu` backend: `CpuKernelBackend` where the pool suits the kernel, else an inner
    TorchNativeBackend; `bind` chooses, and every step goes to the chosen one."""

    def __init__(self, op: Callable, prefill: Callable | None = None) -> None:
        self._kernel = CpuKernelBackend(op, prefill)
        self._torch = TorchNativeBackend()
        self._impl: AttentionBackend = self._kernel  # until bind has seen the pool

    features = frozenset({"sliding_window", "logit_cap"})  # both of its implementations have them

    @property
    def name(self) -> str:
        return self._impl.name  # "cpu", or "torch_native" on a pool the kernel cannot take

    @property
    def uses_kernel(self) -> bool:
        return self._impl is self._kernel

    def _choose(self, dtype: torch.dtype, head_dim: int) -> AttentionBackend:
        return self._kernel if kernel_supports(dtype, head_dim) else self._torch

    def reserved_memory_bytes(
        self,
        max_total_tokens: int,
        num_kv_heads: int,
        head_dim: int,
        num_layers: int,
        dtype: torch.dtype,
    ) -> int:
        """0 where the kernel will run (it holds nothing beyond the pool); else torch_native's."""
        return self._choose(dtype, head_dim).reserved_memory_bytes(
            max_total_tokens, num_kv_heads, head_dim, num_layers, dtype
        )

    def bind(self, kv_pool, req_to_token, num_qo_heads: int) -> None:
        on_cpu = kv_pool.device.type == "cpu"
        self._impl = self._choose(kv_pool.dtype, kv_pool.head_dim) if on_cpu else self._torch
        self._impl.bind(kv_pool, req_to_token, num_qo_heads)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self._impl.init_forward_metadata(batch)

    def forward(self, q, k, v, layer_id, scaling, batch: ForwardBatch, **features) -> torch.Tensor:
        return self._impl.forward(q, k, v, layer_id, scaling, batch, **features)
