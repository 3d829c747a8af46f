"""The remote backend: programs run against an sgl server over HTTP, exactly as in process.

`RuntimeEndpoint(url)` speaks the server's native API: `/generate` (whose body is the
engine's result dict; streamed as Server-Sent Events with cumulative text), `/tokenize`
(to score `select` choices on the same tokens as in process), `/get_model_info` (which
carries the chat template's role strings, so roles render the same remotely), and
`/flush_cache` / `/get_server_info`, and `/open_session` / `/close_session`: each program
state runs as a session, so its KV stays pinned in the server's cache while it lives.
`Runtime(...)` starts a local server process for it.

Behind a router (the sglang-router in front of several sgl workers) `/run_program`, the
session routes and `/tokenize` are not forwarded: their first 404 is remembered, and from then
on programs run here, one `/generate` per call, without sessions (the router's cache-aware
policy keeps a program's calls on the worker holding its prefix), and select's choices are
tokenized by the router's `/v1/tokenize`.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import requests
import urllib3

from sgl.lang.backends.base import ProgramsNotServed
from sgl.lang.backends.scoring import TokenScoringBackend, logprobs_of
from sgl.lang.backends.sse import sse_data
from sgl.lang.chat_template import ChatTemplate

logger = logging.getLogger(__name__)


class RemoteError(ValueError):
    """The server refused a request (4xx/5xx); carries its message, status and param."""

    def __init__(self, message: str, status: int, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


def closed_without_response(e: requests.ConnectionError) -> bool:
    """Whether the connection was dropped with no response (urllib3's "Connection aborted":
    RemoteDisconnected, a reset), as opposed to one that could not be opened."""
    return bool(e.args) and isinstance(e.args[0], urllib3.exceptions.ProtocolError)


class RuntimeEndpoint(TokenScoringBackend):
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: Any = None,
        chat_template_name: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        """SGLang's arguments: `verify` is requests' (TLS certificate checking);
        `chat_template_name` is accepted and not needed: roles render with the server's own
        chat template (from /get_model_info), exact for every model."""
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.verify = verify
        self.chat_template_name = chat_template_name
        self.timeout = timeout
        self._local = threading.local()  # one HTTP session per thread (connection reuse)
        self.model_info = self._request("GET", "/get_model_info")
        self._missing_routes: set[str] = (
            set()
        )  # routes that answered a route-missing 404 (a router in front)
        roles = self.model_info.get("chat_roles")
        self._template = (
            ChatTemplate(
                roles["prefix"], roles["suffix"], roles.get("default_system", ""), "server"
            )
            if roles
            else ChatTemplate.plain()
        )

    @property
    def serves_programs(self) -> bool:
        return "/run_program" not in self._missing_routes

    @property
    def serves_sessions(self) -> bool:
        """The server says it has sessions and its session routes were not found missing."""
        return (
            bool(self.model_info.get("supports_sessions"))
            and "/open_session" not in self._missing_routes
        )

    @property
    def serves_tokenize(self) -> bool:
        return "/tokenize" not in self._missing_routes

    def _missing(self, path: str, e: RemoteError, then: str) -> bool:
        """Whether `e` says `path` itself is missing (remembered, logged once); sgl's own 404s
        (a session closed under a program) name their field and are not."""
        if e.status != 404 or e.param is not None:
            return False
        self._missing_routes.add(path)
        logger.info("%s has no %s (a router in front of workers?): %s", self.base_url, path, then)
        return True

    @property
    def endpoint(self) -> RuntimeEndpoint:
        """Itself: SGLang code reaches the server through `backend.endpoint` (on SGLang's `Runtime`,
        its RuntimeEndpoint), e.g. `global_config.default_backend.endpoint.get_model_name()`."""
        return self

    def get_model_name(self) -> str:
        return self.model_info.get("served_model_name") or self.model_info["model_path"]

    # ------------------------------------------------------------------ HTTP

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
            if self.verify is not None:
                s.verify = self.verify
            if self.api_key:
                s.headers["Authorization"] = f"Bearer {self.api_key}"
        return s

    def _send(self, method: str, path: str, body: Any, stream: bool) -> requests.Response:
        """One HTTP request on this thread's session. A kept-alive connection that the server
        closed just as the next request went out (its idle close racing the request: seen
        through the sglang-router on a loaded machine) fails with no response at all; the
        request never reached a handler, so it goes once more on a new connection. A fresh
        connection's failure, or any other, is the caller's."""
        session = self._session()
        reused = getattr(self._local, "answered", False)
        url = self.base_url + path
        try:
            r = session.request(method, url, json=body, stream=stream, timeout=self.timeout)
        except requests.ConnectionError as e:
            if not (reused and closed_without_response(e)):
                raise
            logger.info("%s closed a kept-alive connection unanswered; sending again", url)
            session.close()  # drops the pool's dead connection
            r = session.request(method, url, json=body, stream=stream, timeout=self.timeout)
        self._local.answered = True
        return r

    def _request(self, method: str, path: str, body: Any = None, stream: bool = False) -> Any:
        r = self._send(method, path, body, stream)
        if r.status_code >= 400:
            try:
                err = r.json().get("error", {})
                message, param = err.get("message", r.text), err.get("param")
            except ValueError:
                message, param = r.text, None
            r.close()
            raise RemoteError(f"{path}: HTTP {r.status_code}: {message}", r.status_code, param)
        return r if stream else r.json()

    # ------------------------------------------------------------------ Backend

    def _generate_request(
        self, body: dict[str, Any], session: str | None, stream: bool = False
    ) -> Any:
        if session is not None:
            body = {**body, "session_params": {"id": session}}
        return self._request("POST", "/generate", body, stream=stream)

    def generate(
        self,
        text: str,
        sampling: dict[str, Any],
        logprobs: dict[str, Any],
        session: str | None = None,
    ) -> tuple[str, dict[str, Any]]:
        out = self._generate_request(
            {"text": text, "sampling_params": sampling, **logprobs}, session
        )
        return out["text"], out["meta_info"]

    def generate_stream(
        self,
        text: str,
        sampling: dict[str, Any],
        logprobs: dict[str, Any],
        session: str | None = None,
    ) -> Iterator[tuple[str, dict[str, Any] | None]]:
        body = {"text": text, "sampling_params": sampling, "stream": True, **logprobs}
        r = self._generate_request(body, session, stream=True)
        seen = ""
        try:
            for chunk in sse_events(r, "/generate stream"):
                full = chunk["text"]  # cumulative, as SGLang's /generate streams it (logprobs too)
                yield full[len(seen) :], chunk["meta_info"]
                seen = full
        finally:
            r.close()  # an early stop closes the connection: the server aborts the request

    # ------------------------------------------------------------------ shipped programs

    def run_program(
        self,
        programs: list[dict[str, Any]],
        defaults: dict[str, Any],
        stream: bool = False,
        arguments: list[dict[str, Any]] | None = None,
    ) -> list:
        """Run static programs (IR JSON, `sgl.lang.ir_json`) on the server in one request:
        a `ShippedState` each (streamed: one program, read as the server sends it). With
        `arguments`, the one program runs once per argument set (the batch form)."""
        if not self.serves_programs:
            raise ProgramsNotServed(f"{self.base_url} does not serve /run_program")
        try:
            return self._run_program(programs, defaults, stream, arguments)
        except RemoteError as e:
            if not self._missing("/run_program", e, "programs run client-side"):
                raise
            raise ProgramsNotServed(str(e)) from e  # nothing ran: the route itself is missing

    def _run_program(
        self,
        programs: list[dict[str, Any]],
        defaults: dict[str, Any],
        stream: bool,
        arguments: list[dict[str, Any]] | None,
    ) -> list:
        from sgl.lang.shipping import ShippedState

        sampling = {k: v for k, v in defaults.items() if v is not None}
        if stream:
            r = self._request(
                "POST",
                "/run_program",
                {"program": programs[0], "sampling": sampling, "stream": True},
                stream=True,
            )
            return [ShippedState(events=sse_events(r, "/run_program"))]
        if arguments is not None:
            results = self._request(
                "POST",
                "/run_program",
                {"program": programs[0], "arguments": arguments, "sampling": sampling},
            )
        elif len(programs) == 1:
            results = [
                self._request(
                    "POST", "/run_program", {"program": programs[0], "sampling": sampling}
                )
            ]
        else:
            results = self._request(
                "POST", "/run_program", {"programs": programs, "sampling": sampling}
            )
        for (
            r
        ) in results:  # the server counted every gen of the program, as the interpreter does here
            self.token_usage.merge(r.get("usage") or {})
        return [
            ShippedState(result=r) if "error" not in r else _failed(r["error"]) for r in results
        ]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids as the server encodes prompts: its `/tokenize`, or behind the sglang-router
        (which forwards no `/tokenize`) the router's `/v1/tokenize`, on the tokenizer it loaded
        from the workers' `model_path`."""
        if self.serves_tokenize:
            try:
                return self._request("POST", "/tokenize", {"text": texts})["input_ids"]
            except RemoteError as e:
                if not self._missing("/tokenize", e, "tokenizing with its /v1/tokenize"):
                    raise
        return self._request(
            "POST", "/v1/tokenize", {"model": self.get_model_name(), "prompt": texts}
        )["tokens"]

    def score_tokens(self, id_lists: list[list[int]], start: int) -> list[list[float]]:
        outs = self._request(
            "POST",
            "/generate",
            {
                "input_ids": id_lists,
                "sampling_params": {"max_new_tokens": 0},
                "return_logprob": True,
                "logprob_start_len": start,
            },
        )
        return [logprobs_of(o["meta_info"]) for o in outs]

    def bos_token_id(self) -> int | None:
        return self.model_info.get("bos_token_id")

    def cache_prefix(self, text: str) -> None:
        if text:
            self._request(
                "POST", "/generate", {"text": text, "sampling_params": {"max_new_tokens": 0}}
            )

    def chat_template(self) -> ChatTemplate:
        return self._template

    def open_session(self) -> str | None:
        if not self.serves_sessions:
            return None
        try:
            return self._request("POST", "/open_session", {})
        except RemoteError as e:
            if not self._missing("/open_session", e, "programs run without sessions"):
                raise
            return None

    def close_session(self, session: str) -> None:
        try:
            self._request("POST", "/close_session", {"session_id": session})
        except RemoteError as e:
            if e.status != 404:  # 404: it had timed out already
                raise

    def flush_cache(self) -> bool:
        """True if the cache was flushed (False while requests are in flight)."""
        return bool(self._request("POST", "/flush_cache").get("success"))

    def get_server_info(self) -> dict[str, Any]:
        return self._request("GET", "/get_server_info")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Runtime:
    """A local sgl server in a subprocess: `Runtime(model_path="default", **server_args)`.

    Server arguments are the launch_server options with underscores (`max_total_tokens=...`,
    `disable_radix_cache=True`, `api_key="..."`). `.url` and `.endpoint` (a RuntimeEndpoint)
    once healthy; `shutdown()` (also at interpreter exit) stops the process.
    """

    def __init__(
        self,
        model_path: str = "default",
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout: float = 300.0,
        **server_args: Any,
    ) -> None:
        self.port = port or _free_port()
        self.url = f"http://{host}:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "sgl.launch_server",
            "--model-path",
            model_path,
            "--host",
            host,
            "--port",
            str(self.port),
        ]
        for key, value in server_args.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                cmd.append(flag)
            elif value not in (None, False):
                cmd += [flag, str(value)]
        self.process = subprocess.Popen(cmd, env=dict(os.environ))
        atexit.register(self.shutdown)
        api_key = server_args.get("api_key")
        deadline = time.monotonic() + startup_timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the server exited with code {self.process.returncode} while starting: "
                    f"{' '.join(cmd)}"
                )
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                self.shutdown()
                raise TimeoutError(
                    f"the server did not become healthy within {startup_timeout:.0f} s"
                )
            time.sleep(0.5)
        self.endpoint = RuntimeEndpoint(self.url, api_key=api_key)

    def shutdown(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def sse_events(r: requests.Response, what: str) -> Iterator[dict[str, Any]]:
    """The `data:` objects of a server-sent event stream up to `[DONE]`, split on bytes
    (`sgl.lang.backends.sse`); an error event raises RemoteError (`what` names the call).
    The connection closes when it ends."""
    try:
        for data in sse_data(r.iter_content(chunk_size=None)):
            if data.strip() == "[DONE]":
                return
            event = json.loads(data)
            if "error" in event:
                err = event["error"]
                info = err if isinstance(err, dict) else {"message": err}
                raise RemoteError(
                    f"{what}: {info.get('message', err)}",
                    info.get("code") or 500,
                    info.get("param"),
                )
            yield event
    finally:
        r.close()


def _failed(err: dict[str, Any]) -> Any:
    from sgl.lang.errors import ProgramError
    from sgl.lang.shipping import ShippedState

    state = ShippedState(result={})
    state.error = ProgramError(f"/run_program: {err.get('message', err)}")
    return state
