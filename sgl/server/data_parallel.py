"""`python -m sgl.launch_server --dp-size N`: N sgl workers behind the real sglang-router.

Data parallelism here is SGLang's: independent servers, each with its own engine and radix
cache, and the router (`pip install sgl[router]`: the Rust `sglang-router`) in front of them,
sending each request to the worker whose cache holds the longest prefix of its text unless
the loads drift apart (`cache_aware`). sgl writes no router of its own.

The workers listen on 127.0.0.1 (ports after the router's), each on its own share of the CPUs
(its affinity mask, which sizes its compute threads) or its own CUDA device; the router
listens on --host / --port. The supervisor restarts a worker that dies (the router stops
sending to it within its health interval and takes it back once healthy) unless it keeps
dying, and stops everything, router first, on SIGTERM / Ctrl-C or when the router dies.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("sgl.server")

ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")
# Options the supervisor handles itself, never passed to a worker.
SUPERVISOR_OPTIONS = (
    "dp_size",
    "router_policy",
    "router_balance_abs_threshold",
    "host",
    "port",
    "api_key",
    "api_key_file",
    "config",
)
START_TIMEOUT_S = 900.0  # a worker's first start may build native kernels and compile
RESTARTS_PER_WINDOW, RESTART_WINDOW_S = 3, 300.0
STOP_GRACE_S = 40.0
# The router's health checks (its default: every 60 s, 3 failures): until they fail, requests
# it sends to a dead worker fail with a 500; at 2 s that window is a few seconds.
HEALTH_CHECK_INTERVAL_S = 2


def worker_argv(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The command-line options of `args` that differ from their defaults, minus the
    supervisor's own: what every worker is started with."""
    out: list[str] = []
    for action in parser._actions:
        if not action.option_strings or action.dest in SUPERVISOR_OPTIONS or action.dest == "help":
            continue
        value = getattr(args, action.dest)
        if value == action.default:
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            out.append(flag if value else "--no-" + flag[2:])
        elif isinstance(action, argparse._StoreTrueAction):
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def cpu_slices(cpus: list[int], n: int) -> list[list[int]]:
    """`cpus` dealt into `n` contiguous, near-equal slices (each at least one CPU)."""
    if n > len(cpus):
        raise ValueError(f"--dp-size {n} needs at least {n} CPUs; this process may use {len(cpus)}")
    base, extra = divmod(len(cpus), n)
    out, start = [], 0
    for i in range(n):
        size = base + (i < extra)
        out.append(cpus[start : start + size])
        start += size
    return out


@dataclass
class Worker:
    index: int
    port: int
    cmd: list[str]
    env: dict[str, str]
    cpus: list[int] | None
    proc: subprocess.Popen | None = None
    deaths: list[float] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cpus = self.cpus
        self.proc = subprocess.Popen(
            self.cmd,
            env=self.env,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )


def router_command(
    urls: list[str],
    policy: str,
    host: str,
    port: int,
    api_key: str | None,
    balance_abs_threshold: int = 2,
) -> list[str]:
    """The router's command line. `balance_abs_threshold`: in-flight requests one worker may
    have beyond another before cache_aware balances by load instead of by prefix (the router's
    default, 64, suits GPU workers; an sgl worker on a few CPU cores is saturated by a handful,
    so at 64 its peers idle while it queues: measured, 18 of 18 requests on one of two workers
    at 64, 13 / 5 at 2 with 88% of one worker's prefix hits)."""
    cmd = [
        sys.executable,
        "-m",
        "sglang_router.launch_router",
        "--worker-urls",
        *urls,
        "--policy",
        policy,
        "--host",
        host,
        "--port",
        str(port),
        "--balance-abs-threshold",
        str(balance_abs_threshold),
        "--health-check-interval-secs",
        str(HEALTH_CHECK_INTERVAL_S),
    ]
    return cmd + (["--api-key", api_key] if api_key else [])


def make_workers(
    parser: argparse.ArgumentParser, args: argparse.Namespace, api_key: str | None
) -> list[Worker]:
    """The workers' commands, ports, environments and CPU (or CUDA device) shares."""
    base = [
        sys.executable,
        "-m",
        "sgl.launch_server",
        *worker_argv(parser, args),
        "--host",
        "127.0.0.1",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("SGL_API_KEY", "SGL_API_KEY_FILE")}
    if api_key:
        env["SGL_API_KEY"] = api_key  # never on a command line (`ps` shows those)
    cuda = str(args.device).startswith("cuda") or (args.device == "auto" and _cuda_devices() > 0)
    if cuda and args.dp_size * max(1, args.tp_size) > _cuda_devices():
        raise ValueError(
            f"--dp-size {args.dp_size} x --tp-size {args.tp_size} needs that many CUDA devices; "
            f"{_cuda_devices()} visible"
        )
    slices = None if cuda else cpu_slices(sorted(os.sched_getaffinity(0)), args.dp_size)
    workers = []
    per_worker = max(1, args.tp_size)  # CUDA devices of one worker (its tensor-parallel ranks)
    for i in range(args.dp_size):
        devices = ",".join(str(d) for d in range(i * per_worker, (i + 1) * per_worker))
        wenv = dict(env, CUDA_VISIBLE_DEVICES=devices) if cuda else env
        port = args.port + 1 + i
        workers.append(
            Worker(
                i, port, [*base, "--port", str(port)], wenv, None if slices is None else slices[i]
            )
        )
    return workers


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # no torch CUDA build: a CPU machine
        return 0


class Stopped(Exception):
    """A signal came while the workers were starting."""


def wait_healthy(
    workers: list[Worker], timeout: float, stopping: Callable[[], bool] = lambda: False
) -> None:
    """Until every worker answers /health 200; RuntimeError naming one that exited first,
    `Stopped` as soon as `stopping()` (Ctrl-C while the models load)."""
    import requests

    deadline = time.monotonic() + timeout
    pending = list(workers)
    while pending:
        if stopping():
            raise Stopped()
        for w in list(pending):
            if w.proc.poll() is not None:
                raise RuntimeError(
                    f"worker {w.index} ({w.url}) exited with {w.proc.returncode} while starting"
                )
            try:
                if requests.get(w.url + "/health", timeout=2).status_code == 200:
                    pending.remove(w)
            except requests.RequestException:
                pass
        if pending and time.monotonic() > deadline:
            raise RuntimeError(
                f"workers {[w.index for w in pending]} not healthy after {timeout:.0f} s"
            )
        if pending:
            time.sleep(0.5)


class Supervisor:
    """Runs the workers and the router until a signal, the router's exit, or a worker that
    keeps dying; returns the exit status."""

    def __init__(self, workers: list[Worker], router_cmd: list[str]) -> None:
        self.workers = workers
        self.router_cmd = router_cmd
        self.router: subprocess.Popen | None = None
        self.stopping = False

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            for w in self.workers:
                w.start()
            wait_healthy(self.workers, START_TIMEOUT_S, lambda: self.stopping)
            self.router = subprocess.Popen(self.router_cmd)
            logger.info(
                "router (%s) in front of %s",
                self.router_cmd[self.router_cmd.index("--policy") + 1],
                [w.url for w in self.workers],
            )
            return self._watch()
        except Stopped:
            return 0
        except RuntimeError as e:
            logger.error("%s", e)
            return 1
        finally:
            self.stop()

    def _on_signal(self, sig: int, frame: Any) -> None:
        logger.info("signal %d: stopping the router and the workers", sig)
        self.stopping = True

    def _watch(self) -> int:
        while not self.stopping:
            if self.router.poll() is not None:
                logger.error(
                    "the router exited with %s: stopping the workers", self.router.returncode
                )
                return 1
            for w in self.workers:
                if w.proc.poll() is not None and not self._restart(w):
                    return 1
            time.sleep(0.5)
        return 0

    def _restart(self, w: Worker) -> bool:
        """Start a dead worker again, unless it died RESTARTS_PER_WINDOW times lately."""
        now = time.monotonic()
        w.deaths = [t for t in w.deaths if now - t < RESTART_WINDOW_S] + [now]
        if len(w.deaths) > RESTARTS_PER_WINDOW:
            logger.error(
                "worker %d (%s) died %d times in %.0f s: stopping",
                w.index,
                w.url,
                len(w.deaths),
                RESTART_WINDOW_S,
            )
            return False
        logger.warning(
            "worker %d (%s) exited with %s: restarting it", w.index, w.url, w.proc.returncode
        )
        w.start()
        return True

    def stop(self) -> None:
        """The router first (no new requests), then the workers (SIGTERM: they drain)."""
        if self.router is not None:
            terminate([self.router])
        terminate([w.proc for w in self.workers if w.proc is not None])


def terminate(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to each; whatever still runs after STOP_GRACE_S is killed."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def serve(parser: argparse.ArgumentParser, args: argparse.Namespace, api_key: str | None) -> int:
    """Start `args.dp_size` workers and the router; the exit status."""
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        logger.error(
            "--dp-size needs the sglang-router: pip install 'sgl[router]' (make setup installs it)"
        )
        return 1
    try:
        workers = make_workers(parser, args, api_key)
    except ValueError as e:
        logger.error("%s", e)
        return 2
    router = router_command(
        [w.url for w in workers],
        args.router_policy,
        args.host,
        args.port,
        api_key,
        args.router_balance_abs_threshold,
    )
    return Supervisor(workers, router).run()
