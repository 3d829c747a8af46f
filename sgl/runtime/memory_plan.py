"""How many tokens the KV pool holds: given, or sized from the memory free once the weights
are loaded, less what the step's activations and the attention backend may use besides."""

from __future__ import annotations

import logging
from typing import Any

import torch

from sgl.runtime.config import EngineConfig

logger = logging.getLogger(__name__)

DEFAULT_MEM_FRACTION = {"cuda": 0.85, "cpu": 0.2}
# Kept free on CUDA besides one step's activations: the CUDA context's own allocations,
# cuBLAS and attention workspaces, and the CUDA graphs' memory pool.
CUDA_FIXED_HEADROOM_BYTES = 1 << 30
CPU_MAX_POOL_TOKENS = 1 << 17
MIN_POOL_TOKENS = 1024


def activation_headroom_bytes(
    mc: Any, dtype: torch.dtype, max_step_tokens: int, max_running_requests: int
) -> int:
    """Memory one forward step needs besides weights and KV, generously: per token, the MLP's
    gate/up/activation tensors, the fused QKV and attention output, the residual stream and
    norms, and RoPE's float32 temporaries; per running request, float32 logits and the
    sampler's copies of them (softmax, sort); plus the fixed CUDA headroom."""
    elem = torch.empty((), dtype=dtype).element_size()
    qkv = mc.q_size + 2 * mc.kv_size
    per_token = elem * (4 * mc.intermediate_size + 2 * qkv + 4 * mc.hidden_size) + 4 * (
        3 * mc.q_size + 2 * mc.hidden_size
    )
    logits = 4 * 4 * mc.vocab_size * max_running_requests
    return max_step_tokens * per_token + logits + CUDA_FIXED_HEADROOM_BYTES


def kv_pool_tokens(
    free_bytes: int, fraction: float, bytes_per_token: int, headroom_bytes: int
) -> int:
    """KV pool capacity in tokens: `fraction` of the memory free once the weights are loaded,
    less the headroom for activations (and, on CUDA, workspaces and graphs), divided by the
    KV bytes of one token (2 x layers x kv_heads x head_dim x element size)."""
    return max(int(free_bytes * fraction) - headroom_bytes, 0) // bytes_per_token


def available_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def plan_kv_pool(
    cfg: EngineConfig,
    mc: Any,
    device: torch.device,
    dtype: torch.dtype,
    backend_bytes: Any,
    kv_heads: int | None = None,
    sharers: int = 1,
) -> dict[str, Any]:
    """The KV pool size and how it was reached (reported as server info `memory_plan`).

    `backend_bytes(max_total_tokens)` is the most the attention backend may allocate beyond
    the pool for a pool of that size (e.g. torch_native's dense decode mirror); it is taken
    out of the memory the pool is sized from. `kv_heads`: the heads this rank keeps (a
    tensor-parallel shard's); `sharers`: how many ranks plan from the same free memory (the
    ranks of one CPU host), each taking its share.
    """
    from sgl.runtime.memory import TokenToKVPool

    kv_heads = mc.num_key_value_heads if kv_heads is None else kv_heads
    per_token = TokenToKVPool.bytes_per_token_for(
        mc.num_hidden_layers, kv_heads, mc.head_dim, dtype
    )
    plan: dict[str, Any] = {
        "kv_bytes_per_token": per_token,
        "max_total_tokens_given": cfg.max_total_tokens,
    }
    max_total = cfg.max_total_tokens
    if max_total is None:
        fraction = (
            cfg.mem_fraction_static
            or DEFAULT_MEM_FRACTION["cuda" if device.type == "cuda" else "cpu"]
        )
        headroom = 0
        if device.type == "cuda":
            torch.cuda.empty_cache()  # blocks the allocator kept from loading are free memory too
            step_tokens = cfg.chunk_size or cfg.max_prefill_tokens
            headroom = activation_headroom_bytes(
                mc, dtype, step_tokens + cfg.max_running_requests, cfg.max_running_requests
            )
        free = available_memory_bytes(device) // sharers
        max_total = kv_pool_tokens(free, fraction, per_token, headroom)
        if device.type == "cpu":
            max_total = min(max_total, CPU_MAX_POOL_TOKENS)
        # The backend's extra memory scales with the pool (at most); take it out once.
        extra = backend_bytes(max_total)
        if extra:
            max_total = kv_pool_tokens(free, fraction, per_token, headroom + extra)
            if device.type == "cpu":
                max_total = min(max_total, CPU_MAX_POOL_TOKENS)
        max_total = max(max_total, MIN_POOL_TOKENS)
        plan.update(
            free_bytes_after_weights=free, mem_fraction_static=fraction, headroom_bytes=headroom
        )
        logger.info(
            "KV pool: %d tokens x %d B = %.2f GiB (%.2f GiB free after the weights x %.2f - %.2f "
            "GiB headroom"
            " - %.2f GiB attention backend)",
            max_total,
            per_token,
            max_total * per_token / 2**30,
            free / 2**30,
            fraction,
            headroom / 2**30,
            extra / 2**30,
        )
    plan["max_total_tokens"] = max_total
    plan["attention_backend_bytes"] = backend_bytes(max_total)
    return plan
