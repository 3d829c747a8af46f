"""Building outlines-core indexes in a child process, under a memory and a time limit.

A regex's DFA can be exponential in the pattern (``(a|b)*a(a|b){20}``), and outlines-core
builds it in Rust, where no budget can be checked and where running out of memory aborts
the process. One such constraint, sent by one client, must not take the server down. So
the engine builds indexes in a child process whose address space is capped
(``RLIMIT_AS``) and which is killed when it runs past the time limit (CPU seconds, so
that a busy machine does not change the outcome; wall time is capped at 3x): the request gets a
GrammarError naming the limit (a 400), the server keeps serving, and the next compile
starts a fresh child. The parent's memory is untouched, since the child's work never
enters it; only the finished, pickled index does (and its size is capped too).

Compiles through one builder are serialised (one child); the compiler's LRU cache means
that the common case, one schema for many requests, compiles once.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from sgl.constrained.errors import ConstraintTooLarge

__all__ = ["IndexBuilder", "DEFAULT_COMPILE_TIMEOUT_S", "DEFAULT_COMPILE_MEMORY_BYTES"]

DEFAULT_COMPILE_TIMEOUT_S = 30.0
DEFAULT_COMPILE_MEMORY_BYTES = 4 << 30
_START_TIMEOUT_S = 120.0  # the child imports outlines-core and builds the vocabulary once
_POLL_S = 0.02  # how often a compile's CPU time is read
_WALL_FACTOR = (
    3  # a compile is stopped after this many times its limit in wall time, whatever its CPU
)
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# The child is `python -c` with this source: it imports nothing of ours (no torch, and no
# re-run of the user's main module, as multiprocessing's spawn would do). Messages both
# ways are 8-byte big-endian lengths followed by a pickle.
_CHILD_SOURCE = """
import pickle, resource, struct, sys
inp, out = sys.stdin.buffer, sys.stdout.buffer
def recv():
    head = inp.read(8)
    return None if len(head) < 8 else pickle.loads(inp.read(struct.unpack(">Q", head)[0]))
def send(obj):
    data = pickle.dumps(obj)
    out.write(struct.pack(">Q", len(data)) + data)
    out.flush()
by_bytes, vocab_size, memory_bytes, max_result = recv()
resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
from outlines_core import Index, Vocabulary
vocabulary = Vocabulary(vocab_size, by_bytes)
del by_bytes
send(("ready", None))
while True:
    pattern = recv()
    if pattern is None:
        break
    try:
        data = pickle.dumps(Index(pattern, vocabulary))
        send(
            ("memory", "the compiled index is %d MB" % (len(data) >> 20))
            if len(data) > max_result
            else ("index", data)
        )
    except MemoryError:
        send(("memory", "out of memory"))
    except ValueError as exc:
        send(("error", str(exc)))
"""


class _ChildGone(Exception):
    pass


class IndexBuilder:
    """``build(pattern) -> outlines_core.Index``, in a capped child process."""

    def __init__(
        self,
        by_bytes: dict[bytes, list[int]],
        vocab_size: int,
        timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
        memory_bytes: int = DEFAULT_COMPILE_MEMORY_BYTES,
    ) -> None:
        self.by_bytes = by_bytes
        self.vocab_size = vocab_size
        self.timeout_s = float(timeout_s)
        self.memory_bytes = int(memory_bytes)
        self._lock = threading.Lock()
        self._proc: Any = None  # the child (subprocess.Popen), started on first use

    def build(self, pattern: str, param: str, timeout_s: float | None = None) -> Any:
        """The index of ``pattern``; ConstraintTooLarge (naming ``param``) when a limit is
        hit (``timeout_s`` may lower the time limit). ValueError: outlines-core refused the
        pattern (the caller words that error)."""
        limit = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        with self._lock:
            self._ensure_started()
            try:
                self._send(pattern)
                reply = self._recv(limit)
            except TimeoutError:
                self._stop()
                raise ConstraintTooLarge(
                    f"{param}: compiling the constraint took longer than {limit:g} s of CPU (the "
                    "compile time "
                    "limit); its automaton is too large: simplify it (fewer nested repetitions or "
                    "alternatives)",
                    param,
                ) from None
            except _ChildGone:  # the child died: the allocator aborted it for memory
                self._stop()
                raise self._memory_error(param, "the compiler process ran out of memory") from None
        kind, payload = reply
        if kind == "index":
            return pickle.loads(payload)
        if kind == "memory":
            raise self._memory_error(param, payload)
        raise ValueError(payload)

    def close(self) -> None:
        with self._lock:
            self._stop()

    # -- internals -------------------------------------------------------------------

    def _memory_error(self, param: str, what: str) -> ConstraintTooLarge:
        return ConstraintTooLarge(
            f"{param}: compiling the constraint needs more than {self.memory_bytes / 2**30:.3g} "
            "GB (the compile memory "
            f"limit; {what}); its automaton is too large: simplify it (fewer nested repetitions "
            "or alternatives)",
            param,
        )

    def _send(self, obj: Any) -> None:
        data = pickle.dumps(obj)
        try:
            self._proc.stdin.write(struct.pack(">Q", len(data)) + data)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _ChildGone() from None

    def _recv(self, timeout: float) -> Any:
        """The child's next reply; TimeoutError once it has spent ``timeout`` seconds of CPU
        on it. CPU, not wall time: on a busy machine the same constraint must take the same
        route (wall time is capped too, at ``_WALL_FACTOR`` times the limit)."""
        fd = self._proc.stdout.fileno()
        start, cpu0 = time.monotonic(), self._child_cpu()
        while not select.select([fd], [], [], min(_POLL_S, timeout))[0]:
            cpu, wall = self._child_cpu(), time.monotonic() - start
            if cpu is None or cpu0 is None:  # no /proc: wall time is all there is
                if wall > timeout:
                    raise TimeoutError
            elif cpu - cpu0 > timeout or wall > _WALL_FACTOR * timeout:
                raise TimeoutError
        head = self._proc.stdout.read(8)
        if len(head) < 8:
            raise _ChildGone()
        data = self._proc.stdout.read(struct.unpack(">Q", head)[0])
        return pickle.loads(data)

    def _child_cpu(self) -> float | None:
        """Seconds of CPU the child has used (user + system), from /proc; None elsewhere."""
        try:
            with open(f"/proc/{self._proc.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        except (OSError, IndexError, ValueError):
            return None

    def _ensure_started(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self._stop()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1"}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD_SOURCE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        try:
            self._send((self.by_bytes, self.vocab_size, self.memory_bytes, self.memory_bytes // 2))
            self._recv(_START_TIMEOUT_S)
        except (TimeoutError, _ChildGone):
            self._stop()
            raise RuntimeError("the constraint compiler process did not start") from None

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()  # it holds nothing worth a graceful exit
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except OSError:
                pass
