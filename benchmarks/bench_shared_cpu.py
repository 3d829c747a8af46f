"""Speed on a shared CPU: the default engine quiet and with busy loops beside it, with the
compute-thread governor (`sgl/runtime/cpu_share.py`) on and off (`SGL_CPU_SHARE=0`).

Each (variant, load) runs in a fresh process: batch-1 decode of 64 tokens (median of 3) and a
16-request batch of 32 tokens, greedy, ignore_eos. Variants and loads are interleaved over
`--rounds`, since this machine's speed drifts between minutes. A busy loop is `sh -c 'while :;
do :; done'`, placed by the kernel (not pinned), as another user's job would be.

    .venv/bin/python benchmarks/bench_shared_cpu.py --rounds 2

Results: results/shared_cpu.json (per variant: quiet and loaded seconds, loaded / quiet).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_info, print_table, python_child, write_result  # noqa: E402

CHILD = r"""
import json, statistics, time, sgl
e = sgl.Engine(model_path="default")
greedy = {"ignore_eos": True, "temperature": 0}
e.generate("warm up", {"max_new_tokens": 8, **greedy})
b1 = []
for i in range(3):
    t = time.perf_counter()
    e.generate(f"Once upon a time {i}", {"max_new_tokens": 64, **greedy})
    b1.append(time.perf_counter() - t)
t = time.perf_counter()
e.generate([f"Story {i}:" for i in range(16)], {"max_new_tokens": 32, **greedy})
b16 = time.perf_counter() - t
print(json.dumps({"batch1_s": round(statistics.median(b1), 3), "batch16_s": round(b16, 3)}))
e.shutdown()
"""
VARIANTS = {"governor": {}, "no-governor": {"SGL_CPU_SHARE": "0"}}


@contextmanager
def busy_loops(n: int) -> Iterator[None]:
    procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--busy", type=int, default=1, help="busy loops in the loaded runs")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    variants = args.variants.split(",")
    runs: dict[str, dict[str, list[dict]]] = {v: {"quiet": [], "loaded": []} for v in variants}
    for r in range(args.rounds):
        for load in ("quiet", "loaded"):
            for v in variants:
                with busy_loops(args.busy if load == "loaded" else 0):
                    res = python_child(CHILD, env=VARIANTS[v])
                runs[v][load].append(res)
                print(f"round {r} {load} {v}: {res}", flush=True)
    summary = {}
    for v in variants:
        s = {
            f"{load}_{k}": round(statistics.median(x[k] for x in runs[v][load]), 3)
            for load in ("quiet", "loaded")
            for k in ("batch1_s", "batch16_s")
        }
        for k in ("batch1_s", "batch16_s"):
            s[f"loaded_over_quiet_{k[:-2]}"] = round(s[f"loaded_{k}"] / s[f"quiet_{k}"], 2)
        summary[v] = s
    print_table(
        "median seconds (quiet / loaded) and loaded / quiet",
        [
            (
                v,
                f"{s['quiet_batch1_s']} / {s['loaded_batch1_s']}",
                s["loaded_over_quiet_batch1"],
                f"{s['quiet_batch16_s']} / {s['loaded_batch16_s']}",
                s["loaded_over_quiet_batch16"],
            )
            for v, s in summary.items()
        ],
        ("variant", "batch-1 64 tok", "ratio", "16 x 32 tok", "ratio"),
    )
    write_result(
        "shared_cpu",
        {"machine": machine_info(), "config": vars(args), "runs": runs, "summary": summary},
    )


if __name__ == "__main__":
    main()
