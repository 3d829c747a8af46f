"""Serving benchmark: the HTTP server under a chat workload, and DSL programs in process vs remote.

1. A request-rate sweep on a chat workload: N short chat requests (default 48; distinct,
   deterministic questions, `max_tokens` 32, greedy) streamed from `/v1/chat/completions`
   with `aiohttp`, arriving as a Poisson process at each rate of the sweep (default 1, 2, 4,
   8 req/s and `inf` = all at once; fixed seed; the radix cache is flushed before each rate).
   Per rate: completed requests, duration, request and output-token throughput, TTFT (to
   the first content delta), TPOT ((e2e - TTFT) / (tokens - 1), requests with more than one
   token) and end-to-end latency, p50 / p99. Output tokens come from the final usage chunk
   (`stream_options.include_usage`).
2. The `bench_programs.py` programs run once with `sgl.as_backend(engine)` and once with
   `sgl.RuntimeEndpoint(url)` on the same engine: `few_shot.run_batch` over `--dsl-items`
   items, the 4-way `four_questions` fork program over `--dsl-items // 8` documents, and
   `--dsl-items` sequential `one_gen` calls. The cache is flushed before each run; the two
   sides alternate for `--repeats` rounds and the best time of each counts. Reported: seconds
   and the remote overhead (remote / in process - 1; target <= 20%), and whether the greedy
   answers are identical.

The server runs in this process (one `sgl.Engine(model_path="default")`, `create_app`, uvicorn
in a background thread on 127.0.0.1 and a free port) so the benchmark is self-contained: no
second process to start, find or clean up. The price is that the client, the server's event
loop and the engine share one interpreter (and its GIL), so the remote numbers include that
contention; a server in its own process would do no worse.

    .venv/bin/python benchmarks/bench_serving.py
    .venv/bin/python benchmarks/bench_serving.py --num-requests 8 --rates 2,inf --dsl-items 4 \
        --repeats 1 --out /tmp/serving-smoke.json   # a quick smoke test (keeps results/ as is)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import socket
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import requests
import uvicorn
from bench_programs import DOC, few_shot, four_questions, one_gen
from common import machine_info, print_table, write_result

import sgl
from sgl.server.app import create_app

SERVED_NAME = "default"

SUBJECTS = [
    "photosynthesis",
    "the French Revolution",
    "black holes",
    "compound interest",
    "the water cycle",
    "machine learning",
    "volcanoes",
    "the Roman Empire",
    "vaccines",
    "climate change",
    "jazz music",
    "the stock market",
    "honeybees",
    "the internet",
    "plate tectonics",
    "the Olympic Games",
]
TEMPLATES = [
    "Explain {} in two sentences.",
    "What is the most surprising fact about {}?",
    "Give me three quick tips for learning about {}.",
    "Why does {} matter to ordinary people?",
]


def chat_prompts(n: int, seed: int = 0) -> list[str]:
    """n user questions: the distinct subject x template pairs in a fixed shuffled order
    (cycled)."""
    pool = [t.format(s) for t in TEMPLATES for s in SUBJECTS]
    random.Random(seed).shuffle(pool)
    return [pool[i % len(pool)] for i in range(n)]


# ---------------------------------------------------------------------------- the server


class InProcessServer:
    """`create_app(engine)` served by uvicorn in a daemon thread on 127.0.0.1 (a free port)."""

    def __init__(self, engine: Any) -> None:
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
        # without it every response waits ~40 ms for a delayed ACK (Nagle).
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))  # bound here, so nothing else can take the port
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(
            create_app(engine, SERVED_NAME),
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=5,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def start(self, timeout: float = 60.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return self.url
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the in-process server did not become healthy")
            time.sleep(0.1)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


def flush(engine: Any, timeout: float = 30.0) -> None:
    """Flush the radix cache (refused while a request is still finishing: retry)."""
    deadline = time.monotonic() + timeout
    while not engine.flush_cache():
        if time.monotonic() > deadline:
            raise RuntimeError("flush_cache kept being refused (requests still in flight?)")
        time.sleep(0.05)


# ---------------------------------------------------------------------------- chat workload


async def chat_request(
    session: aiohttp.ClientSession, url: str, question: str, max_tokens: int
) -> dict:
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    rec: dict[str, Any] = {"ok": False, "ttft": None, "e2e": None, "tokens": 0, "error": None}
    start = time.perf_counter()
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                rec["error"] = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return rec
            done = False
            # SSE events are `data: {...}\n\n`; aiohttp yields the body line by line.
            async for raw in resp.content:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    rec["error"] = str(chunk["error"].get("message", chunk["error"]))[:200]
                    return rec
                for choice in chunk.get("choices") or []:
                    if rec["ttft"] is None and (choice.get("delta") or {}).get("content"):
                        rec["ttft"] = time.perf_counter() - start
                if chunk.get("usage"):
                    rec["tokens"] = chunk["usage"]["completion_tokens"]
            rec["e2e"] = time.perf_counter() - start
            if not done:
                rec["error"] = "the stream ended without [DONE]"
                return rec
    except (TimeoutError, aiohttp.ClientError, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        return rec
    if (
        rec["ttft"] is None
    ):  # no visible text at all (e.g. EOS first): the whole reply is the first token
        rec["ttft"] = rec["e2e"]
    rec["ok"] = True
    return rec


async def run_rate(
    url: str, prompts: list[str], rate: float, max_tokens: int, seed: int
) -> tuple[list[dict], float]:
    """Send every prompt, arrivals a Poisson process of `rate` per second (inf: all at once)."""
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for _ in prompts:
        offsets.append(t)
        if math.isfinite(rate):
            t += rng.expovariate(rate)
    connector = aiohttp.TCPConnector(limit=0)  # no client-side cap on concurrent connections
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None)
    ) as session:
        t0 = time.perf_counter()

        async def one(prompt: str, offset: float) -> dict:
            delay = t0 + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            return await chat_request(session, url, prompt, max_tokens)

        recs = await asyncio.gather(*(one(p, o) for p, o in zip(prompts, offsets)))
        duration = time.perf_counter() - t0
    return list(recs), duration


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(rate: float, recs: list[dict], duration: float) -> dict:
    ok = [r for r in recs if r["ok"]]
    ttft = [1000 * r["ttft"] for r in ok]
    e2e = [1000 * r["e2e"] for r in ok]
    tpot = [1000 * (r["e2e"] - r["ttft"]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1]
    tokens = sum(r["tokens"] for r in ok)
    errors = [r["error"] for r in recs if not r["ok"]]
    return {
        "rate": "inf" if math.isinf(rate) else rate,
        "requests": len(recs),
        "completed": len(ok),
        "failed": len(errors),
        "errors": errors[:5],
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_tokens": tokens,
        "output_throughput": tokens / duration,
        "ttft_ms_p50": pct(ttft, 50),
        "ttft_ms_p99": pct(ttft, 99),
        "tpot_ms_p50": pct(tpot, 50),
        "tpot_ms_p99": pct(tpot, 99),
        "e2e_ms_p50": pct(e2e, 50),
        "e2e_ms_p99": pct(e2e, 99),
    }


def bench_chat(
    engine: Any, url: str, n: int, rates: list[float], max_tokens: int, seed: int
) -> list[dict]:
    prompts = chat_prompts(n, seed)
    asyncio.run(run_rate(url, chat_prompts(2, seed + 1), math.inf, max_tokens, seed))  # warm-up
    rows = []
    for rate in rates:
        flush(engine)
        recs, duration = asyncio.run(run_rate(url, prompts, rate, max_tokens, seed))
        rows.append(summarize(rate, recs, duration))
    return rows


# ---------------------------------------------------------------------------- DSL programs


def prog_run_batch(backend: Any, n: int) -> list:
    items = [{"a": 10 + i, "b": 3 * i % 50} for i in range(n)]
    states = few_shot.run_batch(items, temperature=0, num_threads="auto", backend=backend)
    return [s["answer"] for s in states]


def prog_fork(backend: Any, n: int) -> list:
    out = []
    for i in range(n):
        s = four_questions.run(doc=f"Document {i}. " + DOC, temperature=0, backend=backend)
        out.append(s.text())
    return out


def prog_one_gen(backend: Any, n: int) -> list:
    return [
        one_gen.run(prompt=f"Item {i}: the number after {i} is", temperature=0, backend=backend)[
            "out"
        ]
        for i in range(n)
    ]


def bench_dsl(engine: Any, url: str, items: int, repeats: int) -> dict:
    backends = {"in process": sgl.as_backend(engine), "remote": sgl.RuntimeEndpoint(url)}
    programs = {
        f"few_shot.run_batch ({items} items)": (prog_run_batch, items),
        f"four_questions fork ({max(1, items // 8)} docs)": (prog_fork, max(1, items // 8)),
        f"one_gen sequential ({items} calls)": (prog_one_gen, items),
    }
    for be in backends.values():  # warm-up: thread pools, HTTP connections, first-call costs
        prog_run_batch(be, 2)
        prog_fork(be, 1)
        prog_one_gen(be, 2)
    out: dict[str, Any] = {}
    for name, (fn, n) in programs.items():
        times: dict[str, list[float]] = {k: [] for k in backends}
        answers: dict[str, list] = {}
        for rep in range(repeats):
            order = (
                list(backends) if rep % 2 == 0 else list(reversed(backends))
            )  # alternate who goes first
            for key in order:
                flush(engine)
                t = time.perf_counter()
                answers[key] = fn(backends[key], n)
                times[key].append(time.perf_counter() - t)
        local, remote = min(times["in process"]), min(times["remote"])
        same = sum(a == b for a, b in zip(answers["in process"], answers["remote"]))
        out[name] = {
            "n": n,
            "in_process_seconds": local,
            "remote_seconds": remote,
            "remote_overhead": remote / local - 1,
            "all_seconds": times,
            "identical_results": same,
            "results": len(answers["remote"]),
        }
    return out


# ---------------------------------------------------------------------------- main


def parse_rates(text: str) -> list[float]:
    rates = []
    for part in text.split(","):
        part = part.strip().lower()
        rates.append(math.inf if part in ("inf", "infinity") else float(part))
    if any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError("rates must be > 0 (or inf)")
    return rates


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def compare_modes(args: argparse.Namespace) -> None:
    """The chat sweep with the scheduler on a thread of the server and in its own process,
    alternating (thread, process, process, thread, ...) so a noisy machine's drift falls on both."""
    runs: dict[str, list] = {"thread": [], "process": []}
    for rnd in range(args.rounds):
        for mode in ("thread", "process") if rnd % 2 == 0 else ("process", "thread"):
            engine = sgl.Engine(model_path="default", scheduler_process=mode == "process")
            server = InProcessServer(engine)
            url = server.start()
            try:
                runs[mode].append(
                    bench_chat(
                        engine, url, args.num_requests, args.rates, args.max_tokens, args.seed
                    )
                )
            finally:
                server.stop()
                engine.shutdown()
    rows, summary = [], []
    for i, rate in enumerate(args.rates):
        best = {m: max(r[i]["output_throughput"] for r in rs) for m, rs in runs.items()}
        ttft = {m: min(r[i]["ttft_ms_p50"] or math.inf for r in rs) for m, rs in runs.items()}
        tpot = {m: min(r[i]["tpot_ms_p50"] or math.inf for r in rs) for m, rs in runs.items()}
        label = "inf" if math.isinf(rate) else rate
        summary.append(
            {
                "rate": label,
                "out_tok_s": best,
                "ttft_ms_p50": ttft,
                "tpot_ms_p50": tpot,
                "process_over_thread_throughput": best["process"] / best["thread"],
            }
        )
        rows.append(
            (
                label,
                f"{best['thread']:.1f}",
                f"{best['process']:.1f}",
                f"{best['process'] / best['thread']:.2f}",
                fmt(ttft["thread"]),
                fmt(ttft["process"]),
                fmt(tpot["thread"]),
                fmt(tpot["process"]),
            )
        )
    print_table(
        f"Chat workload, scheduler on a thread vs in its own process (best of {args.rounds}, "
        "interleaved)",
        rows,
        (
            "req/s",
            "thread tok/s",
            "process tok/s",
            "process/thread",
            "TTFT p50 thr",
            "TTFT p50 proc",
            "TPOT p50 thr",
            "TPOT p50 proc",
        ),
    )
    config = {
        **vars(args),
        "rates": ["inf" if math.isinf(r) else r for r in args.rates],
        "out": str(args.out) if args.out else None,
    }
    result = {"config": config, "summary": summary, "runs": runs}
    write_result("serving_modes", result, args.out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-requests", type=int, default=48, help="chat requests per rate")
    ap.add_argument(
        "--rates",
        type=parse_rates,
        default=parse_rates("1,2,4,8,inf"),
        help="comma-separated request rates in req/s; 'inf' sends all at once",
    )
    ap.add_argument("--max-tokens", type=int, default=32, help="max_tokens of each chat request")
    ap.add_argument(
        "--dsl-items",
        type=int,
        default=32,
        help="run_batch items and sequential one_gen calls; "
        "the fork program runs items // 8 documents",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="interleaved repetitions of each DSL program (best counts)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the JSON here instead of benchmarks/results/serving.json (for smoke tests)",
    )
    ap.add_argument(
        "--scheduler",
        choices=["thread", "process", "compare"],
        default="process",
        help="where the engine's scheduler runs (the server's default: its own process); compare: "
        "the chat sweep with each, --rounds times interleaved, into results/serving_modes.json",
    )
    ap.add_argument(
        "--rounds", type=int, default=2, help="interleaved rounds of --scheduler compare"
    )
    args = ap.parse_args()
    if args.scheduler == "compare":
        compare_modes(args)
        return

    engine = sgl.Engine(model_path="default", scheduler_process=args.scheduler == "process")
    server = InProcessServer(engine)
    url = server.start()
    config = {
        **vars(args),
        "rates": ["inf" if math.isinf(r) else r for r in args.rates],
        "out": str(args.out) if args.out else None,
        "server": (
            "uvicorn thread; scheduler in "
            f"{'its own process' if args.scheduler == 'process' else 'a thread'}"
        ),
    }
    results: dict[str, Any] = {"config": config}
    try:
        chat = bench_chat(engine, url, args.num_requests, args.rates, args.max_tokens, args.seed)
        results["chat"] = chat
        print_table(
            f"Chat workload: {args.num_requests} streamed /v1/chat/completions requests per rate, "
            f"max_tokens {args.max_tokens}, greedy, Poisson arrivals (ms)",
            [
                (
                    r["rate"],
                    f"{r['completed']}/{r['requests']}",
                    f"{r['duration_s']:.2f}",
                    f"{r['request_throughput']:.2f}",
                    f"{r['output_throughput']:.1f}",
                    fmt(r["ttft_ms_p50"]),
                    fmt(r["ttft_ms_p99"]),
                    fmt(r["tpot_ms_p50"]),
                    fmt(r["tpot_ms_p99"]),
                    fmt(r["e2e_ms_p50"]),
                    fmt(r["e2e_ms_p99"]),
                )
                for r in chat
            ],
            (
                "req/s",
                "done",
                "seconds",
                "req/s done",
                "out tok/s",
                "TTFT p50",
                "TTFT p99",
                "TPOT p50",
                "TPOT p99",
                "e2e p50",
                "e2e p99",
            ),
        )
        for r in chat:
            if r["failed"]:
                print(f"rate {r['rate']}: {r['failed']} failed, e.g. {r['errors'][0]}")

        dsl = bench_dsl(engine, url, args.dsl_items, args.repeats)
        results["dsl"] = dsl
        print_table(
            f"DSL programs in process vs through the server (best of {args.repeats}, interleaved)",
            [
                (
                    k,
                    f"{v['in_process_seconds']:.2f}",
                    f"{v['remote_seconds']:.2f}",
                    f"{100 * v['remote_overhead']:+.1f}%",
                    f"{v['identical_results']}/{v['results']}",
                )
                for k, v in dsl.items()
            ],
            ("program", "in process s", "remote s", "remote overhead", "identical"),
        )
        worst = max(v["remote_overhead"] for v in dsl.values())
        results["dsl_worst_overhead"] = worst
        print(f"worst remote overhead: {100 * worst:+.1f}% (target <= 20%)")
    finally:
        server.stop()
        engine.shutdown()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"benchmark": "serving", "machine": machine_info(), **results}, indent=2)
        )
        print(f"\nwrote {args.out}")
    else:
        write_result("serving", results)


if __name__ == "__main__":
    main()
