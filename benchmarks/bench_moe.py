"""One mixture-of-experts MLP block (model/moe.py: router, grouped expert matmuls, scatter)
against a dense gated MLP with the same active parameters (intermediate = top_k x the
expert's), at the token counts of decode (1, 8 rows) and prefill chunks (64, 512 rows).

On a CPU with native bf16 matmuls both blocks are packed for oneDNN as the engine packs them
(`pack_dense_layers`: a PackedLinear pair per expert, the dense MLP's two layers); the MoE
block with plain stacked bf16 weights (reordered by oneDNN on every call) is timed beside
them, which is what packing the experts gains.

Shapes: Qwen3-30B-A3B's layer (hidden 2048, 128 experts of 768, top 8) and Mixtral-8x7B's
scaled to a quarter (hidden 1024, 8 experts of 3584, top 2: the full layer is 1.4 GB of
bf16 weights, which the machine holds, but a quarter keeps the run short). The ratio
moe / dense is what the grouping costs: with every expert's weights read once per call, a
decode step of few rows reads up to top_k x rows experts (more bytes than the dense layer),
while large batches amortize the per-expert calls.

    .venv/bin/python benchmarks/bench_moe.py [--dtype bfloat16] [--rows 1,8,64,512]
    python3 benchmarks/bench_moe.py --device cuda      # on a GPU (gpu_check.sh runs it)

On CUDA the block runs the Triton grouped kernels (moe_triton.py); the torch grouped path
(one matmul pair per hit expert, a host sync for the counts) is timed beside them, and
Mixtral's layer at full size.

Results: results/moe_layer.json (CPU), results/moe_layer_cuda.json.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import print_table, write_result  # noqa: E402

from sgl.runtime.model.config import ModelConfig  # noqa: E402
from sgl.runtime.model.cpu_packed import pack_dense_layers, packing_applies  # noqa: E402
from sgl.runtime.model.llama import MLP  # noqa: E402
from sgl.runtime.model.moe import SparseMoE  # noqa: E402

SHAPES = {  # name: (hidden, experts, expert intermediate, top_k)
    "qwen3-30b-a3b layer": (2048, 128, 768, 8),
    "mixtral-8x7b layer / 4": (1024, 8, 3584, 2),
}
CUDA_SHAPES = {
    "qwen3-30b-a3b layer": (2048, 128, 768, 8),
    "mixtral-8x7b layer": (4096, 8, 14336, 2),
}


def layers(
    hidden: int, experts: int, size: int, top_k: int, dtype: torch.dtype
) -> tuple[SparseMoE, MLP]:
    config = ModelConfig(
        vocab_size=1,
        hidden_size=hidden,
        intermediate_size=size,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=hidden,
        num_experts=experts,
        experts_per_token=top_k,
        moe_intermediate_size=size,
        sparse_layers=[True],
    )
    moe, dense = SparseMoE(config, MLP), MLP(config, top_k * size)
    with torch.no_grad():
        for p in [*moe.parameters(), *dense.parameters()]:
            p.normal_(0, 0.02)
    return moe.to(dtype).eval(), dense.to(dtype).eval()


def interleaved_ms(
    fns: dict[str, object], repeats: int, device: str, warmup: int = 3
) -> dict[str, float]:
    """Median ms of each fn, their calls interleaved (one of each in turn), so a noisy machine's
    drift falls on all of them alike."""

    def call(fn):
        fn()
        if device == "cuda":
            torch.cuda.synchronize()

    for fn in fns.values():
        for _ in range(warmup):
            call(fn)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            call(fn)
            times[name].append(time.perf_counter() - t)
    return {name: sorted(ts)[len(ts) // 2] * 1e3 for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--rows", default="1,8,64,512")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    dtype, cuda = getattr(torch, args.dtype), args.device == "cuda"
    where = torch.cuda.get_device_name() if cuda else f"{torch.get_num_threads()} threads"
    results = {"dtype": args.dtype, "device": args.device, "where": where, "shapes": {}}
    rows_out = []
    packed = not cuda and packing_applies(dtype, torch.device("cpu"))
    results["packed"] = packed
    for name, shape in (CUDA_SHAPES if cuda else SHAPES).items():
        moe, dense = layers(*shape, dtype)
        moe, dense = moe.to(args.device), dense.to(args.device)
        plain_moe = copy.deepcopy(moe) if packed else None
        if packed:
            pack_dense_layers(moe)
            pack_dense_layers(dense)
        per_rows = results["shapes"][name] = {}
        for n in map(int, args.rows.split(",")):
            x = torch.randn(n, shape[0], device=args.device).to(dtype)
            with torch.inference_mode():
                experts, weights = moe.route(x)
                experts_hit = int(experts.unique().numel())
                fns = {"moe": lambda: moe(x), "dense": lambda: dense(x)}  # noqa: B023
                if cuda:
                    fns["torch"] = lambda: moe.experts.grouped_matmuls(x, experts, weights)  # noqa: B023
                if packed:
                    fns["plain"] = lambda: plain_moe(x)  # noqa: B023
                ms = interleaved_ms(fns, args.repeats, args.device)
                t_moe, t_dense, t_torch, t_plain = (
                    ms["moe"],
                    ms["dense"],
                    ms.get("torch"),
                    ms.get("plain"),
                )
            per_rows[n] = {
                "moe_ms": round(t_moe, 3),
                "dense_ms": round(t_dense, 3),
                "ratio": round(t_moe / t_dense, 2),
                "experts_hit": experts_hit,
            }
            row = (name, n, experts_hit, f"{t_moe:.2f}", f"{t_dense:.2f}", f"{t_moe / t_dense:.2f}")
            if cuda:
                per_rows[n]["torch_grouped_experts_ms"] = round(t_torch, 3)
                row += (f"{t_torch:.2f}",)
            if packed:
                per_rows[n].update(
                    moe_plain_ms=round(t_plain, 3), packing_speedup=round(t_plain / t_moe, 2)
                )
                row += (f"{t_plain:.2f}", f"{t_plain / t_moe:.2f}")
            rows_out.append(row)
        moe = dense = plain_moe = None  # freed before the next shape is built
    columns = ("shape", "rows", "experts hit", "moe ms", "dense ms", "moe / dense")
    extra = (
        ("torch grouped experts ms",)
        if cuda
        else ("moe plain-weights ms", "plain / packed")
        if packed
        else ()
    )
    print_table(
        f"MoE block vs dense MLP with the same active parameters ({args.dtype}, {where}"
        f"{', packed for oneDNN' if packed else ''})",
        rows_out,
        columns + extra,
    )
    write_result("moe_layer_cuda" if cuda else "moe_layer", results)


if __name__ == "__main__":
    main()
