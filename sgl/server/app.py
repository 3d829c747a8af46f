"""`create_app(engine, served_model_name, api_key=None)`: the FastAPI app around an engine.

The app does not own the engine (tests and `sgl.launch_server` share or shut it down
themselves). Handlers call the engine directly: all generation goes through
`engine.async_generate` or a worker thread, so the event loop never blocks on the model,
and the engine does all the runtime work (chat templates, tokenizing, validation, n > 1
and its seeds, aborting abandoned streams). Metrics are fed by the engine's finish events.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from sgl.lang.backends.engine import EngineBackend
from sgl.lang.chat_template import ChatTemplate
from sgl.runtime.tokenizer import tokenizer_directory
from sgl.server import admin, extract, native, openai_api, programs, sessions
from sgl.server.auth import OPEN_PATHS, APIKeyMiddleware
from sgl.server.errors import install_error_handlers
from sgl.server.lifecycle import BodySizeLimitMiddleware, Lifecycle, LifecycleMiddleware
from sgl.server.metrics import Metrics
from sgl.server.request_log import RequestLogMiddleware
from sgl.server.state import ServerState
from sgl.tool_calls import ReasoningParser, detect_parser, get_parser

DESCRIPTION = """Serves an sgl engine: the native `/generate` (the engine's result dicts, as JSON or
server-sent events), OpenAI-compatible `/v1/chat/completions`, `/v1/completions` and `/v1/models`,
JSON-schema extraction at `/v1/extract`, shipped programs at `/run_program`, operations endpoints
(`/health`, `/get_model_info`, `/get_server_info` or `/server_info`, `/flush_cache`,
`/abort_request`, `/metrics`, `/start_profile`, `/stop_profile`), and sessions (`/open_session`,
`/close_session`, `session_params` on `/generate`). Errors have the body
`{"error": {"message", "type", "param", "code"}}`: 400 bad input, 401 no key, 404 unknown
session or model, 413 over a size limit, 429 at capacity and 503 draining or failed (both
with `Retry-After`), 500 an internal error naming an incident id."""

DEFAULT_MAX_REQUEST_BYTES = 32 << 20


def create_app(
    engine: Any,
    served_model_name: str,
    api_key: str | None = None,
    profile_dir: str | None = None,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
    cors_allow_origins: list[str] | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    log_requests: bool = False,
    metrics_require_api_key: bool = False,
) -> FastAPI:
    """The app over `engine`. `tool_call_parser`: the tool-call format (default: the one the
    chat template uses); `reasoning_parser`: split reasoning from answers ("qwen3", ...);
    `cors_allow_origins`: the browser origins answered (none: no CORS headers at all);
    `max_request_bytes`: larger bodies get a 413; `log_requests`: log bodies and responses;
    `metrics_require_api_key`: /metrics needs the API key too (open by default, as vLLM's)."""
    from sgl import __version__

    metrics = Metrics(served_model_name)
    engine.add_finish_listener(metrics.record_event)
    state = ServerState(
        engine=engine,
        served_model_name=served_model_name,
        metrics=metrics,
        chat_template=ChatTemplate.from_hf_tokenizer(engine.tokenizer),
        # a directory a router can load the tokenizer from (SGLang reports a hub id it can fetch)
        model_path=tokenizer_directory(engine.model_info.tokenizer_path)
        or str(engine.config.model_path),
        context_len=int(engine.context_len),
        created=int(time.time()),
        bos_token_id=getattr(engine.tokenizer, "bos_token_id", None),
        extract_backend=EngineBackend(engine),
        profile_dir=profile_dir,
        tool_call_parser=tool_call_parser
        or detect_parser(getattr(engine.tokenizer, "chat_template", None)),
        reasoning_parser=reasoning_parser,
        lifecycle=Lifecycle(engine),
    )
    get_parser(state.tool_call_parser)  # an unknown name fails at start, listing the known ones
    if reasoning_parser is not None:
        ReasoningParser(reasoning_parser)
    app = FastAPI(title="sgl", version=__version__, description=DESCRIPTION)
    app.state.sgl = state
    install_error_handlers(app)
    # Middleware added later runs earlier: CORS, then the key, then refusals while draining or
    # failed, then the body cap, then the request log.
    if log_requests:
        app.add_middleware(RequestLogMiddleware)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_request_bytes)
    app.add_middleware(LifecycleMiddleware, lifecycle=state.lifecycle, metrics=metrics)
    if api_key:
        app.add_middleware(
            APIKeyMiddleware,
            api_key=api_key,
            open_paths=OPEN_PATHS if metrics_require_api_key else OPEN_PATHS | {"/metrics"},
        )
    if cors_allow_origins:  # added last: outermost, so preflights are answered before the key check
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_allow_origins),
            allow_methods=["*"],
            allow_headers=["*"],
        )
    for module in (native, sessions, programs, openai_api, extract, admin):
        app.include_router(module.router)
    return app
