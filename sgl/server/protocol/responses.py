"""What routes declare they answer besides their success body: the error bodies and statuses
(`error_responses`) and server-sent event streams (`sse_responses`).
"""

from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, TypeAdapter


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class SuccessResponse(BaseModel):
    success: bool
    message: str | None = None


# -------------------------------------------------------------------------- declared error statuses

_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "required": True,
        "schema": {"type": "integer", "minimum": 0},
    }
}
ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "Invalid request: malformed JSON, a field of the wrong type, or a value the "
    "engine refuses (`param` names the field).",
    401: "Missing or invalid API key (a server started with --api-key): "
    "send `Authorization: Bearer <key>`.",
    404: "Not found (`param` names what).",
    413: "Too large: the body is over --max-request-bytes, or the request over a size limit "
    "(prompt tokens, max tokens, n, top logprobs).",
    422: "Unprocessable.",
    429: "At capacity (too many requests in flight): retry after `Retry-After` seconds.",
    503: "Draining (shutting down) or the engine failed: retry after `Retry-After` seconds, "
    "on another replica or on this one once restarted.",
}
# What any route may answer whatever it does: the API key check, the body size cap, admission
# (the queue bound) and draining / an engine fault (sgl.server.auth, sgl.server.lifecycle).
COMMON_ERROR_STATUSES = (401, 413, 429, 503)


def error_responses(
    *statuses: int,
    descriptions: dict[int, str] | None = None,
    needs_key: bool = True,
    media_type: str | None = None,
) -> dict[int | str, dict[str, Any]]:
    """A route's `responses=`: the statuses every route may answer (COMMON_ERROR_STATUSES; without
    401 for a route open without the key) plus `statuses`, each an `ErrorResponse` (429 and 503
    with `Retry-After`). `descriptions` replaces the generic text of a status (say what 404 is
    about). `media_type`: the route's own success media type when it is not JSON (errors are
    JSON all the same; FastAPI would otherwise declare them under the route's type)."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in sorted({*COMMON_ERROR_STATUSES, *statuses} - (set() if needs_key else {401})):
        text = (descriptions or {}).get(status, ERROR_DESCRIPTIONS[status])
        entry: dict[str, Any] = {"description": text}
        if media_type is None or media_type == "application/json":
            entry["model"] = ErrorResponse
        else:
            entry["content"] = {
                "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}
            }
        if status in (429, 503):
            entry["headers"] = dict(_RETRY_AFTER)
        out[status] = entry
    return out


def _inline_refs(schema: Any, defs: dict[str, Any]) -> Any:
    """`schema` with every `#/$defs/...` reference replaced by its definition (the models here
    are not recursive), so it stands alone inside the OpenAPI document."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            return {**_inline_refs(defs[ref[len("#/$defs/") :]], defs), **_inline_refs(rest, defs)}
        return {k: _inline_refs(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inline_refs(v, defs) for v in schema]
    return schema


def event_data_schema(*models: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of an SSE event's `data` (one of `models`), with no references."""
    model = Union[tuple(models)] if len(models) > 1 else models[0]  # noqa: UP007 (runtime value)
    schema = TypeAdapter(model).json_schema(mode="serialization")
    return _inline_refs(schema, schema.get("$defs", {}))


def sse_responses(*models: type[BaseModel], description: str) -> dict[int | str, dict[str, Any]]:
    """The `responses=` entry of a route that answers `stream: true` with server-sent events:
    `text/event-stream` beside its JSON, each event's `data` one of `models` as JSON, the last
    one `[DONE]` (OpenAPI 3.2's `itemSchema`: one event; FastAPI declares its own streams so)."""
    item = {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {
                "anyOf": [
                    {"const": "[DONE]", "description": "The last event."},
                    {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": event_data_schema(*models),
                    },
                ]
            },
            "event": {"type": "string"},
            "id": {"type": "string"},
            "retry": {"type": "integer", "minimum": 0},
        },
    }
    return {
        200: {"description": description, "content": {"text/event-stream": {"itemSchema": item}}}
    }
