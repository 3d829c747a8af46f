"""The server's life beyond the engine: serving, draining (SIGTERM), or failed (an engine fault).

`LifecycleMiddleware` counts the HTTP requests in flight (a stream counts until its last
byte) and, while the server drains or after the engine failed, answers new work with a 503
and `Retry-After` (the control paths in `ALWAYS_OPEN` still answer: a client can abort its
request or close its session, a supervisor can read health and metrics). `/health` reports
the same state. `wait_idle` is what the launcher waits on before it stops uvicorn, so
in-flight requests finish first. `BodySizeLimitMiddleware` refuses bodies over the cap with
a 413, whether or not they declare their length.
"""

from __future__ import annotations

import threading
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sgl.server.errors import error_response

ALWAYS_OPEN = frozenset(
    {"/health", "/metrics", "/get_server_info", "/server_info", "/abort_request", "/close_session"}
)
DRAIN_RETRY_AFTER_S = 5
REFUSALS = frozenset({413, 429, 503})


class Lifecycle:
    """Draining or not, and how many requests are in flight (touched only on the event loop;
    `wait_idle` may be called from any thread)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.draining = False
        self.in_flight = 0
        self._idle = threading.Event()
        self._idle.set()

    def refusal(self) -> str | None:
        """Why new work is refused now, or None when the server takes it."""
        fault = getattr(self.engine, "fault", None)
        if fault is not None:
            return f"the engine failed (incident {fault.incident}); the server is restarting"
        if self.draining:
            return (
                "the server is shutting down; "
                "retry shortly (another replica, or this one once restarted)"
            )
        return None

    def start_drain(self) -> None:
        self.draining = True

    def wait_idle(self, timeout: float | None) -> bool:
        """Block until no request is in flight (True) or `timeout` passes (False)."""
        return self._idle.wait(timeout)

    def enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()


class LifecycleMiddleware:
    """Refuses new work while draining or failed, counts requests in flight, and counts the
    refusals (413, 429, 503) in `metrics`."""

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle, metrics: Any) -> None:
        self.app = app
        self.lifecycle = lifecycle
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("path") not in ALWAYS_OPEN:
            why = self.lifecycle.refusal()
            if why is not None:
                self.metrics.record_refusal(503)
                response = error_response(
                    503, why, headers={"Retry-After": str(DRAIN_RETRY_AFTER_S)}
                )
                await response(scope, receive, send)
                return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] in REFUSALS:
                self.metrics.record_refusal(message["status"])
            await send(message)

        self.lifecycle.enter()
        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.lifecycle.leave()


class _BodyTooLarge(Exception):
    pass


class BodySizeLimitMiddleware:
    """413 for a request body over `max_bytes`: at once when Content-Length says so, else as
    soon as the bytes read pass the cap (the app's own answer is then replaced)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> Any:
        return error_response(
            413,
            f"the request body is over this server's limit of {self.max_bytes} bytes "
            "(--max-request-bytes)",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._too_large()(scope, receive, send)
            return
        received = 0
        over = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    over = True
                    raise _BodyTooLarge()
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if over:  # the app answered the broken read (a 400); the client gets the real reason
                return
            started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _BodyTooLarge:
            pass
        if over and not started:
            await self._too_large()(scope, receive, send)
