"""Compute threads that follow the CPUs other processes leave free.

An OpenMP team with one thread per core waits at every barrier for its slowest thread. When
another process takes one of the cores, the thread sharing it runs only in the time slices the
kernel gives it, every parallel region waits a slice for it (milliseconds, not microseconds)
and a forward step slows 3-4x instead of the 2x the lost core accounts for; spinning at the
barriers (libgomp's default) makes it worse. So the scheduler loop asks `CpuShare.tick()` once
a turn: every half second it reads how much of this process's CPUs went to other processes
(`/proc/stat` minus `/proc/self/stat`) and sizes the team to the CPUs left, growing it back as
they free up. Off Linux, or with `SGL_CPU_SHARE=0`, the team keeps its size.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

INTERVAL_S = 0.5
# A CPU counts as free while other processes use less than this share of it: a busy loop (1.0)
# takes a core away; a server's HTTP front (a fraction, in bursts) does not.
TAKEN_AT = 0.6
MIN_TICKS = 20  # per CPU between readings (0.2 s at the usual 100 ticks/s)


def cpu_ticks(
    cpus: set[int], stat_path: str = "/proc/stat", self_path: str = "/proc/self/stat"
) -> tuple[int, int, int]:
    """(all ticks, busy ticks, this process's ticks) so far on `cpus`; busy includes time the
    hypervisor stole (the CPU was not ours)."""
    total = busy = 0
    with open(stat_path) as f:
        for line in f:
            name, *fields = line.split()
            if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
                continue
            user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
            total += user + nice + system + idle + iowait + irq + softirq + steal
            busy += user + nice + system + irq + softirq + steal
    with open(self_path) as f:
        after_comm = f.read().rsplit(")", 1)[1].split()
    own = int(after_comm[11]) + int(after_comm[12])  # utime, stime (fields 14 and 15)
    return total, busy, own


def omp_set_num_threads() -> Callable[[int], None] | None:
    """The OpenMP runtime's `omp_set_num_threads` (the one torch loaded), which sizes the calling
    thread's teams only. Not `torch.set_num_threads`: that also changes the process-wide count
    every thread started later takes (another engine's scheduler, the caller's own threads)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {
                line.split()[-1] for line in f if line.rstrip().endswith((".so", ".so.1", ".so.5"))
            }
    except OSError:
        return None
    for path in sorted(paths):
        if any(name in os.path.basename(path) for name in ("libgomp", "libiomp", "libomp")):
            try:
                fn = ctypes.CDLL(path).omp_set_num_threads
            except (OSError, AttributeError):
                continue
            fn.argtypes, fn.restype = [ctypes.c_int], None
            return fn
    return None


def threads_for(cpus: int, others: float, max_threads: int) -> int:
    """The team size when other processes use `others` CPUs' worth of our `cpus`."""
    free = cpus - others
    return max(1, min(max_threads, int(free + (1 - TAKEN_AT))))


class CpuShare:
    """Resizes this thread's OpenMP team (`set_threads`) to the CPUs other processes leave."""

    def __init__(
        self,
        max_threads: int,
        set_threads: Callable[[int], None],
        read: Callable[[], tuple[int, int, int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        interval: float = INTERVAL_S,
        cpus: set[int] | None = None,
    ) -> None:
        """`cpus`: the CPUs this process may use (default its affinity); `read` and `clock`
        replace the counters and the time (tests)."""
        self.max_threads, self.threads = max_threads, max_threads
        self.set_threads = set_threads  # resizes the calling thread's OpenMP team
        self._clock, self._interval = clock, interval
        cpus = os.sched_getaffinity(0) if cpus is None else cpus
        self._cpus = len(cpus)
        self._read = read or (lambda: cpu_ticks(cpus))
        self._next = 0.0
        self._last: tuple[int, int, int] | None = None

    @classmethod
    def for_this_thread(cls) -> CpuShare | None:
        """A governor of this thread's OpenMP team, or None where it cannot read the counters or
        reach the OpenMP runtime (or is off)."""
        import torch

        if os.environ.get("SGL_CPU_SHARE", "1") == "0" or not hasattr(os, "sched_getaffinity"):
            return None
        set_threads = omp_set_num_threads()
        if torch.get_num_threads() < 2 or set_threads is None:
            return None
        share = cls(torch.get_num_threads(), set_threads)
        try:
            share._last = share._read()
        except (OSError, ValueError, IndexError):
            return None
        return share

    def tick(self) -> None:
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self._interval
        try:
            reading = self._read()
        except (OSError, ValueError, IndexError):  # counters unreadable now: keep the team as it is
            return
        if self._last is None:
            self._last = reading
            return
        if reading[0] - self._last[0] < MIN_TICKS * self._cpus:
            return  # too few ticks since the last reading to tell a share
        total, busy, own = (a - b for a, b in zip(reading, self._last))
        self._last = reading
        others = self._cpus * max(0, busy - own) / total
        want = threads_for(self._cpus, others, self.max_threads)
        if want != self.threads:
            logger.info(
                "other processes use %.1f of %d CPUs: %d compute threads (was %d)",
                others,
                self._cpus,
                want,
                self.threads,
            )
            self.threads = want
            self.set_threads(want)
