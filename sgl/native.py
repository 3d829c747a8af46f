"""Build and load the project's C++ sources with torch's extension loader.

A source is compiled on first use (a C++ compiler and the `ninja` package) for this
machine's instruction set and cached under $TORCH_EXTENSIONS_DIR/sgl (default
~/.cache/torch_extensions/sgl). A build's name hashes the source, its headers, the flags, the
torch version and the CPU's identity, so a cache shared between machines or checkouts never
hands one a library built for another, and a finished build's library is loaded directly,
in milliseconds: torch's loader would re-run ninja, whose check of every header torch ships
took 10-16 s a library on a 2-core machine (five libraries: about a minute of every start).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# A build lock older than this was left by a build that was killed: it is removed, since
# torch's loader would otherwise wait on it forever.
STALE_LOCK_SECONDS = 600

_CPU_KEYS = (
    "vendor_id",
    "model name",
    "flags",
    "Features",
    "CPU implementer",
    "CPU architecture",
    "CPU part",
)


def cpu_identity() -> str:
    """The CPU's model and feature lines (x86 and Arm spell them differently)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = {ln.strip() for ln in f if ln.split(":")[0].strip() in _CPU_KEYS}
        return "\n".join(sorted(lines)) + platform.machine()
    except OSError:
        return platform.platform() + platform.processor() + platform.machine()


def build_name(prefix: str, source: Path, cflags: list[str]) -> str:
    import torch

    h = hashlib.sha1()
    headers = [
        p.read_bytes() for p in sorted(source.parent.glob("*.h"))
    ]  # what the source may include
    for part in (
        source.read_bytes(),
        *headers,
        " ".join(cflags).encode(),
        torch.__version__.encode(),
        cpu_identity().encode(),
    ):
        h.update(part)
        h.update(b"\0")
    return f"{prefix}_{h.hexdigest()[:12]}"


def build_directory(name: str) -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "torch_extensions"
    )
    return Path(root) / "sgl" / name


def wait_for_lock(directory: Path) -> None:
    """Wait while another process builds here (its lock exists), but not forever: torch's
    loader waits on a lock with no end, and a build that was killed leaves one behind. A
    lock older than STALE_LOCK_SECONDS is removed."""
    lock = directory / "lock"
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except OSError:
            return  # no lock: nobody is building
        if age > STALE_LOCK_SECONDS:
            logger.warning("removing %s, left %.0f s ago by a build that did not finish", lock, age)
            lock.unlink(missing_ok=True)
            return
        time.sleep(0.5)  # another process is building: poll until its lock goes or ages out


def _ninja_dir() -> str | None:
    """Where the pip package's ninja lives, when `ninja` is not on PATH (torch runs it from
    PATH)."""
    if shutil.which("ninja"):
        return None
    try:
        import ninja  # the pip package
    except ImportError:
        return None
    d = getattr(ninja, "BIN_DIR", "")
    return d if d and os.path.isfile(os.path.join(d, "ninja")) else None


def _load_library(name: str, library: Path, python_module: bool) -> Any:
    """Load a finished build as torch's loader would: a pybind module, or a library whose
    static initialisers register torch ops."""
    if python_module:
        spec = importlib.util.spec_from_file_location(name, library)
        if spec is None or spec.loader is None:
            raise ImportError(f"no module loader for {library}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    import torch

    torch.ops.load_library(str(library))
    return None


def build(
    prefix: str,
    source: Path,
    cflags: list[str],
    *,
    ldflags: Sequence[str] = (),
    python_module: bool,
) -> Any:
    """Compile (or load from the cache) ``source``; returns the pybind module when
    ``python_module``, else None (the source registers torch ops). Raises on failure."""
    from torch.utils.cpp_extension import load

    name = build_name(prefix, source, cflags)
    directory = build_directory(name)
    directory.mkdir(parents=True, exist_ok=True)
    wait_for_lock(directory)
    start = time.perf_counter()
    library = directory / f"{name}.so"
    if library.is_file():
        try:
            module = _load_library(name, library, python_module)
            logger.info(
                "loaded %s from %s in %.2f s", source.name, directory, time.perf_counter() - start
            )
            return module
        except (
            OSError,
            ImportError,
        ) as e:  # e.g. a link that was killed half-written: build it again
            logger.warning("could not load %s (%s): rebuilding it", library, e)
    logger.info("building %s (first use; cached in %s)", source.name, directory)
    ninja_dir, path = _ninja_dir(), os.environ.get("PATH", "")
    if ninja_dir:
        os.environ["PATH"] = ninja_dir + os.pathsep + path
    try:
        module = load(
            name=name,
            sources=[str(source)],
            extra_cflags=cflags,
            extra_ldflags=list(ldflags),
            build_directory=str(directory),
            is_python_module=python_module,
            verbose=False,
        )
        logger.info("built %s in %.1f s", source.name, time.perf_counter() - start)
        return module
    finally:
        if ninja_dir:
            os.environ["PATH"] = path
