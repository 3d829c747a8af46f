"""`POST /v1/extract`: JSON-schema extraction, run as an sgl program on the server's engine.

The program is an ordinary `@function` (system instructions with the schema, the user's
text or conversation, and one `gen` constrained by the schema), executed through the
in-process `EngineBackend`, so the endpoint is exactly what a user's program would do. A
client that disconnects stops the program: its session is closed, which aborts the
generation and frees its KV.
Constrained decoding guarantees the output parses and matches the schema unless it was
cut by the token limit, which is answered with 422.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sgl.lang import assistant, function, gen, system, user
from sgl.lang.backends.engine import EngineBackend
from sgl.lang.interpreter import ProgramError
from sgl.runtime.errors import InvalidRequestError
from sgl.server.encoding import JSONBody
from sgl.server.errors import APIError, from_invalid_request
from sgl.server.protocol import ErrorResponse, ExtractRequest, ExtractResponse
from sgl.server.state import ServerState, get_state
from sgl.server.streaming import client_gone, until_disconnected

router = APIRouter(prefix="/v1", tags=["extraction"])

DEFAULT_INSTRUCTIONS = (
    "You extract information from the user's input. Reply with JSON only, using only facts stated in the input."
)
DEFAULT_MAX_TOKENS = 512
_ROLES = {"system": system, "developer": system, "user": user, "assistant": assistant, "tool": user}
_RENAME = {"json_schema": "schema", "max_new_tokens": "max_tokens", "prompt": "text"}


@function
def extraction_program(s, instructions: str, schema_text: str, messages: list[dict[str, str]], limit: int,
                       temp: float, sample_seed: int | None):
    # (`temperature`, `max_new_tokens`, ... are run()'s own keywords: the parameters avoid them.)
    s += system(f"{instructions}\nThe JSON must follow this JSON schema:\n{schema_text}")
    for m in messages:
        s += _ROLES[m["role"]](m["content"])
    s += assistant(gen("data", json_schema=schema_text, max_tokens=limit, temperature=temp, seed=sample_seed))


def _invalid_cause(exc: BaseException) -> InvalidRequestError | None:
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 10:
        if isinstance(cur, InvalidRequestError):
            return cur
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return None


class _CancellableBackend(EngineBackend):
    """The extraction program's backend for one request: it remembers the sessions the
    program opens, so `cancel()` (the client left) closes them, which aborts the program's
    generation in the engine and frees its KV; later calls fail at once."""

    def __init__(self, shared: EngineBackend) -> None:
        super().__init__(shared.engine)
        self._template = shared.chat_template()
        self._sessions: list[str] = []
        self._cancelled = False
        self._cancel_lock = threading.Lock()

    def open_session(self) -> str | None:
        sid = super().open_session()
        with self._cancel_lock:
            cancelled = self._cancelled
            if sid is not None and not cancelled:
                self._sessions.append(sid)
        if cancelled:
            if sid is not None:
                self.engine.close_session(sid)
            raise _Cancelled()
        return sid

    def generate(self, *args: Any, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        if self._cancelled:
            raise _Cancelled()
        return super().generate(*args, **kwargs)

    def shutdown(self) -> None:
        pass  # the engine is the server's, not this request's

    def cancel(self) -> None:
        with self._cancel_lock:
            self._cancelled = True
            sessions, self._sessions = self._sessions, []
        for sid in sessions:
            self.engine.close_session(sid)


class _Cancelled(RuntimeError):
    """The client disconnected: the extraction stops."""


def _run(state: ServerState, req: ExtractRequest, messages: list[dict[str, str]],
         backend: EngineBackend) -> tuple[str, dict[str, Any]]:
    max_tokens = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
    try:  # run() waits for a non-streamed program and raises ProgramError if it failed
        prog = extraction_program.run(
            instructions=req.instructions or DEFAULT_INSTRUCTIONS,
            schema_text=json.dumps(req.schema_),
            messages=messages,
            limit=max_tokens,
            temp=0.0 if req.temperature is None else req.temperature,
            sample_seed=req.seed,
            backend=backend,
        )
        prog.sync()
    except ProgramError as e:
        cause = _invalid_cause(e)
        if cause is not None:
            raise from_invalid_request(cause, {**_RENAME, "prompt": "messages" if req.text is None else "text"}) from e
        raise
    return prog["data"], prog.get_meta_info("data")


@router.post("/extract", response_model=ExtractResponse,
             responses={400: {"model": ErrorResponse}, 401: {"model": ErrorResponse}, 422: {"model": ErrorResponse}})
async def extract(req: ExtractRequest, request: Request) -> Response:
    """Extract a JSON value matching `schema` from `text` (or `messages`)."""
    state = get_state(request)
    state.check_model(req.model)
    if (req.text is None) == (req.messages is None):
        raise APIError(400, "give exactly one of text and messages", "text")
    if req.text is not None:
        messages = [{"role": "user", "content": req.text}]
    else:
        if not req.messages:
            raise APIError(400, "messages is empty", "messages")
        messages = [{"role": m.role, "content": m.content if isinstance(m.content, str)
                     else "\n".join(p.text for p in m.content or [])} for m in req.messages]
    backend = _CancellableBackend(state.extract_backend)
    out = None
    try:
        out = await until_disconnected(request, asyncio.to_thread(_run, state, req, messages, backend))
    finally:
        if out is None:  # the client left (or this handler was cancelled): stop the program, free its KV
            backend.cancel()
    if out is None:
        return client_gone()
    text, meta = out
    reason = meta.get("finish_reason") or {}
    if reason.get("type") == "length":
        raise APIError(422, f"the output was cut by the token limit (max_tokens={reason.get('length')}) before the "
                       "JSON was complete; raise max_tokens or ask for less", "max_tokens")
    if reason.get("type") == "abort":
        raise APIError(503, f"the extraction was aborted: {reason.get('message')}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:  # constrained decoding should make this impossible
        raise APIError(500, f"the model's output is not valid JSON ({e}): {text[:200]!r}") from e
    prompt, completion = meta.get("prompt_tokens", 0), meta.get("completion_tokens", 0)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
             "prompt_tokens_details": {"cached_tokens": meta.get("cached_tokens", 0)}}
    return JSONBody({"data": data, "usage": usage})
