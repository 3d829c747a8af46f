"""Attention test cases shared by the backends' tests: a step over a KV pool with scattered
slots, and the oracle, a float64 softmax(QK^T * scale + causal mask) V in plain torch."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from sgl.runtime.attention import ForwardBatch
from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool

HEADS = 4
MAX_CONTEXT = 128
CAPACITY = 600

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1e-2, atol=1e-2),
       torch.float16: dict(rtol=2e-3, atol=2e-3)}  # fmt: skip


@dataclass
class Case:
    """A step over a pool with scattered slots: request i has spec (prefix, extend)."""

    batch: ForwardBatch
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale: float


def make_case(
    specs: list[tuple[int, int]],
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    seed: int = 0,
    heads: int = HEADS,
    capacity: int = CAPACITY,
    max_context: int = MAX_CONTEXT,
) -> Case:
    g = torch.Generator().manual_seed(seed)
    pool = TokenToKVPool(capacity, 1, kv_heads, head_dim, dtype, "cpu")
    table = ReqToTokenPool(max(8, len(specs)), max_context, "cpu")
    for buf in pool.k_buffers + pool.v_buffers:  # cached prefixes (and junk in every other slot)
        buf[1:] = torch.randn(buf[1:].shape, generator=g).to(dtype)
    slots = torch.randperm(capacity, generator=g)[: sum(p + e for p, e in specs)] + 1  # scattered
    rows = random.Random(seed).sample(range(max(8, len(specs))), len(specs))
    new_slots, used = [], 0
    for row, (prefix, ext) in zip(rows, specs):
        table.req_to_token[row, : prefix + ext] = slots[used : used + prefix + ext]
        new_slots.append(slots[used + prefix : used + prefix + ext])
        used += prefix + ext
    t = sum(e for _, e in specs)
    positions = torch.cat([torch.arange(p, p + e) for p, e in specs])
    batch = ForwardBatch(
        input_ids=torch.zeros(t, dtype=torch.int64), positions=positions,
        out_cache_loc=torch.cat(new_slots), req_rows=rows,
        prefix_lens=[p for p, _ in specs], extend_lens=[e for _, e in specs],
        kv_pool=pool, req_to_token=table, attn_backend=None,
    )  # fmt: skip
    q = torch.randn(t, heads, head_dim, generator=g).to(dtype)
    k = torch.randn(t, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(t, kv_heads, head_dim, generator=g).to(dtype)
    return Case(batch, q, k, v, head_dim**-0.5)


def reference(case: Case, sliding_window: int = 0, logit_cap: float = 0.0) -> torch.Tensor:
    """float64 attention per request: keys = pool prefix + new tokens, causal with prefix offset;
    with a window, only each query's last `sliding_window` keys; with a cap, scores soft-capped."""
    b = case.batch
    kb, vb = b.kv_pool.k_buffers[0].double(), b.kv_pool.v_buffers[0].double()
    group = case.q.shape[1] // kb.shape[1]
    out, tok = [], 0
    for row, prefix, ext in zip(b.req_rows, b.prefix_lens, b.extend_lens):
        ctx = b.req_to_token.req_to_token[row, :prefix]
        keys = torch.cat([kb[ctx], case.k[tok : tok + ext].double()]).repeat_interleave(group, 1)
        vals = torch.cat([vb[ctx], case.v[tok : tok + ext].double()]).repeat_interleave(group, 1)
        q = case.q[tok : tok + ext].double()
        scores = torch.einsum("qhd,khd->hqk", q, keys) * case.scale
        if logit_cap:
            scores = logit_cap * torch.tanh(scores / logit_cap)
        key_pos, q_pos = (
            torch.arange(prefix + ext)[None, :],
            torch.arange(prefix, prefix + ext)[:, None],
        )
        visible = key_pos <= q_pos
        if sliding_window:
            visible &= key_pos > q_pos - sliding_window
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out.append(torch.einsum("hqk,khd->qhd", probs, vals))
        tok += ext
    return torch.cat(out)


def run(backend, case: Case, **features) -> torch.Tensor:
    case.batch.attn_backend = backend
    backend.init_forward_metadata(case.batch)
    return backend.forward(case.q, case.k, case.v, 0, case.scale, case.batch, **features)
