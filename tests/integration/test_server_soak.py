"""A short soak: a few hundred requests of every kind, with client disconnects, aborts and
abandoned sessions, against an in-process server whose KV pool is small enough that requests
are retracted. Every request must come back completed, as a reported error, aborted (when we
aborted it) or disconnected (when we left), never vanish or break; afterwards the server must
be idle, its abandoned sessions timed out, its KV pool whole after a flush and its thread
count back where it was. The mix and its classification live in benchmarks/soak_driver.py
(`bench_soak.py` runs the same with 10,000 requests against a server subprocess)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from server_helpers import ServerThread

import sgl
from sgl.server import create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from soak_driver import proc_status, run_soak, summary_lines  # noqa: E402

pytestmark = pytest.mark.integration

REQUESTS, CONCURRENCY, WARMUP = 300, 16, 48
SESSION_TIMEOUT = 2.0
# KV slots: a burst of 16 requests decoding 48-64 tokens each (the mix has one every 200 specs)
# is admitted on the decode reservation and then outgrows the pool: retractions.
POOL = 512
MIX = dict(session_timeout=SESSION_TIMEOUT, long_prompts=0.1, long_outputs=0.08, burst=CONCURRENCY)
THREAD_MARGIN = 4


@pytest.fixture(scope="module")
def soak_server():
    engine = sgl.Engine(model_path="default", max_total_tokens=POOL)
    try:
        with ServerThread(create_app(engine, "default")) as url:
            yield url
    finally:
        engine.shutdown()


def test_soak_nothing_vanishes_or_leaks(soak_server):
    pid = os.getpid()  # the server runs in this process
    t0 = time.monotonic()
    # Warm-up: compiles the constraints, fills the server's thread pools (to_thread workers).
    warm = run_soak(soak_server, WARMUP, CONCURRENCY, seed=1001, **MIX)
    assert warm["vanished_or_broken"] == 0, json.dumps(warm["broken_samples"], indent=1)
    start = proc_status(pid)
    f = run_soak(soak_server, REQUESTS, CONCURRENCY, seed=7, **MIX)
    end = proc_status(pid)
    elapsed = time.monotonic() - t0
    print("\n".join(summary_lines(f)))
    print(
        f"test process threads {start['threads']} -> {end['threads']}, RSS "
        f"{start['rss_kb'] >> 10} -> "
        f"{end['rss_kb'] >> 10} MB; soak {elapsed:.1f}s"
    )

    assert f["specs_sent"] == REQUESTS and not f["stopped_early"]
    assert f["vanished_or_broken"] == 0, json.dumps(f["broken_samples"], indent=1)
    assert f["server_errors_5xx"] == 0, json.dumps(f["unexpected_error_samples"], indent=1)
    assert f["unexpected_errors"] == 0, json.dumps(f["unexpected_error_samples"], indent=1)
    assert f["invalid_not_400"] == 0, f["by_kind"]
    assert f["constraint_violations"] == 0, json.dumps(f["constraint_violation_samples"], indent=1)
    # every kind of the mix ran
    kinds = f["by_kind"]
    for endpoint in ("chat", "completions", "generate", "session"):
        assert any(k.startswith(endpoint + "/") for k in kinds), kinds
    assert f["outcomes"]["completed"] > REQUESTS // 2
    assert (
        f["outcomes"]["disconnected"] > 0
        and f["outcomes"]["aborted"] > 0
        and f["sessions_opened"] > 0
    )
    assert f["retractions"] > 0, (
        "the long-output bursts no longer overfill the pool: retune POOL / MIX"
    )
    # the server settled: idle, abandoned sessions timed out, every KV slot free after a flush
    assert f["checks"]["idle_after_mix"], f
    assert f["checks"]["no_open_sessions_after_timeout"], f
    assert f["checks"]["kv_pool_full_after_flush"], (
        f["kv_free_after_flush"],
        f["max_total_tokens"],
    )
    assert f["kv_free_after_flush"] == POOL
    # no threads left behind by disconnects, aborts or sessions
    assert end["threads"] <= start["threads"] + THREAD_MARGIN, (start, end)
