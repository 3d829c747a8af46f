"""Whole programs side by side: the SGLang paper's workloads (`benchmarks/programs/`) on sgl and
on the servers users pick instead, same weights (the embedded SmolLM2-135M), greedy.

Engines, run one at a time (`--engines`, comma-separated):
  sgl-dsl            the sgl program on an in-process Engine (`run_batch`)
  sgl-endpoint       the sgl program on sgl's server through RuntimeEndpoint (shipped where static)
  sgl-plain          the plain client code against sgl's server `/v1/completions`
  vllm-plain, llama.cpp-plain     the plain client code against the peer (../shared/tools/)
  vllm-openai, llama.cpp-openai   the sgl program through `sgl.OpenAI` on the peer
Ablations: sgl-dsl-no-radix, sgl-dsl-no-jump-forward, sgl-dsl-fcfs, sgl-endpoint-unshipped;
sgl-dsl-process runs the in-process engine's scheduler in its own process (the server's default).

Per workload and engine: programs/s with `--concurrency` programs in flight (`--programs` of
them), one program's latency alone (median of `--latency-runs`), and on sgl the share of prompt
tokens served from the prefix cache. Throughput, latency and warm-up each use their own seeded
data, so no measurement reads another's cache.

    .venv/bin/python benchmarks/bench_program_workloads.py --engines sgl-dsl,sgl-plain --programs 16

Engines can be run one invocation at a time into one file (`--merge`). `--busy N` runs N busy
loops beside each engine (a shared machine; results/program_workloads_loaded.json).

Results: results/program_workloads.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_shared_cpu import busy_loops  # noqa: E402
from common import RESULTS_DIR, machine_info, print_table, start_server, stop_process, write_result  # noqa: E402
from programs.plain_client import HttpCompletions  # noqa: E402
from programs.workloads import WORKLOADS, Workload  # noqa: E402

import sgl  # noqa: E402
from sgl.lang import ChatTemplate  # noqa: E402

PEERS = ("vllm", "llama.cpp")
IN_PROCESS = {
    "sgl-dsl": {},
    "sgl-dsl-process": {"scheduler_process": True},
    "sgl-dsl-no-radix": {"disable_radix_cache": True},
    "sgl-dsl-no-jump-forward": {"disable_jump_forward": True},
    "sgl-dsl-fcfs": {"schedule_policy": "fcfs"},
}


@dataclass
class Runner:
    """One engine as a workload sees it: `run(workload, items, concurrency)` runs the programs;
    `stats()` reads the server's counters where it has them (sgl)."""

    run: Callable[[Workload, list[dict], int], None]
    stats: Callable[[], dict[str, Any]] = dict


def sgl_runner(backend: Any, ship: bool | str = "auto") -> Runner:
    def run(w: Workload, items: list[dict], concurrency: int) -> None:
        states = w.program.run_batch(
            items, num_threads=concurrency, backend=backend, ship=ship, temperature=0
        )
        for st in states:
            st.sync()
            if st.error is not None:
                raise RuntimeError(f"{w.name}: {st.error}")

    def stats() -> dict[str, Any]:
        info = backend.get_server_info()
        return {k: info.get(k) for k in ("prefill_tokens", "cached_tokens", "jump_forward_tokens")}

    return Runner(run, stats)


def plain_runner(completions: HttpCompletions) -> Runner:
    def run(w: Workload, items: list[dict], concurrency: int) -> None:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda item: w.plain(completions, **item), items))

    return Runner(run)


def chat_template() -> ChatTemplate:
    """The model's chat template: what a plain client's `apply_chat_template` renders."""
    from sgl.runtime.model.paths import resolve_model_path
    from sgl.runtime.tokenizer import load_tokenizer

    return ChatTemplate.from_hf_tokenizer(load_tokenizer(str(resolve_model_path("default"))))


@contextmanager
def server(kind: str, args: tuple[str, ...], parallel: int) -> Iterator[str]:
    proc, url = start_server(kind, args, parallel=parallel)
    try:
        yield url
    finally:
        stop_process(proc)


@contextmanager
def open_runner(engine: str, concurrency: int) -> Iterator[Runner]:
    with ExitStack() as stack:
        if engine in IN_PROCESS:
            e = stack.enter_context(sgl.Engine(model_path="default", **IN_PROCESS[engine]))
            yield sgl_runner(sgl.as_backend(e))
            return
        kind, _, driver = engine.partition("-")  # "llama.cpp-plain" -> llama.cpp, plain
        url = stack.enter_context(server(kind, (), parallel=concurrency))
        if driver in ("endpoint", "endpoint-unshipped"):
            yield sgl_runner(
                sgl.RuntimeEndpoint(url), ship=False if driver == "endpoint-unshipped" else "auto"
            )
        elif driver == "plain":
            completions = HttpCompletions(url, "default", kind, chat_template())
            stack.callback(completions.close)
            yield plain_runner(completions)
        elif driver == "openai":
            yield sgl_runner(sgl.OpenAI("default", base_url=url + "/v1", is_chat_model=False))
        else:
            raise ValueError(f"unknown engine {engine!r}")


def measure(
    runner: Runner, w: Workload, programs: int, concurrency: int, latency_runs: int
) -> dict[str, Any]:
    runner.run(w, w.items(2, seed=99), 2)  # warm-up: first requests, grammar compiles
    before = runner.stats()
    t = time.perf_counter()
    runner.run(w, w.items(programs, seed=0), concurrency)
    seconds = time.perf_counter() - t
    after = runner.stats()
    latencies = []
    for item in w.items(latency_runs, seed=1):
        t = time.perf_counter()
        runner.run(w, [item], 1)
        latencies.append(time.perf_counter() - t)
    out: dict[str, Any] = {
        "programs": programs,
        "seconds": round(seconds, 3),
        "programs_per_s": round(programs / seconds, 3),
        "latency_s": round(statistics.median(latencies), 3),
    }
    if before.get("prefill_tokens") is not None:
        computed = after["prefill_tokens"] - before["prefill_tokens"]
        cached = after["cached_tokens"] - before["cached_tokens"]
        out["cache_hit_rate"] = round(cached / max(1, cached + computed), 3)
    return out


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per workload: sgl's best (in process or server) over the best peer, throughput and
    latency."""
    out = {}
    for name, by_engine in results.items():
        ok = {e: r for e, r in by_engine.items() if "programs_per_s" in r}
        sgl_best = [r for e, r in ok.items() if e in ("sgl-dsl", "sgl-dsl-process", "sgl-endpoint")]
        peers = [r for e, r in ok.items() if e.partition("-")[0] in PEERS]
        if sgl_best and peers:
            out[name] = {
                "throughput": round(
                    max(r["programs_per_s"] for r in sgl_best)
                    / max(r["programs_per_s"] for r in peers),
                    2,
                ),
                "latency": round(
                    min(r["latency_s"] for r in peers) / min(r["latency_s"] for r in sgl_best), 2
                ),
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--engines", default="sgl-dsl,sgl-endpoint,sgl-plain,vllm-plain,llama.cpp-plain"
    )
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--programs", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--latency-runs", type=int, default=3)
    ap.add_argument(
        "--busy", type=int, default=0, help="busy loops beside the engine (a shared machine)"
    )
    ap.add_argument(
        "--merge", action="store_true", help="keep the other engines' results already in the file"
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    name = "program_workloads" + ("_loaded" if args.busy else "")
    out = Path(args.out) if args.out else RESULTS_DIR / f"{name}.json"
    workloads = [WORKLOADS[name] for name in args.workloads.split(",")]
    results: dict[str, dict[str, Any]] = (
        json.loads(out.read_text())["results"] if args.merge and out.exists() else {}
    )
    for w in workloads:
        results.setdefault(w.name, {})
    for engine in args.engines.split(","):
        print(f"{engine} ...", flush=True)
        try:
            with open_runner(engine, args.concurrency) as runner, busy_loops(args.busy):
                for w in workloads:
                    try:
                        results[w.name][engine] = r = measure(
                            runner, w, args.programs, args.concurrency, args.latency_runs
                        )
                    except (RuntimeError, requests.RequestException) as e:
                        results[w.name][engine] = r = {"failed": str(e)[:300]}
                    print(f"  {w.name}: {r}", flush=True)
        except (RuntimeError, TimeoutError) as e:
            for w in workloads:
                results[w.name][engine] = {"skipped": f"could not start: {e}"}
            print(f"  skipped: {e}", flush=True)
    engines = list(dict.fromkeys(e for by in results.values() for e in by))
    print_table(
        f"programs/s ({args.programs} programs, {args.concurrency} in flight); latency of one "
        "program, s",
        [
            (
                w,
                *(
                    f"{by.get(e, {}).get('programs_per_s', '-')} / "
                    f"{by.get(e, {}).get('latency_s', '-')}"
                    for e in engines
                ),
            )
            for w, by in results.items()
        ],
        ("workload", *engines),
    )
    summary = ratios(results)
    for name, r in summary.items():
        print(f"{name}: sgl / best peer: throughput {r['throughput']}x, latency {r['latency']}x")
    write_result(
        name,
        {
            "machine": machine_info(),
            "config": vars(args),
            "results": results,
            "sgl_over_best_peer": summary,
        },
        out,
    )


if __name__ == "__main__":
    main()
