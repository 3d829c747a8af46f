"""Attention with torch's scaled_dot_product_attention over the paged KV pool (CPU and GPU).

Single-token rows (decodes, and 1-token prefills) are batched into one SDPA call per layer
over a padded [B, kv_heads, L, head_dim] copy of their contexts. That copy (the *decode
mirror*) persists across steps: while the same requests keep decoding, each step only
appends the new token's K/V to it, instead of gathering every context from the pool again
(on CPU the gather cost as much as the attention itself). Any change in the decode group
rebuilds it with one gather. The pool stays the source of truth.

Multi-token rows (prefill chunks, jump-forward extends) are few per step and compute-bound,
so they run one SDPA call each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from sgl.runtime.attention.base import AttentionBackend, ForwardBatch

# Headroom (tokens) added to the mirror's length on a rebuild, so appends rarely reallocate.
MIRROR_HEADROOM = 64
# The mirror duplicates the decoding requests' KV; above this size, gather every step instead.
MIRROR_MAX_BYTES = 1 << 30


@dataclass
class _ExtendRow:
    tok_start: int
    tok_end: int
    slots: torch.Tensor | None  # context slots (None: no prefix, use the fresh k/v)
    mask: torch.Tensor | None  # [E, S] bool causal mask with prefix offset; None: plain causal


@dataclass
class _DecodeMirror:
    rows: tuple[int, ...]
    lens: list[int]  # context length per row after the current step's token
    capacity: int
    k: list[torch.Tensor | None] = field(default_factory=list)  # per layer [B, kvh, capacity, D]
    v: list[torch.Tensor | None] = field(default_factory=list)


@dataclass
class _Metadata:
    decode_tok_idx: torch.Tensor | None  # flat token index of each single-token row; None: all rows
    decode_slots: torch.Tensor | None  # [B, Lmax] slot ids, padded with slot 0 (rebuild/gather only)
    decode_mask: torch.Tensor | None  # [B, 1, 1, Lmax] bool
    decode_max_len: int
    decode_append_pos: torch.Tensor | None  # [B] position of the new token (mirror append mode)
    use_mirror: bool
    extends: list[_ExtendRow]


class TorchNativeBackend(AttentionBackend):
    def __init__(self) -> None:
        self._mirror: _DecodeMirror | None = None

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

        md = _Metadata(None, None, None, 0, None, False, extends)
        if decode_rows:
            max_len = max(decode_lens)
            lens = torch.tensor(decode_lens, device=device)
            valid = torch.arange(max_len, device=device).unsqueeze(0) < lens.unsqueeze(1)
            md.decode_mask = valid[:, None, None, :]
            md.decode_max_len = max_len
            if len(decode_rows) != start:
                md.decode_tok_idx = torch.tensor(decode_toks, device=device)
            m = self._mirror
            rows = tuple(decode_rows)
            if (
                m is not None
                and m.rows == rows
                and max_len <= m.capacity
                and all(n == p + 1 for n, p in zip(decode_lens, m.lens))
            ):
                md.use_mirror = True
                md.decode_append_pos = lens - 1
                m.lens = decode_lens
            else:
                md.decode_slots = table[torch.tensor(decode_rows, device=device), :max_len].masked_fill(~valid, 0)
                pool = batch.kv_pool
                capacity = max_len + MIRROR_HEADROOM
                size = 2 * len(rows) * capacity * pool.bytes_per_token
                if size <= MIRROR_MAX_BYTES:
                    n_layers = pool.num_layers
                    self._mirror = _DecodeMirror(rows, decode_lens, capacity, [None] * n_layers, [None] * n_layers)
                    md.use_mirror = True
                else:
                    self._mirror = None
        else:
            self._mirror = None
        batch.metadata = md

    def forward(self, q, k, v, layer_id, scaling, batch: ForwardBatch) -> torch.Tensor:
        pool = batch.kv_pool
        pool.set_kv(layer_id, batch.out_cache_loc, k, v)
        k_buf, v_buf = pool.k_buffers[layer_id], pool.v_buffers[layer_id]
        md: _Metadata = batch.metadata
        out = torch.empty_like(q)

        if md.decode_mask is not None:
            qd = q if md.decode_tok_idx is None else q[md.decode_tok_idx]
            kd, vd = self._decode_context(k, v, k_buf, v_buf, layer_id, md)
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

    def _decode_context(self, k, v, k_buf, v_buf, layer_id: int, md: _Metadata) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V [B, kv_heads, Lmax, D] of the single-token rows, from the mirror or a gather."""
        L = md.decode_max_len
        if md.decode_slots is not None:  # gather from the pool (and seed the mirror)
            flat = md.decode_slots.view(-1)
            shape = (*md.decode_slots.shape, *k_buf.shape[1:])
            kd = k_buf.index_select(0, flat).view(shape).transpose(1, 2)
            vd = v_buf.index_select(0, flat).view(shape).transpose(1, 2)
            if md.use_mirror:
                m = self._mirror
                B, H, _, D = kd.shape
                # zeros, not empty: masked positions are read, and must not hold NaN
                m.k[layer_id] = torch.zeros((B, H, m.capacity, D), dtype=kd.dtype, device=kd.device)
                m.v[layer_id] = torch.zeros((B, H, m.capacity, D), dtype=vd.dtype, device=vd.device)
                m.k[layer_id][:, :, :L] = kd
                m.v[layer_id][:, :, :L] = vd
            return kd, vd
        m = self._mirror
        mk, mv = m.k[layer_id], m.v[layer_id]
        new_k = k if md.decode_tok_idx is None else k[md.decode_tok_idx]
        new_v = v if md.decode_tok_idx is None else v[md.decode_tok_idx]
        b = torch.arange(mk.shape[0], device=mk.device)
        mk[b, :, md.decode_append_pos] = new_k.to(mk.dtype)
        mv[b, :, md.decode_append_pos] = new_v.to(mv.dtype)
        return mk[:, :, :L], mv[:, :, :L]
