"""Where a batch-1 decode step's time goes on CPU: matmuls, attention, other ops, the rest.

The embedded model's forward + logits is run directly (no scheduler) on a one-token step
over a 64-token context, eager and torch.compile'd, under torch's profiler. Ops are grouped
by their self CPU time: matmuls (dense and packed int8/int4), attention (our kernel), other
torch ops, and the compiled graph's own generated code; "python and dispatch" is the wall
time per step not inside any op (module calls, argument handling, dynamo's guards).

    .venv/bin/python benchmarks/bench_cpu_step.py [--quantization auto] [--dtype bfloat16] [--steps 40]
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

MATMUL = ("_weight_int4pack_mm", "_weight_int8pack_mm", "aten::mm", "aten::addmm", "aten::linear", "aten::matmul")


class OneRequest:
    """A request's KV rows and one-token forward steps through the model, as the runner builds them."""

    def __init__(self, model, dtype: torch.dtype) -> None:
        from sgl.runtime.attention import create_attention_backend
        from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool

        c = model.config
        self.model = model
        self.pool = TokenToKVPool(4096, c.num_hidden_layers, c.num_key_value_heads, c.head_dim, dtype, "cpu")
        self.table = ReqToTokenPool(4, c.max_position_embeddings, "cpu")
        self.backend = create_attention_backend("auto", "cpu", dtype)
        self.backend.bind(self.pool, self.table, c.num_attention_heads)
        self.row, self.length = self.table.alloc(), 0

    def step(self, ids: list[int], forward) -> torch.Tensor:
        from sgl.runtime.attention import ForwardBatch

        slots = self.pool.alloc(len(ids))
        self.table.write(self.row, self.length, slots)
        batch = ForwardBatch(torch.tensor(ids), torch.arange(self.length, self.length + len(ids)), slots, [self.row],
                             [self.length], [len(ids)], self.pool, self.table, self.backend,
                             row_epochs=[self.table.epochs[self.row]])
        self.length += len(ids)
        self.backend.init_forward_metadata(batch)
        with torch.inference_mode():
            return self.model.compute_logits(forward(batch.input_ids, batch.positions, batch)[-1:])


def split(req: OneRequest, forward, steps: int) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    for i in range(3):
        req.step([100 + i], forward)
    t = time.perf_counter()
    for i in range(steps):
        req.step([200 + i], forward)
    wall_ms = (time.perf_counter() - t) / steps * 1e3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            req.step([300 + i], forward)
    groups = {"matmuls": 0.0, "attention": 0.0, "other ops": 0.0, "compiled graph code": 0.0}
    for ev in prof.key_averages():
        ms = ev.self_cpu_time_total / 1e3 / steps
        if any(m in ev.key for m in MATMUL):
            groups["matmuls"] += ms
        elif "paged_attention" in ev.key:
            groups["attention"] += ms
        elif "CompiledFxGraph" in ev.key:
            groups["compiled graph code"] += ms
        elif ev.key.startswith(("aten::", "quantized::", "sgl_cpu::")):
            groups["other ops"] += ms
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
    args = ap.parse_args()
    from sgl.runtime.cpu_compile import _register_attention_fake
    from sgl.runtime.model.loader import load_model

    model, _ = load_model("default", getattr(torch, args.dtype), torch.device("cpu"), args.quantization)
    results = {}
    req = OneRequest(model, getattr(torch, args.dtype))
    req.step(list(range(1000, 1064)), model.forward)  # the context
    results["eager"] = split(req, model.forward, args.steps)
    _register_attention_fake()
    t = time.perf_counter()
    compiled = torch.compile(model.forward, dynamic=False)
    req.step([7], compiled)
    compile_s = time.perf_counter() - t
    results["compiled"] = split(req, compiled, args.steps)
    keys = list(results["eager"])
    print_table(f"batch-1 decode step, ms (SmolLM2, {args.dtype}, quantization={args.quantization})",
                [(k, results["eager"][k], results["compiled"][k]) for k in keys], ("part", "eager", "compiled"))
    write_result("cpu_step", {"dtype": args.dtype, "quantization": args.quantization, "compile_s": round(compile_s, 1),
                              "split_ms": results})


if __name__ == "__main__":
    main()
