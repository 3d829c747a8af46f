"""Tensor parallelism on one CPU host: memory per rank, and speed at tp 1 vs tp N.

1. Memory: each rank's weights (`get_server_info()["rank_memory"]`: the tensors its model
   holds) and KV pool bytes for the same pool size, at tp 1 and tp N, for the embedded model
   (SmolLM2-135M: 9 query / 3 KV heads, cut 6 + 3 / 2 + 1 at N = 2, so rank 0 is the larger;
   dense float32 and its GGUF's int4 codes) and a random-weight Llama-3.2-1B body, N = 2.
   Target: weights per rank <= 0.55x of tp 1.
2. Speed on the 1B body (float32, greedy, ignore_eos), every engine with its scheduler in its
   own process(es): batch-1 decode (ms per output token), a decode batch (output tokens/s)
   and a prefill (prompt tokens/s), for tp 1 on 1 thread, tp 1 on all cores, and tp N on
   cores / N threads per rank. Configurations alternate over `--rounds` (best counts), so a
   noisy machine's drift falls on all of them.

    .venv/bin/python benchmarks/bench_tp.py [--rounds 2] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from common import print_table, write_result

import sgl

ONE_B = {  # Llama-3.2-1B's body with the embedded model's vocabulary (as bench_cpu_peers.py)
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
POOL = 4096


def engine(model: dict[str, Any], tp: int, threads: int | None = None) -> sgl.Engine:
    """An engine with its scheduler in its own process(es). `threads` caps a tp-1 process's
    torch threads (it inherits OMP_NUM_THREADS); tp ranks split the cores themselves."""
    old = os.environ.get("OMP_NUM_THREADS")
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        return sgl.Engine(**model, max_total_tokens=POOL, tp_size=tp, scheduler_process=True)
    finally:
        if threads is not None:
            os.environ.pop("OMP_NUM_THREADS") if old is None else os.environ.__setitem__(
                "OMP_NUM_THREADS", old
            )


def memory(model: dict[str, Any], tp: int) -> dict[str, Any]:
    with engine(model, tp) as e:
        ranks = e.get_server_info()["rank_memory"]
    return {
        "tp": tp,
        "ranks": ranks,
        "max_weight_mb": max(r["weight_bytes"] for r in ranks) / 2**20,
        "max_kv_mb": max(r["kv_pool_bytes"] for r in ranks) / 2**20,
    }


def speed(e: sgl.Engine, quick: bool) -> dict[str, float]:
    new = 16 if quick else 48
    greedy = {"temperature": 0, "ignore_eos": True}
    prompt = list(range(1000, 1032))
    e.generate(input_ids=prompt, sampling_params={**greedy, "max_new_tokens": 4})  # warm-up
    out = e.generate(input_ids=prompt, sampling_params={**greedy, "max_new_tokens": new})
    m = out["meta_info"]
    tpot_ms = 1000 * (m["e2e_latency"] - m["ttft"]) / (m["completion_tokens"] - 1)
    batch = [list(range(2000 + 100 * i, 2032 + 100 * i)) for i in range(8)]
    t = time.perf_counter()
    outs = e.generate(input_ids=batch, sampling_params={**greedy, "max_new_tokens": new})
    decode_tps = sum(o["meta_info"]["completion_tokens"] for o in outs) / (time.perf_counter() - t)
    long = [5000 + (i % 3000) for i in range(256 if quick else 1024)]
    e.flush_cache()
    t = time.perf_counter()
    e.generate(input_ids=long, sampling_params={**greedy, "max_new_tokens": 1})
    prefill_tps = len(long) / (time.perf_counter() - t)
    return {
        "batch1_ms_per_token": tpot_ms,
        "decode_batch8_tok_s": decode_tps,
        "prefill_tok_s": prefill_tps,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer tokens (a smoke run)")
    ap.add_argument(
        "--memory-only", action="store_true", help="skip the timed part (memory holds under load)"
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        one_b_config = Path(tmp) / "llama-3.2-1b-body.json"
        one_b_config.write_text(json.dumps(ONE_B))
        one_b = dict(model_path=str(one_b_config), load_format="dummy", dtype="float32")
        embedded = {
            "float32": dict(model_path="default", dtype="float32", quantization="none"),
            "int4 (GGUF codes)": dict(model_path="default", dtype="float32", quantization="auto"),
        }
        mem: dict[str, Any] = {}
        for name, model, n in [
            *((f"embedded {k}", v, 2) for k, v in embedded.items()),
            ("1B float32", one_b, 2),
        ]:
            base, split = memory(model, 1), memory(model, n)
            mem[name] = {
                "tp1": base,
                "tpN": split,
                "weights_ratio": split["max_weight_mb"] / base["max_weight_mb"],
                "kv_ratio": split["max_kv_mb"] / base["max_kv_mb"],
            }
        configs = {
            "tp1, 1 thread": (1, 1),
            f"tp1, {cores} threads": (1, None),
            f"tp2, {cores // 2} thread(s) each": (2, None),
        }
        runs: dict[str, list] = {k: [] for k in configs}
        for rnd in range(0 if args.memory_only else args.rounds):
            order = list(configs) if rnd % 2 == 0 else list(reversed(configs))
            for name in order:
                tp, threads = configs[name]
                with engine(one_b, tp, threads) as e:
                    runs[name].append(speed(e, args.quick))
    runs = {name: rs for name, rs in runs.items() if rs}
    best = {
        name: {
            "batch1_ms_per_token": min(r["batch1_ms_per_token"] for r in rs),
            "decode_batch8_tok_s": max(r["decode_batch8_tok_s"] for r in rs),
            "prefill_tok_s": max(r["prefill_tok_s"] for r in rs),
        }
        for name, rs in runs.items()
    }
    print_table(
        f"Memory per rank (MiB, the largest rank; KV pool of {POOL} tokens)",
        [
            (
                name,
                v["tpN"]["tp"],
                f"{v['tp1']['max_weight_mb']:.1f}",
                f"{v['tpN']['max_weight_mb']:.1f}",
                f"{v['weights_ratio']:.2f}",
                f"{v['tp1']['max_kv_mb']:.1f}",
                f"{v['tpN']['max_kv_mb']:.1f}",
                f"{v['kv_ratio']:.2f}",
            )
            for name, v in mem.items()
        ],
        ("model", "N", "weights tp1", "weights tpN", "ratio", "KV tp1", "KV tpN", "ratio"),
    )
    if best:
        print_table(
            f"1B body, float32, best of {args.rounds} (interleaved)",
            [
                (
                    name,
                    f"{v['batch1_ms_per_token']:.1f}",
                    f"{v['decode_batch8_tok_s']:.2f}",
                    f"{v['prefill_tok_s']:.1f}",
                )
                for name, v in best.items()
            ],
            ("configuration", "batch-1 ms/token", "batch-8 out tok/s", "prefill tok/s"),
        )
    write_result(
        "tp",
        {
            "config": {
                **vars(args),
                "out": str(args.out) if args.out else None,
                "pool_tokens": POOL,
            },
            "memory": mem,
            "speed_best": best,
            "speed_runs": runs,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
