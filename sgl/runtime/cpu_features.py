"""What this CPU can do, read at run time (machines change: never assume).

The flags come from /proc/cpuinfo (Linux x86); elsewhere nothing is reported and the
engine keeps float32. `SGL_CPU_FLAGS_OVERRIDE` (space-separated flags) stands in for the
real ones, so both sides of a decision can be tested on one machine.
"""

from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    override = os.environ.get("SGL_CPU_FLAGS_OVERRIDE")
    if override is not None:
        return frozenset(override.split())
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def bf16_matmul_support() -> str | None:
    """The instruction set that makes bf16 matmuls native here (AMX-BF16 tiles, or
    AVX512-BF16 dot products), or None: bf16 would be emulated and slower than float32."""
    flags = cpu_flags()
    if "amx_bf16" in flags and "amx_tile" in flags:
        return "AMX-BF16"
    if "avx512_bf16" in flags:
        return "AVX512-BF16"
    return None


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a container's or `taskset`'s limit),
    not the machine's count that `os.cpu_count()` gives."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity call on this platform
        return os.cpu_count() or 1
