"""`--log-requests`: each request's body and its response, truncated, in the log.

Off by default: prompts and outputs are the users' data, so the server logs neither unless
asked (the access log names only the method, path and status)."""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("sgl.server.requests")


class RequestLogMiddleware:
    def __init__(self, app: ASGIApp, max_chars: int = 2048) -> None:
        self.app = app
        self.max_chars = max_chars

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = bytearray()
        out = bytearray()
        status = [0]

        async def logged_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request" and len(body) < self.max_chars:
                body.extend(message.get("body", b"")[: self.max_chars - len(body)])
            return message

        async def logged_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body" and len(out) < self.max_chars:
                out.extend(message.get("body", b"")[: self.max_chars - len(out)])
            await send(message)

        try:
            await self.app(scope, logged_receive, logged_send)
        finally:
            logger.info(
                "%s %s -> %s\n  request: %s\n  response: %s",
                scope.get("method"),
                scope.get("path"),
                status[0],
                body.decode("utf-8", "replace"),
                out.decode("utf-8", "replace"),
            )
