"""Operations endpoints: health, model and server info, cache flush, abort, metrics."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

import sgl
from sgl.server.encoding import JSONBody
from sgl.server.errors import APIError
from sgl.server.protocol import (
    AbortRequest,
    ErrorResponse,
    HealthResponse,
    ModelInfo,
    SuccessResponse,
)
from sgl.server.state import get_state

router = APIRouter(tags=["operations"])
ERRORS: dict[int | str, dict[str, Any]] = {400: {"model": ErrorResponse}, 401: {"model": ErrorResponse}}


@router.get("/health", response_model=HealthResponse)
async def health() -> JSONBody:
    """The server is up (no API key needed)."""
    return JSONBody({"status": "ok"})


@router.get("/health_generate", response_model=HealthResponse, responses={503: {"model": ErrorResponse}})
async def health_generate(request: Request) -> JSONBody:
    """The engine generates: runs one real token."""
    state = get_state(request)
    try:
        out = await state.engine.async_generate("Hi", {"max_new_tokens": 1, "temperature": 0})
    except Exception as e:
        raise APIError(503, f"the engine failed to generate: {type(e).__name__}: {e}") from e
    if (out["meta_info"].get("finish_reason") or {}).get("type") == "abort":
        raise APIError(503, f"the engine aborted the health request: {out['meta_info']['finish_reason']}")
    return JSONBody({"status": "ok"})


@router.get("/get_model_info", response_model=ModelInfo, responses=ERRORS)
async def get_model_info(request: Request) -> JSONBody:
    """The model, its limits and its chat roles (so remote programs render roles exactly)."""
    state = get_state(request)
    engine = state.engine
    tmpl = state.chat_template
    return JSONBody({
        "model_path": state.model_path,
        "served_model_name": state.served_model_name,
        "is_generation": True,
        "vocab_size": engine.model_config.vocab_size,
        "context_length": engine.context_len,
        "eos_token_ids": list(engine.eos_token_ids),
        "bos_token_id": state.bos_token_id,
        "chat_roles": {"prefix": tmpl.prefix, "suffix": tmpl.suffix, "default_system": tmpl.default_system},
        "supports_sessions": True,
    })


@router.get("/get_server_info", responses=ERRORS)
async def get_server_info(request: Request) -> JSONBody:
    """The engine's configuration and live scheduler numbers (KV pool, queue, counters)."""
    state = get_state(request)
    info = await asyncio.to_thread(state.engine.get_server_info)
    info.update({"served_model_name": state.served_model_name, "version": sgl.__version__})
    return JSONBody(info)


@router.post("/flush_cache", response_model=SuccessResponse, responses=ERRORS)
async def flush_cache(request: Request) -> JSONBody:
    """Drop the radix cache. `success` is false while requests are in flight."""
    ok = await asyncio.to_thread(get_state(request).engine.flush_cache)
    return JSONBody({"success": bool(ok), "message": None if ok else "requests are in flight; try again when idle"})


@router.post("/abort_request", response_model=SuccessResponse, responses=ERRORS)
async def abort_request(req: AbortRequest, request: Request) -> JSONBody:
    """Abort a request by rid; it finishes with finish_reason type 'abort' and frees its KV."""
    get_state(request).engine.abort(req.rid)
    return JSONBody({"success": True, "message": None})


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> PlainTextResponse:
    """Prometheus text format; names prefixed `sgl:` after SGLang's."""
    state = get_state(request)
    info = await asyncio.to_thread(state.engine.get_server_info)
    return PlainTextResponse(state.metrics.render(info), media_type="text/plain; version=0.0.4; charset=utf-8")
