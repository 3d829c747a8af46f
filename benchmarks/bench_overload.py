"""Overload benchmark: 500 streaming chat clients at once against a server with a small
pool; the excess must be refused cleanly (429 + Retry-After), the rest served, nothing else.

Starts `python -m sgl.launch_server --model-path default --max-running-requests 32
--max-total-tokens 4096 --max-queued-requests 64` on 127.0.0.1 and a free port (with
`--max-queued-requests N` the server refuses a request with 429 and a Retry-After header when
more than max_running_requests + N are in flight; if this checkout's launch_server does not
know the flag yet, the run goes without it and says so). After a short warm-up, --clients
(default 500) streamed /v1/chat/completions requests (max_tokens 16, greedy, distinct
questions) are sent at the same moment. Each is classified:

* completed: 200 and a well-formed stream ending in a finish and `[DONE]`;
* refused: 429 with a `Retry-After` header (a non-negative number of seconds) and the
  OpenAI-style error body {"error": {"message", "type", "param", "code": 429}};
* other: anything else (another status, a 429 without Retry-After or without the body, an
  SSE error event, a cut stream, a timeout, a connection error). It must be 0.

Reported: the counts, TTFT (to the first event with content) and end-to-end latency p50/p99 of
the admitted requests, the time to serve the wave, the server's RSS and threads before and
after, and that afterwards it is idle with every KV slot free after /flush_cache. Writes key
"overload" of benchmarks/results/reliability.json (other keys kept), or --out.

    .venv/bin/python benchmarks/bench_overload.py
    .venv/bin/python benchmarks/bench_overload.py --clients 100 --out /tmp/overload.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from soak_driver import (
    SUBJECTS,
    TEMPLATES,
    ServerProcess,
    _pct,
    flush,
    poll,
    proc_status,
    server_env,
    server_info,
    write_reliability,
)

MODEL = "default"


def questions(n: int) -> list[str]:
    pool = [t.format(s) for t in TEMPLATES for s in SUBJECTS]
    return [f"{pool[i % len(pool)]} (#{i})" for i in range(n)]


async def client(
    http: aiohttp.ClientSession,
    url: str,
    question: str,
    max_tokens: int,
    go: asyncio.Event,
    timeout: float,
) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    rec: dict[str, Any] = {
        "outcome": "other",
        "status": None,
        "ttft": None,
        "e2e": None,
        "detail": "",
    }
    await go.wait()  # every client starts at the same moment
    start = time.perf_counter()
    try:
        async with http.post(
            url + "/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as r:
            rec["status"] = r.status
            if r.status == 429:
                raw = await r.read()
                retry = r.headers.get("Retry-After")
                try:
                    err = json.loads(raw)["error"]
                    body_ok = (
                        set(err) == {"message", "type", "param", "code"}
                        and err["code"] == 429
                        and isinstance(err["message"], str)
                        and bool(err["message"])
                    )
                except (ValueError, KeyError, TypeError):
                    body_ok = False
                try:
                    retry_ok = retry is not None and float(retry) >= 0
                except ValueError:
                    retry_ok = False
                rec["retry_after"] = retry
                if body_ok and retry_ok:
                    rec["outcome"] = "refused"
                else:
                    rec["detail"] = f"429 with Retry-After {retry!r} and body {raw[:300]!r}"
                rec["e2e"] = time.perf_counter() - start
                return rec
            if r.status != 200:
                rec["detail"] = f"HTTP {r.status}: {(await r.read())[:300]!r}"
                return rec
            done, finish = False, None
            async for raw in r.content:
                line = raw.decode("utf-8").rstrip("\r\n")
                if not line:
                    continue
                if not line.startswith("data: "):
                    rec["detail"] = f"not an SSE data line: {line[:200]!r}"
                    return rec
                data = line[len("data: ") :]
                if data == "[DONE]":
                    done = True
                    continue
                ev = json.loads(data)
                if "error" in ev:
                    rec["detail"] = f"SSE error event: {data[:300]}"
                    return rec
                for ch in ev.get("choices") or []:
                    if rec["ttft"] is None and (ch.get("delta") or {}).get("content"):
                        rec["ttft"] = time.perf_counter() - start
                    if ch.get("finish_reason") is not None:
                        finish = ch["finish_reason"]
            rec["e2e"] = time.perf_counter() - start
            if not done or finish not in ("stop", "length"):
                rec["detail"] = f"stream ended: [DONE] {done}, finish_reason {finish!r}"
                return rec
            if rec["ttft"] is None:
                rec["ttft"] = rec["e2e"]
            rec["outcome"] = "completed"
            return rec
    except TimeoutError:
        rec["detail"] = f"timed out after {time.perf_counter() - start:.1f}s"
    except (aiohttp.ClientError, ValueError) as e:
        rec["detail"] = f"{type(e).__name__}: {e}"
    return rec


async def wave(
    url: str, n: int, max_tokens: int, timeout: float, offset: int = 0
) -> tuple[list[dict], float]:
    go = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        tasks = [
            asyncio.ensure_future(client(http, url, q, max_tokens, go, timeout))
            for q in questions(n + offset)[offset:]
        ]
        await asyncio.sleep(0)  # let every client reach go.wait()
        t0 = time.perf_counter()
        go.set()
        recs = await asyncio.gather(*tasks)
        return list(recs), time.perf_counter() - t0


async def settle(url: str, timeout: float) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:

        async def idle():
            info = await server_info(http, url)
            return info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0, info

        idle_ok, idle_s, _ = await poll("idle", idle, timeout)
        flushed = await flush(http, url, timeout)
        info = await server_info(http, url)
    return {
        "idle": idle_ok,
        "idle_wait_s": round(idle_s, 2),
        "flush_ok": flushed,
        "kv_free_after_flush": info["available_kv_tokens"],
        "max_total_tokens": info["max_total_tokens"],
        "kv_pool_full_after_flush": flushed
        and info["available_kv_tokens"] == info["max_total_tokens"],
        "retractions": info["retractions"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-running-requests", type=int, default=32)
    ap.add_argument("--max-total-tokens", type=int, default=4096)
    ap.add_argument(
        "--max-queued-requests",
        type=int,
        default=64,
        help="passed to the server when its launch_server knows the flag; <0: never pass it",
    )
    ap.add_argument("--timeout", type=float, default=1800.0, help="per-client limit in seconds")
    ap.add_argument("--model-path", default="default")
    ap.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="an extra launch_server argument (repeatable)",
    )
    ap.add_argument(
        "--log", type=Path, default=None, help="the server's log file (default: a temporary file)"
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the JSON here instead of merging into benchmarks/results/reliability.json",
    )
    args = ap.parse_args()

    flag_known = ServerProcess.supports("--max-queued-requests")
    use_flag = flag_known and args.max_queued_requests >= 0
    if not flag_known:
        print(
            "NOTE: this launch_server has no --max-queued-requests: running without it (no 429s "
            "expected)"
        )
    server_args = [
        "--model-path",
        args.model_path,
        "--max-running-requests",
        str(args.max_running_requests),
        "--max-total-tokens",
        str(args.max_total_tokens),
        "--log-level",
        "warning",
        *(["--max-queued-requests", str(args.max_queued_requests)] if use_flag else []),
        *[a for arg in args.server_arg for a in arg.split()],
    ]
    log = args.log or Path(tempfile.mkdtemp(prefix="bench_overload_")) / "server.log"
    server = ServerProcess(server_args, log)
    t_start = time.monotonic()
    url = server.start()
    print(f"server pid {server.pid} at {url}, log {log}")
    try:
        warm, _ = asyncio.run(wave(url, 8, args.max_tokens, args.timeout, offset=args.clients))
        if any(r["outcome"] != "completed" for r in warm):
            print(
                "warm-up problems: "
                + "; ".join(r["detail"] for r in warm if r["outcome"] != "completed")
            )
        before = proc_status(server.pid)
        print(f"{args.clients} streaming chat clients at once (max_tokens {args.max_tokens})")
        recs, duration = asyncio.run(wave(url, args.clients, args.max_tokens, args.timeout))
        mid = proc_status(server.pid)
        after_wave = asyncio.run(settle(url, 300.0))
        after = proc_status(server.pid)
        # still serving after the wave
        again, _ = asyncio.run(wave(url, 4, args.max_tokens, args.timeout, offset=args.clients + 8))
    finally:
        exit_code = server.stop()
    problems, problem_lines = server.log_problems()

    done = [r for r in recs if r["outcome"] == "completed"]
    refused = [r for r in recs if r["outcome"] == "refused"]
    other = [r for r in recs if r["outcome"] == "other"]
    ttft = [r["ttft"] for r in done]
    e2e = [r["e2e"] for r in done]
    ms = lambda x: None if x is None else round(1000 * x, 1)  # noqa: E731
    statuses: dict[str, int] = {}
    for r in recs:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    checks = {
        "no_other_errors": not other,
        "every_429_has_retry_after_and_body": all(
            r["outcome"] == "refused" for r in recs if r["status"] == 429
        ),
        "served_after_the_wave": all(r["outcome"] == "completed" for r in again),
        "idle_after": after_wave["idle"],
        "kv_pool_full_after_flush": after_wave["kv_pool_full_after_flush"],
        "server_exit_0_on_sigterm": exit_code == 0,
    }
    capacity = args.max_running_requests + args.max_queued_requests if use_flag else None
    if (
        capacity is not None and len(recs) > capacity
    ):  # more at once than the server holds: some refused
        checks["excess_refused"] = len(refused) > 0
    results = {
        "config": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "server_args": server_args,
            "env": server_env(),
        },
        "max_queued_requests_flag": {"known_to_server": flag_known, "passed": use_flag},
        "capacity_running_plus_queued": capacity,
        "clients": len(recs),
        "completed": len(done),
        "refused_429": len(refused),
        "other_errors": len(other),
        "statuses": statuses,
        "retry_after_values": sorted({r.get("retry_after") for r in refused}),
        "other_error_samples": [r["detail"] for r in other][:20],
        "duration_s": round(duration, 2),
        "ttft_ms": {
            "p50": ms(_pct(ttft, 50)),
            "p99": ms(_pct(ttft, 99)),
            "max": ms(max(ttft) if ttft else None),
        },
        "e2e_ms": {"p50": ms(_pct(e2e, 50)), "p99": ms(_pct(e2e, 99))},
        "refusal_latency_ms_p50": ms(_pct([r["e2e"] for r in refused], 50)),
        "server_rss_mb": {
            "before": round(before["rss_kb"] / 1024, 1),
            "after_wave": round(mid["rss_kb"] / 1024, 1),
            "after_settle": round(after["rss_kb"] / 1024, 1),
        },
        "server_threads": {
            "before": before["threads"],
            "after_wave": mid["threads"],
            "after_settle": after["threads"],
        },
        "after": after_wave,
        "server_exit_code": exit_code,
        "server_log_problem_lines": problems,
        "server_log_problem_samples": problem_lines,
        "checks": checks,
        "passed": all(checks.values()),
        "wall_s": round(time.monotonic() - t_start, 1),
    }
    print(
        f"\n{len(recs)} clients in {duration:.1f}s: completed {len(done)}, refused 429 "
        f"{len(refused)} "
        f"(Retry-After {results['retry_after_values']}), other errors {len(other)}; statuses "
        f"{statuses}"
    )
    print(
        f"admitted TTFT ms p50 {results['ttft_ms']['p50']} p99 {results['ttft_ms']['p99']}; "
        f"e2e ms p50 {results['e2e_ms']['p50']} p99 {results['e2e_ms']['p99']}"
    )
    print(f"server RSS MB {results['server_rss_mb']}, threads {results['server_threads']}")
    print(
        f"after: {after_wave}; exit code on SIGTERM {exit_code}; log lines at ERROR / tracebacks "
        f"{problems}"
    )
    for d in results["other_error_samples"][:5]:
        print("  " + d)
    print("checks: " + ", ".join(f"{k} {'OK' if v else 'FAILED'}" for k, v in checks.items()))
    print("PASSED" if results["passed"] else "FAILED")
    write_reliability("overload", results, args.out)
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
