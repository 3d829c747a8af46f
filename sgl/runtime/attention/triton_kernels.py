"""Triton kernels for attention over the token-slot KV pool (page size 1), and their launchers.

The pool holds K and V per layer as [slots, kv_heads, head_dim]; a request's context is the
row `req_to_token[req_row, :seq_len]` of slot ids. The kernels gather keys by slot, so a
request's context never has to be contiguous.

- Decode (one query per request) is split along the context (flash-decoding): program
  (request, kv head, split) attends the split's share of the context for every query head of
  that kv head's group, and writes a partial output normalised by its own softmax sum plus
  its log-sum-exp. A second kernel combines the splits. The number of splits is a fixed
  constexpr, and every per-request quantity (row, length) is read from tensors, so a launch
  depends only on batch size and head count: what a CUDA graph needs to be replayed on a
  new batch of the same size.
- Extend (new tokens on top of a cached prefix; prefill is prefix 0) tiles each request's
  new queries BLOCK_M at a time. A tile first attends the prefix, read from the pool by
  slot, then the new tokens' keys, read from the step's k/v tensors, with the causal mask;
  online softmax keeps one pass.

Sliding-window layers (`window` W > 0: a query at position p sees keys p - W + 1 .. p) start
each loop at the first key some query of the program can see and mask the rest per query;
soft-capped layers (`logit_cap` c > 0) map the scaled scores to c * tanh(s / c). A row that
sees no key of a block (possible under a window) keeps its running max at -inf and adds
nothing (`_online_update`).

Everything accumulates in float32; inputs may be float32, bfloat16 or float16. Under
`TRITON_INTERPRET=1` (set before triton is imported) the same kernels run on CPU tensors,
which is how the tests check them.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _scores(
    q,
    k,
    sm_scale,
    logit_cap,
    USE_CAP: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """q k^T * scale, soft-capped when USE_CAP (tanh(x) = 2 sigmoid(2x) - 1)."""
    s = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION) * sm_scale
    if USE_CAP:
        s = logit_cap * (2.0 * tl.sigmoid(2.0 * s / logit_cap) - 1.0)
    return s


@triton.jit
def _online_update(s, m_i, l_i, acc, v, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One block of online softmax; rows whose scores are all -inf so far stay empty (no NaN)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(
        p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION
    )
    return m_new, l_i, acc


@triton.jit
def _attend_pool_keys(
    q,
    q_pos,
    m_i,
    l_i,
    acc,
    start,
    end,
    K_buf,
    V_buf,
    Req_to_token,
    row,
    kv_head,
    offs_d,
    d_mask,
    sm_scale,
    window,
    logit_cap,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_row,
    BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_CAP: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Online softmax of the queries `q` [rows, D] (at positions `q_pos` [rows]) over context
    positions [start, end) of request row `row`, whose keys and values are gathered from the
    pool by slot; returns the updated running max, sum and (unnormalised) output."""
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        slots = tl.load(Req_to_token + row * stride_row + offs_n, mask=n_mask, other=0).to(tl.int64)
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(
            K_buf + slots[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        s = _scores(q, k, sm_scale, logit_cap, USE_CAP, DOT_DTYPE, DOT_PRECISION)
        visible = (q_pos[:, None] >= 0) & n_mask[None, :]  # [rows, BLOCK_N]
        if USE_WINDOW:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        v = tl.load(
            V_buf + slots[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        m_i, l_i, acc = _online_update(s, m_i, l_i, acc, v, DOT_DTYPE, DOT_PRECISION)
    return m_i, l_i, acc


@triton.jit
def decode_split_kernel(
    Q,  # [bs, heads, D]: request b's query is token b
    K_buf,  # [slots, kv_heads, D]
    V_buf,
    Req_to_token,  # [rows, max_context] slot ids
    Req_rows,  # [bs]
    Seq_lens,  # [bs]
    Part_out,  # [bs, heads, NUM_SPLITS, D] float32
    Part_lse,  # [bs, heads, NUM_SPLITS] float32
    sm_scale,
    window,  # keys a query sees (USE_WINDOW)
    logit_cap,  # (USE_CAP)
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_row,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,  # query heads per kv head
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,  # GROUP padded to a power of two >= 16 (tl.dot's minimum)
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_CAP: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # operand type of the tl.dot products (see _dot_dtype)
    DOT_PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(Seq_lens + b)
    row = tl.load(Req_rows + b).to(tl.int64)
    first = seq_len * 0  # the splits share the keys the query sees: all, or its window's
    if USE_WINDOW:
        first = tl.maximum(seq_len - window, 0)
    split_len = tl.cdiv(seq_len - first, NUM_SPLITS)
    start = first + split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    heads = kv_head * GROUP + offs_h
    h_mask = offs_h < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q = tl.load(
        Q + b * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=h_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    q_pos = tl.full([BLOCK_H], 0, tl.int32) + seq_len - 1
    m_i, l_i, acc = _attend_pool_keys(
        q, q_pos, m_i, l_i, acc, start, end, K_buf, V_buf, Req_to_token, row, kv_head, offs_d,
        d_mask, sm_scale, window, logit_cap, stride_ks, stride_kh, stride_vs, stride_vh, stride_row,
        BLOCK_N, False, USE_CAP, DOT_DTYPE, DOT_PRECISION,
    )  # fmt: skip

    # An empty split (a context shorter than the split count) leaves l_i == 0: it reports
    # lse = -inf and contributes nothing when the splits are combined.
    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    tl.store(
        Part_out + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps + offs_d[None, :],
        out,
        mask=h_mask[:, None] & d_mask[None, :],
    )
    tl.store(Part_lse + b * stride_lb + heads * stride_lh + split, lse, mask=h_mask)


@triton.jit
def decode_reduce_kernel(
    Part_out,  # [bs, heads, NUM_SPLITS, D] float32
    Part_lse,  # [bs, heads, NUM_SPLITS] float32
    Out,  # [bs, heads, D]
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    lse = tl.load(Part_lse + b * stride_lb + h * stride_lh + offs_s)
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # no split had keys (only padding rows): output 0
    w = tl.exp(lse - m)  # an empty split's -inf gives weight 0
    part = tl.load(
        Part_out + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
        mask=d_mask[None, :],
        other=0.0,
    )
    total = tl.sum(w, 0)
    out = tl.sum(w[:, None] * part, 0) / tl.where(total > 0.0, total, 1.0)
    tl.store(
        Out + b * stride_ot + h * stride_oh + offs_d, out.to(Out.dtype.element_ty), mask=d_mask
    )


@triton.jit
def extend_kernel(
    Q,  # [T, heads, D] flat queries of the step
    K_new,  # [T, kv_heads, D] the step's new keys (also already stored in the pool)
    V_new,
    Out,  # [T, heads, D]
    K_buf,  # [slots, kv_heads, D]
    V_buf,
    Req_to_token,
    Req_rows,  # [bs]
    Prefix_lens,  # [bs]
    Extend_lens,  # [bs]
    Qo_start,  # [bs] first flat token of each request
    sm_scale,
    window,  # keys a query sees (USE_WINDOW)
    logit_cap,  # (USE_CAP)
    stride_qt,
    stride_qh,
    stride_knt,
    stride_knh,
    stride_vnt,
    stride_vnh,
    stride_ot,
    stride_oh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_row,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_CAP: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # operand type of the tl.dot products (see _dot_dtype)
    DOT_PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    m_block = tl.program_id(2)
    ext = tl.load(Extend_lens + b)
    if m_block * BLOCK_M >= ext:  # the grid is sized for the longest extend
        return
    prefix = tl.load(Prefix_lens + b)
    qo = tl.load(Qo_start + b).to(tl.int64)
    row = tl.load(Req_rows + b).to(tl.int64)
    kv_head = h // GROUP

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the extend
    m_mask = offs_m < ext
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q = tl.load(
        Q + (qo + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # The prefix: every query sees all of it (under a window, its last keys); keys are
    # gathered from the pool by slot.
    q_pos = prefix + offs_m  # absolute positions of the tile's queries
    first = prefix * 0
    if USE_WINDOW:
        first = tl.maximum(
            prefix + m_block * BLOCK_M - window + 1, 0
        )  # the tile's first query's window
    m_i, l_i, acc = _attend_pool_keys(
        q, q_pos, m_i, l_i, acc, tl.minimum(first, prefix), prefix, K_buf, V_buf, Req_to_token, row,
        kv_head, offs_d, d_mask, sm_scale, window, logit_cap, stride_ks, stride_kh, stride_vs,
        stride_vh, stride_row, BLOCK_N, USE_WINDOW, USE_CAP, DOT_DTYPE, DOT_PRECISION,
    )  # fmt: skip

    # The new tokens, causally: query i sees new keys 0..i, so this tile stops at its last query.
    end_n = tl.minimum(ext, (m_block + 1) * BLOCK_M)
    for n0 in range(tl.maximum(first - prefix, 0), end_n, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < ext
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(
            K_new + (qo + offs_n)[:, None] * stride_knt + kv_head * stride_knh + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        s = _scores(q, k, sm_scale, logit_cap, USE_CAP, DOT_DTYPE, DOT_PRECISION)
        visible = n_mask[None, :] & (offs_n[None, :] <= offs_m[:, None])
        if USE_WINDOW:
            visible = visible & (offs_n[None, :] > offs_m[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        v = tl.load(
            V_new + (qo + offs_n)[:, None] * stride_vnt + kv_head * stride_vnh + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        m_i, l_i, acc = _online_update(s, m_i, l_i, acc, v, DOT_DTYPE, DOT_PRECISION)

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(
        Out + (qo + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
        out.to(Out.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )


# ---------------------------------------------------------------------------- launchers


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def interpreting() -> bool:
    """Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1, read at decoration)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def _dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """The inputs' own type, except bfloat16 under the interpreter: its tl.dot multiplies
    bfloat16's raw uint16 storage (triton 3.7), so there the products run in float32."""
    if dtype not in _TL_DTYPES:
        raise ValueError(f"attention kernels take float32, bfloat16 or float16, got {dtype}")
    if dtype == torch.bfloat16 and interpreting():
        return tl.float32
    return _TL_DTYPES[dtype]


def dot_options(dtype: torch.dtype) -> dict:
    """float32 products run exact (IEEE): tf32 would cost ~1e-3 relative error."""
    dot_dtype = _dot_dtype(dtype)
    return dict(DOT_DTYPE=dot_dtype, DOT_PRECISION="ieee" if dot_dtype == tl.float32 else "tf32")


def _check_last_dim(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.stride(-1) != 1:
            raise ValueError(
                "attention kernels need a contiguous head_dim (stride 1 on the last dim)"
            )


def decode_partial_buffers(
    bs: int, num_heads: int, head_dim: int, num_splits: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scratch for the split results: partial outputs [bs, heads, splits, D] and their lse."""
    out = torch.empty((bs, num_heads, num_splits, head_dim), dtype=torch.float32, device=device)
    lse = torch.empty((bs, num_heads, num_splits), dtype=torch.float32, device=device)
    return out, lse


def decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    block_n: int = 64,
    num_warps: int = 4,
    window: int = 0,
    logit_cap: float = 0.0,
) -> None:
    """One query per request (q [bs, heads, D], request b's is row b) over its pool context.

    The grid is (bs, kv_heads, splits) then (bs, heads): fixed by the shapes, with lengths
    and rows read from `seq_lens`/`req_rows` on the device. `part_out`/`part_lse` (from
    `decode_partial_buffers`, at least bs rows) fix the split count.
    """
    bs, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    num_splits = part_lse.shape[2]
    if num_splits & (num_splits - 1):
        raise ValueError(f"the number of decode splits must be a power of two, got {num_splits}")
    if num_heads % num_kv_heads:
        raise ValueError(
            f"{num_heads} query heads do not group evenly over {num_kv_heads} kv heads"
        )
    _check_last_dim(q, k_buffer, v_buffer, out, req_to_token)
    group = num_heads // num_kv_heads
    block_d = _block_d(head_dim)
    decode_split_kernel[(bs, num_kv_heads, num_splits)](
        q, k_buffer, v_buffer, req_to_token, req_rows, seq_lens, part_out, part_lse, sm_scale,
        window, float(logit_cap), q.stride(0), q.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        req_to_token.stride(0), part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d, BLOCK_N=block_n, NUM_SPLITS=num_splits, USE_WINDOW=window > 0,
        USE_CAP=logit_cap > 0, **dot_options(q.dtype),
        num_warps=num_warps,
    )  # fmt: skip
    decode_reduce_kernel[(bs, num_heads)](
        part_out, part_lse, out,
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=num_splits,
        num_warps=num_warps,
    )  # fmt: skip


def extend_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    qo_start: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
    block_m: int = 64,
    block_n: int = 32,
    num_warps: int = 4,
    num_stages: int = 2,
    window: int = 0,
    logit_cap: float = 0.0,
) -> None:
    """Flat queries q [T, heads, D] of many requests, each over its prefix and its new tokens.

    Request b owns tokens qo_start[b] .. qo_start[b] + extend_lens[b] of q/k/v/out; its
    prefix (prefix_lens[b] tokens) is read from the pool through `req_to_token[req_rows[b]]`.
    Grid: (requests, query heads, ceil(max_extend_len / block_m)).
    """
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k.shape[1]
    if num_heads % num_kv_heads:
        raise ValueError(
            f"{num_heads} query heads do not group evenly over {num_kv_heads} kv heads"
        )
    _check_last_dim(q, k, v, out, k_buffer, v_buffer, req_to_token)
    bs = req_rows.shape[0]
    grid = (bs, num_heads, triton.cdiv(max_extend_len, block_m))
    extend_kernel[grid](
        q, k, v, out, k_buffer, v_buffer, req_to_token, req_rows, prefix_lens, extend_lens,
        qo_start, sm_scale, window, float(logit_cap),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        req_to_token.stride(0),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim),
        BLOCK_M=block_m, BLOCK_N=block_n, USE_WINDOW=window > 0, USE_CAP=logit_cap > 0,
        **dot_options(q.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
