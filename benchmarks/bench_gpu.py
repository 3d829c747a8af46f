"""GPU benchmark: the sgl Engine on a Llama-3-8B-shaped model with dummy weights (bf16) against
HF transformers `generate` on the same shape (random init, bf16, sdpa), in one run.

Measures, for both: decode throughput at batch 1, 32 and 128 (512-token prompts, 128 new
tokens), and prefill tokens/s on one 4096-token prompt; and the memory-bandwidth floor of a
batch-1 decode step: the bytes of weights a step reads / the device-to-device copy bandwidth
measured here. Targets: batch-1 decode step within 1.4x of the floor; batch-128 decode
throughput >= 5x HF's. Writes benchmarks/results/gpu.json and gpu.md.

How each number is taken:
- sgl decode: the prompts are prefilled once (1 new token), then generated again for 128 new
  tokens: the prompts now come from the radix cache (all but their last token), so the timed
  run is the decode steps plus one batched single-token step, through the whole engine
  (scheduler, sampling, detokenization). tokens/s = batch x 128 / wall time.
- HF decode: generate(1 new token) and generate(1 + k new tokens) on the same batch; a step
  is their time difference / k (k fewer than 127 where HF is slow: the budget). No padding:
  all prompts have the same length.
- prefill: time to first token of one 4096-token prompt (sgl: chunk size 4096, cache flushed;
  HF: one forward computing only the last position's logits), best of 3.

    python3 benchmarks/bench_gpu.py                 # on a CUDA machine (benchmarks/gpu_check.sh)
    python3 benchmarks/bench_gpu.py --smoke         # tiny model on the CPU: runs the code paths
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # run from a checkout without installing

RESULTS_DIR = Path(__file__).resolve().parent / "results"
TARGET_BATCH1_VS_FLOOR = 1.4
TARGET_BATCH128_VS_HF = 5.0


@dataclass
class Workload:
    shape: str
    device: str
    dtype: str
    batch_sizes: list[int]
    input_len: int
    output_len: int
    prefill_len: int
    hf_decode_steps: dict[int, int]  # batch size -> timed HF decode steps
    copy_bytes: int
    repeats: int = 3
    notes: list[str] = field(default_factory=list)


def workload(args: argparse.Namespace) -> Workload:
    if args.smoke:
        return Workload(
            "tiny-llama", "cpu", "float32", [1, 4], 32, 8, 256, {1: 4, 4: 3}, 32 << 20, repeats=1
        )
    return Workload(
        args.shape,
        "cuda",
        "bfloat16",
        [1, 32, 128],
        512,
        128,
        4096,
        {1: 63, 32: 31, 128: 15},
        2 << 30,
    )


# ----------------------------------------------------------------------------- timing


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, fn: Callable[[], Any]) -> tuple[float, Any]:
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t, out


def copy_bandwidth(device: str, nbytes: int, repeats: int = 10) -> float:
    """Device memory bandwidth in bytes/s: a large tensor copy, bytes read + bytes written."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        t, _ = timed(device, lambda: dst.copy_(src))
        best = min(best, t)
    return 2 * nbytes / best


def free_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    hi = min(vocab, 100_000)
    return [[rng.randrange(1000 if hi > 2000 else 1, hi) for _ in range(length)] for _ in range(n)]


class Budget:
    """Wall-clock budget: phases past it are skipped and say so, instead of overrunning."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def allows(self, what: str, need_s: float, notes: list[str]) -> bool:
        if self.left() >= need_s:
            return True
        notes.append(
            f"skipped {what}: {self.left():.0f} s of the time budget left, needs ~{need_s:.0f} s"
        )
        print(notes[-1], flush=True)
        return False


# ----------------------------------------------------------------------------- sgl


def bench_sgl(w: Workload, args: argparse.Namespace, budget: Budget) -> dict[str, Any]:
    import sgl

    max_bs = max(w.batch_sizes)
    engine = sgl.Engine(
        model_path=w.shape,
        load_format="dummy",
        device=w.device,
        dtype=w.dtype,
        attention_backend=args.attention_backend,
        random_seed=0,
        max_running_requests=max_bs,
        max_total_tokens=max_bs * (w.input_len + w.output_len) + w.prefill_len + 1024,
        context_length=max(w.prefill_len, w.input_len + w.output_len) + 64,
        chunked_prefill_size=max(w.prefill_len, 2048),
        max_prefill_tokens=max(w.prefill_len, 16384),
    )
    info = engine.get_server_info()
    model = engine.model
    params = list(model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    embed = model.embed_tokens.weight
    # A decode step gathers a few rows of the input embedding; every other weight is read whole
    # (with tied embeddings the table is the LM head, read whole).
    step_bytes = weight_bytes - (
        0 if model.config.tie_word_embeddings else embed.numel() * embed.element_size()
    )
    vocab = model.config.vocab_size
    sp = {"temperature": 0, "ignore_eos": True}
    out: dict[str, Any] = {
        "attention_backend": info["attention_backend"],
        "cuda_graph_batch_sizes": info["cuda_graph_batch_sizes"],
        "max_total_tokens": info["max_total_tokens"],
        "weight_bytes": weight_bytes,
        "step_weight_bytes": step_bytes,
        "decode": {},
    }
    try:
        engine.generate(
            input_ids=prompts(2, 16, vocab, 99), sampling_params={**sp, "max_new_tokens": 4}
        )  # warm-up
        for bs in w.batch_sizes:
            if not budget.allows(f"sgl decode batch {bs}", 10, w.notes):
                continue
            batch = prompts(bs, w.input_len, vocab, seed=bs)
            engine.flush_cache()
            t_prefill, _ = timed(
                w.device,
                lambda batch=batch: engine.generate(
                    input_ids=batch, sampling_params={**sp, "max_new_tokens": 1}
                ),
            )
            t, outs = timed(
                w.device,
                lambda batch=batch: engine.generate(
                    input_ids=batch, sampling_params={**sp, "max_new_tokens": w.output_len}
                ),
            )
            tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
            steps = [
                (o["meta_info"]["e2e_latency"] - o["meta_info"]["ttft"])
                / (o["meta_info"]["completion_tokens"] - 1)
                for o in outs
                if o["meta_info"]["completion_tokens"] > 1
            ]
            out["decode"][bs] = {
                "tokens": tokens,
                "seconds": t,
                "tokens_per_s": tokens / t,
                "step_ms": 1000 * t / w.output_len,
                "step_ms_after_first_token": 1000 * max(steps) if steps else None,
                "cached_tokens": sum(o["meta_info"]["cached_tokens"] for o in outs),
                "prefill_seconds": t_prefill,
            }
            print(
                f"sgl decode batch {bs}: {tokens / t:.0f} tok/s, {1000 * t / w.output_len:.2f} "
                "ms/step",
                flush=True,
            )
        if budget.allows("sgl prefill", 10, w.notes):
            long = prompts(1, w.prefill_len, vocab, seed=7)[0]
            ttfts = []
            for _ in range(w.repeats):
                engine.flush_cache()
                o = engine.generate(input_ids=long, sampling_params={**sp, "max_new_tokens": 1})
                ttfts.append(o["meta_info"]["ttft"])
            out["prefill"] = {
                "tokens": w.prefill_len,
                "seconds": min(ttfts),
                "tokens_per_s": w.prefill_len / min(ttfts),
            }
            print(
                f"sgl prefill {w.prefill_len}: {w.prefill_len / min(ttfts):.0f} tok/s", flush=True
            )
        out["stats"] = {
            k: v
            for k, v in engine.get_server_info().items()
            if k in ("forward_steps", "cuda_graph_steps")
        }
    finally:
        engine.shutdown()
    return out  # the engine goes with this frame; main() then frees the memory it held


# ----------------------------------------------------------------------------- HF


def hf_model(w: Workload) -> Any:
    import transformers

    from sgl.runtime.model.dummy import dummy_hf_config

    cfg = dict(dummy_hf_config(w.shape))
    cfg.pop("architectures", None)
    cfg.pop("model_type", None)
    config = transformers.LlamaConfig(**cfg, attn_implementation="sdpa")
    with torch.device(w.device):
        model = transformers.LlamaForCausalLM._from_config(config, dtype=getattr(torch, w.dtype))
    return model.eval()


def bench_hf(w: Workload, budget: Budget) -> dict[str, Any]:
    import transformers

    out: dict[str, Any] = {
        "transformers": transformers.__version__,
        "attn_implementation": "sdpa",
        "decode": {},
    }
    model = hf_model(w)
    vocab = model.config.vocab_size
    dev = w.device

    def generate(ids: torch.Tensor, n: int) -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )

    generate(torch.tensor(prompts(2, 16, vocab, 99), device=dev), 4)  # warm-up
    for bs in w.batch_sizes:
        k = w.hf_decode_steps[bs]
        if not budget.allows(f"HF decode batch {bs}", 20, w.notes):
            continue
        ids = torch.tensor(prompts(bs, w.input_len, vocab, seed=bs), device=dev)
        t1 = min(timed(dev, lambda ids=ids: generate(ids, 1))[0] for _ in range(w.repeats))
        runs = [timed(dev, lambda ids=ids, k=k: generate(ids, 1 + k)) for _ in range(w.repeats)]
        tk, gen = min(runs, key=lambda r: r[0])
        assert gen.shape[1] == w.input_len + 1 + k
        if tk > t1:
            step = (tk - t1) / k
        # noise swamped the difference (tiny smoke shapes on a busy CPU): the whole run's mean
        else:
            step = tk / (1 + k)
            w.notes.append(
                f"HF decode batch {bs}: the {k}-step run was not slower than the 1-step run; "
                "step time is that run's mean over all its tokens"
            )
        out["decode"][bs] = {
            "timed_steps": k,
            "step_ms": 1000 * step,
            "tokens_per_s": bs / step,
            "prefill_and_first_token_seconds": t1,
        }
        print(
            f"HF decode batch {bs}: {bs / step:.0f} tok/s, {1000 * step:.2f} ms/step ({k} steps)",
            flush=True,
        )
    if budget.allows("HF prefill", 10, w.notes):
        ids = torch.tensor(prompts(1, w.prefill_len, vocab, seed=7), device=dev)
        best = float("inf")
        for _ in range(w.repeats):
            with torch.inference_mode():
                t, _ = timed(dev, lambda: model(input_ids=ids, logits_to_keep=1, use_cache=False))
            best = min(best, t)
        out["prefill"] = {
            "tokens": w.prefill_len,
            "seconds": best,
            "tokens_per_s": w.prefill_len / best,
        }
        print(f"HF prefill {w.prefill_len}: {w.prefill_len / best:.0f} tok/s", flush=True)
    return out


# ----------------------------------------------------------------------------- report


def summarize(w: Workload, sgl_r: dict, hf_r: dict | None, bandwidth: float) -> dict[str, Any]:
    floor_s = sgl_r["step_weight_bytes"] / bandwidth
    summary: dict[str, Any] = {"batch1_floor_ms": 1000 * floor_s}
    b1 = sgl_r["decode"].get(w.batch_sizes[0])
    if b1 is not None:
        summary["batch1_step_ms"] = b1["step_ms"]
        summary["batch1_step_vs_floor"] = b1["step_ms"] / (1000 * floor_s)
        summary["batch1_target_met"] = summary["batch1_step_vs_floor"] <= TARGET_BATCH1_VS_FLOOR
    if hf_r is not None:
        for bs, r in sgl_r["decode"].items():
            h = hf_r["decode"].get(bs)
            if h is not None:
                summary[f"batch{bs}_vs_hf"] = r["tokens_per_s"] / h["tokens_per_s"]
        top = max(w.batch_sizes)
        if f"batch{top}_vs_hf" in summary:
            summary["batch_max_target_met"] = summary[f"batch{top}_vs_hf"] >= TARGET_BATCH128_VS_HF
        if "prefill" in sgl_r and "prefill" in hf_r:
            summary["prefill_vs_hf"] = (
                sgl_r["prefill"]["tokens_per_s"] / hf_r["prefill"]["tokens_per_s"]
            )
    return summary


def markdown(result: dict[str, Any]) -> str:
    w, s, h, m = result["workload"], result["sgl"], result.get("hf"), result["summary"]
    lines = [
        f"# GPU benchmark: {result['device_name']}",
        "",
        f"{result['date']}; torch {result['torch']}, model shape `{w['shape']}` "
        f"({s['weight_bytes'] / 1e9:.2f} GB of "
        f"{w['dtype']} weights, dummy values); sgl attention backend `{s['attention_backend']}`, "
        "CUDA graphs for "
        f"batch sizes {s['cuda_graph_batch_sizes'] or 'none'}; HF transformers "
        f"{h['transformers'] if h else '-'} (sdpa).",
        "",
        f"## Decode ({w['input_len']}-token prompts, {w['output_len']} new tokens)",
        "",
        "| batch | sgl tok/s | sgl ms/step | HF tok/s | HF ms/step (steps timed) | sgl / HF |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for bs in w["batch_sizes"]:
        r = s["decode"].get(bs) or s["decode"].get(str(bs))
        hr = (h or {}).get("decode", {}).get(bs) if h else None
        ratio = m.get(f"batch{bs}_vs_hf")
        lines.append(
            f"| {bs} | {r['tokens_per_s']:.0f} | {r['step_ms']:.2f} | "
            if r
            else f"| {bs} | - | - | "
        )
        lines[-1] += (
            f"{hr['tokens_per_s']:.0f} | {hr['step_ms']:.2f} ({hr['timed_steps']}) | "
            if hr
            else "- | - | "
        )
        lines[-1] += f"{ratio:.2f}x |" if ratio is not None else "- |"
    lines += ["", f"## Prefill ({w['prefill_len']}-token prompt)", ""]
    if "prefill" in s:
        lines.append(
            f"- sgl: {s['prefill']['tokens_per_s']:.0f} tok/s "
            f"({1000 * s['prefill']['seconds']:.1f} ms)"
        )
    if h and "prefill" in h:
        lines.append(
            f"- HF: {h['prefill']['tokens_per_s']:.0f} tok/s "
            f"({1000 * h['prefill']['seconds']:.1f} ms)"
        )
    lines += [
        "",
        "## Targets",
        "",
        f"- copy bandwidth {result['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s; a batch-1 "
        "decode step reads "
        f"{s['step_weight_bytes'] / 1e9:.2f} GB of weights: floor {m['batch1_floor_ms']:.2f} ms",
    ]
    if "batch1_step_vs_floor" in m:
        lines.append(
            f"- batch-1 decode step {m['batch1_step_ms']:.2f} ms = "
            f"{m['batch1_step_vs_floor']:.2f}x the floor "
            f"(target <= {TARGET_BATCH1_VS_FLOOR}x): "
            f"{'met' if m['batch1_target_met'] else 'NOT met'}"
        )
    top = max(w["batch_sizes"])
    if f"batch{top}_vs_hf" in m:
        lines.append(
            f"- batch-{top} decode throughput {m[f'batch{top}_vs_hf']:.2f}x HF's (target >= "
            f"{TARGET_BATCH128_VS_HF}x): {'met' if m['batch_max_target_met'] else 'NOT met'}"
        )
    if result["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="tiny model, few steps, on the CPU: checks the code runs",
    )
    ap.add_argument(
        "--shape",
        default="llama3-8b",
        help="named model shape (sgl.runtime.model.dummy.NAMED_SHAPES)",
    )
    ap.add_argument("--attention-backend", default=os.environ.get("SGL_ATTENTION_BACKEND", "auto"))
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=300.0,
        help="wall-clock budget; later phases are skipped past it",
    )
    ap.add_argument(
        "--out-dir",
        default=None,
        help="default: benchmarks/results (a temporary folder with --smoke)",
    )
    args = ap.parse_args(argv)
    w = workload(args)
    if w.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device: run on a GPU machine, or pass --smoke")
    budget = Budget(args.budget_s)
    torch.manual_seed(0)
    bandwidth = copy_bandwidth(w.device, w.copy_bytes)
    print(f"{device_name(w.device)}: copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    sgl_r = bench_sgl(w, args, budget)
    free_memory(w.device)
    hf_r = None if args.skip_hf else bench_hf(w, budget)
    free_memory(w.device)
    result = {
        "benchmark": "gpu",
        "device_name": device_name(w.device),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "torch": torch.__version__,
        "smoke": args.smoke,
        "workload": {k: v for k, v in vars(w).items() if k != "notes"},
        "copy_bandwidth_bytes_per_s": bandwidth,
        "sgl": sgl_r,
        "hf": hf_r,
        "summary": summarize(w, sgl_r, hf_r, bandwidth),
        "notes": w.notes,
    }
    out_dir = (
        Path(args.out_dir)
        if args.out_dir
        else (Path(tempfile.mkdtemp(prefix="sgl-bench-gpu-")) if args.smoke else RESULTS_DIR)
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu.json").write_text(json.dumps(result, indent=2, default=str))
    (out_dir / "gpu.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {out_dir / 'gpu.json'} and {out_dir / 'gpu.md'}")
    return result


if __name__ == "__main__":
    main()
