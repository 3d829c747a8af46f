"""The chart of `results/program_workloads.json`: per workload, each engine's programs/s and
one program's latency as multiples of the best peer's (vLLM or llama.cpp), log scale; and the
same figures as a markdown table (`--markdown`, for the README).

    .venv/bin/python benchmarks/plot_program_workloads.py   # writes results/program_workloads.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PEERS = ("vllm", "llama.cpp")
ORDER = (
    "sgl-dsl",
    "sgl-dsl-process",
    "sgl-endpoint",
    "sgl-plain",
    "vllm-plain",
    "vllm-openai",
    "llama.cpp-plain",
    "llama.cpp-openai",
)


def relative(
    results: dict, key: str, higher_is_better: bool
) -> tuple[list[str], list[str], dict[str, list]]:
    """(workloads, engines, engine -> per-workload value / best peer's), better is always > 1."""
    workloads = [
        w
        for w, by in results.items()
        if any(e.partition("-")[0] in PEERS and key in r for e, r in by.items())
    ]
    engines = [e for e in ORDER if any(key in results[w].get(e, {}) for w in workloads)]
    out: dict[str, list] = {e: [] for e in engines}
    for w in workloads:
        peers = [r[key] for e, r in results[w].items() if e.partition("-")[0] in PEERS and key in r]
        best = max(peers) if higher_is_better else min(peers)
        for e in engines:
            v = results[w].get(e, {}).get(key)
            out[e].append(None if v is None else (v / best if higher_is_better else best / v))
    return workloads, engines, out


def markdown(results: dict, ratios: dict, engines: list[str]) -> str:
    """programs/s and one program's latency (s) per workload and engine, and sgl's best over
    the best peer's (`ratios`: the benchmark's `sgl_over_best_peer`)."""
    head = ["workload", *engines, "sgl / best peer"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for w, by in results.items():
        cells = []
        for e in engines:
            r = by.get(e, {})
            cells.append(
                f"{r['programs_per_s']:.2f} / {r['latency_s']:.2f}"
                if "programs_per_s" in r
                else "failed"
                if "failed" in r
                else "-"
            )
        r = ratios.get(w)
        lines.append(
            "| "
            + " | ".join([w, *cells, f"{r['throughput']:.2f}x / {r['latency']:.2f}x" if r else "-"])
            + " |"
        )
    return "\n".join(lines)


def draw(data: dict, out: Path) -> Path:
    """The chart of one program-workloads results dict (also drawn by plot_results.py)."""
    fig, axes = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True)
    for ax, (key, better, title) in zip(
        axes,
        [
            ("programs_per_s", True, "programs/s, x best peer"),
            ("latency_s", False, "one program's latency, x best peer (inverse)"),
        ],
    ):
        workloads, engines, rel = relative(data["results"], key, better)
        width = 0.8 / max(1, len(engines))
        for i, e in enumerate(engines):
            xs = [
                j + (i - (len(engines) - 1) / 2) * width
                for j, v in enumerate(rel[e])
                if v is not None
            ]
            ax.bar(xs, [v for v in rel[e] if v is not None], width, label=e)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylabel(title)
        ax.set_xticks(range(len(workloads)), workloads, rotation=20)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="upper center",
        ncol=len(labels),
        fontsize=8,
        bbox_to_anchor=(0.5, 0.955),
    )
    m, c = data.get("machine", {}), data.get("config", {})
    fig.suptitle(
        f"Program workloads, SmolLM2-135M, greedy, {c.get('programs')} programs / "
        f"{c.get('concurrency')} "
        f"in flight; {m.get('cpu_model', '')}, {m.get('cpu_count')} CPUs",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default=str(RESULTS / "program_workloads.json"))
    ap.add_argument("--out", default=str(RESULTS / "program_workloads.png"))
    ap.add_argument(
        "--markdown", default=None, help="comma-separated engines: print their table and stop"
    )
    args = ap.parse_args()
    data = json.loads(Path(args.results).read_text())
    if args.markdown:
        print(
            markdown(data["results"], data.get("sgl_over_best_peer", {}), args.markdown.split(","))
        )
        return
    draw(data, Path(args.out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
