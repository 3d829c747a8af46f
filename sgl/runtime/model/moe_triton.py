"""The grouped MoE path for CUDA: two Triton kernels over the (token, expert) pairs, grouped by
expert, reading the stacked expert weights in place.

Layout (`expert_blocks`, plain torch and free of host syncs, so it can sit in a CUDA graph):
the pairs are sorted by expert and each expert's run is padded to a multiple of BLOCK_M, so
every BLOCK_M-row block belongs to one expert (`block_expert`, -1 for unused blocks at the
end). `pair_of_row` maps each padded row to its pair (token * top_k + slot), or to the pair
count for padding rows.

- `gate_up_kernel`: program (block, column tile) gathers its rows' tokens straight from x,
  multiplies them by that expert's gate and up columns in one K loop (two accumulators) and
  writes act(gate) * up: the gathered rows and the [rows, 2I] product never exist in memory.
- `down_kernel`: program (block, column tile) multiplies those rows by the expert's down
  projection, scales each row by its routing weight and writes it to its pair's row.
The top_k rows of a token are then summed (deterministic, no atomics). Everything
accumulates in float32; under `TRITON_INTERPRET=1` the kernels run on CPU tensors (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl.runtime.attention.triton_kernels import dot_options


@triton.jit
def _act_and_mul(gate, up, GELU_TANH: tl.constexpr):
    """act(gate) * up in float32: SiLU, or GELU's tanh form (tanh(y) = 2 sigmoid(2y) - 1)."""
    if GELU_TANH:
        y = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = 0.5 * gate * (2.0 * tl.sigmoid(2.0 * y))
    else:
        act = gate * tl.sigmoid(gate)
    return act * up


@triton.jit
def gate_up_kernel(
    X,
    W,
    H,
    Pair_of_row,
    Block_expert,
    num_pairs,
    top_k,
    hidden,
    inter,
    stride_xt,
    stride_we,
    stride_wn,
    stride_hr,
    GELU_TANH: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """H[row, n] = act(x[token] . W[e, n]) * (x[token] . W[e, inter + n]) for a block's rows."""
    block, tile = tl.program_id(0), tl.program_id(1)
    expert = tl.load(Block_expert + block).to(tl.int64)
    if expert >= 0:
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        pairs = tl.load(Pair_of_row + rows)
        valid = pairs < num_pairs
        tokens = tl.where(valid, pairs // top_k, 0).to(tl.int64)
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < inter
        w_base = W + expert * stride_we
        acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, hidden, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < hidden
            x = tl.load(
                X + tokens[:, None] * stride_xt + offs_k[None, :],
                mask=valid[:, None] & k_mask[None, :],
                other=0.0,
            ).to(DOT_DTYPE)
            w_mask = (
                n_mask[:, None] & k_mask[None, :]
            )  # weight tiles [BLOCK_N, BLOCK_K], rows along K
            w_gate = tl.load(
                w_base + offs_n[:, None] * stride_wn + offs_k[None, :], mask=w_mask, other=0.0
            )
            w_up = tl.load(
                w_base + (offs_n[:, None] + inter) * stride_wn + offs_k[None, :],
                mask=w_mask,
                other=0.0,
            )
            acc_gate += tl.dot(x, tl.trans(w_gate.to(DOT_DTYPE)), input_precision=DOT_PRECISION)
            acc_up += tl.dot(x, tl.trans(w_up.to(DOT_DTYPE)), input_precision=DOT_PRECISION)
        h = _act_and_mul(acc_gate, acc_up, GELU_TANH)
        tl.store(
            H + rows[:, None].to(tl.int64) * stride_hr + offs_n[None, :],
            h.to(H.dtype.element_ty),
            mask=valid[:, None] & n_mask[None, :],
        )


@triton.jit
def down_kernel(
    H,
    W,
    Out,
    Pair_of_row,
    Block_expert,
    Pair_weight,
    num_pairs,
    inter,
    hidden,
    stride_hr,
    stride_we,
    stride_wn,
    stride_op,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Out[pair, n] = weight[pair] * (H[row] . W[e, n]) for a block's rows."""
    block, tile = tl.program_id(0), tl.program_id(1)
    expert = tl.load(Block_expert + block).to(tl.int64)
    if expert >= 0:
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        pairs = tl.load(Pair_of_row + rows)
        valid = pairs < num_pairs
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hidden
        w_base = W + expert * stride_we
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < inter
            h = tl.load(
                H + rows[:, None].to(tl.int64) * stride_hr + offs_k[None, :],
                mask=valid[:, None] & k_mask[None, :],
                other=0.0,
            )
            w = tl.load(
                w_base + offs_n[:, None] * stride_wn + offs_k[None, :],
                mask=n_mask[:, None] & k_mask[None, :],
                other=0.0,
            )
            acc += tl.dot(h.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), input_precision=DOT_PRECISION)
        weight = tl.load(Pair_weight + pairs, mask=valid, other=0.0)
        safe_pairs = tl.where(valid, pairs, 0).to(tl.int64)
        tl.store(
            Out + safe_pairs[:, None] * stride_op + offs_n[None, :],
            acc * weight[:, None],
            mask=valid[:, None] & n_mask[None, :],
        )


def expert_blocks(
    experts: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pair_of_row [rows] int32, block_expert [rows / block_m] int32) for experts [T, k]: the
    pairs sorted by expert, each expert's run padded to a multiple of block_m. Sized for the
    worst case (every hit expert padded), so nothing waits on the device."""
    flat = experts.reshape(-1)
    num_pairs, device = flat.numel(), flat.device
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(
        0, flat, torch.ones_like(flat)
    )
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    sorted_experts = flat[order]
    rank = (
        torch.arange(num_pairs, device=device) - (torch.cumsum(counts, 0) - counts)[sorted_experts]
    )
    dest = (padded_end - padded)[sorted_experts] + rank
    num_blocks = triton.cdiv(num_pairs + min(num_experts, num_pairs) * (block_m - 1), block_m)
    pair_of_row = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int32, device=device)
    pair_of_row[dest] = order.to(torch.int32)
    block_start = torch.arange(num_blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, block_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return pair_of_row, block_expert


def grouped_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    act: str,
) -> torch.Tensor:
    """sum over each token's k experts of weight * down_e(act(gate_e x) * up_e x): x [T, H];
    gate_up [E, 2I, H]; down [E, H, I]; experts, weights [T, k]. Returns [T, H] in x's dtype."""
    num_tokens, hidden = x.shape
    num_experts, inter = gate_up.shape[0], down.shape[2]
    top_k = experts.shape[1]
    num_pairs = num_tokens * top_k
    block_m = 16 if num_pairs <= 16 * num_experts else 64
    block_n, block_k = 64, 64
    pair_of_row, block_expert = expert_blocks(experts, num_experts, block_m)
    x, gate_up, down = x.contiguous(), gate_up.contiguous(), down.contiguous()
    dot = dot_options(x.dtype)  # float32 exact; bfloat16 as float32 under the interpreter
    h = torch.empty(pair_of_row.numel(), inter, dtype=x.dtype, device=x.device)
    gate_up_kernel[(block_expert.numel(), triton.cdiv(inter, block_n))](
        x,
        gate_up,
        h,
        pair_of_row,
        block_expert,
        num_pairs,
        top_k,
        hidden,
        inter,
        x.stride(0),
        gate_up.stride(0),
        gate_up.stride(1),
        h.stride(0),
        GELU_TANH=act == "gelu_tanh",
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        **dot,
    )
    out = torch.empty(num_pairs, hidden, dtype=torch.float32, device=x.device)
    down_kernel[(block_expert.numel(), triton.cdiv(hidden, block_n))](
        h,
        down,
        out,
        pair_of_row,
        block_expert,
        weights.reshape(-1).float().contiguous(),
        num_pairs,
        inter,
        hidden,
        h.stride(0),
        down.stride(0),
        down.stride(1),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        **dot,
    )
    return out.view(num_tokens, top_k, hidden).sum(1).to(x.dtype)
