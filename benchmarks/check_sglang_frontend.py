"""SGLang's own frontend against sgl's server, beside sgl's frontend on the same programs.

The same program text runs twice against one `python -m sgl.launch_server` on the embedded
model, greedy: once with SGLang 0.5.23's frontend (`import sglang as sgl`, its
`RuntimeEndpoint`), once with sgl's (`import sgl`): only the import differs. Every variable
must come out equal. (SGLang picks a chat template by the model's name and knows none for
SmolLM2, so its endpoint is told `chat_template_name="chatml"`, the model's format; the
programs give a system message, so ChatML and the model's own template render alike.) The SGLang
frontend is pip-installed (without its runtime's dependencies: the frontend needs six small
packages) into ~/.cache/sgl-peers/sglang-frontend-<version> on first use. Not part of `make test`
(it installs a peer); results in results/sglang_frontend.json.

    .venv/bin/python benchmarks/check_sglang_frontend.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SGLANG_VERSION = "0.5.23"
# What `import sglang` needs beyond this project's own dependencies.
FRONTEND_DEPS = ["orjson", "pybase64", "msgspec", "pyzmq", "ipython", "traitlets"]
SITE = Path.home() / ".cache" / "sgl-peers" / f"sglang-frontend-{SGLANG_VERSION}"


def programs(sgl: Any) -> dict[str, tuple[Callable, dict]]:
    """name -> (program, run kwargs); written once, for either frontend."""

    @sgl.function
    def chat(s, question):  # with a system message: the model's template then adds no default one
        s += sgl.system("You are a terse assistant.")
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=24, stop="\n"))

    @sgl.function
    def constrained(s):
        s += "Q: How many legs does a spider have?\nA: " + sgl.gen(
            "n", regex=r"[0-9]+", max_tokens=4
        )
        s += "\nIs the sky blue? " + sgl.select("yes", ["yes", "no"])
        s += "\nA color: " + sgl.gen("color", choices=["red", "green", "blue"])
        # (not dtype=int: SGLang's int pattern allows trailing blanks and stops at the first
        # one; sgl's is the bare integer. Both give an integer; the digits can differ.)

    @sgl.function
    def forks(s):
        s += "Two animals, one per line.\n"
        f = s.fork(2)
        for i in range(2):
            f[i] += f"Animal {i + 1}: " + sgl.gen("a", max_tokens=8, stop="\n")
        f.join()

    @sgl.function
    def multi_turn(s):
        s += sgl.system("You answer in one line.")
        s += sgl.user("Name a planet.")
        s += sgl.assistant(sgl.gen("p", max_tokens=12))
        s += sgl.user("And a moon of it?")
        s += sgl.assistant(sgl.gen("m", max_tokens=12))

    @sgl.function
    def logprobs(s):
        s += "The capital of France is" + sgl.gen(
            "x", max_tokens=6, return_logprob=True, top_logprobs_num=2
        )

    return {
        "chat": (chat, {"question": "Name a fruit."}),
        "constrained": (constrained, {}),
        "forks": (forks, {}),
        "multi_turn": (multi_turn, {}),
        "logprobs": (logprobs, {}),
    }


def run_all(sgl: Any, url: str) -> dict[str, Any]:
    """Every program's variables (and a streamed and a batched run), greedy."""
    # SGLang's frontend picks a chat template by the model's name, and knows none for the
    # embedded SmolLM2: name ChatML, its format. (sgl takes the server's own template.)
    sgl.set_default_backend(sgl.RuntimeEndpoint(url, chat_template_name="chatml"))
    out: dict[str, Any] = {}
    for name, (prog, kwargs) in programs(sgl).items():
        t = time.perf_counter()
        try:
            state = prog.run(temperature=0, **kwargs)
            state.sync()
            values = {k: state[k] for k in sorted(state.stream_executor.variables)}
            if name == "logprobs":
                meta = state.get_meta_info("x")
                values["x_logprob_tokens"] = [e[1] for e in meta["output_token_logprobs"]]
            out[name] = {"ok": True, "values": values, "seconds": round(time.perf_counter() - t, 2)}
        except Exception as e:  # recorded, compared like the values
            out[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    chat = programs(sgl)["chat"][0]
    state = chat.run(question="Say hello.", temperature=0, stream=True)
    out["stream"] = {"ok": True, "values": {"answer": "".join(state.text_iter("answer"))}}
    states = chat.run_batch([{"question": q} for q in ("One?", "Two?", "Three?")], temperature=0)
    out["run_batch"] = {"ok": True, "values": {"answers": [s["answer"] for s in states]}}
    return out


def ensure_sglang() -> Path:
    if not (SITE / "sglang").is_dir():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(SITE),
                f"sglang=={SGLANG_VERSION}",
                *FRONTEND_DEPS,
            ],
            check=True,
        )
    return SITE


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frontend", choices=["both", "sglang", "sgl"], default="both")
    ap.add_argument("--url", help="an sgl server (default: start one on the embedded model)")
    ap.add_argument("--out", help="(internal) write this frontend's results here")
    args = ap.parse_args()
    if args.frontend != "both":
        sgl = __import__("sglang") if args.frontend == "sglang" else __import__("sgl")
        Path(args.out).write_text(json.dumps(run_all(sgl, args.url)))
        return
    site = ensure_sglang()
    from common import print_table, write_result

    import sgl

    # float32 dense weights: greedy tokens then do not depend on what the cache holds (in bf16
    # a prefix computed once and reused can round differently from one computed again)
    with sgl.Runtime(model_path="default", dtype="float32", quantization="none") as runtime:
        results = {}
        for frontend in ("sglang", "sgl"):
            sgl.RuntimeEndpoint(runtime.url).flush_cache()
            out = Path(f"/tmp/sglang_frontend_{frontend}.json")
            env = dict(
                os.environ,
                PYTHONPATH=os.pathsep.join([str(site), str(ROOT)])
                if frontend == "sglang"
                else str(ROOT),
            )
            subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--frontend",
                    frontend,
                    "--url",
                    runtime.url,
                    "--out",
                    str(out),
                ],
                env=env,
                check=True,
                timeout=900,
            )
            results[frontend] = json.loads(out.read_text())
    rows, same_all = [], True
    for name in results["sgl"]:
        a, b = results["sglang"].get(name, {}), results["sgl"][name]
        same = a.get("ok") and b.get("ok") and a["values"] == b["values"]
        same_all &= bool(same)
        rows.append(
            (
                name,
                "ok" if a.get("ok") else a.get("error", "?")[:60],
                "ok" if b.get("ok") else b["error"][:60],
                "yes" if same else "NO",
            )
        )
    print_table(
        f"SGLang {SGLANG_VERSION} frontend vs sgl frontend, same programs, one sgl server (greedy)",
        rows,
        ("program", "sglang frontend", "sgl frontend", "same variables"),
    )
    write_result(
        "sglang_frontend",
        {"sglang_version": SGLANG_VERSION, "all_same": same_all, "results": results},
    )
    sys.exit(0 if same_all else 1)


if __name__ == "__main__":
    main()
