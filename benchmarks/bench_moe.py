"""One mixture-of-experts MLP block (model/moe.py: router, grouped expert matmuls, scatter)
against a dense gated MLP with the same active parameters (intermediate = top_k x the
expert's), at the token counts of decode (1, 8 rows) and prefill chunks (64, 512 rows).

Shapes: Qwen3-30B-A3B's layer (hidden 2048, 128 experts of 768, top 8) and Mixtral-8x7B's
scaled to a quarter (hidden 1024, 8 experts of 3584, top 2: the full layer is 1.4 GB of
bf16 weights, which the machine holds, but a quarter keeps the run short). The ratio
moe / dense is what the grouping costs: with every expert's weights read once per call, a
decode step of few rows reads up to top_k x rows experts (more bytes than the dense layer),
while large batches amortize the per-expert calls.

    .venv/bin/python benchmarks/bench_moe.py [--dtype bfloat16] [--rows 1,8,64,512]

Results: results/moe_layer.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import call_seconds, print_table, write_result  # noqa: E402

from sgl.runtime.model.config import ModelConfig  # noqa: E402
from sgl.runtime.model.llama import MLP  # noqa: E402
from sgl.runtime.model.moe import SparseMoE  # noqa: E402

SHAPES = {  # name: (hidden, experts, expert intermediate, top_k)
    "qwen3-30b-a3b layer": (2048, 128, 768, 8),
    "mixtral-8x7b layer / 4": (1024, 8, 3584, 2),
}


def layers(hidden: int, experts: int, size: int, top_k: int, dtype: torch.dtype) -> tuple[SparseMoE, MLP]:
    config = ModelConfig(vocab_size=1, hidden_size=hidden, intermediate_size=size, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=hidden, num_experts=experts,
                         experts_per_token=top_k, moe_intermediate_size=size, sparse_layers=[True])
    moe, dense = SparseMoE(config, MLP), MLP(config, top_k * size)
    with torch.no_grad():
        for p in [*moe.parameters(), *dense.parameters()]:
            p.normal_(0, 0.02)
    return moe.to(dtype).eval(), dense.to(dtype).eval()


def median_ms(fn, repeats: int) -> float:
    return call_seconds(fn, repeats) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--rows", default="1,8,64,512")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    results, rows_out = {"dtype": args.dtype, "threads": torch.get_num_threads(), "shapes": {}}, []
    for name, shape in SHAPES.items():
        moe, dense = layers(*shape, dtype)
        per_rows = results["shapes"][name] = {}
        for n in map(int, args.rows.split(",")):
            x = torch.randn(n, shape[0]).to(dtype)
            with torch.inference_mode():
                t_moe = median_ms(lambda: moe(x), args.repeats)  # noqa: B023
                t_dense = median_ms(lambda: dense(x), args.repeats)  # noqa: B023
                experts_hit = int(moe.route(x)[0].unique().numel())
            per_rows[n] = {"moe_ms": round(t_moe, 3), "dense_ms": round(t_dense, 3),
                           "ratio": round(t_moe / t_dense, 2), "experts_hit": experts_hit}
            rows_out.append((name, n, experts_hit, f"{t_moe:.2f}", f"{t_dense:.2f}", f"{t_moe / t_dense:.2f}"))
        del moe, dense
    print_table(f"MoE block vs dense MLP with the same active parameters ({args.dtype}, "
                f"{torch.get_num_threads()} threads)", rows_out,
                ("shape", "rows", "experts hit", "moe ms", "dense ms", "moe / dense"))
    write_result("moe_layer", results)


if __name__ == "__main__":
    main()
