"""Build and load the CPU paged-attention kernel (csrc/paged_attention_cpu.cpp).

The kernel is compiled on first use (about 10 s) for this machine's instruction set and
cached (see :mod:`sgl.native`); later engines load the cached library in milliseconds.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

import torch

from sgl import native

SOURCE = Path(__file__).parent / "csrc" / "paged_attention_cpu.cpp"
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]  # -fopenmp: at::parallel_for runs threads
SUPPORTED_HEAD_DIMS = (16, 32, 64, 96, 128, 256)

_lock = threading.Lock()
_op: Callable | None = None
_error: BaseException | None = None


def _build() -> Callable:
    native.build("sgl_cpu_attention", SOURCE, CFLAGS, ldflags=["-fopenmp"], python_module=False)
    return torch.ops.sgl_cpu.paged_attention


def load_paged_attention() -> Callable:
    """torch.ops.sgl_cpu.paged_attention, built on first call. Raises RuntimeError, saying
    why, when it cannot be built (no C++ compiler, no ninja); the failure is remembered for
    this process."""
    global _op, _error
    with _lock:
        if _op is not None:
            return _op
        if _error is None:
            try:
                _op = _build()
                return _op
            except Exception as e:  # compiler missing, build error, ...
                _error = e
        raise RuntimeError(f"the CPU attention kernel could not be built: {_error}") from _error
