"""A torch.compile'd (inductor, C++) forward for batch-1 decode steps on CPU.

Why: at batch 1 a step of a small model is mostly per-op overhead, not matmuls: ~40 small
torch ops per layer (norms, RoPE, SwiGLU, residuals, casts), each a dispatch and a pass over
memory. Inductor fuses them into a few generated C++ loops around the matmul and attention
calls (measured on SmolLM2 int4: 14.0 -> 10.6-12 ms per forward). Only pure decode steps of
one request take it, on the `cpu` attention kernel: one shape, so the graph is compiled once
and its guards never change; every other step runs eagerly. Compilation happens at start-up
(`warm`), is timed and reported; inductor caches the generated code on disk, so a restart
pays a fraction of it. Any failure leaves the eager path in place, with the reason reported.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from sgl.runtime.attention.base import ForwardBatch

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
    """The compiled forward for batch-1 decode steps; `info` says whether it is in use and why."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.forward: Callable | None = None
        self.info: dict = {"enabled": False}

    def warm(self, make_batch: Callable[[], ForwardBatch], attn_backend) -> None:
        """Compile on a one-token step built by `make_batch` (a padding row); on any error the
        eager path stays and the error is reported."""
        if not getattr(attn_backend, "uses_kernel", False):
            self.info = {"enabled": False, "reason": "needs the cpu attention kernel"}
            return
        t = time.perf_counter()
        try:
            _register_attention_fake()
            compiled = torch.compile(self.model.forward, dynamic=False)
            batch = make_batch()
            attn_backend.init_forward_metadata(batch)
            with torch.inference_mode():
                compiled(batch.input_ids, batch.positions, batch)
        except Exception as e:  # no compiler, an inductor bug: the eager path serves
            logger.warning("torch.compile of the decode forward failed, running eagerly: %s", e)
            self.info = {"enabled": False, "reason": f"compile failed: {type(e).__name__}: {e}"[:300]}
            return
        self.forward = compiled
        self.info = {"enabled": True, "compile_seconds": round(time.perf_counter() - t, 1),
                     "batch_sizes": [1]}
        logger.info("compiled the batch-1 decode forward in %.1f s", self.info["compile_seconds"])

    def takes(self, extend_lens: list[int]) -> bool:
        return self.forward is not None and extend_lens == [1]
