"""`--api-key`: every endpoint but /health (and /metrics unless `--metrics-require-api-key`) needs
`Authorization: Bearer <key>`.

A plain ASGI middleware (not Starlette's BaseHTTPMiddleware), so streaming responses and
client-disconnect detection pass through it untouched.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from sgl.server.errors import error_response

OPEN_PATHS = frozenset({"/health"})


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str, open_paths: frozenset[str] = OPEN_PATHS) -> None:
        self.app = app
        self._open = open_paths
        self._key = api_key.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self._open:
            await self.app(scope, receive, send)
            return
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode("utf-8"), self._key
        ):
            await self.app(scope, receive, send)
            return
        response = error_response(
            401,
            "missing or invalid API key: send the header 'Authorization: Bearer <key>'",
            type="authentication_error",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await response(scope, receive, send)
