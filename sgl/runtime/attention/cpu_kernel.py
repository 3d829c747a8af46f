"""Build and load the CPU attention kernels: paged attention for decode and short rows
(csrc/paged_attention_cpu.cpp) and causal prefill attention where the CPU has AVX512-BF16
(csrc/prefill_attention_cpu.cpp).

A kernel is compiled on first use (about 10 s) for this machine's instruction set and
cached (see :mod:`sgl.native`); later engines load the cached library in milliseconds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from sgl import native
from sgl.runtime.cpu_features import cpu_flags

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_attention_cpu.cpp"
CFLAGS = [
    "-O3",
    "-march=native",
    "-ffast-math",
    "-fopenmp",
]  # -fopenmp: at::parallel_for runs threads
SUPPORTED_HEAD_DIMS = (16, 32, 64, 96, 128, 256)
PREFILL_SOURCE = Path(__file__).parent / "csrc" / "prefill_attention_cpu.cpp"
PREFILL_HEAD_DIMS = (32, 64, 128)

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


_prefill_lock = threading.Lock()
_prefill: list[Callable | None] = []  # [op or None] once tried


def load_prefill_attention() -> Callable | None:
    """torch.ops.sgl_prefill.causal_attention (bf16 q/k/v, head_dim in PREFILL_HEAD_DIMS) where
    this CPU has AVX512-BF16 and the kernel builds; else None, and prefill rows keep torch's
    SDPA. Tried once per process; a build failure is logged."""
    with _prefill_lock:
        if not _prefill:
            op = None
            if {"avx512f", "avx512_bf16"} <= cpu_flags():
                try:
                    native.build(
                        "sgl_cpu_prefill_attention",
                        PREFILL_SOURCE,
                        CFLAGS,
                        ldflags=["-fopenmp"],
                        python_module=False,
                    )
                    if torch.ops.sgl_prefill.available():
                        op = torch.ops.sgl_prefill.causal_attention
                except Exception as e:  # compiler missing, build error, ...
                    logger.warning(
                        "the CPU prefill attention kernel could not be built (SDPA is used): %s", e
                    )
            _prefill.append(op)
        return _prefill[0]
