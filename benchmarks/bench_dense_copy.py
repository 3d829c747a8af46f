"""The default engine (int4 codes from the Q4_1 file) with and without dense bf16 copies of its
quantized layers (`dense_copy`, sgl/runtime/model/dense_copy.py), beside the dense model
(`quantization="none"`): decode tokens/s at batch 1, 8, 16 and 48 (64 new tokens a request,
greedy, ignore_eos), one 1,000-token prefill, and the model's bytes.

Each variant runs in a fresh process (eager, as `Engine` defaults; `--torch-compile`: decode
steps compiled, as `make serve` runs, where each quantized layer's C++ op takes the copy),
variants interleaved over `--rounds` (this machine drifts 20-30% between minutes); medians reported.

    .venv/bin/python benchmarks/bench_dense_copy.py --rounds 2 [--torch-compile]

Results: results/dense_copy.json (dense_copy_compiled.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_info, print_table, python_child, write_result  # noqa: E402

BATCHES = (1, 8, 16, 48)
VARIANTS = {
    "int4": {"dense_copy": "off"},
    "int4+copy": {"dense_copy": "auto"},
    "dense": {"quantization": "none"},
}
CHILD = r"""
import json, random, sys, time, sgl
kwargs, batches = json.loads(sys.argv[1]), json.loads(sys.argv[2])
e = sgl.Engine(model_path="default", **kwargs)
rng = random.Random(0)
prompt = lambda n: [rng.randrange(1000, 20000) for _ in range(n)]
greedy = {"temperature": 0, "ignore_eos": True}
warmup = [prompt(32) for _ in range(4)]
e.generate(input_ids=warmup, sampling_params={"max_new_tokens": 8, **greedy})
out = {}
for b in batches:
    ids = [prompt(rng.randint(24, 64)) for _ in range(b)]
    t = time.perf_counter()
    e.generate(input_ids=ids if b > 1 else ids[0], sampling_params={"max_new_tokens": 64, **greedy})
    out[f"decode_b{b}_tok_s"] = round(b * 64 / (time.perf_counter() - t), 1)
t = time.perf_counter()
e.generate(input_ids=prompt(1000), sampling_params={"max_new_tokens": 1, **greedy})
out["prefill_1000_s"] = round(time.perf_counter() - t, 3)
info = e.get_server_info()
out["weight_bytes"] = info["rank_memory"][0]["weight_bytes"]
out["dense_copy_bytes"] = info["dense_copy_bytes"]
print(json.dumps(out))
e.shutdown()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--torch-compile", action="store_true", help="compile the decode steps in every variant"
    )
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for name, kwargs in VARIANTS.items():
            kwargs = {**kwargs, "torch_compile": args.torch_compile}
            runs[name].append(python_child(CHILD, [json.dumps(kwargs), json.dumps(list(BATCHES))]))
            print(f"round {r} {name}: {runs[name][-1]}", flush=True)
    keys = list(runs["int4"][0])
    summary = {
        v: {k: round(statistics.median(x[k] for x in rs), 3) for k in keys}
        for v, rs in runs.items()
    }
    print_table(
        "medians", [(v, *(s[k] for k in keys)) for v, s in summary.items()], ("variant", *keys)
    )
    write_result(
        "dense_copy_compiled" if args.torch_compile else "dense_copy",
        {"machine": machine_info(), "config": vars(args), "runs": runs, "summary": summary},
    )


if __name__ == "__main__":
    main()
