"""Prefill-chunk attention on CPU: sgl's AVX512-BF16 kernel (csrc/prefill_attention_cpu.cpp)
against what ran before it, torch's CPU flash attention (one causal call without a cached
prefix; with one, two calls merged by log-sum-exp, `attend_after_prefix`), interleaved.

bf16 q / k / v of one layer, chunks of E new tokens after P cached ones; shapes SmolLM2's
heads (9 query / 3 kv, dim 64) and Llama-3.2-1B's (32 / 8, dim 64). Reported: ms per call,
GFLOP/s (4 x heads x dim x the causal (query, key) pairs), and the largest difference of each
from a float32 reference (small cases only: the reference is materialised).

    .venv/bin/python benchmarks/bench_prefill_attention.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import print_table, write_result  # noqa: E402

from sgl.runtime.attention.cpu_kernel import load_prefill_attention  # noqa: E402
from sgl.runtime.attention.torch_native import attend_after_prefix  # noqa: E402

CASES = [
    ("smollm2", 9, 3, 512, 0),
    ("smollm2", 9, 3, 2048, 0),
    ("smollm2", 9, 3, 2048, 400),
    ("smollm2", 9, 3, 512, 2000),
    ("llama-1b", 32, 8, 2048, 0),
    ("llama-1b", 32, 8, 1024, 1024),
]


def torch_flash(q, k, v, scale):
    """What prefill rows ran before the kernel: [E, H, D] in, [E, H, D] out."""
    _E, P = q.shape[0], k.shape[0] - q.shape[0]
    qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    if P == 0:
        out = torch.nn.functional.scaled_dot_product_attention(
            qt, kt, vt, is_causal=True, scale=scale, enable_gqa=True
        )
    else:
        out = attend_after_prefix(qt, kt, vt, P, scale)
    return out.squeeze(0).transpose(0, 1)


def reference(q, k, v, scale):
    E, H, _ = q.shape
    L, KVH, _ = k.shape
    keys = k.float().repeat_interleave(H // KVH, 1).transpose(0, 1)
    vals = v.float().repeat_interleave(H // KVH, 1).transpose(0, 1)
    scores = q.float().transpose(0, 1) @ keys.transpose(-1, -2) * scale
    mask = torch.ones(E, L, dtype=torch.bool).tril(L - E)
    return (scores.masked_fill(~mask, float("-inf")).softmax(-1) @ vals).transpose(0, 1)


def timed(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    kernel = load_prefill_attention()
    if kernel is None:
        sys.exit("the prefill kernel does not run here (it needs AVX512-BF16 and a C++ compiler)")
    g = torch.Generator().manual_seed(0)
    rows, results = [], []
    for model, heads, kv_heads, E, P in CASES:
        q = torch.randn(E, heads, 64, generator=g).bfloat16()
        k, v = (torch.randn(P + E, kv_heads, 64, generator=g).bfloat16() for _ in range(2))
        scale = 64**-0.5
        best = {"torch_flash": float("inf"), "kernel": float("inf")}
        for _ in range(args.rounds):  # interleaved: a noisy moment hits both
            best["torch_flash"] = min(
                best["torch_flash"],
                timed(lambda q=q, k=k, v=v, scale=scale: torch_flash(q, k, v, scale), 3),
            )
            best["kernel"] = min(
                best["kernel"], timed(lambda q=q, k=k, v=v, scale=scale: kernel(q, k, v, scale), 3)
            )
        flops = 4 * heads * 64 * (E * P + E * (E + 1) / 2)
        r = {
            "model": model,
            "new_tokens": E,
            "cached_tokens": P,
            **{f"{n}_ms": round(s * 1e3, 2) for n, s in best.items()},
            **{f"{n}_gflops": round(flops / s / 1e9) for n, s in best.items()},
            "speedup": round(best["torch_flash"] / best["kernel"], 2),
        }
        if heads * E * (P + E) <= 9 * 2048 * 2448:
            ref = reference(q, k, v, scale)
            r["max_abs_err_torch_flash"] = round(
                (torch_flash(q, k, v, scale).float() - ref).abs().max().item(), 5
            )
            r["max_abs_err_kernel"] = round(
                (kernel(q, k, v, scale).float() - ref).abs().max().item(), 5
            )
        results.append(r)
        rows.append(
            (
                model,
                E,
                P,
                r["torch_flash_ms"],
                r["kernel_ms"],
                r["torch_flash_gflops"],
                r["kernel_gflops"],
                f"{r['speedup']}x",
            )
        )
    print_table(
        f"prefill attention, one layer, bf16, {torch.get_num_threads()} threads (best of "
        f"{args.rounds})",
        rows,
        (
            "model",
            "new",
            "cached",
            "flash ms",
            "kernel ms",
            "flash GFLOP/s",
            "kernel GFLOP/s",
            "speedup",
        ),
    )
    write_result(
        "prefill_attention",
        {"config": vars(args), "threads": torch.get_num_threads(), "results": results},
    )


if __name__ == "__main__":
    main()
