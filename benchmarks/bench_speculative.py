"""Speculative decoding by prompt lookup (n-gram drafts), sgl beside llama.cpp and vLLM's CPU
build, each with and without its own n-gram speculation, on the same weights (the embedded
SmolLM2-135M), over HTTP `/v1/completions`, greedy.

Engines (`--engines`, each its own server, started and stopped one after another):
  sgl, sgl-spec               sgl's server as `make serve` runs it (--enable-torch-compile);
                              -spec: --speculative-algorithm NGRAM
                              --speculative-num-draft-tokens K
  sgl-bf16, sgl-bf16-standalone
                              the weights dense in bf16 (--quantization none); -standalone:
                              the same weights in int4 draft for them (STANDALONE)
  llama.cpp, llama.cpp-spec   llama-server, a slot per request in flight; -spec: --spec-type
                              ngram-simple (the last N tokens looked up, the K after the
                              match drafted; N = --llama-ngram, it has no 1..4 range)
  vllm, vllm-spec             vLLM CPU; -spec: --speculative-config {"method": "ngram",
                              "num_speculative_tokens": K, "prompt_lookup_min": 1,
                              "prompt_lookup_max": 4}; both with Intel OpenMP preloaded, as
                              vLLM asks for speculation on CPU (the same for both, for a fair
                              ratio)

Workloads (`spec_workloads.py`): extraction (quote sentences of a ~600-token document),
json_extraction (the people a document names, as schema-constrained JSON: sgl response_format,
llama.cpp json_schema, vLLM structured_outputs), chat (open questions, nothing to copy); held
out, run only when named: proofread (correct the spelling of a text with letters swapped),
code_edit (rename an argument through some Python functions). Batches (`--batches`): 1 =
requests one after another, B = B requests in flight. Each (workload, batch) cell has its own
prompts, the same for every engine; outputs end at EOS or max_new_tokens.

Per engine and cell: output tokens/s (completion tokens / wall time), wall time, acceptance
where the engine reports it (sgl: /get_server_info "speculative"; llama.cpp: the responses'
timings draft_n / draft_n_accepted; vLLM: /metrics spec_decode counters), and for a -spec
engine how many outputs equal its plain twin's (digests of the texts are kept). Ratios:
sgl-spec / sgl, each peer's spec / plain, sgl-spec / the best peer with speculation.

    .venv/bin/python benchmarks/bench_speculative.py          # everything: ~30 min on 2 cores
    .venv/bin/python benchmarks/bench_speculative.py --quick --engines sgl,sgl-spec
    ... --engines vllm,vllm-spec --merge     # add engines to an existing results file

Peers come from ../shared/tools (SGL_PEER_TOOLS elsewhere); one that cannot start is recorded
with its log's tail. Results: results/speculative.json (`--out`); `--outputs FILE` keeps the
full output texts. The machine should be quiet: llama.cpp's spinning threads collapse (to a
few tokens/s) when other processes share the cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cpu_peers import peer  # noqa: E402
from common import RESULTS_DIR, log_tail, print_table, start_server, stop_process, write_result  # noqa: E402
from spec_workloads import HELD_OUT, MAKERS, SpecWorkload, build  # noqa: E402

from sgl.lang.backends.openai_dialects import constraint_fields  # noqa: E402

ENGINES = (
    "sgl",
    "sgl-spec",
    "sgl-bf16",
    "sgl-bf16-standalone",
    "llama.cpp",
    "llama.cpp-spec",
    "vllm",
    "vllm-spec",
)
# sgl as `make serve` runs it (decode graphs compiled); -bf16: the weights dense in bf16, the
# target of a quantized self-draft (-standalone: the same weights in int4 draft for it)
SGL_FLAGS = {
    "sgl": ("--enable-torch-compile",),
    "sgl-bf16": ("--enable-torch-compile", "--quantization", "none"),
}
PEERS = ("llama.cpp", "vllm")
# Requests of a batch-1 cell (a batch-B cell: 2 B, quick: B), the cap on new tokens, and the
# documents' sentences per workload (full: ~600-token prompts).
SIZES = {
    "full": {
        "batch1_requests": 8,
        "max_new_tokens": 256,
        "sentences": {
            "extraction": 34,
            "json_extraction": 28,
            "chat": 0,
            "proofread": 16,
            "code_edit": 20,
        },
    },
    "quick": {
        "batch1_requests": 2,
        "max_new_tokens": 24,
        "sentences": {
            "extraction": 8,
            "json_extraction": 6,
            "chat": 0,
            "proofread": 4,
            "code_edit": 5,
        },
    },
}


# ----------------------------------------------------------------------------- engines


def launch_flags(engine: str, k: int, llama_ngram: int) -> tuple[str, tuple[str, ...]]:
    """(server kind, extra launch flags) of an engine variant."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}; got {engine!r}")
    if engine.startswith("sgl"):
        base = SGL_FLAGS["sgl-bf16" if engine.startswith("sgl-bf16") else "sgl"]
        cap = ("--speculative-num-draft-tokens", str(k))
        if engine == "sgl-spec":
            return "sgl", base + ("--speculative-algorithm", "NGRAM") + cap
        if engine == "sgl-bf16-standalone":
            draft = ("--speculative-draft-model-quantization", "int4")
            return "sgl", base + ("--speculative-algorithm", "STANDALONE") + draft + cap
        return "sgl", base
    kind, _, spec = engine.partition("-")
    if not spec:
        return kind, ()
    if kind == "llama.cpp":
        flags = (
            "--spec-type",
            "ngram-simple",
            "--spec-ngram-simple-size-n",
            str(llama_ngram),
            "--spec-ngram-simple-size-m",
            str(k),
        )
    else:
        config = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 4,
        }
        flags = ("--speculative-config", json.dumps(config))
    return kind, flags


def launch_env(kind: str, vllm_iomp: bool = True) -> dict[str, str]:
    """vLLM's CPU speculation wants Intel OpenMP preloaded (it warns of a large slowdown
    without); its venv ships libiomp5. Both vLLM variants get it, so their ratio is fair."""
    if kind != "vllm" or not vllm_iomp:
        return {}
    python = peer("vllm-cpu.sh")
    lib = Path(python).parent.parent / "lib" / "libiomp5.so" if python else None
    return {"LD_PRELOAD": str(lib)} if lib and lib.exists() else {}


def spec_counters(kind: str, url: str) -> dict[str, int] | None:
    """The server's cumulative draft counters (None: it keeps none, or speculation is off)."""
    if kind == "sgl":
        spec = requests.get(url + "/get_server_info", timeout=30).json().get("speculative") or {}
        if not spec.get("algorithm"):
            return None
        return {
            "draft_tokens": spec["draft_tokens"],
            "accepted_tokens": spec["accepted_tokens"],
            "verify_steps": spec["verify_steps"],
        }
    if kind == "vllm":
        return vllm_spec_metrics(requests.get(url + "/metrics", timeout=30).text)
    return None  # llama.cpp: per response (timings.draft_n)


def vllm_spec_metrics(text: str) -> dict[str, int] | None:
    """vLLM's Prometheus counters of speculation, summed over their label sets."""
    names = {
        "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",
        "vllm:spec_decode_num_drafts_total": "drafts",
    }
    out: dict[str, int] = {}
    for line in text.splitlines():
        metric = line.split("{", 1)[0].split(" ", 1)[0]
        if metric in names:
            key = names[metric]
            out[key] = out.get(key, 0) + int(float(line.rsplit(" ", 1)[1]))
    return out or None


# ----------------------------------------------------------------------------- requests


@dataclass
class Completion:
    text: str
    completion_tokens: int
    prompt_tokens: int
    draft_n: int = 0  # llama.cpp's per-response draft counts
    draft_accepted: int = 0


@dataclass
class Client:
    """`/v1/completions` of one server; one kept-alive session per thread."""

    url: str
    kind: str
    sessions: dict[int, requests.Session] = field(default_factory=dict)

    def complete(self, prompt: str, max_new: int, schema: dict | None) -> Completion:
        session = self.sessions.setdefault(threading.get_ident(), requests.Session())
        body = {"model": "default", "prompt": prompt, "max_tokens": max_new, "temperature": 0}
        if schema is not None:
            body.update(constraint_fields(self.kind, {"json_schema": schema}, chat=False))
        r = session.post(self.url + "/v1/completions", json=body, timeout=1800)
        if r.status_code != 200:
            raise RuntimeError(f"{self.kind} answered {r.status_code}: {r.text[:300]}")
        data = r.json()
        timings = data.get("timings") or {}
        return Completion(
            data["choices"][0]["text"],
            data["usage"]["completion_tokens"],
            data["usage"]["prompt_tokens"],
            timings.get("draft_n", 0),
            timings.get("draft_n_accepted", 0),
        )

    def run(self, w: SpecWorkload, batch: int) -> list[Completion]:
        """All of `w`'s requests, `batch` in flight (1: one after another)."""
        with ThreadPoolExecutor(batch) as pool:
            return list(
                pool.map(lambda p: self.complete(p, w.max_new_tokens, w.json_schema), w.prompts)
            )

    def close(self) -> None:
        for s in self.sessions.values():
            s.close()


# ----------------------------------------------------------------------------- measuring


def acceptance(
    spec: bool, kind: str, before: dict | None, after: dict | None, done: list[Completion]
) -> dict[str, Any] | None:
    """Drafted and accepted tokens over a cell (None for a plain engine): llama.cpp's from its
    responses, the others' from the server's counters before and after."""
    if not spec:
        return None
    if kind == "llama.cpp":
        delta = {
            "draft_tokens": sum(c.draft_n for c in done),
            "accepted_tokens": sum(c.draft_accepted for c in done),
        }
    elif before is None or after is None:
        return {"unavailable": f"{kind} reported no speculation counters"}
    else:
        delta = {k: after[k] - before.get(k, 0) for k in after}
    drafted = delta["draft_tokens"]
    delta["acceptance_rate"] = round(delta["accepted_tokens"] / drafted, 3) if drafted else None
    if delta.get("verify_steps"):  # sgl: tokens per decode step, SGLang's avg_spec_accept_length
        steps = delta["verify_steps"]
        delta["accept_length"] = round((delta["accepted_tokens"] + steps) / steps, 3)
    if delta.get("drafts"):  # vLLM's mean acceptance length: tokens per step that drafted
        delta["accept_length_per_draft"] = round(1 + delta["accepted_tokens"] / delta["drafts"], 3)
    return delta


def digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def measure(
    client: Client, spec: bool, w: SpecWorkload, warm: SpecWorkload, batch: int
) -> dict[str, Any]:
    """One cell: a warm-up at the same batch (other prompts, few tokens), then the timed
    requests."""
    client.run(warm, batch)
    before = spec_counters(client.kind, client.url)
    t = time.perf_counter()
    done = client.run(w, batch)
    seconds = time.perf_counter() - t
    after = spec_counters(client.kind, client.url)
    tokens = sum(c.completion_tokens for c in done)
    return {
        "requests": len(done),
        "seconds": round(seconds, 3),
        "completion_tokens": tokens,
        "prompt_tokens": sum(c.prompt_tokens for c in done),
        "tok_per_s": round(tokens / seconds, 1),
        "acceptance": acceptance(spec, client.kind, before, after, done),
        "output_digests": [digest(c.text) for c in done],
        "outputs": [c.text for c in done],
    }


def cells(args: argparse.Namespace) -> dict[tuple[str, int], tuple[SpecWorkload, SpecWorkload]]:
    """(workload, batch) -> (timed requests, warm-up requests), the same for every engine."""
    size = SIZES["quick" if args.quick else "full"]
    n1, max_new, sentences = size["batch1_requests"], size["max_new_tokens"], size["sentences"]
    out = {}
    for name in args.workloads.split(","):
        for batch in map(int, args.batches.split(",")):
            n = n1 if batch == 1 else (batch if args.quick else 2 * batch)
            timed = build(name, n, f"b{batch}", sentences[name], max_new)
            warm = build(name, batch, f"warm{batch}", sentences[name], min(16, max_new))
            out[(name, batch)] = (timed, warm)
    return out


def run_engine(engine: str, args: argparse.Namespace, work: dict, log_dir: Path) -> dict:
    """Every cell on one engine's server; {(workload, batch): result}."""
    kind, flags = launch_flags(engine, args.num_draft_tokens, args.llama_ngram)
    log = log_dir / f"{engine}.log"
    slots = max(batch for _, batch in work)  # llama.cpp's parallel slots
    try:
        proc, url = start_server(
            kind, flags, parallel=slots, env=launch_env(kind, args.vllm_iomp), log=log
        )
    except (RuntimeError, TimeoutError) as e:
        return {cell: {"skipped": f"could not start: {e}"} for cell in work}
    client = Client(url, kind)
    results = {}
    try:
        speculative = engine.endswith(("-spec", "-standalone"))
        for cell, (w, warm) in work.items():
            try:
                results[cell] = measure(client, speculative, w, warm, cell[1])
            except (RuntimeError, requests.RequestException) as e:
                results[cell] = {"failed": f"{e} ...{log_tail(log, 600)}"[:1500]}
            r = results[cell]
            print(f"  {cell[0]} batch {cell[1]}: {short(r)}", flush=True)
    finally:
        client.close()
        stop_process(proc)
    return results


def short(r: dict) -> str:
    return json.dumps({k: v for k, v in r.items() if k not in ("output_digests", "outputs")})[:400]


# ----------------------------------------------------------------------------- report


def compare_outputs(by_engine: dict[str, dict]) -> None:
    """Each speculative engine's outputs against its plain twin's, request by request."""
    for engine, r in by_engine.items():
        speculative = engine.endswith(("-spec", "-standalone"))
        plain = by_engine.get(engine.removesuffix("-spec").removesuffix("-standalone"))
        if not speculative or "output_digests" not in r:
            continue
        if not plain or "output_digests" not in plain:
            r.pop("equal_to_plain", None)
            continue
        same = [a == b for a, b in zip(r["output_digests"], plain["output_digests"])]
        r["equal_to_plain"] = f"{sum(same)}/{len(same)}"
        r["differing_requests"] = [i for i, s in enumerate(same) if not s]


def ratios(by_engine: dict[str, dict]) -> dict[str, Any]:
    tps = {e: r["tok_per_s"] for e, r in by_engine.items() if "tok_per_s" in r}
    out: dict[str, Any] = {}
    pairs = [(f"{kind}-spec", kind) for kind in ("sgl", *PEERS)]
    for spec, plain in pairs + [("sgl-bf16-standalone", "sgl-bf16")]:
        if spec in tps and plain in tps:
            out[f"{spec}_over_{plain}"] = round(tps[spec] / tps[plain], 3)
    peers_spec = {e: v for e, v in tps.items() if e in (f"{p}-spec" for p in PEERS)}
    if "sgl-spec" in tps and peers_spec:
        best = max(peers_spec, key=peers_spec.get)
        out["best_peer_spec"] = best
        out["sgl-spec_over_best_peer_spec"] = round(tps["sgl-spec"] / peers_spec[best], 3)
    return out


def report(results: dict[str, dict[str, dict]]) -> dict[str, Any]:
    rows, summary = [], {}
    for key, by_engine in results.items():
        compare_outputs(by_engine)
        summary[key] = ratios(by_engine)
        for engine, r in by_engine.items():
            acc = r.get("acceptance") or {}
            rows.append(
                (
                    key,
                    engine,
                    r.get("tok_per_s", "-"),
                    r.get("seconds", "-"),
                    acc.get("acceptance_rate", "-"),
                    r.get("equal_to_plain", "-"),
                    (r.get("skipped") or r.get("failed") or "")[:50],
                )
            )
    print_table(
        "speculative decoding (greedy; tok/s = completion tokens / wall s)",
        rows,
        ("cell", "engine", "tok/s", "wall s", "accept", "= plain", "skipped/failed"),
    )
    for key, r in summary.items():
        print(f"{key}: {r}")
    return summary


# ----------------------------------------------------------------------------- main


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Bad names or sizes stop the run before any server starts."""
    for engine in args.engines.split(","):
        if engine not in ENGINES:
            ap.error(f"--engines: {engine!r} is not one of {', '.join(ENGINES)}")
    for name in args.workloads.split(","):
        if name not in MAKERS and name not in HELD_OUT:
            known = ", ".join([*MAKERS, *HELD_OUT])
            ap.error(f"--workloads: {name!r} is not one of {known}")
    if not all(b.isdigit() and int(b) >= 1 for b in args.batches.split(",")):
        ap.error(
            f"--batches: give positive integers separated by commas (1,16); got {args.batches!r}"
        )
    if args.num_draft_tokens < 1 or args.llama_ngram < 1:
        ap.error("--num-draft-tokens and --llama-ngram must be at least 1")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--workloads", default=",".join(MAKERS))
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--quick", action="store_true", help="a smoke run: few requests, 24 tokens")
    ap.add_argument("--num-draft-tokens", type=int, default=4, help="K, every engine's draft cap")
    ap.add_argument("--llama-ngram", type=int, default=3, help="llama.cpp's lookup n-gram size")
    ap.add_argument(
        "--no-vllm-iomp",
        dest="vllm_iomp",
        action="store_false",
        help="run vLLM without Intel OpenMP preloaded (both of its variants)",
    )
    ap.add_argument("--merge", action="store_true", help="keep other engines' results in --out")
    ap.add_argument("--out", default=str(RESULTS_DIR / "speculative.json"))
    ap.add_argument("--outputs", default=None, help="also write the full output texts here")
    return ap


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    check_args(ap, args)
    out = Path(args.out)
    previous = json.loads(out.read_text()) if args.merge and out.exists() else {}
    results: dict[str, dict[str, dict]] = previous.get("results", {})
    launch: dict[str, dict] = previous.get("config", {}).get("launch", {})
    work = cells(args)
    outputs: dict[str, dict[str, list[str]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-spec-") as log_dir:
        for engine in args.engines.split(","):
            print(f"{engine} ...", flush=True)
            kind, flags = launch_flags(engine, args.num_draft_tokens, args.llama_ngram)
            launch[engine] = {"flags": list(flags), "env": launch_env(kind, args.vllm_iomp)}
            for (name, batch), r in run_engine(engine, args, work, Path(log_dir)).items():
                key = f"{name}/batch{batch}"
                outputs.setdefault(key, {})[engine] = r.pop("outputs", [])
                results.setdefault(key, {})[engine] = r
            summary = report(results)
            config = {**vars(args), "sizes": SIZES["quick" if args.quick else "full"]}
            write_result(
                "speculative",
                {"config": {**config, "launch": launch}, "results": results, "ratios": summary},
                out,
            )  # after each engine, so an interrupted run keeps what it measured
    if args.outputs:
        write_outputs(Path(args.outputs), outputs, args.merge)


def write_outputs(path: Path, outputs: dict[str, dict[str, list[str]]], merge: bool) -> None:
    """The full output texts per cell and engine (with --merge, added to the file's)."""
    kept = json.loads(path.read_text()) if merge and path.exists() else {}
    for key, by_engine in outputs.items():
        kept.setdefault(key, {}).update(by_engine)
    path.write_text(json.dumps(kept, indent=1))


if __name__ == "__main__":
    main()
