"""Sessions: `POST /open_session` and `POST /close_session` (SGLang's endpoints).

A session keeps a client's turns and pins their KV in the radix cache, so a turn sent
to `/generate` with `session_params: {"id", "rid"}` carries only its new input and
recomputes nothing of the history, even under memory pressure. See sgl.runtime.session.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from sgl.server.encoding import JSONBody
from sgl.server.errors import APIError
from sgl.server.protocol import (
    CloseSessionReqInput,
    OpenSessionReqInput,
    SuccessResponse,
    error_responses,
)
from sgl.server.state import get_state

router = APIRouter(tags=["sessions"])


@router.post("/open_session", response_model=str, responses=error_responses(400))
async def open_session(req: OpenSessionReqInput, request: Request) -> JSONBody:
    """Open a session; the body is its id (a JSON string), as SGLang returns it."""
    engine = get_state(request).engine
    return JSONBody(
        await engine.async_open_session(req.capacity_tokens, req.session_id, req.timeout)
    )


@router.post(
    "/close_session",
    response_model=SuccessResponse,
    responses=error_responses(
        400, 404, descriptions={404: "No such session is open (closed or timed out)."}
    ),
)
async def close_session(req: CloseSessionReqInput, request: Request) -> JSONBody:
    """Close a session and unpin its KV. 404 if it is not open (closed or timed out)."""
    if not await get_state(request).engine.async_close_session(req.session_id):
        raise APIError(
            404, f"no open session {req.session_id!r} (closed or timed out)", "session_id"
        )
    return JSONBody({"success": True})
