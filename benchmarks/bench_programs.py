"""Frontend programs on the in-process engine, same run:

1. `run_batch` of a few-shot program over 64 items vs the same items run one after another;
2. a 4-way fork program with the radix cache on vs off (two engines);
3. interpreter overhead per gen call: a program's gen vs a direct `Engine.generate` call on
   the same prompt (median of many, interleaved), and the interpreter alone on a backend
   that answers instantly.

    .venv/bin/python benchmarks/bench_programs.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from typing import Any

from common import print_table, write_result

import sgl
from sgl.lang import Backend, ChatTemplate
from sgl.lang.choices import ChoiceScores, decide

FEW_SHOT = "".join(
    f"Q: What is {a} plus {b}?\nA: {a + b}\n\n"
    for a, b in [(12, 7), (30, 12), (8, 8), (41, 9), (3, 75), (19, 23)]
)


@sgl.function
def few_shot(s, a, b):
    s += FEW_SHOT + f"Q: What is {a} plus {b}?\nA:"
    s += sgl.gen("answer", max_tokens=8, stop="\n")


DOC = (
    "The river town kept its old stone bridge, a market on Saturdays, a library in the former "
    "mill, and a small harbour where fishing boats unloaded at dawn. Visitors came for the walks "
    "along the cliffs and the festival of lanterns held every autumn. "
) * 4


@sgl.function
def four_questions(s, doc):
    s += "Read the text and answer the questions briefly.\n\n" + doc + "\n"
    forks = s.fork(4)
    questions = [
        "What does the town keep?",
        "When is the market?",
        "Where is the library?",
        "Why do visitors come?",
    ]
    forks += lambda i: (
        f"Question: {questions[i]}\nAnswer:" + sgl.gen("answer", max_tokens=16, stop="\n")
    )
    forks.join()


@sgl.function
def one_gen(s, prompt):
    s += prompt
    s += sgl.gen("out", max_tokens=1)


class InstantBackend(Backend):
    """Answers every call at once: what remains is the interpreter's own cost."""

    def generate(self, text, sampling, logprobs):
        return "x", {"finish_reason": {"type": "length", "length": 1}}

    def generate_stream(self, text, sampling, logprobs) -> Iterator[tuple[str, Any]]:
        yield "x", {"finish_reason": {"type": "length", "length": 1}}

    def select(self, text, choices, temperature, method):
        return decide(method, ChoiceScores(list(choices), [[-1.0] for _ in choices]), temperature)

    def cache_prefix(self, text):
        pass

    def chat_template(self):
        return ChatTemplate.plain()


def bench_run_batch(engine, n: int) -> dict:
    backend = sgl.as_backend(engine)
    items = [{"a": 10 + i, "b": 3 * i % 50} for i in range(n)]
    engine.flush_cache()
    t = time.perf_counter()
    batched = few_shot.run_batch(items, temperature=0, num_threads="auto", backend=backend)
    t_batch = time.perf_counter() - t
    engine.flush_cache()
    t = time.perf_counter()
    sequential = [few_shot.run(**it, temperature=0, backend=backend) for it in items]
    t_seq = time.perf_counter() - t
    same = sum(a["answer"] == b["answer"] for a, b in zip(batched, sequential))
    return {
        "items": n,
        "run_batch_seconds": t_batch,
        "sequential_seconds": t_seq,
        "speedup": t_seq / t_batch,
        "identical_answers": same,
    }


def bench_fork(engines: dict, runs: int) -> dict:
    out = {}
    docs = [f"Document {i}. " + DOC for i in range(runs)]
    for name, engine in engines.items():
        backend = sgl.as_backend(engine)
        engine.flush_cache()
        info = engine.get_server_info()
        t = time.perf_counter()
        for d in docs:
            four_questions.run(doc=d, temperature=0, backend=backend)
        seconds = time.perf_counter() - t
        after = engine.get_server_info()
        out[name] = {
            "seconds": seconds,
            "prefill_tokens": after["prefill_tokens"] - info["prefill_tokens"],
            "cached_tokens": after["cached_tokens"] - info["cached_tokens"],
        }
    return out


def bench_overhead(engine, calls: int) -> dict:
    backend = sgl.as_backend(engine)
    prompt = "Count: one, two, three,"
    sampling = {"max_new_tokens": 1, "temperature": 0}
    engine.generate(prompt, sampling)  # cache the prompt: both sides then do the same tiny step
    program, direct = [], []
    for _ in range(calls):
        t = time.perf_counter()
        one_gen.run(prompt=prompt, temperature=0, backend=backend)
        program.append(time.perf_counter() - t)
        t = time.perf_counter()
        engine.generate(prompt, sampling)
        direct.append(time.perf_counter() - t)
    instant = InstantBackend()
    one_gen.run(prompt=prompt, backend=instant)
    t = time.perf_counter()
    for _ in range(calls):
        one_gen.run(prompt=prompt, backend=instant)
    alone = (time.perf_counter() - t) / calls
    return {
        "calls": calls,
        "program_ms_median": 1000 * statistics.median(program),
        "direct_ms_median": 1000 * statistics.median(direct),
        "overhead_ms": 1000 * (statistics.median(program) - statistics.median(direct)),
        "interpreter_alone_ms": 1000 * alone,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=64)
    ap.add_argument("--fork-runs", type=int, default=6)
    ap.add_argument("--overhead-calls", type=int, default=50)
    args = ap.parse_args()

    engine = sgl.Engine(model_path="default")
    results: dict = {"config": vars(args)}

    rb = bench_run_batch(engine, args.items)
    results["run_batch"] = rb
    print_table(
        f"Few-shot program over {args.items} items (8 new tokens each, greedy)",
        [
            ("run_batch (threads)", f"{rb['run_batch_seconds']:.2f}"),
            ("one after another", f"{rb['sequential_seconds']:.2f}"),
        ],
        ("how", "seconds"),
    )
    print(
        f"run_batch speedup: {rb['speedup']:.2f}x (target >= 4x); identical answers "
        f"{rb['identical_answers']}/{args.items}"
    )

    no_radix = sgl.Engine(model_path="default", disable_radix_cache=True)
    fk = bench_fork({"radix cache on": engine, "radix cache off": no_radix}, args.fork_runs)
    no_radix.shutdown()
    results["fork"] = fk
    fk["speedup"] = fk["radix cache off"]["seconds"] / fk["radix cache on"]["seconds"]
    print_table(
        f"4-way fork program ({args.fork_runs} runs, ~{len(engine.encode(DOC))}-token shared "
        "document)",
        [
            (k, f"{v['seconds']:.2f}", v["prefill_tokens"], v["cached_tokens"])
            for k, v in fk.items()
            if k != "speedup"
        ],
        ("engine", "seconds", "prompt tokens computed", "prompt tokens cached"),
    )
    print(f"radix cache speedup on the fork program: {fk['speedup']:.2f}x")

    ov = bench_overhead(engine, args.overhead_calls)
    results["overhead"] = ov
    print_table(
        f"Interpreter overhead per gen call (median of {ov['calls']}, interleaved)",
        [
            ("program with one gen", f"{ov['program_ms_median']:.2f}"),
            ("direct Engine.generate", f"{ov['direct_ms_median']:.2f}"),
            ("interpreter alone (instant backend)", f"{ov['interpreter_alone_ms']:.3f}"),
        ],
        ("call", "ms"),
    )
    print(
        f"overhead per gen: {ov['overhead_ms']:.2f} ms vs direct (target < 1 ms); "
        f"interpreter alone {ov['interpreter_alone_ms']:.3f} ms"
    )
    engine.shutdown()
    write_result("programs", results)


if __name__ == "__main__":
    main()
