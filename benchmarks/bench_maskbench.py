"""MaskBench on the embedded model's tokenizer: JSON-schema coverage, soundness and mask speed.

The method of guidance-ai/jsonschemabench's `maskbench` runner, on a random sample of its
schemas. For each schema and engine: compile (timed); then for each test instance
`json.dumps(data)` is tokenized and walked token by token: compute the mask (timed), check
that the token is allowed, commit it; at the end the mask must allow EOS. A valid instance
must get through; an invalid one must be stopped somewhere. A schema *passes* iff it
compiles, every valid instance is accepted and every invalid one is rejected.

Every engine runs in its own worker process under an address-space cap (`--memory-gb`) and
a per-schema time limit (`--timeout`); a worker that dies or runs over is replaced and the
schema counts as a crash / timeout, so one pathological schema cannot take the run down.

Mask percentiles are over every mask. "warm" ones are over the masks of each schema's second
half of instances, walked after the first half on the same compiled grammar: what a server
that caches the grammar sees once a schema has served a few requests (the grammar's
per-kernel walks and tables are shared by its matchers).

The schemas are not shipped. Point `--data` at a checkout's `maskbench/data` folder:

    git clone https://github.com/guidance-ai/jsonschemabench /tmp/jsb
    .venv/bin/python benchmarks/bench_maskbench.py --data /tmp/jsb/maskbench/data --sample 300
    .venv/bin/python benchmarks/bench_maskbench.py --data DIR --engines sgl,llguidance,xgrammar

Engines: the `grammar_backend`s, each through sgl's Grammar/Matcher contract as the engine
runs it: `sgl` (ours), `llguidance` and `xgrammar` (each when installed; xgrammar in
compliant mode, `strict_mode=False`, as the issue measured it). Results go to
`benchmarks/results/maskbench.json` (or `--out`), with each schema's outcome per engine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from common import print_table, write_result

ENGINES = ("sgl", "llguidance", "xgrammar")


# -------------------------------------------------------------------------- engines (in the worker)


class BackendEngine:
    """One grammar_backend through sgl's Grammar/Matcher contract: what a user of that
    backend gets (sgl's compiler as the engine runs it: isolated, no cache)."""

    def __init__(self, name: str, tokenizer: Any, vocab_size: int) -> None:
        from sgl.constrained import GrammarCompiler, TokenVocabulary, allocate_bitmask

        self.vocab = TokenVocabulary.from_tokenizer(tokenizer, vocab_size=vocab_size)
        self.compiler = GrammarCompiler(
            self.vocab, cache_size=0, isolate=name == "sgl", backend=name, tokenizer=tokenizer
        )
        self.row = allocate_bitmask(1, vocab_size)[0]
        self.eos = self.vocab.eos_token_ids[0]

    def compile(self, schema: Any) -> Any:
        return self.compiler.compile("json_schema", json.dumps(schema))

    def start(self, grammar: Any) -> Any:
        return grammar.matcher()

    def mask_allows(self, m: Any, token: int) -> bool:
        self.row.zero_()
        m.fill_mask(self.row)
        return bool((int(self.row[token // 32]) >> (token % 32)) & 1)

    def accept(self, m: Any, token: int) -> bool:
        return m.accept(token)


def load_tokenizer() -> tuple[Any, int]:
    from sgl.runtime.model.paths import resolve_model_path
    from sgl.runtime.tokenizer import load_tokenizer as load

    tok = load(resolve_model_path("default"))
    return tok, len(tok)


def walk(engine: Any, grammar: Any, tokens: list[int], mask_us: list[float]) -> bool:
    """True iff every token and then EOS is allowed (each mask timed into ``mask_us``)."""
    m = engine.start(grammar)
    for t in tokens + [engine.eos]:
        t0 = time.perf_counter()
        allowed = engine.mask_allows(m, t)
        mask_us.append((time.perf_counter() - t0) * 1e6)
        if not allowed:
            return False
        if t != engine.eos and not engine.accept(m, t):
            return False
    return True


def run_schema(engine: Any, tokenizer: Any, path: str) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text())
    out: dict[str, Any] = {
        "status": "pass",
        "mask_us": [],
        "warm_mask_us": [],
        "valid_refused": 0,
        "invalid_accepted": 0,
    }
    t0 = time.perf_counter()
    try:
        grammar = engine.compile(doc["schema"])
    except Exception as e:  # the engine refused the schema
        out.update(
            status="compile_error",
            error=f"{type(e).__name__}: {str(e)[:300]}",
            compile_s=time.perf_counter() - t0,
        )
        return out
    out["compile_s"] = time.perf_counter() - t0
    tests = doc.get("tests", [])
    for i, test in enumerate(tests):
        tokens = tokenizer.encode(json.dumps(test["data"]), add_special_tokens=False)
        timed: list[float] = []
        ok = walk(engine, grammar, tokens, timed)
        out["mask_us"] += timed
        if (
            i >= len(tests) // 2
        ):  # the grammar has served half the instances: what a server sees later
            out["warm_mask_us"] += timed
        if test["valid"] and not ok:
            out["valid_refused"] += 1
        elif not test["valid"] and ok:
            out["invalid_accepted"] += 1
    if out["invalid_accepted"]:
        out["status"] = "invalid_accepted"
    elif out["valid_refused"]:
        out["status"] = "valid_refused"
    return out


def worker(name: str, memory_gb: float, conn: Any) -> None:
    limit = int(memory_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    tokenizer, vocab_size = load_tokenizer()
    engine = BackendEngine(name, tokenizer, vocab_size)
    conn.send("ready")
    while True:
        path = conn.recv()
        if path is None:
            return
        try:
            conn.send(run_schema(engine, tokenizer, path))
        except MemoryError:
            conn.send({"status": "crash", "error": "MemoryError", "mask_us": []})
        except Exception:
            conn.send(
                {"status": "crash", "error": traceback.format_exc(limit=3)[-400:], "mask_us": []}
            )


# ---------------------------------------------------------------------------- the driver


class Worker:
    """One engine in a child process; replaced when it dies or runs over the time limit."""

    def __init__(self, name: str, memory_gb: float) -> None:
        self.name, self.memory_gb = name, memory_gb
        self.proc: Any = None

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker, args=(self.name, self.memory_gb, child), daemon=True)
        self.proc.start()
        if not self.conn.poll(300) or self.conn.recv() != "ready":
            raise RuntimeError(f"{self.name} worker did not start")

    def run(self, path: str, timeout: float) -> dict[str, Any]:
        if self.proc is None or not self.proc.is_alive():
            self.start()
        self.conn.send(path)
        t0 = time.perf_counter()
        try:
            if self.conn.poll(timeout):
                return self.conn.recv()
            result = {"status": "timeout", "error": f"over {timeout:.0f} s", "mask_us": []}
        except EOFError:  # the worker died (the kernel's OOM killer, a segfault)
            result = {
                "status": "crash",
                "error": f"worker died after {time.perf_counter() - t0:.1f} s",
                "mask_us": [],
            }
        self.stop(kill=True)
        return result

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if not kill:
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.proc = None


def available(name: str) -> bool:
    if name == "sgl":
        return True
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    statuses = [r["status"] for r in results]
    masks = np.array([t for r in results for t in r["mask_us"]] or [0.0])
    warm = np.array([t for r in results for t in r.get("warm_mask_us", [])] or [0.0])
    compiles = np.array(
        [r["compile_s"] for r in results if "compile_s" in r and r["status"] != "compile_error"]
        or [0.0]
    )
    return {
        "schemas": len(results),
        "passing": statuses.count("pass"),
        "compile_errors": statuses.count("compile_error"),
        "valid_refused": statuses.count("valid_refused"),
        "invalid_accepted": statuses.count("invalid_accepted"),
        "timeouts": statuses.count("timeout"),
        "crashes": statuses.count("crash"),
        "masks": int(masks.size),
        "mask_us_p50": float(np.percentile(masks, 50)),
        "mask_us_p99": float(np.percentile(masks, 99)),
        "mask_us_max": float(masks.max()),
        "warm_mask_us_p50": float(np.percentile(warm, 50)),
        "warm_mask_us_p99": float(np.percentile(warm, 99)),
        "compile_ms_p50": float(np.percentile(compiles, 50) * 1e3),
        "compile_ms_p99": float(np.percentile(compiles, 99) * 1e3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--data",
        type=Path,
        required=True,
        help="a jsonschemabench checkout's maskbench/data folder",
    )
    ap.add_argument("--sample", type=int, default=300, help="schemas drawn at random (0: all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--engines",
        default="sgl,llguidance,xgrammar",
        help="comma-separated; missing ones are skipped",
    )
    ap.add_argument(
        "--timeout", type=float, default=60.0, help="seconds per schema (compile and all tests)"
    )
    ap.add_argument(
        "--memory-gb", type=float, default=8.0, help="address-space cap of each engine's worker"
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write here instead of benchmarks/results/maskbench.json",
    )
    args = ap.parse_args()

    files = sorted(str(p) for p in args.data.glob("*.json"))
    if not files:
        raise SystemExit(
            f"--data {args.data}: no *.json files (expected jsonschemabench's maskbench/data)"
        )
    if args.sample and args.sample < len(files):
        files = random.Random(args.seed).sample(files, args.sample)
    engines = [e for e in args.engines.split(",") if e]
    for e in engines:
        if e not in ENGINES:
            raise SystemExit(f"--engines: unknown engine {e!r} (choose from {', '.join(ENGINES)})")
    for e in [e for e in engines if not available(e)]:
        print(f"skipping {e}: not installed")
        engines.remove(e)

    per_schema: dict[str, dict[str, Any]] = {Path(f).stem: {} for f in files}
    summary: dict[str, Any] = {}
    for name in engines:
        w = Worker(name, args.memory_gb)
        results = []
        for i, f in enumerate(files):
            r = w.run(f, args.timeout)
            results.append(r)
            per_schema[Path(f).stem][name] = {
                k: v for k, v in r.items() if k not in ("mask_us", "warm_mask_us")
            }
            if r["status"] != "pass":
                print(
                    f"[{name} {i + 1}/{len(files)}] {Path(f).stem}: {r['status']} "
                    f"{r.get('error', '')[:160]}",
                    flush=True,
                )
        w.stop()
        summary[name] = summarize(results)

    print_table(
        f"MaskBench: {len(files)} schemas (seed {args.seed}), embedded model's tokenizer",
        [
            (
                e,
                f"{s['passing']}/{s['schemas']} ({100 * s['passing'] / s['schemas']:.0f}%)",
                s["compile_errors"],
                s["valid_refused"],
                s["invalid_accepted"],
                s["timeouts"] + s["crashes"],
                f"{s['mask_us_p50']:.0f}",
                f"{s['mask_us_p99']:.0f}",
                f"{s['warm_mask_us_p99']:.0f}",
                f"{s['compile_ms_p50']:.1f}",
                f"{s['compile_ms_p99']:.0f}",
            )
            for e, s in summary.items()
        ],
        (
            "engine",
            "passing",
            "compile err",
            "valid refused",
            "invalid accepted",
            "timeout/crash",
            "mask p50 us",
            "mask p99 us",
            "warm p99 us",
            "compile p50 ms",
            "compile p99 ms",
        ),
    )
    write_result(
        "maskbench",
        {
            "config": {
                **vars(args),
                "data": str(args.data),
                "out": str(args.out) if args.out else None,
            },
            "summary": summary,
            "schemas": per_schema,
        },
        path=args.out,
    )


if __name__ == "__main__":
    main()
