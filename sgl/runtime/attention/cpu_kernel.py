"""Build and load the CPU paged-attention kernel (csrc/paged_attention_cpu.cpp).

The kernel is compiled on first use with torch's C++ extension loader (g++ and ninja, about
10 s) for this machine's instruction set, and cached under TORCH_EXTENSIONS_DIR (default
~/.cache/torch_extensions); later engines load the cached library in milliseconds. The
build is named after the CPU's model and flags, so a cache shared between different
machines never hands one a library built for another's instruction set.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Callable

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_attention_cpu.cpp"
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]  # -fopenmp: at::parallel_for runs threads
SUPPORTED_HEAD_DIMS = (32, 64, 96, 128, 256)

_lock = threading.Lock()
_op: Callable | None = None
_error: BaseException | None = None


def _cpu_tag() -> str:
    """A short hash of the CPU model and feature flags (Linux), or of the platform."""
    info = ""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
        info = "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))
    except OSError:
        import platform

        info = platform.processor() + platform.machine()
    return hashlib.sha1(info.encode()).hexdigest()[:10]


def _ensure_ninja_on_path() -> None:
    """torch runs `ninja` from PATH; the pip package puts it next to the venv's python."""
    if shutil.which("ninja"):
        return
    try:
        import ninja  # the pip package
    except ImportError:
        return
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def load_paged_attention() -> Callable:
    """torch.ops.sgl_cpu.paged_attention, built on first call. Raises RuntimeError, saying
    why, when it cannot be built (no C++ compiler, no ninja); the failure is remembered."""
    global _op, _error
    with _lock:
        if _op is not None:
            return _op
        if _error is not None:
            raise RuntimeError(f"the CPU attention kernel could not be built: {_error}") from _error
        from torch.utils.cpp_extension import load

        _ensure_ninja_on_path()
        name = f"sgl_cpu_attention_{_cpu_tag()}"
        logger.info("loading the CPU attention kernel %s (built on first use, ~10 s)", name)
        try:
            load(name=name, sources=[str(SOURCE)], extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"],
                 is_python_module=False, verbose=False)
            _op = torch.ops.sgl_cpu.paged_attention
        except Exception as e:  # compiler missing, build error, ...
            _error = e
            raise RuntimeError(f"the CPU attention kernel could not be built: {e}") from e
        return _op
