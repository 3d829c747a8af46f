"""The same sgl programs through `sgl.OpenAI` on sgl's server, llama.cpp's llama-server and vLLM.

Every engine serves the embedded SmolLM2-135M (sgl and llama.cpp its GGUF; vLLM the HF
directory `bench_cpu_peers.prepare` writes from the same weights) on 127.0.0.1, one after
another. Each program runs greedily through `sgl.OpenAI` (chat or completion mode), and
per engine and program we record: the variables, the select method used, API calls,
prompt / completion tokens (the server's `usage`), wall time, and what was refused (the
error naming the parameter). The speculative program runs with and without
`num_api_spec_tokens` to count the calls and prompt tokens it saves.

    .venv/bin/python benchmarks/bench_openai_backends.py [--engines sgl,llama.cpp,vllm]

Results: results/openai_backends.json. vLLM's first start compiles for minutes on 2 cores;
leave it out of --engines to skip it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import start_server, stop_process  # noqa: E402

import sgl  # noqa: E402
from sgl.lang.backends.openai_dialects import UnsupportedParameterError  # noqa: E402

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


# ----------------------------------------------------------------------------- programs


@sgl.function
def chat(s, question):
    s += sgl.system("You are brief.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=24))


@sgl.function
def classify(s, text):
    s += f"Review: {text}\nSentiment:"
    s += sgl.select("label", [" positive", " negative"])
    s += "\nConfidence (1-9): " + sgl.gen_int("score", max_tokens=2)


@sgl.function
def phone(s):
    s += "A phone number: " + sgl.gen("phone", regex=r"\d{3}-\d{4}", max_tokens=12)


@sgl.function
def chat_json(s):
    s += sgl.user("Invent a person.")
    s += sgl.assistant(sgl.gen("person", json_schema=PERSON, max_tokens=48))


@sgl.function
def chat_choice(s):
    s += sgl.user("Is the sky blue? Answer Yes or No.")
    s += sgl.assistant(sgl.select("yn", ["Yes", "No"]))


@sgl.function
def branches(s):
    s += "Name two colors and two animals.\n"
    forks = s.fork(2)
    forks += lambda i: ["Color:", "Animal:"][i] + sgl.gen("item", max_tokens=6, stop="\n")
    forks.join()


def _people(s):
    s += "Name: Alice\nAge: 30\nCity: Paris\n\nName: Bob\nAge: 25\nCity: London\n\nName:"
    s += (
        sgl.gen("name", max_tokens=8, stop="\n")
        + "\nAge:"
        + sgl.gen("age", max_tokens=4, stop="\n")
    )
    s += "\nCity:" + sgl.gen("city", max_tokens=8, stop="\n")


people = sgl.function(_people)
people_spec = sgl.function(num_api_spec_tokens=48)(_people)

QUESTIONS = [
    {"question": q} for q in ("Name a fruit.", "Name a color.", "Name a river.", "Name a planet.")
]

# name -> (chat mode?, run(backend) -> states)
PROGRAMS: dict[str, tuple[bool, Callable[[Any], list]]] = {
    "chat_gen": (True, lambda b: [chat.run(question="Name a planet.", temperature=0, backend=b)]),
    "chat_stream": (True, lambda b: [_streamed(b)]),
    "chat_run_batch": (True, lambda b: chat.run_batch(QUESTIONS, temperature=0, backend=b)),
    "chat_json_schema": (True, lambda b: [chat_json.run(temperature=0, backend=b)]),
    "chat_select": (True, lambda b: [chat_choice.run(temperature=0, backend=b)]),
    "select_and_int": (
        False,
        lambda b: [classify.run(text="Great food, lovely staff.", temperature=0, backend=b)],
    ),
    "regex": (False, lambda b: [phone.run(temperature=0, backend=b)]),
    "fork": (False, lambda b: [branches.run(temperature=0, backend=b)]),
    "three_gens": (False, lambda b: [people.run(temperature=0, backend=b)]),
    "three_gens_speculative": (False, lambda b: [people_spec.run(temperature=0, backend=b)]),
}


def _streamed(backend: Any) -> Any:
    state = chat.run(question="Name a fruit.", temperature=0, stream=True, backend=backend)
    pieces = list(state.text_iter("answer"))
    if "".join(pieces) != state["answer"] or len(pieces) < 2:
        raise sgl.ProgramError(f"streamed {len(pieces)} pieces that do not add up to the answer")
    return state


def run_program(name: str, backend: Any) -> dict[str, Any]:
    _chat, fn = PROGRAMS[name]
    backend.token_usage.reset()
    t = time.perf_counter()
    try:
        states = fn(backend)
        for st in states:
            st.sync()
    except sgl.ProgramError as e:
        cause = e.__cause__
        refused = isinstance(cause, UnsupportedParameterError)
        return {
            "ok": False,
            "refused" if refused else "error": str(cause or e),
            **({"param": cause.param} if refused else {}),
            **backend.token_usage.snapshot(),
        }
    out: dict[str, Any] = {
        "ok": True,
        "wall_s": round(time.perf_counter() - t, 3),
        **backend.token_usage.snapshot(),
    }
    out["results"] = [dict(st.stream_executor.variables) for st in states]
    methods = {
        k: m.get("select_method")
        for st in states
        for k, m in st.stream_executor.meta_info.items()
        if isinstance(m, dict) and m.get("select_method")
    }
    if methods:
        out["select_method"] = methods
    return out


def run_engine(base_url: str) -> dict[str, Any]:
    chat_api = sgl.OpenAI("default", base_url=base_url)
    text_api = sgl.OpenAI("default", base_url=base_url, is_chat_model=False)
    res: dict[str, Any] = {"server_kind": chat_api.server_kind, "programs": {}}
    if chat_api.server_kind == "sgl":
        info = requests.get(base_url[: -len("/v1")] + "/get_server_info", timeout=30).json()
        res["sgl_weights"] = {"dtype": info.get("dtype"), "quantization": info.get("quantization")}
    # Warm-up (first requests, a first grammar compile), not timed.
    classify.run(text="Fine.", temperature=0, backend=text_api)
    chat.run(question="Hi.", temperature=0, backend=chat_api)
    for name, (is_chat, _fn) in PROGRAMS.items():
        res["programs"][name] = r = run_program(name, chat_api if is_chat else text_api)
        print(f"  {name}: {str(r)[:160]}", flush=True)
    res["refusals"] = refusals(text_api, chat_api)
    p, s = res["programs"]["three_gens"], res["programs"]["three_gens_speculative"]
    if p["ok"] and s["ok"]:
        res["speculation"] = {
            "same_results": p["results"] == s["results"],
            "calls": [p["calls"], s["calls"]],
            "prompt_tokens": [p["prompt_tokens"], s["prompt_tokens"]],
        }
    return res


def refusals(text_api: Any, chat_api: Any) -> dict[str, str]:
    """What this kind refuses among the constraints (each is a one-gen program)."""
    probes = {
        "regex": sgl.gen("x", regex=r"\d+", max_tokens=4),
        "dtype_int": sgl.gen_int("x", max_tokens=4),
        "json_schema_completion": sgl.gen("x", json_schema=PERSON, max_tokens=4),
        "ebnf": sgl.gen("x", ebnf='root ::= "a"', max_tokens=4),
        "top_k": sgl.gen("x", top_k=5, max_tokens=4),
    }
    out = {}
    for name, expr in probes.items():
        prog = sgl.function(lambda s, e=expr: s.__iadd__("Q: " + e))
        try:
            prog.run(temperature=0, backend=text_api)
        except sgl.ProgramError as e:
            out[name] = str(e.__cause__ or e)[:300]
    return out


# ----------------------------------------------------------------------------- servers


def start(engine: str) -> tuple[subprocess.Popen, str]:
    proc, url = start_server(engine)
    return proc, url + "/v1"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", default="sgl,llama.cpp,vllm")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from common import write_result

    results: dict[str, Any] = {
        "programs": {k: "chat" if v[0] else "completion" for k, v in PROGRAMS.items()}
    }
    for engine in args.engines.split(","):
        print(f"{engine} ...", flush=True)
        t = time.perf_counter()
        try:
            proc, url = start(engine)
        except Exception as e:
            results[engine] = {"skipped": f"could not start: {e}"}
            continue
        try:
            results[engine] = {"start_s": round(time.perf_counter() - t, 1), **run_engine(url)}
        finally:
            stop_process(proc)
    print(write_result("openai_backends", results, args.out))


if __name__ == "__main__":
    main()
