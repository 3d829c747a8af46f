"""`--dp-size 2`: two sgl workers behind the real sglang-router, started as a user starts them.

Oracles: a request or a program through the router gives what one worker gives (greedy);
the workers' own counters say where requests went and what their caches saved; killing a
worker fails its requests with an error, the other serves, and the supervisor restarts it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

import pytest
import requests
from process_helpers import gone
from server_helpers import wait_until

import sgl

pytestmark = pytest.mark.integration
sglang_router = pytest.importorskip(
    "sglang_router", reason="the router extra: pip install 'sgl[router]'"
)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _free_port_block(n: int) -> int:
    """A port p with p .. p + n - 1 free (the router's and its workers')."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n < 65535 and all(_free(base + i) for i in range(n)):
            return base
    raise RuntimeError("no block of free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _get(url: str, path: str) -> requests.Response | None:
    try:
        return requests.get(url + path, timeout=5)
    except requests.RequestException:
        return None


def _healthy(url: str) -> bool:
    r = _get(url, "/health")
    return r is not None and r.status_code == 200


def _routes_to_both(router: str, workers: list[str]) -> bool:
    """The router lists both workers as healthy (its workers API)."""
    r = _get(router, "/workers")
    if r is None or r.status_code != 200:
        return False
    text = r.text
    return all(w in text for w in workers) and '"is_healthy":false' not in text.replace(" ", "")


class Cluster:
    def __init__(self) -> None:
        self.port = _free_port_block(3)
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = [f"http://127.0.0.1:{self.port + 1 + i}" for i in range(2)]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sgl.launch_server",
                "--model-path",
                "default",
                "--dp-size",
                "2",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--max-total-tokens",
                "8192",
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
        )

    def info(self, i: int) -> dict:
        return requests.get(self.workers[i] + "/get_server_info", timeout=30).json()


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    try:
        assert wait_until(
            lambda: (
                c.proc.poll() is not None
                or (all(_healthy(w) for w in c.workers) and _routes_to_both(c.url, c.workers))
            ),
            timeout=600,
            interval=0.5,
        )
        assert c.proc.poll() is None, "the supervisor exited while starting"
        yield c
    finally:
        pids = [p for i in range(2) for p in (_worker_pid(c, i),) if p]
        if c.proc.poll() is None:
            c.proc.send_signal(signal.SIGTERM)
            try:
                c.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
        assert c.proc.returncode == 0
        assert all(gone(p) for p in pids)  # the workers stop with the supervisor
        assert not any(_healthy(u) for u in [c.url, *c.workers])


def _worker_pid(c: Cluster, i: int) -> int | None:
    r = _get(c.workers[i], "/get_server_info")
    return r.json().get("pid") if r is not None and r.status_code == 200 else None


def _generate(url: str, text: str, n: int = 12) -> dict:
    r = requests.post(
        url + "/generate",
        json={"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0}},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    return r.json()


def _routed_ok(url: str, text: str) -> bool:
    r = requests.post(
        url + "/generate",
        json={"text": text, "sampling_params": {"max_new_tokens": 4}},
        timeout=300,
    )
    return r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4


def test_worker_contract(cluster):
    """What the router reads from a worker: load, model info under both names, a tokenizer dir."""
    w = cluster.workers[0]
    load = requests.get(w + "/get_load", timeout=10).json()
    assert isinstance(load, list) and load[0]["dp_rank"] == 0
    assert {"num_reqs", "num_waiting_reqs", "num_tokens"} <= set(load[0])
    info = requests.get(w + "/get_model_info", timeout=10).json()
    assert requests.get(w + "/model_info", timeout=10).json() == info
    assert os.path.isfile(os.path.join(info["tokenizer_path"], "tokenizer.json"))


def test_generate_through_router_equals_one_worker(cluster):
    text = "The three primary colors are"
    direct = _generate(cluster.workers[1], text)
    routed = _generate(cluster.url, text)
    assert routed["text"] == direct["text"] and routed["output_ids"] == direct["output_ids"]
    body = {"model": "default", "prompt": text, "max_tokens": 12, "temperature": 0}
    completion = requests.post(cluster.url + "/v1/completions", json=body, timeout=300)
    assert (
        completion.status_code == 200 and completion.json()["choices"][0]["text"] == direct["text"]
    )


def test_generate_takes_fields_sglang_clients_add(cluster):
    """The router's and SGLang 0.5 clients' extra fields are accepted; a misspelt real one is
    not."""
    extras = {
        "model": "default",
        "background": False,
        "no_logs": False,
        "return_bytes": False,
        "return_entropy": False,
        "priority": None,
        "bootstrap_host": None,
        "data_parallel_rank": None,
    }
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 2}, **extras}
    assert (
        requests.post(cluster.workers[0] + "/generate", json=body, timeout=120).status_code == 200
    )
    bad = requests.post(
        cluster.workers[0] + "/generate", json={"text": "Hi", "strem": True}, timeout=30
    )
    assert bad.status_code == 400 and "did you mean 'stream'" in bad.json()["error"]["message"]


@sgl.function
def program(s, topic):
    s += f"Write about {topic}.\nTitle:" + sgl.gen("title", max_tokens=8, stop="\n")
    s += "\nMood:" + sgl.select("mood", [" happy", " sad", " calm"])
    s += "\nYear: " + sgl.gen("year", regex=r"(19|20)[0-9]{2}")
    forks = s.fork(2)
    forks += lambda i: ["\nPro:", "\nCon:"][i] + sgl.gen("point", max_tokens=6, stop="\n")
    forks.join()


def _vars(state: sgl.ProgramState) -> dict:
    return {k: state[k] for k in ("title", "mood", "year")} | {"text": state.text()}


def test_programs_through_router_equal_one_worker(cluster):
    """Shipped and session-less fallbacks: the router forwards neither /run_program nor the
    session routes; the endpoint finds that out (404) and runs the program here."""
    worker, routed = sgl.RuntimeEndpoint(cluster.workers[0]), sgl.RuntimeEndpoint(cluster.url)
    topics = ["the sea", "a city"]
    expected = [_vars(program.run(topic=t, backend=worker, temperature=0)) for t in topics]
    got = [_vars(program.run(topic=t, backend=routed, temperature=0)) for t in topics]
    assert got == expected
    assert routed.serves_programs is False and routed.serves_sessions is False
    batch = program.run_batch([{"topic": t} for t in topics], backend=routed, temperature=0)
    assert [_vars(s) for s in batch] == expected
    streamed = program.run(topic=topics[0], backend=routed, temperature=0, stream=True)
    pieces = "".join(streamed.text_iter())
    assert streamed.text() == expected[0]["text"] and pieces
    with pytest.raises(sgl.ProgramError, match="cannot run programs"):
        program.run(topic="x", backend=routed, temperature=0, ship=True)


def _cached(c: Cluster) -> list[int]:
    return [c.info(i)["cached_tokens"] for i in range(2)]


def _served(c: Cluster) -> list[int]:
    return [c.info(i)["finished_requests"] for i in range(2)]


def test_cache_aware_routing_keeps_tenants_on_their_worker(cluster):
    """Two tenants' long prefixes, one request at a time and then concurrently: the prefix hits
    over both workers are >= 80% of what one worker would hit, and both workers get work."""
    tenants = [
        ("You are a legal assistant. " + "Cite the statute. " * 60),
        ("You are a chef. " + "Name the dish. " * 60),
    ]
    ids = [
        requests.post(cluster.workers[0] + "/tokenize", json={"text": t}, timeout=30).json()[
            "input_ids"
        ]
        for t in tenants
    ]
    for w in cluster.workers:
        requests.post(w + "/flush_cache", timeout=30)
    before_cached, before_served = _cached(cluster), _served(cluster)
    questions = [f"\nQuestion {i}: what next?" for i in range(10)]
    for q in questions[:5]:
        for t in tenants:
            _generate(cluster.url, t + q, n=2)
    threads = [
        threading.Thread(target=_generate, args=(cluster.url, t + q, 2))
        for q in questions[5:]
        for t in tenants
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    cached = sum(_cached(cluster)) - sum(before_cached)
    served = [a - b for a, b in zip(_served(cluster), before_served)]
    one_worker = sum(len(i) - 1 for i in ids) * (
        len(questions) - 1
    )  # all but each tenant's first request hit
    assert min(served) > 0, served
    assert cached >= 0.8 * one_worker, (cached, one_worker)


def test_a_killed_worker_fails_its_requests_and_comes_back(cluster):
    victim = 1
    pid = _worker_pid(cluster, victim)
    body = {
        "text": "Count to a thousand:",
        "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True},
    }
    result: dict = {}

    def long_request() -> None:  # straight to the victim, so it is surely in flight there
        try:
            result["status"] = requests.post(
                cluster.workers[victim] + "/generate", json=body, timeout=300
            ).status_code
        except requests.RequestException as e:
            result["error"] = e

    th = threading.Thread(target=long_request)
    th.start()
    assert wait_until(lambda: cluster.info(victim)["num_running_reqs"] == 1, timeout=120)
    os.kill(pid, signal.SIGKILL)
    th.join(timeout=120)
    assert not th.is_alive() and ("error" in result or result["status"] >= 500)
    # the router sends to the dead worker until its health checks fail (a 500 each, never a hang),
    # then serves from the other
    assert wait_until(lambda: _routed_ok(cluster.url, "Still serving:"), timeout=120, interval=0.5)
    assert wait_until(
        lambda: _worker_pid(cluster, victim) not in (None, pid), timeout=600, interval=1.0
    )
    assert wait_until(
        lambda: _routes_to_both(cluster.url, cluster.workers), timeout=300, interval=1.0
    )
    assert _generate(cluster.workers[victim], "Back:", n=2)["meta_info"]["completion_tokens"] == 2
