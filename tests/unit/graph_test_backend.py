"""A reference attention backend with CUDA-graph hooks, for testing the graph runner.

`TorchNativeBackend` for eager steps; for graph decode steps, each row attends over a
fixed-width gather of its table row, masked by its length: static shapes and tensors only,
so it captures into a CUDA graph. Far too slow for serving (it reads the whole table width
every step); it exists so the runner is tested without flashinfer or triton.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sgl.runtime.attention.base import ForwardBatch
from sgl.runtime.attention.torch_native import TorchNativeBackend
from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool


@dataclass
class GraphDecodeMetadata:
    req_rows: torch.Tensor  # views of the runner's static buffers
    seq_lens: torch.Tensor


class DenseDecodeBackend(TorchNativeBackend):
    def __init__(self) -> None:
        super().__init__(use_mirror=False)
        self.calls: list[tuple[str, int]] = []

    def bind(self, kv_pool: TokenToKVPool, req_to_token: ReqToTokenPool, num_qo_heads: int) -> None:
        self.table = req_to_token

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        self.calls.append(("state", max_bs))
        self.cols = torch.arange(max_context_len, device=self.table.req_to_token.device)

    def init_forward_metadata_capture(
        self, bs: int, req_rows: torch.Tensor, seq_lens: torch.Tensor
    ) -> GraphDecodeMetadata:
        self.calls.append(("capture", bs))
        return GraphDecodeMetadata(req_rows, seq_lens)

    def init_forward_metadata_replay(
        self, bs: int, req_rows: torch.Tensor, seq_lens: torch.Tensor
    ) -> None:
        self.calls.append(("replay", bs))

    def forward(self, q, k, v, layer_id: int, scaling: float, batch: ForwardBatch) -> torch.Tensor:
        md = batch.metadata
        if not isinstance(md, GraphDecodeMetadata):
            return super().forward(q, k, v, layer_id, scaling, batch)
        pool = batch.kv_pool
        pool.set_kv(layer_id, batch.out_cache_loc, k, v)
        slots = self.table.req_to_token[md.req_rows]  # [bs, width]
        mask = self.cols.unsqueeze(0) < md.seq_lens.unsqueeze(1)
        kb = pool.k_buffers[layer_id][slots].transpose(1, 2)  # [bs, kv_heads, width, D]
        vb = pool.v_buffers[layer_id][slots].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), kb, vb, attn_mask=mask[:, None, None, :], scale=scaling, enable_gqa=True
        )
        return out.squeeze(2)
