"""Measured crossovers (rows above which a quantized layer dequantizes to a bf16 matmul),
kept per machine on disk.

A compiled decode graph bakes each layer's crossover in as a constant, so a value measured
afresh at every start (timings swing 20-30% here) gave inductor a new graph each time: its
disk cache never hit and every start of a quantized model recompiled (45-120 s on 2 cores).
Measured once per (layer kind, shape) and CPU / torch / thread count and reused after, the
graphs are the same from one start to the next and load from inductor's cache.

Timed with the layer's weight out of the caches (`cold_seconds`): in a forward pass each
layer's weight arrives from memory, since the model does not fit the cache. Timed warm (the
same call repeated), a dense bf16 copy read 4x the bytes of an int4 layer for free and looked
faster from 4 rows; in a real step it was 2-3x slower there (SmolLM2 on a 2-core Zen 4: 150
vs 60 us per call for the 3072x576 layer at 4 rows), which made speculative verify steps
(2-8 rows per request) pay for every draft token.
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


def best_seconds(
    fn: Callable[[], object], repeats: int, before: Callable[[], None] | None = None
) -> float:
    """The fastest of `repeats` timed calls of `fn` (what a crossover is measured with), each
    after an untimed call of `before` when given."""
    best = float("inf")
    for _ in range(repeats):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


# Weights smaller than this are timed warm: a model made of them stays in the cache (tiny test
# models), and their timings are too short for the eviction to be worth its cost.
EVICT_MIN_BYTES = 256 << 10
# The eviction pass streams this much (2x the last-level cache as the OS reports it, within
# these bounds: VMs report the whole socket's L3 while a core sees its own slice of it).
EVICT_BYTES_RANGE = (64 << 20, 256 << 20)


def last_level_cache_bytes(sysfs: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The largest cache this CPU reports (Linux sysfs), or None."""
    sizes = []
    for index in Path(sysfs).glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes) if sizes else None


class CacheEvictor:
    """Streams a buffer larger than the last-level cache, so the next call reads its operands
    from memory. Held only while crossovers are measured (`measured`)."""

    def __init__(self) -> None:
        low, high = EVICT_BYTES_RANGE
        llc = last_level_cache_bytes() or low
        self.buffer = torch.zeros(min(max(2 * llc, low), high) // 4, dtype=torch.int32)

    def __call__(self) -> None:
        self.buffer.add_(1)


_evictor: CacheEvictor | None = None


def cold_seconds(fn: Callable[[], object], repeats: int, weight_bytes: int) -> float:
    """The fastest of `repeats` calls of `fn`, each made with the caches emptied first (where
    the weight it reads is `EVICT_MIN_BYTES` or more), as a layer runs inside a forward pass."""
    global _evictor
    if weight_bytes < EVICT_MIN_BYTES:
        return best_seconds(fn, repeats)
    if _evictor is None:
        _evictor = CacheEvictor()
    return best_seconds(fn, repeats, before=_evictor)


def crossover_file() -> Path:
    """This machine's table: under the cache root, keyed by the CPU, torch and the thread count."""
    from sgl.native import cpu_identity
    from sgl.runtime.model.paths import cache_root

    # "cold": timed with the weights out of the cache (tables timed warm are not reused)
    ident = f"{cpu_identity()}|{torch.__version__}|{torch.get_num_threads()}|cold"
    return cache_root() / "crossovers" / f"{hashlib.sha1(ident.encode()).hexdigest()[:16]}.json"


def measured(key: str, measure: Callable[[], int]) -> int:
    """The stored crossover for `key`, else `measure()`'s, stored for the next process."""
    global _table, _evictor
    with _lock:
        path = crossover_file()
        if _table is None:
            _table = _read(path)
        if key not in _table:
            try:
                _table[key] = int(measure())
            finally:
                _evictor = None  # the eviction buffer is not kept past a measurement
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
