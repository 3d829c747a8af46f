"""Charts of the README's benchmark tables, drawn from the results JSON each table cites (never
typed-in figures), one PNG per table under `results/` (or `--out-dir`).

    .venv/bin/python benchmarks/plot_results.py [--out-dir DIR] [--only NAME ...]

A missing JSON or field stops the script with a message naming the file and the field.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DPI = 110
WIDTH_IN = 8.2  # ~900 px at DPI


class ResultsError(Exception):
    """A results JSON is missing or lacks a field a chart needs."""


def load(results: Path, name: str) -> dict:
    path = results / name
    if not path.is_file():
        raise ResultsError(
            f"{path}: results file missing; rerun its benchmark or restore it from git"
        )
    return {"__file__": str(path), **json.loads(path.read_text())}


def field(data: dict, *keys: str):
    """data[k1][k2]...; a missing key is a ResultsError naming the file and the key path."""
    node = data
    for i, k in enumerate(keys):
        if not isinstance(node, dict) or k not in node:
            raise ResultsError(f"{data['__file__']}: field {'.'.join(keys[: i + 1])!r} missing")
        node = node[k]
    return node


def machine(data: dict) -> str:
    m = field(data, "machine")
    cpu = m.get("cpu_model") or m.get("processor", "CPU")
    extra = f", {m['bf16_matmul']}" if m.get("bf16_matmul") else ""
    return f"{cpu}{extra}, {m.get('cpu_count')} cores, {str(m.get('date', ''))[:10]}"


def grouped_bars(
    ax, groups: list[str], series: dict[str, list[float]], fmt: str = "{:.3g}"
) -> None:
    """One cluster per group, one bar per series, each bar labelled with its value."""
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(groups))]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, [fmt.format(v) for v in values], fontsize=7)
    ax.set_xticks(range(len(groups)), groups, fontsize=8)


def save(fig, out: Path) -> Path:
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return out


def plot_tp(results: Path, out_dir: Path) -> Path:
    d = load(results, "tp.json")
    mem = field(d, "memory")
    rows = [
        (
            k.replace(" (", "\n(").replace(" float32", "\nfloat32") + "\nweights",
            field(d, "memory", k, "tp1", "max_weight_mb"),
            field(d, "memory", k, "tpN", "max_weight_mb"),
        )
        for k in mem
    ]
    k0 = next(iter(mem))
    rows.append(
        (
            f"{k0}\nKV pool",
            field(d, "memory", k0, "tp1", "max_kv_mb"),
            field(d, "memory", k0, "tpN", "max_kv_mb"),
        )
    )
    speed = field(d, "speed_best")
    fig, (a, b) = plt.subplots(1, 2, figsize=(WIDTH_IN, 4.2))
    grouped_bars(
        a,
        [r[0] for r in rows],
        {"tp 1": [r[1] for r in rows], "tp 2 (largest rank)": [r[2] for r in rows]},
        "{:.0f}",
    )
    a.set_yscale("log")
    a.set_ylabel("MB per rank (log)")
    a.tick_params(axis="x", labelsize=6)
    a.legend(fontsize=7)
    metrics = [
        ("batch1_ms_per_token", "batch-1 decode\n(inverse of ms/token)", -1),
        ("decode_batch8_tok_s", "batch-8 decode\ntok/s", 1),
        ("prefill_tok_s", "prefill\ntok/s", 1),
    ]
    base = next(iter(speed))
    grouped_bars(
        b,
        [m[1] for m in metrics],
        {
            s: [
                (field(d, "speed_best", s, k) / field(d, "speed_best", base, k)) ** sign
                for k, _, sign in metrics
            ]
            for s in speed
        },
        "{:.2f}",
    )
    b.axhline(1.0, color="black", linewidth=0.8)
    b.set_ylabel(f"speed, x {base} (1B body, float32)", fontsize=8)
    b.legend(fontsize=7)
    fig.suptitle(f"Tensor parallelism (results/tp.json); {machine(d)}", fontsize=9)
    return save(fig, out_dir / "tp.png")


def plot_dp(results: Path, out_dir: Path) -> Path:
    d = load(results, "dp_saturated.json")
    res = field(d, "results")
    setups = list(res)
    fig, (a, b) = plt.subplots(1, 2, figsize=(WIDTH_IN, 3.8))
    grouped_bars(
        a,
        setups,
        {"output tok/s": [field(d, "results", s, "output_tok_s") for s in setups]},
        "{:.0f}",
    )
    a.set_ylabel("output tokens/s")
    a.tick_params(axis="x", labelsize=7, rotation=15)
    lat = {
        f"{k} {p}": [field(d, "results", s, f"{k}_{p}") for s in setups]
        for k in ("ttft", "e2e")
        for p in ("p50", "p99")
    }
    grouped_bars(b, setups, lat, "{:.1f}")
    b.set_ylabel("seconds")
    b.tick_params(axis="x", labelsize=7, rotation=15)
    b.legend(fontsize=7)
    rate = field(d, "config", "rate")
    fig.suptitle(
        f"Data parallelism at {rate:g} requests/s (results/dp_saturated.json); {machine(d)}",
        fontsize=9,
    )
    return save(fig, out_dir / "dp_saturated.png")


def plot_cpu_peers(results: Path, out_dir: Path) -> Path:
    d = load(results, "cpu_peers.json")
    models = [("embedded", "SmolLM2-135M"), ("1b", "Llama-3.2-1B shape")]
    metrics = [
        ("decode", "tok_per_s", "decode, tok/s"),
        ("prefix", "seconds", "shared prefix, s (lower is better)"),
        ("batch1", "tok_per_s", "batch-1, tok/s"),
    ]
    fig, axes = plt.subplots(len(metrics), 1, figsize=(WIDTH_IN, 8.5))
    engines = [e for e in field(d, "embedded") if e != "workloads"]
    for ax, (w, key, label) in zip(axes, metrics):
        series = {}
        for e in engines:
            series[e] = [
                float("nan") if "skipped" in field(d, m, e, w) else field(d, m, e, w, key)
                for m, _ in models
            ]
        grouped_bars(ax, [name for _, name in models], series, "{:.3g}")
        ax.set_yscale("log")
        ax.set_ylabel(label + " (log)", fontsize=8)
    axes[0].legend(fontsize=7, ncol=4, loc="upper right")
    fig.suptitle(
        f"sgl vs llama.cpp vs vLLM vs HF (results/cpu_peers.json); {machine(d)}", fontsize=9
    )
    return save(fig, out_dir / "cpu_peers.png")


def plot_remote_programs(results: Path, out_dir: Path) -> Path:
    d = load(results, "remote_programs.json")
    progs = field(d, "programs")
    lat = ["0ms", "10ms", "50ms"]
    series = {
        f"{ms} added": [field(d, "programs", p, "client_side_over_shipped", ms) for p in progs]
        for ms in lat
    }
    series["shipped / in process (0 ms)"] = [
        field(d, "programs", p, "shipped_vs_in_process_0ms") for p in progs
    ]
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.8))
    grouped_bars(ax, list(progs), series, "{:.2f}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("ratio of median seconds per program")
    ax.set_title("client-side / shipped per added latency; shipped / in process", fontsize=8)
    ax.legend(fontsize=7)
    fig.suptitle(
        f"Shipped programs, median of {field(d, 'runs')} (results/remote_programs.json); "
        f"{machine(d)}",
        fontsize=9,
    )
    return save(fig, out_dir / "remote_programs.png")


def plot_tools(results: Path, out_dir: Path) -> Path:
    d = load(results, "tools.json")
    modes = list(field(d, "modes"))
    fig, (a, b) = plt.subplots(1, 2, figsize=(WIDTH_IN, 3.6))
    grouped_bars(
        a,
        modes,
        {
            label: [100 * field(d, "modes", m, key) for m in modes]
            for key, label in [
                ("well_formed_rate", "well-formed call"),
                ("schema_valid_rate", "arguments valid"),
            ]
        },
        "{:.0f}%",
    )
    a.set_ylabel("% of outputs")
    a.set_ylim(0, 110)
    a.legend(fontsize=7)
    grouped_bars(
        b,
        modes,
        {"ms / output token": [field(d, "modes", m, "median_ms_per_token") for m in modes]},
        "{:.1f}",
    )
    b.set_ylabel("median ms per output token")
    fig.suptitle(
        f"Tool calls, {field(d, 'requests')} requests x {field(d, 'samples')} samples at "
        "temperature "
        f"{field(d, 'temperature')} (results/tools.json); {machine(d)}",
        fontsize=9,
    )
    return save(fig, out_dir / "tools.png")


def plot_program_workloads(results: Path, out_dir: Path) -> Path:
    from plot_program_workloads import draw  # the one way these two tables are drawn

    d = load(results, "program_workloads.json")
    field(d, "results")
    return draw(d, out_dir / "program_workloads.png")


CHARTS = {
    "tp": plot_tp,
    "dp_saturated": plot_dp,
    "cpu_peers": plot_cpu_peers,
    "remote_programs": plot_remote_programs,
    "tools": plot_tools,
    "program_workloads": plot_program_workloads,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(RESULTS), help="folder of the results JSONs")
    ap.add_argument("--out-dir", default=str(RESULTS), help="folder the PNGs go to")
    ap.add_argument("--only", nargs="*", choices=sorted(CHARTS), help="draw only these charts")
    args = ap.parse_args(argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        for name in args.only or CHARTS:
            print(f"wrote {CHARTS[name](Path(args.results), out_dir)}")
    except ResultsError as e:
        print(f"plot_results: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
