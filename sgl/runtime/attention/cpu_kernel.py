"""Build and load the CPU paged-attention kernel (csrc/paged_attention_cpu.cpp).

The kernel is compiled on first use with torch's C++ extension loader (a C++ compiler and
the `ninja` package, about 10 s) for this machine's instruction set, and cached under
$TORCH_EXTENSIONS_DIR/sgl (default ~/.cache/torch_extensions/sgl); later engines load the
cached library in milliseconds. The build's name hashes the source, the flags, the torch
version and the CPU's identity, so a cache shared between machines or checkouts never hands
one a library built for another.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import threading
import time
from pathlib import Path
from typing import Callable

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_attention_cpu.cpp"
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]  # -fopenmp: at::parallel_for runs threads
SUPPORTED_HEAD_DIMS = (16, 32, 64, 96, 128, 256)
# A build lock older than this was left by a build that was killed: it is removed, since
# torch's loader would otherwise wait on it forever.
STALE_LOCK_SECONDS = 600

_CPU_KEYS = ("vendor_id", "model name", "flags", "Features", "CPU implementer", "CPU architecture", "CPU part")

_lock = threading.Lock()
_op: Callable | None = None
_error: BaseException | None = None


def _cpu_identity() -> str:
    """The CPU's model and feature lines (x86 and Arm spell them differently)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = {ln.strip() for ln in f if ln.split(":")[0].strip() in _CPU_KEYS}
        return "\n".join(sorted(lines)) + platform.machine()
    except OSError:
        return platform.platform() + platform.processor() + platform.machine()


def build_name() -> str:
    h = hashlib.sha1()
    for part in (SOURCE.read_bytes(), " ".join(CFLAGS).encode(), torch.__version__.encode(), _cpu_identity().encode()):
        h.update(part)
        h.update(b"\0")
    return f"sgl_cpu_attention_{h.hexdigest()[:12]}"


def build_directory(name: str) -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")
    return Path(root) / "sgl" / name


def _remove_stale_lock(directory: Path) -> None:
    lock = directory / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except OSError:
        return
    if age > STALE_LOCK_SECONDS:
        logger.warning("removing %s, left %.0f s ago by a build that did not finish", lock, age)
        lock.unlink(missing_ok=True)


def _ninja_dir() -> str | None:
    """Where the pip package's ninja lives, when `ninja` is not on PATH (torch runs it from PATH)."""
    if shutil.which("ninja"):
        return None
    try:
        import ninja  # the pip package
    except ImportError:
        return None
    d = getattr(ninja, "BIN_DIR", "")
    return d if d and os.path.isfile(os.path.join(d, "ninja")) else None


def _build() -> Callable:
    from torch.utils.cpp_extension import load

    name = build_name()
    directory = build_directory(name)
    directory.mkdir(parents=True, exist_ok=True)
    _remove_stale_lock(directory)
    logger.info("loading the CPU attention kernel from %s (built on first use, ~10 s)", directory)
    ninja_dir, path = _ninja_dir(), os.environ.get("PATH", "")
    if ninja_dir:
        os.environ["PATH"] = ninja_dir + os.pathsep + path
    try:
        load(name=name, sources=[str(SOURCE)], extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"],
             build_directory=str(directory), is_python_module=False, verbose=False)
    finally:
        if ninja_dir:
            os.environ["PATH"] = path
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
