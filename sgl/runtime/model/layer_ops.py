"""The fused elementwise ops of a decoder layer on CPU (csrc/layer_ops_cpu.cpp, library
`sgl_layer`): RMSNorm, residual add + RMSNorm, rotate-half RoPE and the gated activation.

CPU steps use them in place of ~25 small torch ops a layer (a decode step of a small model is
mostly per-op overhead); they compute what the torch ops compute (see the source), and each
row of a batch alone: a row's result does not depend on how many rows share the call.

That holds inside the compiled decode graphs too (`cpu_compile`), which call them as opaque
ops (their shapes are registered for the compiler). Left to inductor, the torch ops were fused
one way for the static batch-1 graph and another for the graph of 2+ rows (a residual add
rounded to bf16 in one and not in the other, sums of squares in 32 or 16 lanes), so a
speculative verify row (the batched graph) differed from the decode step it stands for (the
batch-1 graph) by up to ~0.3 in a logit, and greedy output drifted from non-speculative
decoding (1 of 4 extraction prompts within 128 tokens). With these ops the two graphs agree
bit for bit, and the graphs ran no slower (measured at batch 1 on SmolLM2 int4).

Not used on other devices or where the library cannot be built (no compiler).
`SGL_FUSED_CPU_OPS=0` turns them off, as does setting `enabled` (benchmarks compare both);
`fused_ops_for(x)` is the one place that decides.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "layer_ops_cpu.cpp"
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_lock = threading.Lock()
_built: list[bool] = []  # [True / False] once tried
enabled = os.environ.get("SGL_FUSED_CPU_OPS", "1") != "0"


def layer_ops_built() -> bool:
    """Whether torch.ops.sgl_layer is loaded, building it on first call (False where it cannot
    be built)."""
    if _built:  # the common case, without the lock
        return _built[0]
    with _lock:
        if not _built:
            _built.append(_build())
        return _built[0]


def _build() -> bool:
    try:
        from sgl import native

        native.build(
            "sgl_layer_ops",
            SOURCE,
            ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"],
            ldflags=["-fopenmp"],
            python_module=False,
        )
        _register_fakes()
        return True
    except Exception as e:  # no compiler: the torch ops serve
        logger.warning("the fused CPU layer ops could not be built (%s); using torch ops", e)
        return False


def _register_fakes() -> None:
    """The ops' output shapes, for torch.compile to trace through them."""
    fake = torch.library.register_fake
    fake("sgl_layer::rms_norm")(lambda x, w, eps, offset: torch.empty_like(x))
    fake("sgl_layer::add_rms_norm")(
        lambda x, a, w, eps, offset: (torch.empty_like(x), torch.empty_like(x))
    )
    fake("sgl_layer::rotate")(lambda x, cos, sin: x.new_empty(x.shape))
    fake("sgl_layer::gated_act")(
        lambda gate_up, gelu: gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))
    )


def fused_ops_for(x: torch.Tensor) -> bool:
    """Whether x's layer math goes through the fused ops: a CPU step, eager or compiled."""
    return enabled and x.device.type == "cpu" and x.dtype in FUSED_DTYPES and layer_ops_built()
