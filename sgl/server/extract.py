"""`POST /v1/extract`: JSON-schema extraction, run as an sgl program on the server's engine.

The program is an ordinary `@function` (system instructions with the schema, the user's
text or conversation, and one `gen` constrained by the schema), executed through the
in-process `EngineBackend`, so the endpoint is exactly what a user's program would do. A
client that disconnects stops the program (see `_CancellableBackend`): no generation starts
after that, and the running one is aborted, which frees its KV.
Constrained decoding guarantees the output parses and matches the schema unless it was
cut by the token limit, which is answered with 422.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sgl.lang import assistant, function, gen, system, user
from sgl.lang.backends.engine import EngineBackend
from sgl.lang.interpreter import ProgramError
from sgl.runtime.errors import InvalidRequestError
from sgl.server.encoding import JSONBody
from sgl.server.errors import APIError, from_invalid_request
from sgl.server.lifecycle import DRAIN_RETRY_AFTER_S
from sgl.server.openai_api import chat_messages
from sgl.server.openai_tools import history_as_text
from sgl.server.protocol import ExtractRequest, ExtractResponse, error_responses
from sgl.server.state import ServerState, get_state
from sgl.server.streaming import client_gone, until_disconnected

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["extraction"])

DEFAULT_INSTRUCTIONS = (
    "You extract information from the user's input. "
    "Reply with JSON only, using only facts stated in the input."
)
DEFAULT_MAX_TOKENS = 512
_ROLES = {"system": system, "developer": system, "user": user, "assistant": assistant, "tool": user}
_RENAME = {"json_schema": "schema", "max_new_tokens": "max_tokens", "prompt": "text"}


@function
def extraction_program(
    s,
    instructions: str,
    schema_text: str,
    messages: list[dict[str, str]],
    limit: int,
    temp: float,
    sample_seed: int | None,
):
    # (`temperature`, `max_new_tokens`, ... are run()'s own keywords: the parameters avoid them.)
    s += system(f"{instructions}\nThe JSON must follow this JSON schema:\n{schema_text}")
    for m in messages:
        s += _ROLES[m["role"]](m["content"])
    s += assistant(
        gen("data", json_schema=schema_text, max_tokens=limit, temperature=temp, seed=sample_seed)
    )


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
    """The extraction program's backend for one request. `cancel()` (the client left) stops
    the program: no generation starts after it, and what is already in the engine is
    aborted, which frees its KV.

    A generation checks for cancellation, then submits (its constraint compiles in the
    scheduler, where an abort also reaches a request still compiling). `cancel()` aborts the
    generations submitted so far by id and closes the program's sessions, which aborts their
    turns in the engine and makes the scheduler reject a turn submitted after the close;
    either way nothing a cancelled program submitted runs to its end."""

    def __init__(self, shared: EngineBackend) -> None:
        super().__init__(shared.engine)
        self._template = shared.chat_template()
        self._sessions: list[str] = []
        self._inflight: set[str] = set()  # rids of generations submitted and not yet returned
        self._cancelled = False
        self._cancel_lock = threading.Lock()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

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

    def generate(
        self,
        text: str,
        sampling: dict[str, Any],
        logprobs: dict[str, Any],
        session: str | None = None,
    ) -> tuple[str, dict[str, Any]]:
        rid = uuid.uuid4().hex
        with self._cancel_lock:  # cancel() either sees this rid, or this sees the cancellation
            if self._cancelled:
                raise _Cancelled()
            self._inflight.add(rid)
        try:
            out = self.engine.generate(
                text,
                sampling,
                rid=rid,
                session_params={"id": session} if session is not None else None,
                **logprobs,
            )
        finally:
            with self._cancel_lock:
                self._inflight.discard(rid)
        if self._cancelled:  # aborted by the cancellation: its partial text is no result
            raise _Cancelled()
        return out["text"], out["meta_info"]

    def generate_stream(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("extraction programs are not streamed")

    def shutdown(self) -> None:
        pass  # the engine is the server's, not this request's

    def cancel(self, wait: bool = True) -> None:
        """Stop the program. `wait=False` (on the event loop) closes its sessions on a
        thread instead of waiting for the scheduler's answer; nothing can start meanwhile."""
        with self._cancel_lock:
            self._cancelled = True
            sessions, self._sessions = self._sessions, []
            rids = list(self._inflight)
        for rid in rids:
            self.engine.abort(rid)  # a message: does not wait
        if not sessions:
            return
        if wait:
            self._close(sessions)
        else:
            threading.Thread(
                target=self._close, args=(sessions,), name="sgl-extract-cancel", daemon=True
            ).start()

    def _close(self, sessions: list[str]) -> None:
        for sid in sessions:
            try:
                self.engine.close_session(sid)
            except Exception:  # the engine is shutting down: the session goes with it
                logger.warning(
                    "could not close session %s of a cancelled extraction", sid, exc_info=True
                )


class _Cancelled(RuntimeError):
    """The client disconnected: the extraction stops."""


def _run(
    state: ServerState, req: ExtractRequest, messages: list[dict[str, str]], backend: EngineBackend
) -> tuple[str, dict[str, Any]]:
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
        if isinstance(backend, _CancellableBackend) and backend.cancelled:
            raise _Cancelled() from e  # whatever it failed with, it failed because the client left
        cause = _invalid_cause(e)
        if cause is not None:
            raise from_invalid_request(
                cause, {**_RENAME, "prompt": "messages" if req.text is None else "text"}
            ) from e
        raise
    return prog["data"], prog.get_meta_info("data")


@router.post(
    "/extract",
    response_model=ExtractResponse,
    responses=error_responses(
        400,
        404,
        422,
        descriptions={
            404: "`model` names a model this server does not serve.",
            422: "The output was cut by max_tokens before the JSON was complete.",
        },
    ),
)
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
        # tool calls and results as text in the turns (the extraction reads them too)
        messages = history_as_text(chat_messages(req.messages), None, state.tool_call_parser)
    backend = _CancellableBackend(state.extract_backend)
    out = None
    try:
        out = await until_disconnected(
            request, asyncio.to_thread(_run, state, req, messages, backend)
        )
    finally:
        if (
            out is None
        ):  # the client left (or this handler was cancelled): stop the program, free its KV
            backend.cancel(wait=False)
    if out is None:
        return client_gone()
    text, meta = out
    reason = meta.get("finish_reason") or {}
    if reason.get("type") == "length":
        raise APIError(
            422,
            f"the output was cut by the token limit (max_tokens={reason.get('length')}) before the "
            "JSON was complete; raise max_tokens or ask for less",
            "max_tokens",
        )
    if reason.get("type") == "abort":
        raise APIError(
            503,
            f"the extraction was aborted: {reason.get('message')}",
            headers={"Retry-After": str(DRAIN_RETRY_AFTER_S)},
        )
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:  # constrained decoding should make this impossible
        raise APIError(500, f"the model's output is not valid JSON ({e}): {text[:200]!r}") from e
    prompt, completion = meta.get("prompt_tokens", 0), meta.get("completion_tokens", 0)
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": meta.get("cached_tokens", 0)},
    }
    return JSONBody({"data": data, "usage": usage})
