"""Server-sent events and client disconnects.

A client that goes away must not leave its request decoding. A stream's body generator
checks for a disconnect between events, and whether it ends by disconnect, cancellation
(Starlette cancels the response task when the client leaves) or garbage collection, its
`finally` aborts the requests synchronously by id (also when the body never started, so
the engine's iterator never ran) and closes the engine iterator, whose own `finally`
aborts whatever of its call is still running. A non-streamed generation is watched by
`until_disconnected`, which cancels it (the engine aborts a cancelled `async_generate`) if the
client leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from sgl.runtime.errors import InvalidRequestError
from sgl.server.encoding import dumps
from sgl.server.errors import APIError, error_body, internal_error_body

DONE = "data: [DONE]\n\n"
T = TypeVar("T")


def sse(data: Any) -> str:
    return f"data: {dumps(data)}\n\n"


def _error_event(exc: BaseException) -> str:
    if isinstance(exc, InvalidRequestError):
        return sse(error_body(exc.status, exc.message, exc.param))
    if isinstance(exc, APIError):
        return sse(error_body(exc.status, exc.message, exc.param, exc.type))
    return sse(internal_error_body(exc, "a stream"))


DISCONNECT_POLL_S = 0.5


async def until_disconnected(request: Request, coro: Awaitable[T]) -> T | None:
    """Await `coro`; if the client disconnects first, cancel it and return None."""
    task = asyncio.ensure_future(coro)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                return None
    except BaseException:  # our own handler was cancelled
        task.cancel()
        raise


def client_gone() -> Response:
    """What a handler returns when its client left (nobody reads it; 499 as nginx logs it)."""
    return Response(status_code=499)


class _SSEResponse(StreamingResponse):
    """A StreamingResponse that runs `on_abandon` unless its body ran to the end, also when
    the body never started (the client left before the headers went out)."""

    def __init__(self, body: AsyncIterator[str], on_abandon: Callable[[], None] | None) -> None:
        super().__init__(
            body,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.on_abandon = on_abandon
        self.completed = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.completed and self.on_abandon is not None:
                self.on_abandon()


def sse_response(
    request: Request, events: AsyncIterator[str], on_abandon: Callable[[], None] | None = None
) -> StreamingResponse:
    """Stream `events` (already framed), then `data: [DONE]`. An error mid-stream becomes an
    error event. If the stream does not run to its end, `on_abandon` (abort the requests)
    runs before `events` is closed."""

    async def body() -> AsyncIterator[str]:
        try:
            try:
                async for event in events:
                    if await request.is_disconnected():
                        return
                    yield event
            except Exception as exc:  # after the 200 header went out: report it in-band
                yield _error_event(exc)
            response.completed = True
            yield DONE
        finally:
            if not response.completed and on_abandon is not None:
                on_abandon()  # synchronously, before anything here can be cancelled
            await events.aclose()  # type: ignore[attr-defined]

    response = _SSEResponse(body(), on_abandon)
    return response
