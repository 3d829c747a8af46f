"""Soak benchmark: thousands of mixed requests with faults against a server subprocess; nothing
may vanish, leak or grow.

Starts `python -m sgl.launch_server --model-path default --max-total-tokens 2048` (a small KV
pool, so decoding requests are retracted) on 127.0.0.1 and a free port, waits for /health,
then runs the soak driver (benchmarks/soak_driver.py): a warm-up of --warmup requests, then
--requests (default 10,000) at --concurrency (default 32), a deterministic mix of chat /
completions / /generate, streamed and not, regex and JSON-schema constraints, n > 1, abandoned
sessions, client disconnects and aborts (see soak_driver's docstring). It stops sending after
--max-seconds and reports what it did.

Checked (the run FAILS, exit status 1, when any is false):

* vanished/broken requests: 0 (every request completed, was refused with an OpenAI-style
  error, finished 'abort' because we aborted it, or was disconnected by us);
* no 5xx, no unexpected 4xx (only the deliberately invalid constraints may be refused);
* after the mix the server is idle, every abandoned session has timed out, and after
  /flush_cache every KV slot is free;
* the server process's RSS at the end within +--rss-margin (default 15%) of its RSS after
  the warm-up, and its thread count within +--thread-margin (default 4);
* the server exits 0 on SIGTERM.

Writes the figures under the key "soak" of benchmarks/results/reliability.json (other keys
kept), or to --out.

    .venv/bin/python benchmarks/bench_soak.py                 # 10,000 requests (~80 min on 2 cores)
    .venv/bin/python benchmarks/bench_soak.py --quick         # 300 requests, a few minutes
    .venv/bin/python benchmarks/bench_soak.py --requests 2000 --out /tmp/soak.json

On a small shared CPU machine, `OMP_NUM_THREADS=1` in the environment (inherited by the
server) avoids OpenMP threads spinning against other processes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from soak_driver import ServerProcess, run_soak, server_env, summary_lines, write_reliability


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--requests",
        type=int,
        default=10_000,
        help="specs of the mix (a session spec runs 1-2 turns)",
    )
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="300 requests, a 50-request warm-up")
    ap.add_argument(
        "--warmup", type=int, default=100, help="requests before the RSS / thread baseline"
    )
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=10800.0,
        help="stop sending after this long "
        "(10,000 requests took 78 min on a shared 2-core machine)",
    )
    ap.add_argument("--max-total-tokens", type=int, default=2048, help="the server's KV pool")
    ap.add_argument(
        "--session-timeout", type=float, default=5.0, help="timeout of the abandoned sessions"
    )
    ap.add_argument(
        "--long-prompts", type=float, default=0.2, help="share of 100-350-token prompts"
    )
    ap.add_argument(
        "--long-outputs",
        type=float,
        default=0.08,
        help="share of 48-64-token ignore_eos requests (in bursts: retractions)",
    )
    ap.add_argument(
        "--burst", type=int, default=None, help="long-output burst length (default: --concurrency)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-path", default="default")
    ap.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="an extra launch_server argument (repeatable)",
    )
    ap.add_argument(
        "--rss-margin",
        type=float,
        default=0.15,
        help="allowed RSS growth after the warm-up (fraction)",
    )
    ap.add_argument(
        "--thread-margin", type=int, default=4, help="allowed thread-count growth after the warm-up"
    )
    ap.add_argument(
        "--request-timeout",
        type=float,
        default=1200.0,
        help="seconds a request may take before it counts as vanished (a client timeout)",
    )
    ap.add_argument(
        "--sample-every", type=float, default=30.0, help="seconds between RSS / thread samples"
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
    if args.quick:
        args.requests, args.warmup = 300, 50
    burst = args.burst or args.concurrency

    log = args.log or Path(tempfile.mkdtemp(prefix="bench_soak_")) / "server.log"
    server_args = [
        "--model-path",
        args.model_path,
        "--max-total-tokens",
        str(args.max_total_tokens),
        "--log-level",
        "warning",
        *[a for arg in args.server_arg for a in arg.split()],
    ]
    server = ServerProcess(server_args, log)
    t_start = time.monotonic()
    url = server.start()
    print(
        f"server pid {server.pid} at {url}, log {log} (healthy after "
        f"{time.monotonic() - t_start:.1f}s)"
    )
    opts = dict(
        session_timeout=args.session_timeout,
        long_prompts=args.long_prompts,
        long_outputs=args.long_outputs,
        burst=burst,
        request_timeout=args.request_timeout,
    )
    results: dict[str, Any] = {
        "config": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "burst": burst,
            "server_args": server_args,
            "env": server_env(),
        }
    }
    exit_code = None
    try:
        print(f"\nwarm-up: {args.warmup} requests")
        warm = run_soak(
            url, args.warmup, args.concurrency, seed=args.seed + 10_000, pid=server.pid, **opts
        )
        print("\n".join("  " + ln for ln in summary_lines(warm)))
        print(
            f"\nsoak: {args.requests} requests at concurrency {args.concurrency} (at most "
            f"{args.max_seconds:.0f}s)"
        )
        soak = run_soak(
            url,
            args.requests,
            args.concurrency,
            seed=args.seed,
            pid=server.pid,
            max_seconds=args.max_seconds,
            sample_every=args.sample_every,
            progress=True,
            **opts,
        )
        print("\n".join("  " + ln for ln in summary_lines(soak)))
    finally:
        exit_code = server.stop()
    problems, problem_lines = server.log_problems()

    p = soak["process"]
    rss_limit = p["rss_mb_start"] * (1 + args.rss_margin)
    thread_limit = p["threads_start"] + args.thread_margin
    margins = {
        "rss_mb_post_warmup": p["rss_mb_start"],
        "rss_mb_end": p["rss_mb_end"],
        "rss_growth_pct": round(100 * (p["rss_mb_end"] / p["rss_mb_start"] - 1), 1),
        "rss_margin_pct": round(100 * args.rss_margin, 1),
        "rss_ok": p["rss_mb_end"] <= rss_limit,
        "threads_post_warmup": p["threads_start"],
        "threads_end": p["threads_end"],
        "thread_margin": args.thread_margin,
        "threads_ok": p["threads_end"] <= thread_limit,
    }
    checks = {
        **soak["checks"],
        "no_5xx": soak["server_errors_5xx"] == 0,
        "no_unexpected_errors": soak["unexpected_errors"] == 0 and soak["invalid_not_400"] == 0,
        "no_constraint_violations": soak["constraint_violations"] == 0,
        "warmup_no_vanished_or_broken": warm["vanished_or_broken"] == 0,
        "rss_within_margin": margins["rss_ok"],
        "threads_within_margin": margins["threads_ok"],
        "server_exit_0_on_sigterm": exit_code == 0,
    }
    results.update(
        {
            "warmup": {
                k: warm[k]
                for k in ("generations", "duration_s", "outcomes", "vanished_or_broken", "process")
            },
            "soak": soak,
            "margins": margins,
            "server_exit_code": exit_code,
            "server_log_problem_lines": problems,
            "server_log_problem_samples": problem_lines,
            "checks": checks,
            "passed": all(checks.values()),
            "wall_s": round(time.monotonic() - t_start, 1),
        }
    )
    print(
        f"\nmargins: RSS {margins['rss_mb_post_warmup']} -> {margins['rss_mb_end']} MB "
        f"({margins['rss_growth_pct']:+.1f}%, allowed +{margins['rss_margin_pct']:.0f}%: "
        f"{'OK' if margins['rss_ok'] else 'FAILED'}); threads {margins['threads_post_warmup']} -> "
        f"{margins['threads_end']} (allowed +{args.thread_margin}: "
        f"{'OK' if margins['threads_ok'] else 'FAILED'})"
    )
    print(f"server exit code on SIGTERM: {exit_code}; log lines at ERROR / tracebacks: {problems}")
    for line in problem_lines[:5]:
        print("  " + line)
    for s in soak["broken_samples"][:5] + soak["unexpected_error_samples"][:5]:
        print("  " + json.dumps(s)[:600])
    print("checks: " + ", ".join(f"{k} {'OK' if v else 'FAILED'}" for k, v in checks.items()))
    print("PASSED" if results["passed"] else "FAILED")
    write_reliability("soak", results, args.out)
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
