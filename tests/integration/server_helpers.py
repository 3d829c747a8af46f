"""Run a FastAPI app with uvicorn in a background thread on 127.0.0.1 (a free port), and read
the server's replies: SSE events and error bodies."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import requests
import uvicorn

# A small schema the server tests constrain output with.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


class ServerThread:
    """`with ServerThread(app) as url: ...` serves `app` until the block ends."""

    def __init__(self, app: Any) -> None:
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
        # without it every response waits ~40 ms for a delayed ACK (Nagle).
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))  # bound here, so no other process can take the port
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5)
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self.url

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


def sse_lines(resp: requests.Response) -> Iterator[str]:
    """The lines of a streamed response, split on bytes (CR, LF, CRLF: SSE's line endings) and
    only then decoded; `iter_lines(decode_unicode=True)` would also split inside a JSON string
    holding U+2028, U+0085 and the like."""
    for line in resp.iter_lines():
        yield line.decode("utf-8")


def sse_events(resp: requests.Response) -> Iterator[Any]:
    """The `data:` payloads of an SSE response: parsed JSON, or the string '[DONE]'."""
    for line in sse_lines(resp):
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line[len("data: ") :]
        yield payload if payload == "[DONE]" else json.loads(payload)


def assert_error(resp: requests.Response, status: int, param: str | None = "any") -> dict:
    """The OpenAI-style error body: {"error": {"message", "type", "param", "code"}}."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, body
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    assert err["code"] == status
    if param != "any":
        assert err["param"] == param, body
    return err


def wait_until(cond: Callable[[], bool], timeout: float = 60.0, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return cond()


def kv_whole(url: str) -> bool:
    """Idle, and once the radix cache is flushed every KV slot is free: nothing leaked."""
    info = requests.get(url + "/get_server_info", timeout=30).json()
    if info["num_running_reqs"] or info["num_waiting_reqs"]:
        return False
    if not requests.post(url + "/flush_cache", timeout=30).json()["success"]:
        return False
    info = requests.get(url + "/get_server_info", timeout=30).json()
    return info["available_kv_tokens"] == info["max_total_tokens"]


def parse_metrics(text: str) -> dict[str, float]:
    """`name{labels} value` / `name value` lines -> {"name{labels}": value}; asserts the format."""
    import re

    line_re = re.compile(
        r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$'
    )
    out: dict[str, float] = {}
    for line in text.split(
        "\n"
    ):  # the exposition format's line ending (str.splitlines splits more)
        if not line or line.startswith("#"):
            continue
        m = line_re.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def metric(samples: dict[str, float], name: str) -> float:
    """The value of the sample named `name` (whatever its labels; exactly one must match)."""
    hits = [v for k, v in samples.items() if k == name or k.startswith(name + "{")]
    assert len(hits) == 1, (name, hits)
    return hits[0]
