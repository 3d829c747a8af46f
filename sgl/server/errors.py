"""Every error leaves the server as an OpenAI-style body:
`{"error": {"message", "type", "param", "code"}}`, whatever raised it.

Bad input is a 4xx (pydantic validation and malformed JSON become 400, not FastAPI's
default 422 shape; the engine's `InvalidRequestError` and its kinds carry their status: 400,
404, 413, 429 or 503, the last two with `Retry-After`); anything else is a 500 naming an
incident id. Handlers only build responses, so the server goes on serving.
"""

from __future__ import annotations

import difflib
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from sgl.runtime.errors import InvalidRequestError, new_incident_id
from sgl.server.encoding import JSONBody

logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "unprocessable_entity_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """Raised by handlers for a client-visible error with a given status."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type
        self.headers = headers


def error_body(
    status: int, message: str, param: str | None = None, type: str | None = None
) -> dict[str, Any]:
    kind = type or _TYPES.get(
        status, "invalid_request_error" if status < 500 else "internal_server_error"
    )
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def _logged_incident(exc: BaseException) -> str | None:
    """The incident id an error already carries (an engine fault is logged where it happens)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(getattr(cur, "incident", None), str):
            return cur.incident  # type: ignore[union-attr]
        cur = cur.__cause__ or cur.__context__
    return None


def internal_error_body(exc: BaseException, where: str) -> dict[str, Any]:
    """A 500's body: an incident id, and nothing of the exception itself (its message may hold
    paths or data); the log has the traceback under the same id."""
    incident = _logged_incident(exc)
    if incident is None:
        incident = new_incident_id()
        logger.error("incident %s: internal error in %s", incident, where, exc_info=exc)
    else:
        logger.error(
            "incident %s: %s failed (the traceback is logged under the incident)", incident, where
        )
    return error_body(
        500, f"internal server error (incident {incident}; the server's log has the details)"
    )


def refusal_headers(e: InvalidRequestError) -> dict[str, str] | None:
    """`Retry-After` on the refusals worth retrying (429 overloaded, 503 unavailable)."""
    retry_after = getattr(e, "retry_after", None)
    return {"Retry-After": str(retry_after)} if retry_after is not None else None


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    type: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONBody:
    return JSONBody(error_body(status, message, param, type), status_code=status, headers=headers)


def from_invalid_request(e: InvalidRequestError, rename: dict[str, str] | None = None) -> APIError:
    """The engine's error as a 400; `rename` maps engine field names to the API's."""
    param = e.param if not rename or e.param not in rename else rename[e.param]
    return APIError(e.status, e.message, param, headers=refusal_headers(e))


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none", "bytes"})


def _field_path(loc: tuple[Any, ...]) -> str:
    """`("body", "text", "list[str]", 0)` -> "text.0": drops "body" and the union-branch tags
    pydantic puts in locations (type names such as "str", "list[int]", "ContentPart")."""
    parts = []
    for x in loc:
        if x == "body":
            continue
        if isinstance(x, str) and (x in _TYPE_TAGS or "[" in x or x[:1].isupper()):
            continue
        parts.append(str(x))
    return ".".join(parts)


def _validation_message(errors: list[dict[str, Any]], known: Any = ()) -> tuple[str, str | None]:
    """One readable line for pydantic's error list, and the first bad field as `param`.
    Errors of the branches of one union field are merged ("... or ..."); an unknown top-level
    field close to one of `known` (the body's field names) gets a "did you mean"."""
    by_field: dict[str, list[str]] = {}
    for err in errors:
        kind = err.get("type", "")
        loc = tuple(err.get("loc", ()))
        if kind == "json_invalid":
            detail = (err.get("ctx") or {}).get("error", "")
            return f"malformed JSON in the request body{': ' + str(detail) if detail else ''}", None
        field = _field_path(loc)
        if not field and kind == "missing":
            return "the request body is missing: send a JSON object", None
        if not field and kind in ("model_attributes_type", "dict_type", "model_type"):
            return (
                "the request body must be a JSON object (sent with Content-Type: application/json)",
                None,
            )
        msg = (
            _unknown_field(field, known) if kind == "extra_forbidden" else err.get("msg", "invalid")
        )
        msgs = by_field.setdefault(field, [])
        if msg not in msgs:
            msgs.append(msg)
    parts = [
        f"{f}: {' or '.join(m)}" if f else " or ".join(m) for f, m in list(by_field.items())[:5]
    ]
    param = next((f for f in by_field if f), None)
    return "; ".join(parts) or "invalid request", param


def _unknown_field(field: str, known: Any) -> str:
    close = (
        difflib.get_close_matches(field, list(known), n=1, cutoff=0.75) if "." not in field else []
    )
    return (
        f"unknown field (not part of this API); did you mean {close[0]!r}?"
        if close
        else "unknown field (not part of this API)"
    )


def _body_fields(request: Request) -> list[str]:
    """The top-level field names of the route's body model (none where it has no model)."""
    body = getattr(request.scope.get("route"), "body_field", None)
    model = getattr(getattr(body, "field_info", None), "annotation", None)
    fields = getattr(model, "model_fields", None) or {}
    return [f.alias or name for name, f in fields.items()]


def install_error_handlers(app: FastAPI) -> None:
    _declare_validation_as_400(app)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONBody:
        return error_response(exc.status, exc.message, exc.param, exc.type, exc.headers)

    @app.exception_handler(InvalidRequestError)
    async def _invalid(request: Request, exc: InvalidRequestError) -> JSONBody:
        return error_response(exc.status, exc.message, exc.param, headers=refusal_headers(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONBody:
        message, param = _validation_message(list(exc.errors()), _body_fields(request))
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONBody:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {request.method} {request.url.path}"
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONBody:
        return JSONBody(
            internal_error_body(exc, f"{request.method} {request.url.path}"), status_code=500
        )


def _declare_validation_as_400(app: FastAPI) -> None:
    """FastAPI declares a 422 `HTTPValidationError` on every route with parameters, but a body
    that fails validation is answered 400 here (the routes declare 400 themselves): drop those
    422 declarations from /openapi.json so clients and fuzzers read what the server does. A
    route's own 422 (/v1/extract: output cut short) has the `ErrorResponse` schema and stays."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        fresh = app.openapi_schema is None
        schema = build()
        if fresh:
            for operations in schema.get("paths", {}).values():
                for op in operations.values():
                    declared = op.get("responses", {}).get("422", {})
                    if "HTTPValidationError" in repr(declared):
                        del op["responses"]["422"]
            components = schema.get("components", {}).get("schemas", {})
            if "HTTPValidationError" not in repr(schema.get("paths")):
                components.pop("HTTPValidationError", None)
                components.pop("ValidationError", None)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
