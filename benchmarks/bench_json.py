"""JSON extraction with constrained decoding, same run:

1. jump-forward on vs off (decode steps, end-to-end time) on 32 short texts, one ~6-key schema,
   submitted together and (the first 8) one at a time;
2. per-token cost of masks: constrained vs unconstrained decoding at batch 32;
3. the `outlines` library driving HF transformers on the same model and schema;
4. mask latency per token (regex, JSON schema, EBNF) at the embedded vocabulary size and
   compile time (first and cached).

    .venv/bin/python benchmarks/bench_json.py [--skip-outlines]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from common import load_hf_model, print_table, write_result

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 30},
        "occupation": {"type": "string", "maxLength": 30},
        "status": {"type": "string", "enum": ["employed", "student", "retired"]},
        "likes_sport": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "occupation", "status", "likes_sport"],
    "additionalProperties": False,
}

FIRST = ["Alice", "Bruno", "Chen", "Dara", "Emil", "Fatima", "Goran", "Hana"]
LAST = ["Smith", "Rossi", "Wang", "Okafor"]
CITIES = ["Paris", "Lagos", "Osaka", "Lima", "Oslo", "Pune", "Quebec", "Turin"]
JOBS = ["nurse", "teacher", "welder", "pilot", "chemist", "baker", "lawyer", "student"]


def texts(n: int) -> list[str]:
    out = []
    for i in range(n):
        first, last = FIRST[i % len(FIRST)], LAST[(i // len(FIRST)) % len(LAST)]
        age, city, job = 19 + (i * 7) % 60, CITIES[(i * 3) % len(CITIES)], JOBS[(i * 5) % len(JOBS)]
        sport = "loves football" if i % 2 else "never plays sports"
        out.append(f"{first} {last} is a {age}-year-old {job} living in {city}, who {sport}.")
    return out


def prompt(tokenizer, text: str) -> str:
    msg = (
        "Extract the person as JSON with keys name, age, city, occupation, status "
        f"(employed, student or retired) and likes_sport (true/false).\nText: {text}"
    )
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": msg}], tokenize=False, add_generation_prompt=True
    )


def run_engine(engine, prompts: list[str], params: dict) -> tuple[float, int, list[dict]]:
    engine.flush_cache()
    before = engine.get_server_info()["forward_steps"]
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - t
    return seconds, engine.get_server_info()["forward_steps"] - before, outs


def mask_latency(engine, kind: str, spec, steps: int = 200) -> dict:
    """Compile (first, cached) and fill_mask time along a greedy-free random walk of allowed
    tokens."""
    import random

    from sgl.constrained.compiler import GrammarCompiler
    from sgl.constrained.matcher import allocate_bitmask, bitmask_to_bool
    from sgl.constrained.vocab import TokenVocabulary

    vocab = TokenVocabulary.from_tokenizer(
        engine.tokenizer,
        vocab_size=engine.model_config.vocab_size,
        eos_token_ids=engine.eos_token_ids,
    )
    compiler = GrammarCompiler(vocab)  # empty cache: the first compile is real
    t = time.perf_counter()
    grammar = compiler.compile(kind, spec)
    first = time.perf_counter() - t
    t = time.perf_counter()
    compiler.compile(kind, spec)
    cached = time.perf_counter() - t
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    times = []
    walks = 0
    while len(times) < steps and walks < 50:
        walks += 1
        m = grammar.matcher()
        for _ in range(steps):
            row = allocate_bitmask(1, vocab)
            t = time.perf_counter()
            m.fill_mask(row[0])
            times.append(time.perf_counter() - t)
            allowed = bitmask_to_bool(row, vocab)[0].nonzero().flatten().tolist()
            allowed = [a for a in allowed if a not in engine.eos_token_ids]
            if not allowed or m.is_done():
                break
            m.accept(rng.choice(allowed))
            if len(times) >= steps:
                break
    times_us = sorted(x * 1e6 for x in times)
    return {
        "compile_first_s": first,
        "compile_cached_s": cached,
        "mask_us_mean": statistics.fmean(times_us),
        "mask_us_p50": times_us[len(times_us) // 2],
        "mask_us_p95": times_us[int(len(times_us) * 0.95)],
        "samples": len(times_us),
    }


def run_outlines(prompts: list[str], max_new_tokens: int) -> tuple[float, list[str]]:
    import outlines
    from outlines.types import JsonSchema

    from sgl.runtime.model.paths import resolve_model_path

    hf = load_hf_model("default")
    import os

    import transformers

    p = resolve_model_path("default")
    tok = transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(p), gguf_file=os.path.basename(p)
    )
    model = outlines.from_transformers(hf, tok)
    generator = outlines.Generator(model, JsonSchema(json.dumps(SCHEMA)))
    generator(prompts[0], max_new_tokens=8)  # warm-up (compiles the index)
    t = time.perf_counter()
    outs = [generator(p, max_new_tokens=max_new_tokens, do_sample=False) for p in prompts]
    return time.perf_counter() - t, outs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-texts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument(
        "--num-sequential", type=int, default=8, help="texts for the one-at-a-time comparison"
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="interleaved repetitions of each timed run (best kept)",
    )
    ap.add_argument("--skip-outlines", action="store_true")
    args = ap.parse_args()

    import jsonschema

    import sgl

    results: dict = {"config": vars(args), "schema": SCHEMA}
    engine = sgl.Engine(model_path="default")
    prompts = [prompt(engine.tokenizer, t) for t in texts(args.num_texts)]
    params = {
        "json_schema": json.dumps(SCHEMA),
        "temperature": 0,
        "max_new_tokens": args.max_new_tokens,
    }
    engine.generate(prompts[:2], params)  # warm-up, compiles the schema

    # 1. Jump-forward on vs off, all texts submitted together. Repetitions are interleaved and
    # the fastest of each kept, so a noisy neighbour on a shared machine skews both alike.
    def validate(outs) -> int:
        valid = 0
        for o in outs:
            try:
                jsonschema.validate(json.loads(o["text"]), SCHEMA)
                valid += 1
            except Exception:
                pass
        return valid

    def jump_forward_runs(batch_prompts: list[str], one_at_a_time: bool) -> dict:
        runs: dict = {"jump-forward on": [], "jump-forward off": []}
        out: dict = {}
        for _ in range(args.repeats):
            for name in runs:
                engine.update_options(disable_jump_forward=name != "jump-forward on")
                if one_at_a_time:
                    engine.flush_cache()
                    steps = engine.get_server_info()["forward_steps"]
                    t = time.perf_counter()
                    outs = [engine.generate(p, params) for p in batch_prompts]
                    seconds = time.perf_counter() - t
                    steps = engine.get_server_info()["forward_steps"] - steps
                else:
                    seconds, steps, outs = run_engine(engine, batch_prompts, params)
                runs[name].append(seconds)
                out[name] = {
                    "forward_steps": steps,
                    "valid": validate(outs),
                    "texts": [o["text"] for o in outs],
                    "completion_tokens": sum(o["meta_info"]["completion_tokens"] for o in outs),
                }
        engine.update_options(disable_jump_forward=False)
        for name, times in runs.items():
            out[name].update(seconds=min(times), all_seconds=times)
        on, off = out["jump-forward on"], out["jump-forward off"]
        out["step_ratio"] = off["forward_steps"] / on["forward_steps"]
        out["speedup"] = off["seconds"] / on["seconds"]
        out["identical_outputs"] = on["texts"] == off["texts"]
        for name in runs:
            out[name].pop("texts")
        return out

    table_cols = (
        "engine",
        "seconds (best)",
        "all runs",
        "forward steps",
        "completion tokens",
        "valid JSON",
    )

    def jump_rows(r: dict, n: int) -> list:
        return [
            (
                k,
                f"{r[k]['seconds']:.2f}",
                " ".join(f"{x:.2f}" for x in r[k]["all_seconds"]),
                r[k]["forward_steps"],
                r[k]["completion_tokens"],
                f"{r[k]['valid']}/{n}",
            )
            for k in ("jump-forward on", "jump-forward off")
        ]

    together = jump_forward_runs(prompts, one_at_a_time=False)
    results["jump_forward_batch"] = together
    print_table(
        f"JSON extraction, {args.num_texts} texts submitted together, 6-key schema, greedy",
        jump_rows(together, len(prompts)),
        table_cols,
    )
    print(
        f"jump-forward: {together['step_ratio']:.2f}x fewer forward steps (target >= 1.5x), "
        f"{together['speedup']:.2f}x faster (target >= 1.3x); identical outputs: "
        f"{together['identical_outputs']}"
    )
    results["jump_forward_step_ratio"], results["jump_forward_speedup"] = (
        together["step_ratio"],
        together["speedup"],
    )

    alone = jump_forward_runs(prompts[: args.num_sequential], one_at_a_time=True)
    results["jump_forward_one_at_a_time"] = alone
    print_table(
        f"Same, the first {args.num_sequential} texts one at a time (latency-bound steps)",
        jump_rows(alone, args.num_sequential),
        table_cols,
    )
    print(
        f"jump-forward one at a time: {alone['step_ratio']:.2f}x fewer forward steps, "
        f"{alone['speedup']:.2f}x faster"
    )

    # 2. Mask cost per decode step at batch 32: decode-only time (a 64-token run minus a
    # 1-token run, so prefill cancels out) with and without a constraint. The regex never
    # forces text and is longer than 64 tokens, so every request decodes exactly 64 tokens
    # either way. Interleaved repetitions; the fastest of each kept.
    free = {"temperature": 0, "ignore_eos": True}
    masked = {**free, "regex": "[a-z ,.]{400}"}
    timings: dict = {name: {1: [], 64: []} for name in ("unconstrained", "regex-constrained")}
    for _ in range(args.repeats):
        for name, p in (("unconstrained", free), ("regex-constrained", masked)):
            for n in (1, 64):
                seconds, steps, outs = run_engine(engine, prompts, {**p, "max_new_tokens": n})
                assert all(o["meta_info"]["completion_tokens"] == n for o in outs)
                timings[name][n].append((seconds, steps))
    costs = {}
    for name, t in timings.items():
        s1, n1 = min(t[1])
        s64, n64 = min(t[64])
        costs[name] = {
            "decode_seconds": s64 - s1,
            "decode_steps": n64 - n1,
            "ms_per_step": 1000 * (s64 - s1) / (n64 - n1),
        }
    overhead = costs["regex-constrained"]["ms_per_step"] / costs["unconstrained"]["ms_per_step"] - 1
    print_table(
        f"Decode step cost at batch {len(prompts)} (64 decode steps, prefill excluded, best of "
        f"{args.repeats})",
        [
            (k, f"{v['decode_seconds']:.2f}", v["decode_steps"], f"{v['ms_per_step']:.1f}")
            for k, v in costs.items()
        ],
        ("decoding", "seconds", "decode steps", "ms/step"),
    )
    print(f"mask overhead per step: {overhead:+.1%} (target <= +10%)")
    results["per_step"], results["mask_overhead"] = costs, overhead

    lat = {
        "regex": mask_latency(engine, "regex", r"(\+\d{1,3} )?\(?\d{3}\)?[ -]\d{3}-\d{4}"),
        "json_schema": mask_latency(engine, "json_schema", json.dumps(SCHEMA)),
        "ebnf": mask_latency(
            engine,
            "ebnf",
            'root ::= expr\nexpr ::= term (("+" | "-") term)*\n'
            'term ::= factor (("*" | "/") factor)*\n'
            'factor ::= [0-9]+ | "(" expr ")"\n',
        ),
    }
    print_table(
        f"Mask latency per token at vocab {engine.model_config.vocab_size}",
        [
            (
                k,
                f"{v['mask_us_mean']:.0f}",
                f"{v['mask_us_p50']:.0f}",
                f"{v['mask_us_p95']:.0f}",
                f"{v['compile_first_s'] * 1000:.0f}",
                f"{v['compile_cached_s'] * 1e6:.0f}",
            )
            for k, v in lat.items()
        ],
        ("grammar", "mean us", "p50 us", "p95 us", "compile ms (first)", "compile us (cached)"),
    )
    results["mask_latency"] = lat
    engine.shutdown()

    if not args.skip_outlines:
        seconds, outs = run_outlines(prompts, args.max_new_tokens)
        valid = 0
        for o in outs:
            try:
                jsonschema.validate(json.loads(o), SCHEMA)
                valid += 1
            except Exception:
                pass
        results["outlines_hf"] = {"seconds": seconds, "valid": valid}
        on = together["jump-forward on"]
        speedup = seconds / on["seconds"]
        results["speedup_vs_outlines"] = speedup
        print_table(
            "sgl vs outlines + HF transformers (same model, schema, texts; outlines one text at a "
            "time)",
            [
                (
                    "sgl (jump-forward on)",
                    f"{on['seconds']:.2f}",
                    f"{on['valid']}/{args.num_texts}",
                ),
                ("outlines + HF", f"{seconds:.2f}", f"{valid}/{args.num_texts}"),
            ],
            ("system", "seconds", "valid JSON"),
        )
        print(f"sgl speedup over outlines + HF: {speedup:.1f}x (target >= 5x)")
    write_result("json", results)


if __name__ == "__main__":
    main()
