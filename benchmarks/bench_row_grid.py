"""Prefill over many prompt lengths: memory and speed with matmul row counts on the grid
(sgl/runtime/model/row_grid.py) and with exact row counts.

Each round is a fresh process with an engine on the embedded model: `--lengths` prompts of
distinct lengths (random token ids, one output token, the radix cache flushed between
prompts so every prompt is a full prefill) are run twice: the first pass meets every shape for
the first time (oneDNN builds its primitives), the second reuses them. Reported per mode:
prefill tokens/s of each pass and the malloc memory in use (glibc mallinfo2) before and after,
the figure that grew by hundreds of MB in the soak. Modes alternate round by round (this
machine is noisy).

    .venv/bin/python benchmarks/bench_row_grid.py [--rounds 3] [--lengths 120] [--max-len 1500]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_in_use_mb() -> float:
    """Bytes malloc has handed out and not had back (arenas + mmapped chunks), in MB."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return round((info.uordblks + info.hblkhd) / 2**20, 1)


def one_round(mode: str, lengths: list[int]) -> dict:
    """In this process: an engine, two passes over `lengths`, the figures."""
    from sgl.runtime.engine import Engine
    from sgl.runtime.model import row_grid

    if mode == "exact":
        row_grid.padded_rows = lambda rows: rows  # on_row_grid then calls the matmul as it is
    engine = Engine(model_path="default", max_total_tokens=max(lengths) + 64)
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 20000) for _ in range(n)] for n in lengths]
    engine.generate(input_ids=prompts[0][:8], sampling_params={"max_new_tokens": 1})
    out = {"mode": mode, "malloc_mb_start": malloc_in_use_mb()}
    for name in ("first_pass", "second_pass"):
        elapsed = 0.0
        for ids in prompts:
            engine.flush_cache()
            t = time.perf_counter()
            engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0})
            elapsed += time.perf_counter() - t
        out[f"{name}_tok_s"] = round(sum(lengths) / elapsed, 1)
        out[f"malloc_mb_after_{name}"] = malloc_in_use_mb()
    engine.shutdown()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lengths", type=int, default=120, help="distinct prompt lengths per pass")
    ap.add_argument("--max-len", type=int, default=1500)
    ap.add_argument("--round", choices=("grid", "exact"), help=argparse.SUPPRESS)  # a child process
    ap.add_argument("--name", default="row_grid")
    args = ap.parse_args()
    lengths = random.Random(1).sample(range(65, args.max_len + 1), args.lengths)
    if args.round:
        print(json.dumps(one_round(args.round, lengths)))
        return 0

    from common import print_table, write_result

    runs: list[dict] = []
    for r in range(args.rounds):
        for mode in ("grid", "exact") if r % 2 == 0 else ("exact", "grid"):
            cmd = [
                sys.executable,
                __file__,
                "--round",
                mode,
                "--lengths",
                str(args.lengths),
                "--max-len",
                str(args.max_len),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(runs[-1], flush=True)
    summary = {}
    for mode in ("grid", "exact"):
        mine = [x for x in runs if x["mode"] == mode]
        summary[mode] = {
            k: round(statistics.median(x[k] for x in mine), 1) for k in mine[0] if k != "mode"
        }
        summary[mode]["malloc_growth_mb"] = round(
            summary[mode]["malloc_mb_after_second_pass"] - summary[mode]["malloc_mb_start"], 1
        )
    rows = [
        (
            m,
            s["first_pass_tok_s"],
            s["second_pass_tok_s"],
            s["malloc_mb_start"],
            s["malloc_mb_after_second_pass"],
            s["malloc_growth_mb"],
        )
        for m, s in summary.items()
    ]
    print_table(
        f"prefill of {args.lengths} distinct lengths 65..{args.max_len} (medians of {args.rounds} "
        "rounds)",
        rows,
        ("rows", "1st pass tok/s", "2nd pass tok/s", "malloc MB start", "after", "growth"),
    )
    ratios = {
        k: round(summary["grid"][k] / summary["exact"][k], 3)
        for k in ("first_pass_tok_s", "second_pass_tok_s")
    }
    print("grid / exact:", ratios)
    write_result(
        args.name,
        {"config": vars(args), "runs": runs, "median": summary, "grid_over_exact": ratios},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
