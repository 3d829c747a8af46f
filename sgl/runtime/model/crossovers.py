"""Measured crossovers (rows above which a quantized layer dequantizes to a bf16 matmul),
kept per machine on disk.

A compiled decode graph bakes each layer's crossover in as a constant, so a value measured
afresh at every start (timings swing 20-30% here) gave inductor a new graph each time: its
disk cache never hit and every start of a quantized model recompiled (45-120 s on 2 cores).
Measured once per (layer kind, shape) and CPU / torch / thread count and reused after, the
graphs are the same from one start to the next and load from inductor's cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

_lock = threading.Lock()
_table: dict[str, int] | None = None


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` timed calls of `fn` (what a crossover is measured with)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def crossover_file() -> Path:
    """This machine's table: under the cache root, keyed by the CPU, torch and the thread count."""
    from sgl.native import cpu_identity
    from sgl.runtime.model.paths import cache_root

    ident = f"{cpu_identity()}|{torch.__version__}|{torch.get_num_threads()}"
    return cache_root() / "crossovers" / f"{hashlib.sha1(ident.encode()).hexdigest()[:16]}.json"


def measured(key: str, measure: Callable[[], int]) -> int:
    """The stored crossover for `key`, else `measure()`'s, stored for the next process."""
    global _table
    with _lock:
        path = crossover_file()
        if _table is None:
            _table = _read(path)
        if key not in _table:
            _table[key] = int(measure())
            _write(path, key, _table[key])
        return _table[key]


def _read(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
        return {str(k): int(v) for k, v in data.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}  # none yet, or unreadable: measure again


def _write(path: Path, key: str, value: int) -> None:
    """Merge into what is on disk now (another process may have added keys) and replace the
    file atomically; a failure to write only costs a later measurement."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        table = {**_read(path), key: value}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass
