"""Scheduler overhead per step at batch 1: wall time of a decode step minus the time spent in
the model's forward (attention, matmuls, logits excluded), on the embedded model.

What is left is everything the engine does around the model: batch building, KV slot
bookkeeping, building the forward batch, sampling, detokenizing, stop checks, events and
delivery to the caller. The forward is timed by wrapping the model's `forward` (the same on
every version of the engine), so this script also measures older checkouts:

    .venv/bin/python benchmarks/bench_step_overhead.py [--tokens 128] [--repeats 5]
        [--name step_overhead]
    PYTHONPATH=/other/checkout .venv/bin/python benchmarks/bench_step_overhead.py --name other
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import print_table, random_prompts, write_result


def measure(engine, prompt: list[int], tokens: int) -> dict[str, float]:
    model = engine.model
    inner = model.forward
    spent = [0.0, 0]

    def timed_forward(*args, **kwargs):
        t = time.perf_counter()
        out = inner(*args, **kwargs)
        spent[0] += time.perf_counter() - t
        spent[1] += 1
        return out

    model.forward = timed_forward
    try:
        sp = {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}
        engine.generate(input_ids=prompt, sampling_params=sp)  # warm: same prompt, cached prefix
        spent[0], spent[1] = 0.0, 0
        t = time.perf_counter()
        out = engine.generate(input_ids=prompt, sampling_params=sp)
        wall = time.perf_counter() - t
    finally:
        del model.forward
    steps = spent[1]
    assert out["meta_info"]["completion_tokens"] == tokens
    return {
        "steps": steps,
        "step_ms": 1000 * wall / steps,
        "forward_ms": 1000 * spent[0] / steps,
        "overhead_ms": 1000 * (wall - spent[0]) / steps,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default="step_overhead")
    args = ap.parse_args()

    import sgl

    prompt = random_prompts(1, 32, 32, seed=3)[0]
    runs = []
    with sgl.Engine(model_path="default") as engine:
        for _ in range(args.repeats):
            runs.append(measure(engine, prompt, args.tokens))
    med = {
        k: statistics.median(r[k] for r in runs) for k in ("step_ms", "forward_ms", "overhead_ms")
    }
    print_table(
        f"batch-1 decode, {args.tokens} tokens, median of {args.repeats}",
        [(f"{med['step_ms']:.2f}", f"{med['forward_ms']:.2f}", f"{med['overhead_ms']:.3f}")],
        ("step ms", "model forward ms", "overhead ms (outside the forward)"),
    )
    write_result(
        args.name, {"tokens": args.tokens, "repeats": args.repeats, "median": med, "runs": runs}
    )


if __name__ == "__main__":
    main()
