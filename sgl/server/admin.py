"""Operations endpoints: health, model and server info, cache flush, abort, metrics."""

from __future__ import annotations

import asyncio
import os

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

import sgl
from sgl.runtime.errors import InvalidRequestError
from sgl.server.encoding import JSONBody
from sgl.server.errors import APIError, internal_error_body
from sgl.server.lifecycle import DRAIN_RETRY_AFTER_S
from sgl.server.protocol import (
    AbortRequest,
    HealthResponse,
    LoadReport,
    ModelInfo,
    ProfileReqInput,
    ServerInfo,
    SuccessResponse,
    error_responses,
)
from sgl.server.state import get_state

router = APIRouter(tags=["operations"])


@router.get("/health", response_model=HealthResponse, responses=error_responses(needs_key=False))
async def health(request: Request) -> JSONBody:
    """200 while the server takes requests; 503 once it drains (SIGTERM) or its engine failed
    (the message names the incident), so load balancers and supervisors stop sending and
    restart it. No API key needed."""
    why = get_state(request).lifecycle.refusal()
    if why is not None:
        raise APIError(503, why, headers={"Retry-After": str(DRAIN_RETRY_AFTER_S)})
    return JSONBody({"status": "ok"})


@router.get(
    "/health_generate",
    response_model=HealthResponse,
    responses=error_responses(
        descriptions={
            503: "The engine failed to generate, or the server drains: retry after "
            "`Retry-After` seconds."
        }
    ),
)
async def health_generate(request: Request) -> JSONBody:
    """The engine generates: runs one real token."""
    state = get_state(request)
    try:
        out = await state.engine.async_generate("Hi", {"max_new_tokens": 1, "temperature": 0})
    except InvalidRequestError as e:  # at capacity, or failed: its own message
        raise APIError(
            503,
            f"the engine cannot generate now: {e.message}",
            headers={"Retry-After": str(DRAIN_RETRY_AFTER_S)},
        ) from e
    except Exception as e:  # the log has it under an incident id; the body never has its text
        raise APIError(
            503,
            internal_error_body(e, "/health_generate")["error"]["message"],
            headers={"Retry-After": str(DRAIN_RETRY_AFTER_S)},
        ) from e
    if (out["meta_info"].get("finish_reason") or {}).get("type") == "abort":
        raise APIError(
            503,
            f"the engine aborted the health request: {out['meta_info']['finish_reason']}",
            headers={"Retry-After": str(DRAIN_RETRY_AFTER_S)},
        )
    return JSONBody({"status": "ok"})


@router.get("/get_model_info", response_model=ModelInfo, responses=error_responses())
@router.get("/model_info", response_model=ModelInfo, responses=error_responses())
async def get_model_info(request: Request) -> JSONBody:
    """The model, its limits and its chat roles (so remote programs render roles exactly);
    `/model_info` is SGLang's current name for it. `model_path` and `tokenizer_path` are a local
    directory a router or client can load the tokenizer from (for a GGUF file, its converted
    tokenizer's files; the file itself is `/get_server_info`'s `resolved_model_path`)."""
    state = get_state(request)
    engine = state.engine
    tmpl = state.chat_template
    return JSONBody(
        {
            "model_path": state.model_path,
            "tokenizer_path": state.model_path,
            "served_model_name": state.served_model_name,
            "is_generation": True,
            "vocab_size": engine.model_config.vocab_size,
            "context_length": engine.context_len,
            "eos_token_ids": list(engine.eos_token_ids),
            "bos_token_id": state.bos_token_id,
            "chat_roles": {
                "prefix": tmpl.prefix,
                "suffix": tmpl.suffix,
                "default_system": tmpl.default_system,
            },
            "supports_sessions": True,
        }
    )


@router.get("/get_server_info", response_model=ServerInfo, responses=error_responses())
@router.get("/server_info", response_model=ServerInfo, responses=error_responses())
async def get_server_info(request: Request) -> JSONBody:
    """The engine's configuration and live scheduler numbers (KV pool, queue, counters);
    `/server_info` is SGLang's current name for it."""
    state = get_state(request)
    info = await asyncio.to_thread(state.engine.get_server_info)
    info.update(
        {
            "model_path": state.model_path,
            "tokenizer_path": state.model_path,
            "served_model_name": state.served_model_name,
            "version": sgl.__version__,
            "pid": os.getpid(),
        }
    )
    return JSONBody(info)


@router.get("/get_load", response_model=list[LoadReport], responses=error_responses())
async def get_load(request: Request) -> JSONBody:
    """The engine's load, one entry per data-parallel rank as SGLang reports it (sgl: one):
    requests running and waiting, and their tokens. The sglang-router polls it to balance."""
    info = await asyncio.to_thread(get_state(request).engine.get_server_info)
    running, waiting = info["num_running_reqs"], info["num_waiting_reqs"]
    return JSONBody(
        [
            {
                "dp_rank": 0,
                "num_reqs": running + waiting,
                "num_waiting_reqs": waiting,
                "num_tokens": info["num_load_tokens"],
            }
        ]
    )


@router.post("/flush_cache", response_model=SuccessResponse, responses=error_responses())
async def flush_cache(request: Request) -> JSONBody:
    """Drop the radix cache. `success` is false while requests are in flight."""
    ok = await asyncio.to_thread(get_state(request).engine.flush_cache)
    return JSONBody(
        {
            "success": bool(ok),
            "message": None if ok else "requests are in flight; try again when idle",
        }
    )


@router.post("/abort_request", response_model=SuccessResponse, responses=error_responses(400))
async def abort_request(req: AbortRequest, request: Request) -> JSONBody:
    """Abort a request by rid; it finishes with finish_reason type 'abort' and frees its KV."""
    get_state(request).engine.abort(req.rid)
    return JSONBody({"success": True, "message": None})


@router.get(
    "/metrics", response_class=PlainTextResponse, responses=error_responses(media_type="text/plain")
)
async def metrics(request: Request) -> PlainTextResponse:
    """Prometheus text format; names prefixed `sgl:` after SGLang's."""
    state = get_state(request)
    info = await asyncio.to_thread(state.engine.get_server_info)
    return PlainTextResponse(
        state.metrics.render(info), media_type="text/plain; version=0.0.4; charset=utf-8"
    )


@router.post("/start_profile", response_model=SuccessResponse, responses=error_responses(400))
@router.get("/start_profile", include_in_schema=False)  # SGLang answers GET too
async def start_profile(request: Request, req: ProfileReqInput | None = None) -> JSONBody:
    """Record the engine's forward steps with the torch profiler until /stop_profile (or
    `num_steps`). Traces go under the server's --profile-dir (`output_dir`: a subdirectory
    of it); 400 when the server runs without one."""
    state = get_state(request)
    if state.profile_dir is None:
        raise APIError(
            400,
            "profiling is not enabled: start the server with --profile-dir DIR "
            "(or $SGL_TORCH_PROFILER_DIR)",
            "output_dir",
        )
    req = req or ProfileReqInput()
    where = _profile_subdir(state.profile_dir, req.output_dir)
    try:
        await asyncio.to_thread(
            state.engine.start_profile,
            where,
            req.num_steps,
            req.activities,
            req.record_shapes,
            req.with_stack,
        )
    except InvalidRequestError as e:
        raise APIError(400, e.message, e.param) from e
    return JSONBody({"success": True, "message": f"profiling; traces go to {where}"})


@router.post("/stop_profile", response_model=SuccessResponse, responses=error_responses(400))
@router.get("/stop_profile", include_in_schema=False)  # SGLang answers GET too
async def stop_profile(request: Request) -> JSONBody:
    """End the profile started by /start_profile; the message names the trace file."""
    state = get_state(request)
    if state.profile_dir is None:
        raise APIError(400, "profiling is not enabled: start the server with --profile-dir DIR")
    try:
        path = await asyncio.to_thread(state.engine.stop_profile)
    except InvalidRequestError as e:
        raise APIError(400, e.message, e.param) from e
    return JSONBody({"success": True, "message": f"trace written to {path}"})


def _profile_subdir(root: str, sub: str | None) -> str:
    """`sub` under `root`, refusing anything that would leave it (clients never pick where the
    server writes)."""
    if not sub:
        return root
    base = os.path.realpath(root)
    where = os.path.realpath(os.path.join(base, sub))
    if os.path.commonpath([base, where]) != base:
        raise APIError(
            400,
            f"output_dir {sub!r} must be a subdirectory of the server's profile directory",
            "output_dir",
        )
    return where
