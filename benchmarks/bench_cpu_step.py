"""Where a decode step's time goes on CPU: matmuls, attention, other ops, the rest.

The embedded model's forward + logits is run directly (no scheduler) on one-token steps of
`--batch` rows over a `--context`-token context, eager with plain torch ops, eager with the
fused CPU layer ops (`model/layer_ops.py`, what the engine runs) and torch.compile'd (at that
batch size), under torch's profiler. Ops are grouped
by their self CPU time: matmuls (dense and packed int8/int4), attention (our kernel), other
torch ops, and the compiled graph's own generated code; "python and dispatch" is the wall
time per step not inside any op (module calls, argument handling, dynamo's guards).

    .venv/bin/python benchmarks/bench_cpu_step.py [--quantization auto] [--dtype bfloat16]
        [--steps 40] [--batch 1] [--context 64] [--dense-copy auto|on|off] [--no-compile]
        [--wrapper cpp|python] [--name cpu_step]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import print_table, write_result  # noqa: E402

MATMUL = (
    "_weight_int4pack_mm",
    "_weight_int8pack_mm",
    "aten::mm",
    "aten::addmm",
    "aten::linear",
    "aten::matmul",
    "_linear_pointwise",
    "packed_linear",
    "sgl_qmm::",
)


class DecodeRows:
    """`rows` requests' KV rows and one-token-per-row forward steps through the model, as the
    runner builds them."""

    def __init__(self, model, dtype: torch.dtype, rows: int) -> None:
        from sgl.runtime.attention import create_attention_backend
        from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool

        c = model.config
        self.model = model
        self.pool = TokenToKVPool(
            rows * 1024 + 64, c.num_hidden_layers, c.num_key_value_heads, c.head_dim, dtype, "cpu"
        )
        self.table = ReqToTokenPool(rows + 1, c.max_position_embeddings, "cpu")
        self.backend = create_attention_backend("auto", "cpu", dtype)
        self.backend.bind(self.pool, self.table, c.num_attention_heads)
        self.rows = [self.table.alloc() for _ in range(rows)]
        self.lengths = [0] * rows

    def step(self, ids: list[list[int]], forward) -> torch.Tensor:
        """One forward: ids[i] are row i's new tokens (slots interleave across rows, as in
        decoding)."""
        from sgl.runtime.attention import ForwardBatch

        n = sum(len(t) for t in ids)
        slots = self.pool.alloc(n)
        flat, positions, first = [], [], 0
        for row, t in enumerate(ids):
            length = self.lengths[row]
            self.table.write(self.rows[row], length, slots[first : first + len(t)])
            flat += t
            positions += range(length, length + len(t))
            first += len(t)
        batch = ForwardBatch(
            torch.tensor(flat),
            torch.tensor(positions),
            slots,
            list(self.rows),
            list(self.lengths),
            [len(t) for t in ids],
            self.pool,
            self.table,
            self.backend,
            row_epochs=[self.table.epochs[r] for r in self.rows],
        )
        for row, t in enumerate(ids):
            self.lengths[row] += len(t)
        self.backend.init_forward_metadata(batch)
        last = torch.tensor([sum(len(t) for t in ids[: i + 1]) - 1 for i in range(len(ids))])
        with torch.inference_mode():
            return self.model.compute_logits(forward(batch.input_ids, batch.positions, batch)[last])

    def decode(self, token: int, forward) -> torch.Tensor:
        return self.step([[token]] * len(self.rows), forward)


def split(req: DecodeRows, forward, steps: int, top: int = 0) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    for i in range(3):
        req.decode(100 + i, forward)
    t = time.perf_counter()
    for i in range(steps):
        req.decode(200 + i, forward)
    wall_ms = (time.perf_counter() - t) / steps * 1e3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            req.decode(300 + i, forward)
    groups = {"matmuls": 0.0, "attention": 0.0, "other ops": 0.0, "compiled graph code": 0.0}
    for ev in prof.key_averages():
        ms = ev.self_cpu_time_total / 1e3 / steps
        if any(m in ev.key for m in MATMUL):
            groups["matmuls"] += ms
        elif "paged_attention" in ev.key:
            groups["attention"] += ms
        elif "CompiledFxGraph" in ev.key:
            groups["compiled graph code"] += ms
        elif ev.key.startswith(
            ("aten::", "quantized::", "sgl_cpu::", "sgl_linear::", "sgl_layer::", "mkldnn::")
        ):
            groups["other ops"] += ms
    for ev in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]:
        print(
            f"  {ev.self_cpu_time_total / 1e3 / steps:7.3f} ms  {ev.count // steps:4d} calls  "
            f"{ev.key[:90]}"
        )
    profiled_ms = sum(groups.values())
    out = {k: round(v, 3) for k, v in groups.items()}
    out["python and dispatch"] = round(max(0.0, wall_ms - profiled_ms), 3)
    out["wall ms"] = round(wall_ms, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quantization", default="auto")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=1, help="decode rows per step")
    ap.add_argument(
        "--context", type=int, default=64, help="tokens each row holds before the timed steps"
    )
    ap.add_argument("--no-compile", action="store_true", help="the eager split only")
    ap.add_argument(
        "--wrapper",
        choices=("cpp", "python"),
        default="cpp",
        help="inductor's wrapper around the generated kernels (the engine tries cpp first)",
    )
    ap.add_argument(
        "--no-pack", action="store_true", help="plain bf16 weights (no oneDNN prepacking)"
    )
    ap.add_argument(
        "--dense-copy",
        default="auto",
        choices=("auto", "on", "off"),
        help="dense bf16 copies of the quantized layers, as the engine's option",
    )
    ap.add_argument(
        "--top", type=int, default=0, help="also print the N ops of most self time a step"
    )
    ap.add_argument("--name", default="cpu_step")
    args = ap.parse_args()
    from sgl.runtime.cpu_compile import _register_attention_fake
    from sgl.runtime.model.cpu_packed import pack_dense_layers, packing_applies
    from sgl.runtime.model.dense_copy import add_dense_copies
    from sgl.runtime.model.loader import load_model
    from sgl.runtime.model.quant_route import prepare_for_compile
    from sgl.runtime.worker import dense_copy_budget

    model, _ = load_model(
        "default", getattr(torch, args.dtype), torch.device("cpu"), args.quantization
    )
    if packing_applies(getattr(torch, args.dtype), torch.device("cpu")) and not args.no_pack:
        pack_dense_layers(model)  # as the engine does
        add_dense_copies(model, lambda: dense_copy_budget(args.dense_copy, torch.device("cpu")))
    results = {}

    def fresh_rows() -> DecodeRows:
        """Rows holding `context` tokens each (one prefill), so every column starts at the same
        context."""
        req = DecodeRows(model, getattr(torch, args.dtype), args.batch)
        req.step(
            [list(range(1000 + r, 1000 + r + args.context)) for r in range(args.batch)],
            model.forward,
        )
        return req

    from sgl.runtime.model import layer_ops

    if (
        layer_ops.layer_ops_built()
    ):  # eager with the torch ops the fused ones replace, then with them
        layer_ops.enabled = False
        results["eager, torch ops"] = split(fresh_rows(), model.forward, args.steps, args.top)
        layer_ops.enabled = True
    results["eager"] = split(fresh_rows(), model.forward, args.steps, args.top)
    compile_s = None
    if not args.no_compile:
        _register_attention_fake()
        prepare_for_compile(model)
        t = time.perf_counter()
        compiled = torch.compile(
            model.forward, dynamic=False, options={"cpp_wrapper": args.wrapper == "cpp"}
        )
        req = fresh_rows()
        req.decode(7, compiled)
        compile_s = round(time.perf_counter() - t, 1)
        results["compiled"] = split(req, compiled, args.steps, args.top)
    keys = list(results["eager"])  # "eager": the engine's eager steps (fused layer ops where built)
    print_table(
        f"decode step of {args.batch} row(s) at ~{args.context} tokens, ms (SmolLM2, {args.dtype}, "
        f"quantization={args.quantization})",
        [(k, *(r[k] for r in results.values())) for k in keys],
        ("part", *results),
    )
    write_result(
        args.name,
        {
            "dtype": args.dtype,
            "quantization": args.quantization,
            "dense_copy": args.dense_copy,
            "batch": args.batch,
            "context": args.context,
            "compile_s": compile_s,
            "wrapper": args.wrapper,
            "split_ms": results,
        },
    )


if __name__ == "__main__":
    main()
