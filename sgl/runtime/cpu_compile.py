"""torch.compile'd (inductor, C++) forwards for decode steps on CPU: one graph for batch 1,
one for every batch of 2 or more rows.

Why: a decode step of a small model is mostly per-op overhead, not matmuls: ~40 small torch
ops per layer (norms, RoPE, SwiGLU, residuals, casts), each a dispatch and a pass over
memory. Inductor fuses them into a few generated C++ loops around the matmul and attention
calls (measured on SmolLM2 int4 at batch 1: 14.0 -> 10.6-12 ms per forward; bf16 at 48 rows:
82 -> 55-68 ms). Only pure decode steps on the `cpu` attention kernel take them; prefill and
mixed steps run eagerly. The batch-1 graph is static (one shape, guards never change); the
batched one is compiled once with the row count symbolic (`mark_dynamic`), so every batch
size from 2 up runs it without recompiling. A quantized layer's packed-or-dequantize choice,
which depends on the row count, is made at run time inside one C++ op per layer
(model/csrc/linear_ops_cpu.cpp), so the graph neither guards on it nor recompiles. Both are
compiled at start-up (`warm`, on padding rows), timed and reported; inductor caches the
generated code on disk, so a restart pays a fraction (SmolLM2 bf16 batched: 52 s cold, 8 s
warm). Any failure leaves the eager path for that graph, with the reason reported.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from sgl.runtime.attention.base import ForwardBatch
from sgl.runtime.model.quant import prepare_for_compile

logger = logging.getLogger(__name__)

_fake_registered = False


def _register_attention_fake() -> None:
    """Shapes of our attention op for the compiler (the output is shaped like q)."""
    global _fake_registered
    if not _fake_registered:
        torch.library.register_fake("sgl_cpu::paged_attention")(
            lambda q, k_buf, v_buf, table, rows, scale: torch.empty_like(q))
        _fake_registered = True


class CompiledDecode:
    """The compiled decode forwards; `info` says which are in use and why."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.forward: Callable | None = None  # batch 1
        self.batched: Callable | None = None  # 2+ rows, the row count symbolic
        self.info: dict = {"enabled": False}

    def warm(self, make_batch: Callable[[int], ForwardBatch], attn_backend) -> None:
        """Compile on one-token steps of padding rows built by `make_batch(rows)`; on any error
        the eager path stays for that graph and the error is reported."""
        if not getattr(attn_backend, "uses_kernel", False):
            self.info = {"enabled": False, "reason": "needs the cpu attention kernel"}
            return
        _register_attention_fake()
        prepare_for_compile(self.model)
        seconds: dict[str, float] = {}
        errors: dict[str, str] = {}
        self.forward = self._compile("batch 1", lambda: torch.compile(self.model.forward, dynamic=False),
                                     make_batch(1), attn_backend, seconds, errors)
        batched = torch.compile(self.model.forward, dynamic=None)

        def run_batched(input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
            for t in (input_ids, positions, batch.out_cache_loc, batch.metadata.rows):
                torch._dynamo.mark_dynamic(t, 0)
            return batched(input_ids, positions, batch)

        self.batched = self._compile("batch 2+", lambda: run_batched, make_batch(2), attn_backend, seconds, errors)
        self.info = {"enabled": self.forward is not None or self.batched is not None,
                     "compile_seconds": round(sum(seconds.values()), 1), "graphs": seconds}
        if errors:
            self.info["errors"] = errors

    def _compile(self, name: str, make: Callable[[], Callable], batch: ForwardBatch, attn_backend,
                 seconds: dict, errors: dict) -> Callable | None:
        t = time.perf_counter()
        try:
            forward = make()
            attn_backend.init_forward_metadata(batch)
            with torch.inference_mode():
                forward(batch.input_ids, batch.positions, batch)
        except Exception as e:  # no compiler, an inductor bug: the eager path serves
            logger.warning("torch.compile of the %s decode forward failed, running eagerly: %s", name, e)
            errors[name] = f"{type(e).__name__}: {e}"[:300]
            return None
        seconds[name] = round(time.perf_counter() - t, 1)
        logger.info("compiled the %s decode forward in %.1f s", name, seconds[name])
        return forward

    def pick(self, extend_lens: list[int]) -> Callable | None:
        """The compiled forward for a step of these rows, or None (eager)."""
        if len(extend_lens) == 1:
            return self.forward if extend_lens[0] == 1 else None
        return self.batched if all(e == 1 for e in extend_lens) else None
