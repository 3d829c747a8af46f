"""`POST /v1/extract`: JSON-schema extraction, run as an sgl program on the server's engine.

The program is an ordinary `@function` (system instructions with the schema, the user's
text or conversation, and one `gen` constrained by the schema), executed through the
in-process `EngineBackend`, so the endpoint is exactly what a user's program would do.
Constrained decoding guarantees the output parses and matches the schema unless it was
cut by the token limit, which is answered with 422.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Request

from sgl.lang import assistant, function, gen, system, user
from sgl.lang.interpreter import ProgramError
from sgl.runtime.errors import InvalidRequestError
from sgl.server.encoding import JSONBody
from sgl.server.errors import APIError, from_invalid_request
from sgl.server.protocol import ErrorResponse, ExtractRequest, ExtractResponse
from sgl.server.state import ServerState, get_state

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


def _run(state: ServerState, req: ExtractRequest, messages: list[dict[str, str]]) -> tuple[str, dict[str, Any]]:
    max_tokens = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
    try:  # run() waits for a non-streamed program and raises ProgramError if it failed
        prog = extraction_program.run(
            instructions=req.instructions or DEFAULT_INSTRUCTIONS,
            schema_text=json.dumps(req.schema_),
            messages=messages,
            limit=max_tokens,
            temp=0.0 if req.temperature is None else req.temperature,
            sample_seed=req.seed,
            backend=state.extract_backend,
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
async def extract(req: ExtractRequest, request: Request) -> JSONBody:
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
    text, meta = await asyncio.to_thread(_run, state, req, messages)
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
