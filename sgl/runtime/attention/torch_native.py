"""Attention with torch's scaled_dot_product_attention over the paged KV pool (CPU and GPU).

Gathering a request's context out of the pool costs, on CPU, as much as attending over it.
So the backend keeps a *mirror*: a dense copy [rows, len, kv_heads, D] per layer of the
contexts of the requests that run with few new tokens per step (decodes, jump-forward
extends, short prompts). Each step writes only the new tokens' K/V into it (and fills from
the pool whatever a row's copy lacks, e.g. after a long extend), instead of gathering every
context again. A request keeps its mirror row while it runs; a finished one leaves a hole
that a new request reuses, and the mirror is compacted when holes outnumber rows in use.
The pool stays the source of truth: the mirror can be dropped at any step.

Per layer: one SDPA call for all single-token rows (one query each, over the mirror's rows),
and one call per multi-token row: short ones read their context as a view of the mirror,
long ones (prefill chunks) from the pool. Padding every row to the longest query instead
would multiply the decode rows' attention cost by that length.

The mirror is memory outside the KV pool, so `reserved_memory_bytes` reports its bound
(`mirror_bound_bytes`: about MIRROR_MAX_BYTES / 2) for the engine's memory plan.
It stays because dropping it measured slower: on CPU, float32, embedded-model shape
(30 layers, 3 KV / 9 query heads, head_dim 64), decode steps of 16-32 rows over 200-400
tokens ran their attention 5-22% slower gathering from the pool (in bfloat16 it made no
difference).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from sgl.runtime.attention.base import AttentionBackend, ForwardBatch
from sgl.runtime.memory import TokenToKVPool

# Rows with at most this many new tokens are mirrored; longer ones read the pool.
MIRRORED_EXTEND_MAX = 64
# Multi-token mirrored rows either join the single-token rows' SDPA call, padded to the
# longest query (costs ~ rows x extra query positions x context length), or run one call
# each (a fixed cost per call). On CPU one call costs about as much as this many padded
# query-key pairs; the cheaper plan is taken each step. Rows longer than PAD_QUERY_MAX
# always run alone.
CALL_COST_PAIRS = 2500
PAD_QUERY_MAX = 16
# Headroom (tokens) added to the mirror's length on a resize, so appends rarely reallocate.
MIRROR_HEADROOM = 64
# The mirror duplicates its rows' KV; above this size, gather from the pool every step instead.
# The check counts twice the mirror's size, so a resize (a layer's old and new copies alive at
# once) stays under it too.
MIRROR_MAX_BYTES = 1 << 30


@dataclass
class _ExtendRow:
    """A multi-token row: its queries attend over `seq_len` keys with a causal offset."""

    tok_start: int
    tok_end: int
    seq_len: int
    device: torch.device
    mirror_row: int | None = None  # context from the mirror; None: from the pool
    slots: torch.Tensor | None = None  # pool slots of the context (None with no prefix: fresh k/v)
    windowed: dict[int, torch.Tensor] = field(
        default_factory=dict
    )  # window -> mask, made once a step

    @functools.cached_property
    def mask(self) -> torch.Tensor | None:
        """[E, S] bool causal mask with the prefix offset (None: plain causal), made on first use:
        rows taken by a kernel never need it (a 2,048-token chunk's costs ~2 ms to build)."""
        return _causal_mask(
            self.seq_len - (self.tok_end - self.tok_start), self.seq_len, self.device
        )

    def mask_for(self, window: int, device) -> torch.Tensor | None:
        """The causal mask, narrowed to the last `window` keys of each query where window > 0."""
        if not window:
            return self.mask
        if window not in self.windowed:
            q_pos = torch.arange(
                self.seq_len - (self.tok_end - self.tok_start), self.seq_len, device=device
            )
            self.windowed[window] = window_mask(self.mask, q_pos.unsqueeze(1), self.seq_len, window)
        return self.windowed[window]


@dataclass
class _Batched:
    """Rows attended in one SDPA call: queries [rows, heads, q_len, D], padded."""

    num_rows: int
    q_len: int
    ctx_len: int
    mask: torch.Tensor  # [rows, 1, q_len, ctx_len] bool; padding queries see only key 0
    tok: torch.Tensor  # [N] flat token index of each batched token
    slot: torch.Tensor  # [N] its place row * q_len + query index in the padded queries
    identity: bool  # the batch is single-token rows 0..N-1, in token order
    q_pos: torch.Tensor  # [rows, 1, q_len, 1] each query's position (the mask's causal limit)
    gather_slots: torch.Tensor | None = None  # [rows, ctx_len] pool slots when there is no mirror
    windowed: dict[int, torch.Tensor] = field(
        default_factory=dict
    )  # window -> mask, made once a step

    def mask_for(self, window: int) -> torch.Tensor:
        if not window:
            return self.mask
        if window not in self.windowed:
            self.windowed[window] = window_mask(self.mask, self.q_pos, self.ctx_len, window)
        return self.windowed[window]


@dataclass
class _MirrorWrite:
    """Where this step's K/V goes in the mirror (flat row * len_capacity + position)."""

    tok: torch.Tensor  # flat token indices of the mirrored rows' new tokens
    dest: torch.Tensor
    fill_dest: torch.Tensor | None  # context positions the mirror lacks ...
    fill_slots: torch.Tensor | None  # ... and the pool slots they are copied from
    resize_from: tuple[int, int] | None  # the mirror grew: old (rows, len) capacity to copy


@dataclass
class _Mirror:
    index: dict[tuple[int, int], int] = field(
        default_factory=dict
    )  # (pool row, epoch) -> mirror row
    lens: list[int] = field(default_factory=list)  # valid context length per mirror row
    free: list[int] = field(default_factory=list)  # holes left by rows that stopped running
    row_capacity: int = 0
    len_capacity: int = 0
    k: list[torch.Tensor | None] = field(default_factory=list)  # per layer [rows, len, kv_heads, D]
    v: list[torch.Tensor | None] = field(default_factory=list)


@dataclass
class _Metadata:
    batched: _Batched | None
    extends: list[_ExtendRow]
    write: _MirrorWrite | None


def _causal_mask(prefix: int, seq: int, device) -> torch.Tensor | None:
    if prefix == 0:
        return None
    q_pos = torch.arange(prefix, seq, device=device).unsqueeze(1)
    return torch.arange(seq, device=device).unsqueeze(0) <= q_pos


def window_mask(
    causal: torch.Tensor | None, q_pos: torch.Tensor, ctx_len: int, window: int
) -> torch.Tensor:
    """`causal` (None: plain causal over q_pos) and only keys inside each query's window: key
    position > query position - window, so a query sees `window` keys, itself included (HF's
    sliding-window rule)."""
    keys = torch.arange(ctx_len, device=q_pos.device)
    recent = keys > q_pos - window
    return (keys <= q_pos) & recent if causal is None else causal & recent


def attend(
    q, k, v, mask: torch.Tensor | None, scale: float, logit_cap: float = 0.0
) -> torch.Tensor:
    """softmax(q k^T * scale [soft-capped] + mask) v over [..., heads, len, D] (GQA: k/v heads
    divide q's). mask None: causal. SDPA where there is no cap (it has none); else in float32."""
    if not logit_cap:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
        )
    group = q.shape[-3] // k.shape[-3]
    k32, v32 = k.float().repeat_interleave(group, -3), v.float().repeat_interleave(group, -3)
    scores = torch.matmul(q.float(), k32.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / logit_cap) * logit_cap
    if mask is None:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return torch.matmul(probs, v32).to(q.dtype)


def attend_after_prefix(q, k, v, prefix: int, scale: float) -> torch.Tensor:
    """Causal attention of E new queries [1, h, E, D] over `prefix` cached keys then their own
    E, on CPU: two flash calls, the prefix block unmasked and the new block causal (square, so
    torch's top-left alignment is right), merged by their log-sum-exps. With the offset mask
    instead, torch's CPU flash kernel turns the mask into floats and computes every (query, key)
    pair, the half it masks out included: on a 2,048-token chunk after a 27-token cached prefix
    (embedded model) 76 ms a layer against 46 ms this way."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out_prefix, lse_prefix = flash(q, k[..., :prefix, :], v[..., :prefix, :], scale=scale)
    out_new, lse_new = flash(q, k[..., prefix:, :], v[..., prefix:, :], is_causal=True, scale=scale)
    # softmax over both blocks = each block's softmax weighted by its share of the total mass
    share_prefix = torch.sigmoid(lse_prefix - lse_new).unsqueeze(-1)
    return torch.lerp(out_new.float(), out_prefix.float(), share_prefix).to(q.dtype)


def pool_extend_row(
    table: torch.Tensor, prow: int, prefix: int, ext: int, first: int
) -> _ExtendRow:
    """A multi-token row whose context is read from the pool (or, with no prefix, is its own
    k/v)."""
    seq = prefix + ext
    return _ExtendRow(
        first, first + ext, seq, table.device, slots=table[prow, :seq] if prefix > 0 else None
    )


def extend_row_context(k, v, k_buf, v_buf, ext: _ExtendRow) -> tuple[torch.Tensor, torch.Tensor]:
    """A pool-read row's keys and values [S, kv_heads, D]: its own fresh k/v without a prefix,
    else gathered from the pool by slot (the new tokens' K/V are already written there)."""
    if ext.slots is None:
        return k[ext.tok_start : ext.tok_end], v[ext.tok_start : ext.tok_end]
    return k_buf.index_select(0, ext.slots), v_buf.index_select(0, ext.slots)


def attend_extend_row(
    q,
    k,
    v,
    k_buf,
    v_buf,
    ext: _ExtendRow,
    scaling: float,
    out: torch.Tensor,
    ke: torch.Tensor | None = None,
    ve: torch.Tensor | None = None,
    sliding_window: int = 0,
    logit_cap: float = 0.0,
) -> None:
    """One attention call for a multi-token row, written into out[tok_start:tok_end]. Its
    context is (ke, ve) when given, else the fresh k/v (no prefix) or the pool at ext.slots."""
    qe = q[ext.tok_start : ext.tok_end].transpose(0, 1).unsqueeze(0)  # [1, h, E, D]
    if ke is None:
        ke, ve = extend_row_context(k, v, k_buf, v_buf, ext)
    ke = ke.transpose(0, 1).unsqueeze(0)
    ve = ve.transpose(0, 1).unsqueeze(0)
    if ext.slots is not None and q.device.type == "cpu" and not (sliding_window or logit_cap):
        oe = attend_after_prefix(qe, ke, ve, ext.seq_len - (ext.tok_end - ext.tok_start), scaling)
    else:
        oe = attend(qe, ke, ve, ext.mask_for(sliding_window, q.device), scaling, logit_cap)
    out[ext.tok_start : ext.tok_end] = oe.squeeze(0).transpose(0, 1)


def mirror_bound_bytes(max_total_tokens: int, bytes_per_token: int, num_layers: int) -> int:
    """The most the mirror can hold for a pool of `max_total_tokens` slots (`bytes_per_token`:
    K and V of every layer), counting the old copy of one layer kept while it is resized.

    The size check admits a mirror of at most MIRROR_MAX_BYTES / 2. And every mirrored request
    writes a new slot each step, so there are at most `max_total_tokens` rows (rounded up to
    8), none longer than the pool plus the headroom: the tighter bound for a tiny pool.
    """
    rows = -(-max_total_tokens // 8) * 8
    size = min(rows * (max_total_tokens + MIRROR_HEADROOM) * bytes_per_token, MIRROR_MAX_BYTES // 2)
    return size + -(-size // num_layers)


class TorchNativeBackend(AttentionBackend):
    name = "torch_native"
    features = frozenset({"sliding_window", "logit_cap"})

    def __init__(self, use_mirror: bool = True) -> None:
        self.use_mirror = use_mirror
        self._mirror: _Mirror | None = None

    @property
    def mirror(self) -> _Mirror | None:
        """The dense K/V mirror held now, or None (test hook: its size is what
        `reserved_memory_bytes` bounds)."""
        return self._mirror

    def reserved_memory_bytes(
        self,
        max_total_tokens: int,
        num_kv_heads: int,
        head_dim: int,
        num_layers: int,
        dtype: torch.dtype,
    ) -> int:
        """The mirror's bound (see `mirror_bound_bytes`); 0 without a mirror."""
        if not self.use_mirror:
            return 0
        bytes_per_token = TokenToKVPool.bytes_per_token_for(
            num_layers, num_kv_heads, head_dim, dtype
        )
        return mirror_bound_bytes(max_total_tokens, bytes_per_token, num_layers)

    # ------------------------------------------------------------------ planning

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        device = batch.input_ids.device
        table = batch.req_to_token.req_to_token
        # (pool row, epoch, prefix, ext, first token index) per request
        rows = []
        start = 0
        for i, (row, prefix, ext) in enumerate(
            zip(batch.req_rows, batch.prefix_lens, batch.extend_lens)
        ):
            rows.append(
                (
                    row,
                    batch.row_epochs[i] if batch.row_epochs is not None else -1,
                    prefix,
                    ext,
                    start,
                )
            )
            start += ext
        mirrored = [r for r in rows if r[3] <= MIRRORED_EXTEND_MAX]
        placed = None
        if mirrored and self.use_mirror and batch.row_epochs is not None:
            placed = self._place_in_mirror(mirrored, batch)
        if placed is None:
            self._mirror = None
            batch.metadata = self._plan_from_pool(rows, start, table, device)
        else:
            batch.metadata = self._plan_with_mirror(rows, *placed, start, table, device)

    def _plan_from_pool(
        self, rows: list, num_tokens: int, table: torch.Tensor, device
    ) -> _Metadata:
        decodes = [r for r in rows if r[3] == 1]
        extends = [
            pool_extend_row(table, prow, prefix, ext, first)
            for prow, _, prefix, ext, first in rows
            if ext > 1
        ]
        decode = None
        if decodes:
            lens = torch.tensor([prefix + 1 for _, _, prefix, _, _ in decodes], device=device)
            ctx_len = int(lens.max())
            valid = torch.arange(ctx_len, device=device).unsqueeze(0) < lens.unsqueeze(1)
            prows = torch.tensor([r[0] for r in decodes], device=device)
            decode = _Batched(
                num_rows=len(decodes),
                q_len=1,
                ctx_len=ctx_len,
                mask=valid[:, None, None, :],
                tok=torch.tensor([r[4] for r in decodes], device=device),
                slot=torch.arange(len(decodes), device=device),
                identity=len(decodes) == num_tokens,
                q_pos=(lens - 1).view(-1, 1, 1, 1),
                gather_slots=table[prows, :ctx_len].masked_fill(~valid, 0),
            )
        return _Metadata(decode, extends, None)

    def _place_in_mirror(
        self, mirrored: list, batch: ForwardBatch
    ) -> tuple[list[int], tuple | None] | None:
        """Give each mirrored request its mirror row, keeping old ones and reusing holes.

        Returns (mirror row per request, the old (rows, len) capacity if the mirror grew), or
        None when the mirror would exceed MIRROR_MAX_BYTES.
        """
        m = self._mirror
        keys = [(prow, epoch) for prow, epoch, *_ in mirrored]
        if m is not None:
            live = set(keys)
            for key in [k for k in m.index if k not in live]:  # stopped running: leave a hole
                idx = m.index.pop(key)
                m.lens[idx] = 0
                m.free.append(idx)
            if len(m.lens) > 8 and 2 * len(m.free) > len(m.lens):
                m = None  # mostly holes: start a compact mirror (rows refilled from the pool)
        if m is None:
            m = _Mirror()
        placement = []
        for key in keys:
            idx = m.index.get(key)
            if idx is None:
                if m.free:
                    idx = min(m.free)
                    m.free.remove(idx)
                else:
                    idx = len(m.lens)
                    m.lens.append(0)
                m.index[key] = idx
                m.lens[idx] = 0
            placement.append(idx)
        need_rows = len(m.lens)
        need_len = max(prefix + ext for _, _, prefix, ext, _ in mirrored)
        resize_from = None
        if need_rows > m.row_capacity or need_len > m.len_capacity:
            row_cap = m.row_capacity if need_rows <= m.row_capacity else -(-need_rows // 8) * 8
            len_cap = m.len_capacity if need_len <= m.len_capacity else need_len + MIRROR_HEADROOM
            if 2 * row_cap * len_cap * batch.kv_pool.bytes_per_token > MIRROR_MAX_BYTES:
                return None
            resize_from = (m.row_capacity, m.len_capacity)
            m.row_capacity, m.len_capacity = row_cap, len_cap
            if not m.k:
                m.k = [None] * batch.kv_pool.num_layers
                m.v = [None] * batch.kv_pool.num_layers
        self._mirror = m
        return placement, resize_from

    def _plan_with_mirror(
        self,
        rows: list,
        placement: list[int],
        resize_from,
        num_tokens: int,
        table: torch.Tensor,
        device,
    ) -> _Metadata:
        m = self._mirror
        cap = m.len_capacity
        extends: list[_ExtendRow] = []
        multi: list[
            tuple[int, int, int, int]
        ] = []  # mirrored multi-token rows: (mirror row, prefix, ext, first)
        single: list[tuple[int, int, int, int]] = []
        write_tok, write_dest, fill_dest, fill_slots = [], [], [], []
        placed = iter(placement)
        for prow, _, prefix, ext, first in rows:
            seq = prefix + ext
            if ext > MIRRORED_EXTEND_MAX:
                extends.append(pool_extend_row(table, prow, prefix, ext, first))
                continue
            r = next(placed)
            have = m.lens[r]
            if have < prefix:  # the mirror lacks part of this row's context: copy it in
                fill_dest.append(torch.arange(r * cap + have, r * cap + prefix))
                fill_slots.append(table[prow, have:prefix])
            write_tok.extend(range(first, first + ext))
            write_dest.extend(range(r * cap + prefix, r * cap + seq))
            m.lens[r] = seq
            (single if ext == 1 else multi).append((r, prefix, ext, first))

        # Pad the multi-token rows into the batched call, or give each its own call?
        paddable = [x for x in multi if x[2] <= PAD_QUERY_MAX]
        if paddable:
            num_rows = max(x[0] for x in single + paddable) + 1
            q_len = max(x[2] for x in paddable)
            ctx_len = max(x[1] + x[2] for x in single + paddable)
            if num_rows * (q_len - 1) * ctx_len >= CALL_COST_PAIRS * len(paddable):
                paddable = []
        for r, prefix, ext, first in multi:
            if ext > PAD_QUERY_MAX or not paddable:
                extends.append(_ExtendRow(first, first + ext, prefix + ext, device, mirror_row=r))
        batched_rows = single + paddable
        batched = self._plan_padded(batched_rows, num_tokens, device) if batched_rows else None
        write = _MirrorWrite(
            tok=torch.tensor(write_tok, device=device),
            dest=torch.tensor(write_dest, device=device),
            fill_dest=torch.cat(fill_dest).to(device) if fill_dest else None,
            fill_slots=torch.cat(fill_slots).to(device) if fill_slots else None,
            resize_from=resize_from,
        )
        return _Metadata(batched, extends, write)

    @staticmethod
    def _plan_padded(rows: list[tuple[int, int, int, int]], num_tokens: int, device) -> _Batched:
        """One SDPA call over mirror rows 0..max: each (mirror row, prefix, ext, first) row's
        queries padded to the longest; rows not in this call see only key 0."""
        num_rows = max(r for r, *_ in rows) + 1
        q_len = max(ext for _, _, ext, _ in rows)
        ctx_len = max(prefix + ext for _, prefix, ext, _ in rows)
        limit = [[0] * q_len for _ in range(num_rows)]
        tok, slot = [], []
        for r, prefix, ext, first in rows:
            tok.extend(range(first, first + ext))
            slot.extend(range(r * q_len, r * q_len + ext))
            limit[r] = [prefix + min(i, ext - 1) for i in range(q_len)]
        limit_t = torch.tensor(limit, device=device).view(num_rows, 1, q_len, 1)
        mask = torch.arange(ctx_len, device=device).view(1, 1, 1, -1) <= limit_t
        identity = q_len == 1 and num_rows == len(rows) == num_tokens and tok == slot
        return _Batched(
            num_rows,
            q_len,
            ctx_len,
            mask,
            torch.tensor(tok, device=device),
            torch.tensor(slot, device=device),
            identity,
            q_pos=limit_t,
        )

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
        md: _Metadata = batch.metadata
        mk = mv = None
        if md.write is not None:
            mk, mv = self._update_mirror(k, v, k_buf, v_buf, layer_id, md.write)
        out = torch.empty_like(q)

        b = md.batched
        if b is not None:
            if mk is not None:  # [rows, kv_heads, L, D] views of the mirror
                kb = mk[: b.num_rows, : b.ctx_len].transpose(1, 2)
                vb = mv[: b.num_rows, : b.ctx_len].transpose(1, 2)
            else:
                flat = b.gather_slots.view(-1)
                shape = (*b.gather_slots.shape, *k_buf.shape[1:])
                kb = k_buf.index_select(0, flat).view(shape).transpose(1, 2)
                vb = v_buf.index_select(0, flat).view(shape).transpose(1, 2)
            if b.identity:
                qb = q.unsqueeze(2)
            else:
                qb = q.new_zeros((b.num_rows * b.q_len, *q.shape[1:]))
                qb.index_copy_(0, b.slot, q.index_select(0, b.tok))
                qb = qb.view(b.num_rows, b.q_len, *q.shape[1:]).transpose(1, 2)
            ob = attend(qb, kb, vb, b.mask_for(sliding_window), scaling, logit_cap)
            if b.identity:
                out = ob.squeeze(2)
            else:
                ob = ob.transpose(1, 2).reshape(b.num_rows * b.q_len, *q.shape[1:])
                out.index_copy_(0, b.tok, ob.index_select(0, b.slot))

        for ext in md.extends:
            ke = ve = None
            if ext.mirror_row is not None:
                ke, ve = mk[ext.mirror_row, : ext.seq_len], mv[ext.mirror_row, : ext.seq_len]
            attend_extend_row(
                q, k, v, k_buf, v_buf, ext, scaling, out, ke, ve, sliding_window, logit_cap
            )
        return out

    def _update_mirror(
        self, k, v, k_buf, v_buf, layer_id: int, w: _MirrorWrite
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Bring this layer's mirror up to date (resize, fill, new tokens); returns (k, v)."""
        m = self._mirror
        out = []
        for store, new, buf in ((m.k, k, k_buf), (m.v, v, v_buf)):
            t = store[layer_id]
            if t is None or w.resize_from is not None:
                # zeros, not empty: padded positions are read (and masked), and must not hold NaN
                grown = torch.zeros(
                    (m.row_capacity, m.len_capacity, *buf.shape[1:]),
                    dtype=buf.dtype,
                    device=buf.device,
                )
                if t is not None:
                    rows, length = w.resize_from
                    grown[:rows, :length] = t[:rows, :length]
                t = store[layer_id] = grown
            flat = t.view(-1, *buf.shape[1:])
            if w.fill_dest is not None:
                flat.index_copy_(0, w.fill_dest, buf.index_select(0, w.fill_slots))
            flat.index_copy_(0, w.dest, new.index_select(0, w.tok).to(t.dtype))
            out.append(t)
        return out[0], out[1]
