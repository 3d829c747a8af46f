"""Offline throughput: sgl Engine (all requests at once) vs HF transformers `generate`
(static left-padded batches of 16), same model, same run; plus batch-1 decode speed
against HF batch-1 and against the memory-bandwidth floor.

    .venv/bin/python benchmarks/bench_throughput.py [--num-prompts 48] [--new-tokens 96]
"""

from __future__ import annotations

import argparse
import time

import torch
from common import (
    hf_generate_static,
    load_hf_model,
    measure_copy_bandwidth,
    print_table,
    random_prompts,
    write_result,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--hf-batch-size", type=int, default=16)
    ap.add_argument("--batch1-tokens", type=int, default=64)
    args = ap.parse_args()

    import sgl

    prompts = random_prompts(args.num_prompts, 20, 80, seed=0)
    sp = {"max_new_tokens": args.new_tokens, "temperature": 0, "ignore_eos": True}

    engine = sgl.Engine(model_path="default", dtype="float32")
    engine.generate(input_ids=prompts[:2], sampling_params={**sp, "max_new_tokens": 4})  # warm-up
    engine.flush_cache()
    t = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=sp)
    sgl_time = time.perf_counter() - t
    sgl_tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)

    one = engine.generate(
        input_ids=prompts[0], sampling_params={**sp, "max_new_tokens": args.batch1_tokens}
    )
    m = one["meta_info"]
    sgl_b1 = (m["completion_tokens"] - 1) / (m["e2e_latency"] - m["ttft"])
    engine.shutdown()

    hf = load_hf_model("default")
    pad = hf.config.pad_token_id if hf.config.pad_token_id is not None else 0
    hf_generate_static(hf, prompts[:2], 4, 2, pad)  # warm-up
    t = time.perf_counter()
    hf_tokens = hf_generate_static(hf, prompts, args.new_tokens, args.hf_batch_size, pad)
    hf_time = time.perf_counter() - t

    # HF batch 1: time per decode step = (gen N tokens - gen 1 token) / (N - 1)
    ids = torch.tensor([prompts[0]])
    with torch.inference_mode():
        t = time.perf_counter()
        hf.generate(input_ids=ids, max_new_tokens=1, do_sample=False, pad_token_id=pad)
        t1 = time.perf_counter() - t
        t = time.perf_counter()
        hf.generate(
            input_ids=ids,
            max_new_tokens=args.batch1_tokens,
            min_new_tokens=args.batch1_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
        tn = time.perf_counter() - t
    hf_b1 = (args.batch1_tokens - 1) / (tn - t1)

    weight_bytes = sum(p.numel() * p.element_size() for p in hf.parameters())
    bw = measure_copy_bandwidth()
    floor_tps = bw / weight_bytes

    sgl_tps, hf_tps = sgl_tokens / sgl_time, hf_tokens / hf_time
    rows = [
        ("sgl Engine (all at once)", f"{sgl_tokens}", f"{sgl_time:.2f}", f"{sgl_tps:.1f}", "1.00x"),
        (
            f"HF generate (batches of {args.hf_batch_size})",
            f"{hf_tokens}",
            f"{hf_time:.2f}",
            f"{hf_tps:.1f}",
            f"{hf_tps / sgl_tps:.2f}x",
        ),
    ]
    print_table(
        f"Throughput: {args.num_prompts} prompts of 20-80 tokens, {args.new_tokens} new tokens "
        "each, fp32, CPU",
        rows,
        ("system", "tokens", "seconds", "tokens/s", "vs sgl"),
    )
    print(f"sgl / HF throughput ratio: {sgl_tps / hf_tps:.2f}x (target >= 2.0x)")
    rows = [
        ("sgl Engine", f"{sgl_b1:.1f}", f"{1000 / sgl_b1:.1f}", f"{sgl_b1 / floor_tps:.2f}"),
        ("HF generate", f"{hf_b1:.1f}", f"{1000 / hf_b1:.1f}", f"{hf_b1 / floor_tps:.2f}"),
        ("bandwidth floor", f"{floor_tps:.1f}", f"{1000 / floor_tps:.1f}", "1.00"),
    ]
    print_table(
        f"Batch-1 decode ({weight_bytes / 1e6:.0f} MB of weights, copy bandwidth {bw / 1e9:.1f} "
        "GB/s)",
        rows,
        ("system", "tokens/s", "ms/token", "fraction of floor"),
    )
    write_result(
        "throughput",
        {
            "config": vars(args),
            "sgl": {
                "tokens": sgl_tokens,
                "seconds": sgl_time,
                "tokens_per_s": sgl_tps,
                "batch1_tokens_per_s": sgl_b1,
            },
            "hf": {
                "tokens": hf_tokens,
                "seconds": hf_time,
                "tokens_per_s": hf_tps,
                "batch1_tokens_per_s": hf_b1,
            },
            "ratio_vs_hf": sgl_tps / hf_tps,
            "batch1_ratio_vs_hf": sgl_b1 / hf_b1,
            "weight_bytes": weight_bytes,
            "copy_bandwidth_bytes_per_s": bw,
            "batch1_floor_tokens_per_s": floor_tps,
        },
    )


if __name__ == "__main__":
    main()
