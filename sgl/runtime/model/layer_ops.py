"""The fused elementwise ops of a decoder layer on CPU (csrc/layer_ops_cpu.cpp, library
`sgl_layer`): RMSNorm, residual add + RMSNorm, rotate-half RoPE and the gated activation.

Eager CPU steps use them in place of ~25 small torch ops a layer (a decode step of a small
model is mostly per-op overhead); they compute what the torch ops compute (see the source).
Not used on other devices, inside a torch.compile graph (inductor fuses the torch ops
itself), or where the library cannot be built (no compiler). `SGL_FUSED_CPU_OPS=0` turns
them off, as does setting `enabled` (benchmarks compare both); `fused_ops_for(x)` is the one
place that decides.
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
        return True
    except Exception as e:  # no compiler: the torch ops serve
        logger.warning("the fused CPU layer ops could not be built (%s); using torch ops", e)
        return False


def fused_ops_for(x: torch.Tensor) -> bool:
    """Whether x's layer math goes through the fused ops: an eager step on the CPU."""
    return (
        enabled
        and x.device.type == "cpu"
        and x.dtype in FUSED_DTYPES
        and not torch.compiler.is_compiling()
        and layer_ops_built()
    )
