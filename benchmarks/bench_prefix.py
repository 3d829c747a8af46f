"""Shared-prefix workload: 48 requests = one ~800-token few-shot prefix + a distinct short
question, 8 new tokens each, submitted together; radix cache on vs off, same run.

    .venv/bin/python benchmarks/bench_prefix.py
"""

from __future__ import annotations

import argparse
import random
import time

from common import print_table, write_result


def few_shot_prefix(engine, target_tokens: int) -> str:
    rng = random.Random(0)
    cities = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Delhi", "Quito", "Seoul", "Rome", "Accra"]
    text = "Answer each question with a short fact.\n\n"
    while len(engine.encode(text)) < target_tokens:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        c = rng.choice(cities)
        text += (
            f"Question: What is {a} plus {b}, and which country is {c} in?\n"
            f"Answer: {a + b}; {c} is a capital.\n\n"
        )
    return text


def run(engine, prompts: list[str], new_tokens: int) -> tuple[float, list[dict]]:
    engine.flush_cache()
    t = time.perf_counter()
    outs = engine.generate(
        prompts, {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    )
    return time.perf_counter() - t, outs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-requests", type=int, default=48)
    ap.add_argument("--prefix-tokens", type=int, default=800)
    ap.add_argument("--new-tokens", type=int, default=8)
    args = ap.parse_args()

    import sgl

    results = {}
    for name, disable in (("radix cache on", False), ("radix cache off", True)):
        engine = sgl.Engine(model_path="default", disable_radix_cache=disable)
        prefix = few_shot_prefix(engine, args.prefix_tokens)
        prompts = [
            f"{prefix}Question: What is {i} plus {2 * i + 3}, and which country is Bern "
            "in?\nAnswer:"
            for i in range(args.num_requests)
        ]
        engine.generate(prompts[0][-200:], {"max_new_tokens": 2})  # warm-up
        seconds, outs = run(engine, prompts, args.new_tokens)
        prompt_tokens = sum(o["meta_info"]["prompt_tokens"] for o in outs)
        cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
        results[name] = {
            "seconds": seconds,
            "prompt_tokens": prompt_tokens,
            "cached_tokens": cached,
            "cached_ratio": cached / prompt_tokens,
            "prefix_tokens": len(engine.encode(prefix)),
            "texts": [o["text"] for o in outs],
        }
        engine.shutdown()

    on, off = results["radix cache on"], results["radix cache off"]
    speedup = off["seconds"] / on["seconds"]
    same = on["texts"] == off["texts"]
    rows = [
        (
            name,
            f"{r['seconds']:.2f}",
            f"{r['prompt_tokens']}",
            f"{r['cached_tokens']}",
            f"{r['cached_ratio']:.1%}",
        )
        for name, r in results.items()
    ]
    print_table(
        f"{args.num_requests} requests sharing a {on['prefix_tokens']}-token prefix, "
        f"{args.new_tokens} new tokens",
        rows,
        ("engine", "seconds", "prompt tokens", "cached tokens", "cached ratio"),
    )
    print(
        f"speedup with radix cache: {speedup:.2f}x (target >= 4x); identical greedy outputs: {same}"
    )
    for r in results.values():
        r.pop("texts")
    write_result(
        "prefix",
        {"config": vars(args), "results": results, "speedup": speedup, "identical_outputs": same},
    )


if __name__ == "__main__":
    main()
