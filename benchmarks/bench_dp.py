"""Data parallelism on this machine: one sgl worker against `--dp-size 2` behind the real
sglang-router, with its cache_aware, round_robin and power_of_two policies.

Workload: `--tenants` tenants, each with its own ~1k-token system prompt, `--requests`
requests (a tenant and a short question each, 16 new tokens, greedy), sent at Poisson arrivals
of `--rate` requests/s, each streamed (TTFT is the first chunk). Per setup: the workers' prefix
cache hit rate (cached / (cached + computed) prompt tokens, from their /get_server_info),
output tokens/s, TTFT and end-to-end p50 / p99, requests per worker. Then the router's own
cost: a 1-token request straight to a worker and through the router, one at a time.

One worker gets both cores (2 threads); under dp=2 each worker gets one core (its affinity).

    .venv/bin/python benchmarks/bench_dp.py [--requests 200] [--rate 3] [--tenants 8] [--name dp]

Results: results/dp.json (at 3 requests/s: below what one worker serves, so TTFT tells the
setups apart), results/dp_saturated.json (--rate 12: above it, so throughput does).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import free_port, print_table, stop_process, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SETUPS = {
    "1 worker": None,
    "dp2 cache_aware": "cache_aware",
    "dp2 round_robin": "round_robin",
    "dp2 power_of_two": "power_of_two",
}


def workload(tenants: int, n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = (
        "river stone market ledger orbit candle harbor signal meadow copper lantern valley".split()
    )
    prompts = [
        f"System {t}: you assist tenant {t}. " + " ".join(rng.choice(words) for _ in range(700))
        for t in range(tenants)
    ]
    return [
        f"{rng.choice(prompts)}\nUser: question {i} about {rng.choice(words)}?\nAssistant:"
        for i in range(n)
    ]


def start(policy: str | None, port: int) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "sgl.launch_server",
        "--model-path",
        "default",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    if policy:
        cmd += ["--dp-size", "2", "--router-policy", policy]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def worker_urls(policy: str | None, port: int) -> list[str]:
    return (
        [f"http://127.0.0.1:{port}"]
        if policy is None
        else [f"http://127.0.0.1:{port + 1 + i}" for i in range(2)]
    )


def ready(url: str, workers: list[str], routed: bool) -> bool:
    try:
        if not all(requests.get(w + "/health", timeout=2).status_code == 200 for w in workers):
            return False
        return not routed or requests.get(url + "/workers", timeout=2).text.count(
            '"is_healthy":true'
        ) == len(workers)
    except requests.RequestException:
        return False


def one(url: str, text: str, out: list) -> None:
    body = {
        "text": text,
        "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    with requests.post(url + "/generate", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for raw in r.iter_lines():  # bytes: split on SSE's line endings only, then decode
            line = raw.decode("utf-8")
            if line.startswith("data: {"):
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                tokens = json.loads(line[6:])["meta_info"]["completion_tokens"]
    out.append((ttft, time.perf_counter() - t0, tokens))


def counters(workers: list[str]) -> list[dict]:
    return [requests.get(w + "/get_server_info", timeout=30).json() for w in workers]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)


def run_setup(policy: str | None, texts: list[str], rate: float) -> dict:
    port = free_port()
    proc = start(policy, port)
    url, workers = f"http://127.0.0.1:{port}", worker_urls(policy, port)
    try:
        deadline = time.monotonic() + 900
        while not ready(url, workers, policy is not None):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{policy or '1 worker'} did not start")
            time.sleep(0.5)
        one(url, "Warm up.", [])
        before = counters(workers)
        rng, results, threads = random.Random(1), [], []
        t0 = time.perf_counter()
        for text in texts:
            th = threading.Thread(target=one, args=(url, text, results))
            th.start()
            threads.append(th)
            time.sleep(rng.expovariate(rate))
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
        after = counters(workers)
        cached = sum(a["cached_tokens"] - b["cached_tokens"] for a, b in zip(after, before))
        computed = sum(a["prefill_tokens"] - b["prefill_tokens"] for a, b in zip(after, before))
        overhead = router_overhead(url, workers[0]) if policy else None
        return {
            "requests": len(results),
            "cache_hit_rate": round(cached / max(1, cached + computed), 3),
            "output_tok_s": round(sum(r[2] for r in results) / wall, 1),
            "ttft_p50": pct([r[0] for r in results], 0.5),
            "ttft_p99": pct([r[0] for r in results], 0.99),
            "e2e_p50": pct([r[1] for r in results], 0.5),
            "e2e_p99": pct([r[1] for r in results], 0.99),
            "per_worker": [
                a["finished_requests"] - b["finished_requests"] for a, b in zip(after, before)
            ],
            "router_overhead_ms": overhead,
        }
    finally:
        stop_process(proc)


def router_overhead(router: str, worker: str, n: int = 30) -> float:
    """Median extra milliseconds of a 1-token request through the router (interleaved pairs)."""
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    diffs = []
    for _ in range(n):
        times = []
        for url in (worker, router):
            t = time.perf_counter()
            requests.post(url + "/generate", json=body, timeout=60).raise_for_status()
            times.append(time.perf_counter() - t)
        diffs.append(times[1] - times[0])
    return round(statistics.median(diffs) * 1000, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rate", type=float, default=3.0, help="Poisson arrivals, requests/s")
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--name", default="dp", help="results/<name>.json")
    args = ap.parse_args()
    texts = workload(args.tenants, args.requests)
    results = {}
    for name in args.setups.split(","):
        print(f"{name} ...", flush=True)
        results[name] = run_setup(SETUPS[name], texts, args.rate)
        print(f"  {results[name]}", flush=True)
    keys = (
        "cache_hit_rate",
        "output_tok_s",
        "ttft_p50",
        "ttft_p99",
        "e2e_p50",
        "e2e_p99",
        "per_worker",
        "router_overhead_ms",
    )
    print_table(
        f"{args.requests} requests of {args.tenants} tenants at {args.rate}/s",
        [(k, *(results[s][k] for s in results)) for k in keys],
        ("", *results),
    )
    write_result(args.name, {"config": vars(args), "results": results})


if __name__ == "__main__":
    main()
