"""CPU attention backends side by side on the embedded model (float32): `cpu` (our C++ kernel,
one call per layer for all short rows, context read from the pool by slot) vs `torch_native`
(torch SDPA over a dense mirror of the contexts).

Measured per backend, same run, each in a fresh engine (rounds alternate the backends; the
best of the rounds is kept):
1. decode time per step at batch 1, 8 and 32 (a 33-token generation minus a 1-token one);
2. prefill of 32 short prompts (30-90 tokens, max_new_tokens=1);
3. the JSON extraction of bench_json.py (32 texts, jump-forward on and off), whose mixed
   steps (decodes + short jump-forward extends) are what the kernel was written for.

    .venv/bin/python benchmarks/bench_cpu_attention.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import time

from bench_json import SCHEMA, prompt, run_engine, texts
from common import print_table, random_prompts, write_result

BACKENDS = ("torch_native", "cpu")


def decode_ms_per_step(engine, batch: list[list[int]], steps: int = 32) -> float:
    def timed(n: int) -> float:
        engine.flush_cache()
        t = time.perf_counter()
        engine.generate(
            input_ids=batch,
            sampling_params={"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
        )
        return time.perf_counter() - t

    return 1000 * (timed(steps + 1) - timed(1)) / steps


def measure(backend: str) -> dict[str, float]:
    import sgl

    engine = sgl.Engine(model_path="default", dtype="float32", attention_backend=backend)
    assert engine.get_server_info()["attention_backend"] == backend
    out: dict[str, float] = {}
    engine.generate(
        input_ids=random_prompts(2, 10, 20, seed=9), sampling_params={"max_new_tokens": 4}
    )  # warm-up
    for bs in (1, 8, 32):
        out[f"decode ms/step, batch {bs}"] = decode_ms_per_step(
            engine, random_prompts(bs, 60, 120, seed=bs)
        )
    prompts = random_prompts(32, 30, 90, seed=1)
    engine.flush_cache()
    t = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 1})
    out["prefill 32 short prompts, s"] = time.perf_counter() - t

    json_prompts = [prompt(engine.tokenizer, x) for x in texts(32)]
    params = {"json_schema": json.dumps(SCHEMA), "temperature": 0, "max_new_tokens": 128}
    engine.generate(json_prompts[:2], params)  # compiles the schema
    for jf in (True, False):
        engine.update_options(disable_jump_forward=not jf)
        seconds, _, _ = run_engine(engine, json_prompts, params)
        out[f"JSON, jump-forward {'on' if jf else 'off'}, s"] = seconds
    engine.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    runs: dict[str, list[dict[str, float]]] = {b: [] for b in BACKENDS}
    for _ in range(args.rounds):
        for b in BACKENDS:  # one engine at a time: two scheduler threads would share the cores
            runs[b].append(measure(b))
    best = {b: {k: min(r[k] for r in runs[b]) for k in runs[b][0]} for b in BACKENDS}
    for b in BACKENDS:
        best[b]["JSON jump-forward speedup"] = (
            best[b]["JSON, jump-forward off, s"] / best[b]["JSON, jump-forward on, s"]
        )
    rows = []
    for k in best["cpu"]:
        a, c = best["torch_native"][k], best["cpu"][k]
        ratio = c / a if k.endswith("speedup") else a / c
        rows.append((k, f"{a:.2f}", f"{c:.2f}", f"{ratio:.2f}x"))
    print_table(
        f"CPU attention backends, embedded model, float32 (best of {args.rounds} rounds)",
        rows,
        ("measure", "torch_native", "cpu", "cpu speed-up"),
    )
    write_result("cpu_attention", {"config": vars(args), "best": best, "runs": runs})


if __name__ == "__main__":
    main()
