"""Attention with torch's scaled_dot_product_attention over the paged KV pool (CPU and GPU).

Single-token rows (decodes, and 1-token prefills) are batched: their contexts are gathered
through one padded slot-index matrix built once per step, so a decode step costs one
gather and one SDPA call per layer regardless of the number of requests. Multi-token rows
(prefill chunks) are few per step and compute-bound, so they run one SDPA call each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sgl.runtime.attention.base import AttentionBackend, ForwardBatch


@dataclass
class _ExtendRow:
    tok_start: int
    tok_end: int
    slots: torch.Tensor | None  # context slots (None: no prefix, use the fresh k/v)
    mask: torch.Tensor | None  # [E, S] bool causal mask with prefix offset; None: plain causal


@dataclass
class _Metadata:
    decode_tok_idx: torch.Tensor | None  # flat token index of each single-token row; None: all rows
    decode_slots: torch.Tensor | None  # [B, Lmax] slot ids, padded with slot 0
    decode_mask: torch.Tensor | None  # [B, 1, 1, Lmax] bool
    extends: list[_ExtendRow]


class TorchNativeBackend(AttentionBackend):
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        device = batch.input_ids.device
        table = batch.req_to_token.req_to_token
        decode_rows: list[int] = []
        decode_toks: list[int] = []
        decode_lens: list[int] = []
        extends: list[_ExtendRow] = []
        start = 0
        for row, prefix, ext in zip(batch.req_rows, batch.prefix_lens, batch.extend_lens):
            seq = prefix + ext
            if ext == 1:
                decode_rows.append(row)
                decode_toks.append(start)
                decode_lens.append(seq)
            else:
                slots = table[row, :seq] if prefix > 0 else None
                mask = None
                if prefix > 0:
                    q_pos = torch.arange(prefix, seq, device=device).unsqueeze(1)
                    mask = torch.arange(seq, device=device).unsqueeze(0) <= q_pos
                extends.append(_ExtendRow(start, start + ext, slots, mask))
            start += ext

        decode_slots = decode_mask = decode_tok_idx = None
        if decode_rows:
            max_len = max(decode_lens)
            lens = torch.tensor(decode_lens, device=device)
            decode_mask = torch.arange(max_len, device=device).unsqueeze(0) < lens.unsqueeze(1)
            rows = torch.tensor(decode_rows, device=device)
            decode_slots = table[rows, :max_len].masked_fill(~decode_mask, 0)
            decode_mask = decode_mask[:, None, None, :]
            if len(decode_rows) != start:
                decode_tok_idx = torch.tensor(decode_toks, device=device)
        batch.metadata = _Metadata(decode_tok_idx, decode_slots, decode_mask, extends)

    def forward(self, q, k, v, layer_id, scaling, batch: ForwardBatch) -> torch.Tensor:
        pool = batch.kv_pool
        pool.set_kv(layer_id, batch.out_cache_loc, k, v)
        k_buf, v_buf = pool.k_buffers[layer_id], pool.v_buffers[layer_id]
        md: _Metadata = batch.metadata
        out = torch.empty_like(q)

        if md.decode_slots is not None:
            qd = q if md.decode_tok_idx is None else q[md.decode_tok_idx]
            flat = md.decode_slots.view(-1)
            shape = (*md.decode_slots.shape, *k_buf.shape[1:])
            kd = k_buf.index_select(0, flat).view(shape).transpose(1, 2)  # [B, kvh, L, D]
            vd = v_buf.index_select(0, flat).view(shape).transpose(1, 2)
            od = F.scaled_dot_product_attention(
                qd.unsqueeze(2), kd, vd, attn_mask=md.decode_mask, scale=scaling, enable_gqa=True
            ).squeeze(2)
            if md.decode_tok_idx is None:
                out = od
            else:
                out[md.decode_tok_idx] = od

        for ext in md.extends:
            qe = q[ext.tok_start : ext.tok_end].transpose(0, 1).unsqueeze(0)  # [1, h, E, D]
            if ext.slots is None:
                ke, ve = k[ext.tok_start : ext.tok_end], v[ext.tok_start : ext.tok_end]
            else:
                ke, ve = k_buf.index_select(0, ext.slots), v_buf.index_select(0, ext.slots)
            ke = ke.transpose(0, 1).unsqueeze(0)
            ve = ve.transpose(0, 1).unsqueeze(0)
            oe = F.scaled_dot_product_attention(
                qe, ke, ve, attn_mask=ext.mask, is_causal=ext.mask is None, scale=scaling, enable_gqa=True
            )
            out[ext.tok_start : ext.tok_end] = oe.squeeze(0).transpose(0, 1)
        return out
