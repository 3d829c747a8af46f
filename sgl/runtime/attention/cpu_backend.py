"""CPU attention with our C++ kernel (csrc/paged_attention_cpu.cpp): per layer, one call for
every row with up to KERNEL_MAX_EXTEND new tokens (decodes, jump-forward extends, short
prompts), each reading its context from the KV pool by slot.

Against TorchNativeBackend (torch SDPA over a dense mirror of the contexts), a step costs
what its real (query, key) pairs cost: a batch mixing single-token rows with a few
multi-token rows no longer pads every row to the longest query, a batch of short prompts
no longer makes one SDPA call per row, and there is no mirror to keep up to date. Longer
rows (prefill chunks) still go to SDPA, whose matrix-multiply kernels suit them better.

The kernel takes float32 and head_dim in SUPPORTED_HEAD_DIMS; for anything else this
backend behaves exactly like TorchNativeBackend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from sgl.runtime.attention.base import ForwardBatch
from sgl.runtime.attention.cpu_kernel import SUPPORTED_HEAD_DIMS
from sgl.runtime.attention.torch_native import TorchNativeBackend, _ExtendRow, attend_extend_row, pool_extend_row

# Rows with more new tokens than this go to SDPA (the kernel's cost grows with queries x keys
# without the blocking a matrix multiply gets).
KERNEL_MAX_EXTEND = 64


@dataclass
class _KernelMetadata:
    rows: torch.Tensor | None  # [B, 4] int64: (table row, first token, new tokens, context length)
    extends: list[_ExtendRow]  # the longer rows, each one SDPA call


class CpuBackend(TorchNativeBackend):
    def __init__(self, op: Callable) -> None:
        super().__init__()
        self._op = op
        self._use_kernel = False

    def bind(self, kv_pool, req_to_token, num_qo_heads: int) -> None:
        super().bind(kv_pool, req_to_token, num_qo_heads)
        self._use_kernel = (
            kv_pool.device.type == "cpu" and kv_pool.dtype == torch.float32 and kv_pool.head_dim in SUPPORTED_HEAD_DIMS
        )

    @property
    def uses_kernel(self) -> bool:
        return self._use_kernel

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if not self._use_kernel:
            return super().init_forward_metadata(batch)
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
        batch.metadata = _KernelMetadata(torch.tensor(rows, dtype=torch.int64) if rows else None, extends)

    def forward(self, q, k, v, layer_id, scaling, batch: ForwardBatch) -> torch.Tensor:
        if not self._use_kernel:
            return super().forward(q, k, v, layer_id, scaling, batch)
        pool = batch.kv_pool
        pool.set_kv(layer_id, batch.out_cache_loc, k, v)
        k_buf, v_buf = pool.k_buffers[layer_id], pool.v_buffers[layer_id]
        md: _KernelMetadata = batch.metadata
        q = q.contiguous()
        if md.rows is not None:
            out = self._op(q, k_buf, v_buf, batch.req_to_token.req_to_token, md.rows, scaling)
        else:
            out = torch.empty_like(q)
        for ext in md.extends:
            attend_extend_row(q, k, v, k_buf, v_buf, ext, scaling, out)
        return out
