"""How the engine's caller side and its scheduler talk: messages one way, lists of outputs the
other, and nothing else (no shared objects).

Two implementations behind the same three calls (`start`, `send`, `close`):

- `ThreadTransport`: the scheduler loop on a thread of this process. Messages go into its
  inbox queue; its outputs come back through an outbox queue that a caller-side delivery
  thread drains, so no caller code (sinks, event loops, finish listeners) ever runs on the
  scheduler thread.
- `ProcessTransport`: the scheduler (and model) in child processes started with
  `python -m sgl.runtime.scheduler_process`, one per tensor-parallel rank, each over one
  `multiprocessing.connection` (a Unix socket, authenticated; pickle is the one codec).
  Messages go to rank 0 only (it shares them with the other ranks, rank_sync.py); outputs come
  from rank 0 only; the other ranks' connections carry their start-up answer and then only
  tell, by closing, that the rank exited. Any rank's exit at a time other than a requested
  shutdown is reported once to `on_dead` (and the other ranks are stopped), so every waiting
  and later call fails instead of hanging.

Either way `deliver(outputs)` runs on the transport's delivery thread.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener
from typing import Any

from sgl.runtime.config import EngineConfig
from sgl.runtime.errors import EngineDeadError, new_incident_id
from sgl.runtime.messages import EngineFaulted, SchedulerMessage, Shutdown
from sgl.runtime.worker import ModelInfo

logger = logging.getLogger(__name__)

Deliver = Callable[[list], None]
STARTUP_POLL_S = 0.25
SHUTDOWN_TIMEOUT_S = 30.0
# After rank 0 faults: how long the other ranks get to show that one of them died (the cause)
PEER_EXIT_GRACE_S = 3.0
PEER_EXIT_POLL_S = 0.02
AUTHKEY_ENV = "SGL_SCHEDULER_AUTHKEY"


# ---------------------------------------------------------------------------- handshake messages


@dataclass
class StartScheduler:
    """The first message to a scheduler process: the options it builds its scheduler with, and
    where the ranks of a tensor-parallel group meet (`dist_init`, a tcp:// URL; tp_size 1: None)."""

    config: EngineConfig
    log_level: int
    rank: int = 0
    dist_init: str | None = None


@dataclass
class SchedulerReady:
    info: ModelInfo


@dataclass
class SchedulerStartFailed:
    error: BaseException  # re-raised in the caller as the same error type as in thread mode


# ---------------------------------------------------------------------------- thread mode


class ThreadTransport:
    """The scheduler loop on a thread; outputs handed over through a queue."""

    def __init__(self, deliver: Deliver) -> None:
        self._deliver = deliver
        self._outbox: queue.Queue[list | None] = queue.Queue()
        self.scheduler: Any = None
        self._delivery: threading.Thread | None = None

    def emit(self, outputs: list) -> None:
        """The scheduler's `emit` (scheduler thread): only a queue put."""
        self._outbox.put(outputs)

    def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self._delivery = threading.Thread(
            target=self._deliver_loop, name="sgl-results", daemon=True
        )
        self._delivery.start()
        scheduler.start()

    def _deliver_loop(self) -> None:
        while (outputs := self._outbox.get()) is not None:
            self._deliver(outputs)

    def send(self, msg: SchedulerMessage) -> None:
        self.scheduler.inbox.put(msg)

    def close(self) -> None:
        self.scheduler.inbox.put(Shutdown())
        self.scheduler.join(timeout=SHUTDOWN_TIMEOUT_S)
        self._outbox.put(None)  # after the scheduler's last outputs
        if self._delivery is not None and self._delivery is not threading.current_thread():
            self._delivery.join(timeout=SHUTDOWN_TIMEOUT_S)


# ---------------------------------------------------------------------------- process mode


class ProcessTransport:
    """The scheduler in child processes, one per rank; see the module docstring."""

    def __init__(self, deliver: Deliver, on_dead: Callable[[EngineDeadError], None]) -> None:
        self._deliver = deliver
        self._on_dead = on_dead
        self._send_lock = threading.Lock()
        self._dead_lock = threading.Lock()
        self._closing = False
        self._dead: EngineDeadError | None = None
        self.procs: list[subprocess.Popen] = []
        self._conns: list[Connection] = []
        self._readers: list[threading.Thread] = []
        self.rank_infos: list[ModelInfo] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self, config: EngineConfig) -> ModelInfo:
        """Start the ranks, send each the options, wait until every scheduler is built. A
        start-up error in a rank is raised here as itself; a rank that dies is an
        EngineDeadError. Returns rank 0's ModelInfo."""
        try:
            self._spawn(config.tp_size)
            dist_init = f"tcp://127.0.0.1:{_free_port()}" if config.tp_size > 1 else None
            level = logging.getLogger().getEffectiveLevel()
            for rank, conn in enumerate(self._conns):
                conn.send(StartScheduler(config, level, rank, dist_init))
            replies = [self._recv_during_start(rank) for rank in range(len(self._conns))]
        except BaseException:
            self._kill()
            raise
        failed = [r for r in replies if isinstance(r, SchedulerStartFailed)]
        if failed:
            self._kill()
            raise failed[0].error
        self.rank_infos = [reply.info for reply in replies]
        for rank, conn in enumerate(self._conns):
            reader = threading.Thread(
                target=self._read_loop,
                args=(rank, conn),
                daemon=True,
                name="sgl-results" if rank == 0 else f"sgl-rank{rank}-watch",
            )
            reader.start()
            self._readers.append(reader)
        return replies[0].info

    def _spawn(self, n: int) -> None:
        """Start n children and accept their connections (each first sends its rank)."""
        authkey = secrets.token_bytes(32)
        sock_dir = tempfile.mkdtemp(prefix="sgl-sched-")
        address = os.path.join(sock_dir, "sock")
        try:
            with Listener(
                address, family="AF_UNIX", authkey=authkey, backlog=max(1, n)
            ) as listener:
                env = {**os.environ, AUTHKEY_ENV: authkey.hex()}
                for rank in range(n):
                    self.procs.append(
                        subprocess.Popen(
                            [
                                sys.executable,
                                "-m",
                                "sgl.runtime.scheduler_process",
                                address,
                                str(rank),
                            ],
                            env=env,
                            stdin=subprocess.DEVNULL,
                        )
                    )
                conns = {}
                for _ in range(n):
                    conn = self._accept(listener)
                    conns[conn.recv()] = conn
                self._conns = [conns[rank] for rank in range(n)]
        finally:
            shutil.rmtree(sock_dir, ignore_errors=True)

    def _accept(self, listener: Listener) -> Connection:
        """Accept a child's connection, or fail if a child exits first (accept alone would
        block)."""
        accepted: list[Connection] = []
        waiter = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
        waiter.start()
        while waiter.is_alive():
            waiter.join(STARTUP_POLL_S)
            exited = [p for p in self.procs if p.poll() is not None]
            if waiter.is_alive() and exited:
                listener.close()  # ends the blocked accept
                raise self._exit_error(exited[0], "during start-up")
        if not accepted:
            raise self._exit_error(self.procs[0], "during start-up")
        return accepted[0]

    def _recv_during_start(self, rank: int) -> Any:
        conn = self._conns[rank]
        while not conn.poll(STARTUP_POLL_S):
            exited = [p for p in self.procs if p.poll() is not None]
            if exited:
                raise self._exit_error(exited[0], "while loading the model")
        try:
            return conn.recv()
        except (EOFError, OSError):
            raise self._exit_error(self.procs[rank], "while loading the model") from None

    def _exit_error(self, proc: subprocess.Popen, when: str) -> EngineDeadError:
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        incident = new_incident_id()
        rank = self.procs.index(proc)
        logger.error(
            "incident %s: the scheduler process (pid %d, rank %d) exited %s with code %s",
            incident,
            proc.pid,
            rank,
            when,
            code,
        )
        return EngineDeadError(
            f"the scheduler process of rank {rank} exited {when} with code {code}; its log says "
            "why",
            incident,
        )

    def _read_loop(self, rank: int, conn: Connection) -> None:
        while True:
            try:
                outputs = conn.recv()
            except (EOFError, OSError):
                break
            except (
                Exception
            ):  # an output that cannot be unpickled: a bug, but not a reason to stop reading
                logger.exception("dropped a scheduler output that could not be read")
                continue
            if rank == 0:
                outputs, dead_peer = split_at_dead_peer(outputs, self.procs)
                self._deliver(outputs)
                if dead_peer is not None:
                    rank = dead_peer
                    break
        with self._dead_lock:
            if self._closing or self._dead is not None:
                return
            self._dead = self._exit_error(self.procs[rank], "unexpectedly")
        self._on_dead(self._dead)
        self._kill()  # the other ranks cannot go on without this one

    def send(self, msg: SchedulerMessage) -> None:
        with self._send_lock:
            if self._dead is not None:
                raise self._dead
            try:
                self._conns[0].send(msg)
            except (
                OSError,
                ValueError,
            ) as e:  # the child is gone; the reader reports it to everyone
                raise EngineDeadError("the scheduler process is gone", new_incident_id()) from e

    def close(self) -> None:
        """Ask the scheduler to stop, wait for its last outputs and the ranks' exit; kill what
        hangs."""
        with self._dead_lock:
            self._closing = True
        if not self._conns:
            return
        try:
            with self._send_lock:
                self._conns[0].send(Shutdown())
        except (OSError, ValueError):
            pass
        for reader in self._readers:
            if reader is not threading.current_thread():
                reader.join(SHUTDOWN_TIMEOUT_S)
        for proc in self.procs:
            try:
                proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.error("the scheduler process (pid %d) did not stop: killed", proc.pid)
        self._kill()
        for conn in self._conns:
            conn.close()

    def _kill(self) -> None:
        with self._dead_lock:
            self._closing = True
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            try:
                proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process that survives SIGKILL
                logger.error("the scheduler process (pid %d) survived SIGKILL", proc.pid)


def split_at_dead_peer(
    outputs: list, procs: list, grace_s: float = PEER_EXIT_GRACE_S
) -> tuple[list, int | None]:
    """Rank 0's step fails when another rank dies inside a collective (its socket resets before
    the parent sees the exit). Then the dead rank is the cause every caller must see, not rank 0's
    fault: returns the outputs before the fault and the dead rank; else (outputs, None). A killed
    process's sockets close before it can be reaped (on a loaded machine, measurably later), so
    the other ranks get up to `grace_s` to show an exit before the fault counts as rank 0's own."""
    at = next((i for i, o in enumerate(outputs) if isinstance(o, EngineFaulted)), None)
    if at is None:
        return outputs, None
    deadline = time.monotonic() + (grace_s if len(procs) > 1 else 0.0)
    while True:
        dead = next((r for r, p in enumerate(procs) if r > 0 and p.poll() is not None), None)
        if dead is not None:
            return outputs[:at], dead
        if time.monotonic() >= deadline:
            return outputs, None
        time.sleep(PEER_EXIT_POLL_S)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
