"""The CPU paged-attention kernel alone, this checkout's against another revision's, interleaved.

Decode rows over a bf16 pool, as a 30-layer model sees them: each layer's K/V is its own
buffer (cold in cache when its layer comes), a row's first half of keys contiguous (its
prompt) and the rest interleaved with the other rows' (decode slots). Shapes: SmolLM2's heads
(9 query / 3 kv, dim 64) and Llama-3.2-1B's (32 / 8, dim 64). Each version runs in its own
process (both register `sgl_cpu::paged_attention`), alternating, best of the rounds kept.

    .venv/bin/python benchmarks/bench_cpu_attention_kernel.py [--against HEAD~1] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import print_table, write_result  # noqa: E402

SOURCE = "sgl/runtime/attention/csrc/paged_attention_cpu.cpp"
CASES = [("smollm2", 9, 3, 48, 100), ("smollm2", 9, 3, 48, 500), ("llama-1b", 32, 8, 16, 500)]
LAYERS = 30


def worker(source: str) -> dict[str, float]:
    """us per call of the kernel built from `source`, per case."""
    import torch

    from sgl import native

    native.build(
        "sgl_cpu_attention_bench",
        Path(source),
        ["-O3", "-march=native", "-ffast-math", "-fopenmp"],
        ldflags=["-fopenmp"],
        python_module=False,
    )
    op = torch.ops.sgl_cpu.paged_attention
    out = {}
    for model, heads, kv_heads, rows, keys in CASES:
        slots = rows * keys + 1
        ks = [torch.randn(slots, kv_heads, 64).bfloat16() for _ in range(LAYERS)]
        vs = [torch.randn(slots, kv_heads, 64).bfloat16() for _ in range(LAYERS)]
        prompt = keys // 2
        table = torch.empty(rows, keys, dtype=torch.int64)
        for r in range(rows):
            table[r, :prompt] = torch.arange(r * prompt, (r + 1) * prompt)
        for j in range(prompt, keys):
            table[:, j] = rows * prompt + (j - prompt) * rows + torch.arange(rows)
        spec = torch.tensor([[r, r, 1, keys] for r in range(rows)], dtype=torch.int64)
        q = torch.randn(rows, heads, 64)
        for i in range(LAYERS):
            op(q, ks[i], vs[i], table, spec, 0.125)
        t = time.perf_counter()
        for _ in range(5):
            for i in range(LAYERS):
                op(q, ks[i], vs[i], table, spec, 0.125)
        out[f"{model} {rows} rows x {keys} keys"] = round(
            (time.perf_counter() - t) / (5 * LAYERS) * 1e6, 1
        )
    return out


def run(source: str) -> dict[str, float]:
    res = subprocess.run(
        [sys.executable, __file__, "--worker", source],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=1200,
    )
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-2000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", default=None, help="a git revision whose kernel to compare with")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--worker", default=None)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return
    versions = {"this checkout": str(ROOT / SOURCE)}
    if args.against:
        old = subprocess.run(
            ["git", "show", f"{args.against}:{SOURCE}"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout
        path = Path(tempfile.mkdtemp()) / "paged_attention_cpu.cpp"
        path.write_text(old)
        versions[args.against] = str(path)
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for name, source in versions.items():
            for case, us in run(source).items():
                best.setdefault(name, {})[case] = min(
                    us, best.get(name, {}).get(case, float("inf"))
                )
    cases = list(best["this checkout"])
    print_table(
        "us per kernel call (one layer), best of rounds",
        [(c, *(best[v][c] for v in best)) for c in cases],
        ("case", *best),
    )
    write_result(
        "cpu_attention_kernel", {"rounds": args.rounds, "layers": LAYERS, "us_per_call": best}
    )


if __name__ == "__main__":
    main()
