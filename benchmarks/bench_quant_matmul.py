"""Quantized matmuls at decode shapes: our AVX-512 VNNI kernels (model/quant_vnni.py) vs
torch's packed CPU kernels (`_weight_int4pack_mm_for_cpu`, `_weight_int8pack_mm`, model/quant.py).

Per layer shape of SmolLM2-135M and Llama-3.2-1B (fused QKV, o, fused gate-up, down; the
LM head of the small one), int4 (groups of 32) and int8 (one scale per row), at 1, 4 and 16
activation rows: the median-ish (25th percentile) microseconds of a call, both kernels on
the same random weights in the same process, interleaved shape by shape. The weights stay
in cache between calls, so this measures the kernels, not memory: `bench_cpu_step.py`
measures them inside a decode step.

    .venv/bin/python benchmarks/bench_quant_matmul.py [--rows 1,4,16] [--repeats 200]

Results: results/quant_matmul.json.
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

SHAPES = {  # (out_features, in_features)
    "SmolLM2-135M": [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)],
    "Llama-3.2-1B": [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)],
}


def quarter_us(fn, repeats: int) -> float:
    return call_seconds(fn, repeats, quantile=0.25, warmup=5) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--name", default="quant_matmul")
    args = ap.parse_args()
    from sgl.runtime.model import quant_vnni
    from sgl.runtime.model.quant import Int4Linear, Int8Linear
    from sgl.runtime.model.quant_tensor import quantize_int4, quantize_int8

    if not quant_vnni.vnni_available():
        sys.exit("this CPU has no AVX-512 VNNI (or no compiler): nothing to compare")
    gen = torch.Generator().manual_seed(0)
    rows_out, results = [], []
    for model, shapes in SHAPES.items():
        for m in (int(r) for r in args.rows.split(",")):
            totals = {"int4": [0.0, 0.0], "int8": [0.0, 0.0]}
            for n, k in shapes:
                w = torch.randn(n, k, generator=gen) * 0.02
                x = torch.randn(m, k, generator=gen).bfloat16()
                q4, q8 = quantize_int4(w, 32), quantize_int8(w)
                pairs = {
                    "int4": (Int4Linear(q4, None), quant_vnni.VnniInt4Linear(q4, None)),
                    "int8": (Int8Linear(q8, None), quant_vnni.VnniInt8Linear(q8, None)),
                }
                for kind, (theirs, ours) in pairs.items():
                    t_torch = quarter_us(
                        lambda theirs=theirs, x=x: theirs.packed_mm(x), args.repeats
                    )
                    t_ours = quarter_us(lambda ours=ours, x=x: ours.packed_mm(x), args.repeats)
                    totals[kind][0] += t_torch
                    totals[kind][1] += t_ours
                    results.append(
                        {
                            "model": model,
                            "rows": m,
                            "shape": [n, k],
                            "kind": kind,
                            "torch_us": round(t_torch, 1),
                            "vnni_us": round(t_ours, 1),
                        }
                    )
            for kind, (t_torch, t_ours) in totals.items():
                rows_out.append(
                    (model, m, kind, round(t_torch), round(t_ours), f"{t_torch / t_ours:.2f}x")
                )
    print_table(
        "quantized matmuls, a model's layer shapes summed, us a call (25th percentile)",
        rows_out,
        ("model", "rows", "kind", "torch", "vnni", "speed-up"),
    )
    write_result(
        args.name,
        {
            "repeats": args.repeats,
            "per_shape": results,
            "summed": [
                dict(zip(("model", "rows", "kind", "torch_us", "vnni_us", "speedup"), r))
                for r in rows_out
            ],
        },
    )


if __name__ == "__main__":
    main()
