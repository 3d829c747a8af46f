"""Programs in process vs through a server, interpreted on the client vs shipped whole.

The programs of `bench_programs.py` (a few-shot gen, a 4-way fork over a document, and
`run_batch` of the few-shot program over 16 items) and a 5-gen few-shot program, run on one
engine three ways: in process, through `RuntimeEndpoint` with the interpreter on the client
(`ship=False`: one HTTP request per gen, plus a session opened and closed), and shipped
(`ship=True`: one `/run_program` request). The server is its own process (`sgl.launch_server`
on the same model and defaults), as a remote backend is; `--server thread` runs it on the
benchmark's engine in this process instead, where client, server and engine share one GIL.
At 0 ms the client talks to the server directly (loopback); for 10 and 50 ms it goes through a
small proxy on 127.0.0.1 that holds each request that long before forwarding it, standing in
for the network between two hosts. Greedy; the median of `--runs` runs per cell, modes
interleaved.

    .venv/bin/python benchmarks/bench_remote_programs.py [--runs 5] [--delays 0,10,50]
        [--server process|thread]

Targets (issue 17): shipped within 5% of in-process at loopback; at 50 ms, shipped >= 3x
faster than client-side for the 5-gen program and for run_batch. `requests_per_run` counts
the HTTP requests of one run of each: a program that makes k requests one after another
cannot gain more than (t + k*d) / (t + d) from shipping, t being its compute time and d the
delay. Results: results/remote_programs.json (`--server thread`: remote_programs_thread.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from bench_programs import DOC, FEW_SHOT, few_shot, four_questions  # noqa: E402
from common import free_port, print_table, stop_process, wait_healthy, write_result  # noqa: E402

import sgl  # noqa: E402


@sgl.function
def five_gens(s, name):
    s += FEW_SHOT + f"Q: Write {name}'s profile.\n"
    for field in ("Name", "Age", "City", "Job", "Hobby"):
        s += f"{field}:" + sgl.gen(field.lower(), max_tokens=6, stop="\n") + "\n"


ITEMS = [{"a": a, "b": b} for a, b in zip(range(11, 27), range(40, 56))]
PROGRAMS: dict[str, Callable[[Any, Any], Any]] = {
    "few_shot (1 gen)": lambda be, ship: few_shot.run(
        a=17, b=25, backend=be, temperature=0, **ship
    ),
    "four_questions (fork 4)": lambda be, ship: four_questions.run(
        doc=DOC, backend=be, temperature=0, **ship
    ),
    "five_gens (5 gens)": lambda be, ship: five_gens.run(
        name="Ada", backend=be, temperature=0, **ship
    ),
    "run_batch (16 x few_shot)": lambda be, ship: few_shot.run_batch(
        ITEMS, backend=be, temperature=0, **ship
    ),
}


class DelayProxy:
    """HTTP proxy on 127.0.0.1 that waits `delay_s` before forwarding each request."""

    def __init__(self, target: str, delay_s: float) -> None:
        self.target, self.delay_s = target, delay_s
        self.requests = 0  # forwarded so far
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        threading.Thread(target=self._serve, daemon=True).start()
        self._ready.wait(30)

    def _serve(self) -> None:
        from aiohttp import ClientSession, web

        async def forward(request: web.Request) -> web.StreamResponse:
            self.requests += 1
            await asyncio.sleep(self.delay_s)
            body = await request.read()
            async with (
                ClientSession() as client,
                client.request(
                    request.method,
                    self.target + request.path_qs,
                    data=body,
                    headers={
                        k: v
                        for k, v in request.headers.items()
                        if k.lower() not in ("host", "content-length")
                    },
                ) as upstream,
            ):
                response = web.StreamResponse(
                    status=upstream.status,
                    headers={
                        k: v
                        for k, v in upstream.headers.items()
                        if k.lower()
                        not in ("content-length", "transfer-encoding", "content-encoding")
                    },
                )
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response

        async def main() -> None:
            app = web.Application(client_max_size=64 << 20)
            app.router.add_route("*", "/{tail:.*}", forward)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self._ready.set()
            await asyncio.Event().wait()

        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(main())


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    out = fn()
    for s in out if isinstance(out, list) else [out]:
        s.sync()
    return time.perf_counter() - t


@contextlib.contextmanager
def serving(engine: Any, where: str) -> Iterator[str]:
    """The server's URL: its own process on the embedded model, or a thread on `engine`."""
    if where == "thread":
        from server_helpers import ServerThread

        from sgl.server import create_app

        with ServerThread(create_app(engine, "default")) as url:
            yield url
        return
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sgl.launch_server",
            "--model-path",
            "default",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc, 300)
        yield url
    finally:
        stop_process(proc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--delays", default="0,10,50", help="ms added to each request by the proxy")
    ap.add_argument("--server", choices=("process", "thread"), default="process")
    args = ap.parse_args()

    engine = sgl.Engine(model_path="default")
    local = sgl.as_backend(engine)
    delays = [int(d) for d in args.delays.split(",")]
    results: dict[str, Any] = {
        "engine": {"dtype": str(engine.dtype)},
        "server": args.server,
        "runs": args.runs,
        "programs": {},
    }
    rows = []
    with serving(engine, args.server) as url:
        counter = DelayProxy(
            url, 0
        )  # counts one run's requests; timed runs at 0 ms go straight to the server
        remotes = {
            d: sgl.RuntimeEndpoint(DelayProxy(url, d / 1000).url if d else url) for d in delays
        }
        for name, run in PROGRAMS.items():
            modes: dict[str, Callable[[], Any]] = {"in_process": lambda run=run: run(local, {})}
            for d in delays:
                modes[f"client_side_{d}ms"] = lambda run=run, d=d: run(remotes[d], {"ship": False})
                modes[f"shipped_{d}ms"] = lambda run=run, d=d: run(remotes[d], {"ship": True})
            for fn in modes.values():  # warm-up: caches, first compile of constraints
                timed(fn)
            counting = sgl.RuntimeEndpoint(counter.url)
            requests_per_run = {}
            for side, ship in (("client_side", False), ("shipped", True)):
                before = counter.requests
                timed(lambda run=run, counting=counting, ship=ship: run(counting, {"ship": ship}))
                requests_per_run[side] = counter.requests - before
            times: dict[str, list[float]] = {m: [] for m in modes}
            for _ in range(args.runs):  # interleaved: the machine drifts
                for m, fn in modes.items():
                    times[m].append(timed(fn))
            med = {m: statistics.median(t) for m, t in times.items()}
            entry = {
                "median_s": {m: round(v, 4) for m, v in med.items()},
                "requests_per_run": requests_per_run,
            }
            entry["shipped_vs_in_process_0ms"] = (
                round(med["shipped_0ms"] / med["in_process"], 3) if 0 in delays else None
            )
            entry["client_side_over_shipped"] = {
                f"{d}ms": round(med[f"client_side_{d}ms"] / med[f"shipped_{d}ms"], 2)
                for d in delays
            }
            results["programs"][name] = entry
            for d in delays:
                rows.append(
                    (
                        name,
                        f"{requests_per_run['client_side']}/{requests_per_run['shipped']}",
                        f"{d} ms",
                        f"{med['in_process']:.3f}",
                        f"{med[f'client_side_{d}ms']:.3f}",
                        f"{med[f'shipped_{d}ms']:.3f}",
                        entry["client_side_over_shipped"][f"{d}ms"],
                        f"{med[f'shipped_{d}ms'] / med['in_process']:.2f}",
                    )
                )
    engine.shutdown()
    print_table(
        f"Programs in process vs remote (client-side interpreter vs shipped IR), {engine.dtype}, "
        f"server in a {args.server}, median of {args.runs}",
        rows,
        (
            "program",
            "requests client/shipped",
            "added delay",
            "in process s",
            "client-side s",
            "shipped s",
            "client/shipped",
            "shipped/in-process",
        ),
    )
    write_result(
        "remote_programs" if args.server == "process" else "remote_programs_thread", results
    )


if __name__ == "__main__":
    main()
