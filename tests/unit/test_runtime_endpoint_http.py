"""RuntimeEndpoint's HTTP: a kept-alive connection that the server closes unanswered (its idle
close racing the next request) is retried once on a new connection; a failure on a fresh
connection is the caller's. The server here is a raw socket that scripts each connection."""

from __future__ import annotations

import json
import socket
import threading

import pytest
import requests

from sgl.lang.backends.runtime_endpoint import RuntimeEndpoint

MODEL_INFO = {"model_path": "m", "served_model_name": "m"}


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += conn.recv(65536)
    return head.split(b"\r\n")[0]


def _answer(conn: socket.socket, body: dict) -> None:
    payload = json.dumps(body).encode()
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )


class ScriptedServer:
    """Connection i answers its first `answers[i]` requests, then closes on the next one
    without a response (or serves until the client leaves when `answers[i]` is None)."""

    def __init__(self, answers: list[int | None]) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.answers = answers
        self.requests: list[tuple[int, bytes]] = []  # (connection, request line)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        for i, budget in enumerate(self.answers):
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed by the test: no more connections come
                return
            with conn:
                served = 0
                while True:
                    line = _read_request(conn)
                    if not line:
                        break
                    self.requests.append((i, line))
                    if budget is not None and served == budget:
                        break  # closed with the request unanswered
                    _answer(conn, MODEL_INFO if b"model_info" in line else {"ok": i})
                    served += 1

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def scripted():
    servers: list[ScriptedServer] = []

    def make(answers):
        servers.append(ScriptedServer(answers))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def test_a_kept_alive_connection_closed_unanswered_is_retried_on_a_new_one(scripted):
    server = scripted([1, None])  # connection 0: /get_model_info, then closes on the next
    ep = RuntimeEndpoint(server.url)
    assert ep._request("POST", "/generate", {"text": "x"}) == {"ok": 1}
    assert [c for c, _ in server.requests] == [0, 0, 1]
    assert server.requests[1][1] == server.requests[2][1] == b"POST /generate HTTP/1.1"


def test_a_fresh_connection_closed_unanswered_is_the_callers_error(scripted):
    server = scripted([0, None])  # the very first request is dropped
    with pytest.raises(requests.ConnectionError, match="aborted"):
        RuntimeEndpoint(server.url)
    assert [c for c, _ in server.requests] == [0]  # not sent again


def test_a_retry_dropped_again_is_the_callers_error(scripted):
    server = scripted([1, 0, None])
    ep = RuntimeEndpoint(server.url)
    with pytest.raises(requests.ConnectionError, match="aborted"):
        ep._request("POST", "/generate", {"text": "x"})
    assert [c for c, _ in server.requests] == [0, 0, 1]  # one retry, no more
