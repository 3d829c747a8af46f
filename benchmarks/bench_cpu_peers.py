"""sgl on CPU side by side with llama.cpp, vLLM's CPU build and HF transformers.

Each engine runs in its own process, one after another, on the same token-id prompts:

    decode   48 prompts (24-64 tokens) x 96 new tokens, all submitted at once: tokens/s
    prefix   48 prompts = one ~1k-token prefix + 8 own tokens, 8 new tokens each: seconds
    batch1   one prompt, 128 new tokens: tokens/s (llama.cpp also by `llama-bench -n 128`)

Engines: sgl fp32 / bf16 (dense), int8 / int4 (weights quantized), each with the batch-1
decode forward compiled (`torch_compile=True`; load_s includes the compile); llama.cpp
`llama-server` (Q4_1 and Q8_0 GGUF, 16 slots, continuous batching, prompt cache on); vLLM CPU (bf16,
prefix caching on); HF transformers fp32 (static batches of 16; no prefix workload: it has
no prefix cache). Models: the embedded SmolLM2-135M (its Q4_1 file; a Q8_0 file and an HF
directory written from the same weights) and a Llama-3.2-1B body with random weights
(written once as HF bf16, Q4_1 and Q8_0 GGUF, so every engine loads the same weights; its
vocabulary is the embedded model's 49152 tokens, not Llama 3's 128256, since no other
tokenizer is on this machine). Peak RSS is each engine process's VmHWM.

    .venv/bin/python benchmarks/bench_cpu_peers.py [--models embedded,1b] [--engines ...] [--quick]
        [--workloads '1b=decode,batch1']  # a model's workloads (1B prefix run: llama.cpp ~15 min)

Peers: `../shared/tools/llama-server.sh` and `../shared/tools/vllm-cpu.sh` print them (built
once); a peer that cannot be had is reported as skipped. Results: results/cpu_peers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("SGL_BENCH_CACHE", Path.home() / ".cache" / "sgl" / "bench-cpu-peers"))
# The peers' build scripts; SGL_PEER_TOOLS names them for a checkout not beside ../shared.
TOOLS = Path(os.environ.get("SGL_PEER_TOOLS", ROOT.parent / "shared" / "tools"))
SGL_VARIANTS = {
    "sgl-fp32": ("float32", "none", "hf"),
    "sgl-bf16": ("bfloat16", "none", "hf"),
    "sgl-int8": ("bfloat16", "int8", "q8_0"),
    "sgl-int4": ("bfloat16", "auto", "q4_1"),
}
ENGINES = (*SGL_VARIANTS, "llama-q4_1", "llama-q8_0", "vllm-bf16", "hf-fp32")
ONE_B = {  # Llama-3.2-1B's body; the embedded model's vocabulary
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
    "torch_dtype": "bfloat16",
}


# ----------------------------------------------------------------------------- workloads


def workloads(quick: bool) -> dict:
    rng = random.Random(0)
    tok = lambda: rng.randrange(1000, 20000)  # noqa: E731 - ordinary, non-special tokens
    n = 16 if quick else 48
    prefix = [tok() for _ in range(1000)]
    return {
        "decode": {
            "prompts": [[tok() for _ in range(rng.randint(24, 64))] for _ in range(n)],
            "new": 96,
        },
        "prefix": {"prompts": [prefix + [tok() for _ in range(8)] for _ in range(n)], "new": 8},
        "batch1": {"prompts": [[tok() for _ in range(32)]], "new": 128},
    }


def peak_rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def tree_peak_rss_mb(pid: int | str = "self") -> float:
    """Sum of the peak RSS of a process and its descendants (vLLM runs its engine core in a
    child process): an upper bound of their peak together."""
    total = peak_rss_mb(pid)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        total += sum(tree_peak_rss_mb(child) for child in children)
    return total


def summarize(name: str, wall: float, tokens: int) -> dict:
    return {"seconds": round(wall, 3), "tokens": tokens, "tok_per_s": round(tokens / wall, 1)}


# ----------------------------------------------------------------------------- workers


def worker_sgl(args, wl: dict) -> dict:
    sys.path.insert(0, str(ROOT))
    import sgl

    dtype, quantization, _ = SGL_VARIANTS[args.engine]
    t = time.perf_counter()
    engine = sgl.Engine(
        model_path=args.model_file,
        dtype=dtype,
        quantization=quantization,
        max_total_tokens=24000,
        max_running_requests=64,
        torch_compile=True,
    )
    out = {
        "load_s": round(time.perf_counter() - t, 1),
        "info": {
            k: engine.get_server_info()[k]
            for k in (
                "dtype",
                "dtype_reason",
                "weight_layouts",
                "attention_backend",
                "torch_compile",
            )
        },
    }
    engine.generate(input_ids=[[5, 6, 7]] * 2, sampling_params={"max_new_tokens": 4})  # warm up
    for name, w in wl.items():
        engine.flush_cache()
        sp = {"max_new_tokens": w["new"], "temperature": 0, "ignore_eos": True}
        t = time.perf_counter()
        res = engine.generate(input_ids=w["prompts"], sampling_params=sp)
        wall = time.perf_counter() - t
        res = res if isinstance(res, list) else [res]
        out[name] = summarize(name, wall, sum(r["meta_info"]["completion_tokens"] for r in res))
    engine.shutdown()
    out["peak_rss_mb"] = round(peak_rss_mb(), 0)
    return out


def worker_vllm(args, wl: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t = time.perf_counter()
    llm = LLM(
        model=args.model_file,
        dtype="bfloat16",
        enable_prefix_caching=True,
        max_model_len=2048,
        max_num_seqs=64,
        seed=0,
    )
    out = {"load_s": round(time.perf_counter() - t, 1)}
    for name, w in wl.items():
        llm.reset_prefix_cache()
        sp = SamplingParams(max_tokens=w["new"], temperature=0, ignore_eos=True)
        prompts = [TokensPrompt(prompt_token_ids=p) for p in w["prompts"]]
        t = time.perf_counter()
        res = llm.generate(prompts, sp, use_tqdm=False)
        out[name] = summarize(
            name, time.perf_counter() - t, sum(len(r.outputs[0].token_ids) for r in res)
        )
    out["peak_rss_mb"] = round(tree_peak_rss_mb(), 0)  # with the engine core's process
    return out


def worker_hf(args, wl: dict) -> dict:
    import torch
    import transformers

    t = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model_file, dtype=torch.float32
    ).eval()
    out = {"load_s": round(time.perf_counter() - t, 1)}
    for name in [n for n in ("decode", "batch1") if n in wl]:
        w = wl[name]
        total, t = 0, time.perf_counter()
        for i in range(0, len(w["prompts"]), 16):
            batch = w["prompts"][i : i + 16]
            width = max(map(len, batch))
            ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])  # left padding
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
            with torch.no_grad():
                gen = model.generate(
                    ids,
                    attention_mask=mask,
                    max_new_tokens=w["new"],
                    min_new_tokens=w["new"],
                    do_sample=False,
                    pad_token_id=0,
                )
            total += (gen.shape[1] - width) * len(batch)
        out[name] = summarize(name, time.perf_counter() - t, total)
    if "prefix" in wl:
        out["prefix"] = {"skipped": "HF transformers has no prefix cache across requests"}
    out["peak_rss_mb"] = round(peak_rss_mb(), 0)
    return out


# ----------------------------------------------------------------------------- llama.cpp


def run_llama(binary: str, gguf: Path, wl: dict, port: int = 30177) -> dict:
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    cmd = [
        binary,
        "-m",
        str(gguf),
        "-t",
        "2",
        "-np",
        "16",
        "-c",
        str(16 * 1280),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "-cb",
        "--no-webui",
    ]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        while True:
            if proc.poll() is not None:
                return {"skipped": f"llama-server exited with {proc.returncode}"}
            try:
                if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        out = {"load_s": round(time.perf_counter() - t, 1)}

        def complete(prompt: list[int], new: int) -> int:
            body = json.dumps(
                {
                    "prompt": prompt,
                    "n_predict": new,
                    "temperature": 0,
                    "ignore_eos": True,
                    "cache_prompt": True,
                }
            ).encode()
            req = urllib.request.Request(
                url + "/completion", body, {"Content-Type": "application/json"}
            )
            return int(
                json.loads(urllib.request.urlopen(req, timeout=3600).read())["tokens_predicted"]
            )

        complete([5, 6, 7], 4)
        for name, w in wl.items():
            t = time.perf_counter()
            with ThreadPoolExecutor(len(w["prompts"])) as pool:
                got = sum(pool.map(lambda p, w=w: complete(p, w["new"]), w["prompts"]))
            out[name] = summarize(name, time.perf_counter() - t, got)
        out["peak_rss_mb"] = round(peak_rss_mb(proc.pid), 0)
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def llama_bench(binary: str, gguf: Path) -> float | None:
    bench = Path(binary).with_name("llama-bench")
    if not bench.exists():
        return None
    res = subprocess.run(
        [str(bench), "-m", str(gguf), "-t", "2", "-p", "0", "-n", "128", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    rows = json.loads(res.stdout) if res.returncode == 0 else []
    return round(float(rows[0]["avg_ts"]), 1) if rows else None


# ----------------------------------------------------------------------------- models


def prepare(model: str) -> dict[str, Path]:
    """The model's files: an HF directory (with tokenizer), a Q4_1 and a Q8_0 GGUF."""
    sys.path.insert(0, str(ROOT))
    import torch

    from sgl.runtime.model.gguf_export import write_llama_gguf
    from sgl.runtime.model.gguf_model import read_gguf
    from sgl.runtime.model.paths import resolve_model_path
    from sgl.runtime.tokenizer import load_tokenizer

    embedded = Path(resolve_model_path("default"))
    folder = CACHE / model
    files = {
        "hf": folder / "hf",
        "q4_1": folder / "model-Q4_1.gguf",
        "q8_0": folder / "model-Q8_0.gguf",
    }
    if model == "embedded":
        files["q4_1"] = embedded
    if all(p.exists() for p in files.values()):
        return files
    folder.mkdir(parents=True, exist_ok=True)
    if model == "embedded":
        config, state = read_gguf(embedded)
    else:
        config, gen = dict(ONE_B), torch.Generator().manual_seed(0)
        state = {
            name: torch.ones(shape) if "norm" in name else torch.randn(shape, generator=gen) * 0.02
            for name, shape in _hf_shapes(config).items()
        }
    from safetensors.torch import save_file

    files["hf"].mkdir(exist_ok=True)
    save_file(
        {k: v.to(torch.bfloat16).contiguous() for k, v in state.items()},
        str(files["hf"] / "model.safetensors"),
    )
    (files["hf"] / "config.json").write_text(
        json.dumps({**config, "torch_dtype": "bfloat16"}, indent=1)
    )
    load_tokenizer(str(embedded.parent), gguf_file=embedded.name).save_pretrained(files["hf"])
    for kind in ("q4_1", "q8_0"):
        if not files[kind].exists():
            write_llama_gguf(
                files[kind],
                config,
                state.items(),
                kind.upper(),
                tokenizer_from=embedded,
                embed_qtype="Q8_0",
            )
    return files


def _hf_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    h, i, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], h), "model.norm.weight": (h,)}
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
            }
        )
    return shapes


# ----------------------------------------------------------------------------- orchestration


def peer(tool: str) -> str | None:
    script = TOOLS / tool
    if not script.exists():
        return None
    res = subprocess.run([str(script)], capture_output=True, text=True, timeout=3600)
    path = res.stdout.strip().splitlines()[-1] if res.returncode == 0 and res.stdout.strip() else ""
    return path if path and Path(path).exists() else None


def run_worker(python: str, engine: str, model_file: Path, quick: bool, names: list[str]) -> dict:
    from common import vllm_cpu_env

    cmd = [
        python,
        __file__,
        "--worker",
        engine,
        "--model-file",
        str(model_file),
        "--workloads",
        ",".join(names),
    ]
    cmd += ["--quick"] if quick else []
    env = dict(os.environ, PYTHONPATH=str(ROOT), **vllm_cpu_env())
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    if res.returncode != 0 or not lines:
        return {"skipped": f"worker failed (rc {res.returncode}): {res.stderr.strip()[-400:]}"}
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="embedded,1b")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--quick", action="store_true", help="16 prompts instead of 48 (a smoke run)")
    ap.add_argument("--worker", default=None)
    ap.add_argument("--model-file", default=None)
    ap.add_argument(
        "--workloads",
        default="decode,prefix,batch1",
        help="per model, e.g. '1b=decode,batch1' (comma list; models not named run all)",
    )
    ap.add_argument("--name", default="cpu_peers")
    args = ap.parse_args()
    wl = workloads(args.quick)
    if args.worker:
        wl = {k: v for k, v in wl.items() if k in args.workloads.split(",")}
    if args.worker:
        fn = (
            worker_vllm
            if args.worker.startswith("vllm")
            else worker_hf
            if args.worker.startswith("hf")
            else worker_sgl
        )
        args.engine = args.worker
        print("RESULT " + json.dumps(fn(args, wl)), flush=True)
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import print_table, write_result

    llama, vllm = peer("llama-server.sh"), peer("vllm-cpu.sh")
    results: dict = {
        "workloads": {
            k: {
                "prompts": len(v["prompts"]),
                "new_tokens": v["new"],
                "prompt_tokens": sum(map(len, v["prompts"])),
            }
            for k, v in wl.items()
        }
    }
    per_model = dict(spec.split("=", 1) for spec in args.workloads.split(";") if "=" in spec)
    for model in args.models.split(","):
        files = prepare(model)
        names = per_model.get(model, "decode,prefix,batch1").split(",")
        mwl = {k: v for k, v in wl.items() if k in names}
        res = results[model] = {"workloads": names}
        for engine in args.engines.split(","):
            print(f"[{model}] {engine} ...", flush=True)
            if engine in SGL_VARIANTS:
                res[engine] = run_worker(
                    sys.executable, engine, files[SGL_VARIANTS[engine][2]], args.quick, names
                )
            elif engine.startswith("llama-"):
                gguf = files[engine.split("-", 1)[1]]
                res[engine] = (
                    run_llama(llama, gguf, mwl)
                    if llama
                    else {"skipped": "llama-server not available"}
                )
                if llama:
                    res[engine]["llama_bench_tg128"] = llama_bench(llama, gguf)
            elif engine == "vllm-bf16":
                res[engine] = (
                    run_worker(vllm, engine, files["hf"], args.quick, names)
                    if vllm
                    else {"skipped": "vLLM CPU not available"}
                )
            elif engine == "hf-fp32":
                res[engine] = run_worker(sys.executable, engine, files["hf"], args.quick, names)
            print(f"  {json.dumps(res[engine])[:300]}", flush=True)
        rows = []
        for engine, r in res.items():
            if engine == "workloads":
                continue

            def cell(w, key, r=r):
                return r.get(w, {}).get(key, "-") if isinstance(r.get(w), dict) else "-"

            rows.append(
                (
                    engine,
                    cell("decode", "tok_per_s"),
                    cell("prefix", "seconds"),
                    cell("batch1", "tok_per_s"),
                    r.get("llama_bench_tg128", "-"),
                    r.get("peak_rss_mb", "-"),
                    r.get("skipped", "")[:40],
                )
            )
        print_table(
            f"{model}",
            rows,
            (
                "engine",
                "decode tok/s",
                "prefix s",
                "batch-1 tok/s",
                "llama-bench tg128",
                "peak RSS MB",
                "skipped",
            ),
        )
        write_result(
            args.name, results
        )  # after each model, so an interrupted run keeps what it measured


if __name__ == "__main__":
    main()
