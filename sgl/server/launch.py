"""`python -m sgl.launch_server`: load an engine and serve it with uvicorn.

Engine options are the `EngineConfig` fields as `--kebab-case` flags (`engine_flags`).
SIGTERM (or Ctrl-C) starts a drain: `/health` and new requests get 503, in-flight requests
finish for up to `--graceful-shutdown-timeout` seconds (streams still open then are
cancelled, which aborts their requests), then uvicorn stops, the engine shuts down and the
process exits 0. A second signal stops at once. An engine fault (an exception in the scheduler loop)
drains the same way and exits 1, so a supervisor restarts a fresh process instead of a dead
engine being served.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from sgl.server.app import DEFAULT_MAX_REQUEST_BYTES, create_app
from sgl.server.data_parallel import ROUTER_POLICIES
from sgl.server.engine_flags import add_engine_flags, engine_kwargs
from sgl.server.launch_compat import (
    add_compat_flags,
    check_kv_cache_dtype,
    config_argv,
    read_chat_template,
    use_chat_template,
)
from sgl.server.lifecycle import Lifecycle
from sgl.tool_calls.reasoning import reasoning_parser_names
from sgl.tool_calls.registry import parser_names as tool_call_parser_names

logger = logging.getLogger("sgl.server")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sgl.launch_server", description="Serve an sgl engine over HTTP."
    )
    add_engine_flags(p)
    server = p.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=30000)
    server.add_argument(
        "--api-key",
        default=os.environ.get("SGL_API_KEY"),
        help="require 'Authorization: Bearer <key>' on every endpoint but /health "
        "(default: $SGL_API_KEY; a key on the command line shows in `ps`: prefer "
        "the variable or --api-key-file)",
    )
    server.add_argument(
        "--api-key-file",
        default=os.environ.get("SGL_API_KEY_FILE"),
        help="read the API key from this file (default: $SGL_API_KEY_FILE)",
    )
    server.add_argument(
        "--cors-allow-origins",
        nargs="+",
        default=None,
        metavar="ORIGIN",
        help="answer browsers from these origins ('*' for any); default: no CORS headers",
    )
    server.add_argument(
        "--served-model-name",
        default=None,
        help="the model name clients use (default: the model file or directory name)",
    )
    server.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"]
    )
    server.add_argument(
        "--graceful-shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests get to finish on SIGTERM",
    )
    server.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help="largest request body taken (a 413 past it)",
    )
    server.add_argument(
        "--log-requests",
        action="store_true",
        help="log each request's body and response (prompts and outputs; off by default)",
    )
    server.add_argument(
        "--profile-dir",
        default=os.environ.get("SGL_TORCH_PROFILER_DIR"),
        help="enable /start_profile and /stop_profile; torch profiler traces are written "
        "under this directory (default: $SGL_TORCH_PROFILER_DIR; unset: profiling off)",
    )
    tool_call_parsers, reasoning_parsers = tool_call_parser_names(), reasoning_parser_names()
    server.add_argument(
        "--tool-call-parser",
        default=None,
        type=parser_name("--tool-call-parser", tool_call_parsers),
        help="the format of tool calls in the model's output: "
        + _names(tool_call_parsers)
        + " (default: the one its chat template uses; hermes when it names none)",
    )
    server.add_argument(
        "--dp-size",
        "--data-parallel-size",
        type=int,
        default=1,
        help="data parallelism: this many workers (each its share of the CPUs, or its own CUDA "
        "device) behind the sglang-router on --host/--port (pip install 'sgl[router]')",
    )
    server.add_argument(
        "--router-policy",
        default="cache_aware",
        choices=list(ROUTER_POLICIES),
        help="with --dp-size: the router's policy (cache_aware: the worker holding the longest "
        "prefix of the request, unless the loads drift apart)",
    )
    server.add_argument(
        "--router-balance-abs-threshold",
        type=int,
        default=2,
        help="with --dp-size: requests in flight one worker may have beyond another before the "
        "router balances by load instead of by prefix (the router's own default, 64, keeps "
        "CPU workers idle while one queues)",
    )
    server.add_argument(
        "--reasoning-parser",
        default=None,
        type=parser_name("--reasoning-parser", reasoning_parsers),
        help="split the model's <think> reasoning into reasoning_content: "
        + _names(reasoning_parsers),
    )
    server.add_argument(
        "--enable-metrics",
        action="store_true",
        help="accepted for SGLang command lines: /metrics is always on here",
    )
    server.add_argument(
        "--metrics-require-api-key",
        action="store_true",
        help="with an API key: /metrics needs it too (default: /metrics is open, as vLLM's is)",
    )
    add_compat_flags(p)
    return p


def _names(table: dict[str, str]) -> str:
    return ", ".join(k if k == v else f"{k} (= {v})" for k, v in table.items())


def parser_name(flag: str, table: dict[str, str]) -> Callable[[str], str]:
    """An argparse type: our parser name for `name` (ours or SGLang's alias of the same format)."""

    def convert(name: str) -> str:
        if name not in table:
            raise argparse.ArgumentTypeError(
                f"{flag} {name!r}: no such format here; the ones we have: {_names(table)}"
            )
        return table[name]

    return convert


def default_served_name(model_path: str) -> str:
    """The file name without .gguf, or the directory name."""
    base = os.path.basename(os.path.normpath(model_path))
    return base[: -len(".gguf")] if base.endswith(".gguf") else base


def resolve_api_key(args: argparse.Namespace) -> str | None:
    """The API key from --api-key ($SGL_API_KEY) or --api-key-file ($SGL_API_KEY_FILE);
    ValueError for both, or for a file that cannot be read or holds no key."""
    if args.api_key_file is None:
        return args.api_key or None
    if args.api_key:
        raise ValueError("give --api-key or --api-key-file, not both")
    try:
        with open(args.api_key_file, encoding="utf-8") as f:
            key = f.read().strip()
    except OSError as e:
        raise ValueError(f"--api-key-file: cannot read {args.api_key_file}: {e.strerror}") from None
    if not key:
        raise ValueError(f"--api-key-file: {args.api_key_file} holds no key")
    return key


def parse_args(
    parser: argparse.ArgumentParser, argv: list[str] | None = None
) -> argparse.Namespace:
    """The command line over its --config file (whose flags come first, so the command line's
    win)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    try:
        if args.config is not None:
            args = parser.parse_args(config_argv(parser, args.config) + argv)
        check_kv_cache_dtype(args)
    except ValueError as e:
        parser.error(str(e))
    return args


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parse_args(parser, argv)
    try:
        api_key = resolve_api_key(args)
        chat_template = read_chat_template(args.chat_template) if args.chat_template else None
    except ValueError as e:
        parser.error(str(e))
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.dp_size < 1:
        parser.error(f"--dp-size must be >= 1, got {args.dp_size}")
    if args.dp_size > 1:
        from sgl.server import data_parallel

        sys.exit(data_parallel.serve(parser, args, api_key))
    from sgl.runtime.engine import Engine

    kwargs = engine_kwargs(args)
    logger.info("loading the engine: %s", {k: v for k, v in kwargs.items() if v is not None})
    engine = Engine(**kwargs)
    try:
        if chat_template is not None:
            use_chat_template(engine.tokenizer, chat_template)
        name = args.served_model_name or default_served_name(engine.model_path)
        app = create_app(
            engine,
            name,
            api_key=api_key,
            profile_dir=args.profile_dir,
            tool_call_parser=args.tool_call_parser,
            reasoning_parser=args.reasoning_parser,
            cors_allow_origins=args.cors_allow_origins,
            max_request_bytes=args.max_request_bytes,
            log_requests=args.log_requests,
            metrics_require_api_key=args.metrics_require_api_key,
        )
        logger.info(
            "serving %r (%s) on http://%s:%d", name, engine.model_path, args.host, args.port
        )
        # uvicorn re-raises the signal that stopped it under the handler found before it; a
        # no-op one lets us exit with our own status.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: None)
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=args.graceful_shutdown_timeout,
        )
        DrainingServer(
            config, app.state.sgl.lifecycle, engine, args.graceful_shutdown_timeout
        ).run()
        logger.info("server stopped; shutting the engine down")
    finally:
        engine.shutdown()
    if engine.fault is not None:
        logger.error("exiting 1 after the engine fault (incident %s)", engine.fault.incident)
        sys.exit(1)


class DrainingServer(uvicorn.Server):
    """uvicorn that drains before it stops: on the first SIGTERM / SIGINT, or when the engine
    faults, new requests get 503 while those in flight finish (up to `drain_timeout` s)."""

    def __init__(
        self, config: uvicorn.Config, lifecycle: Lifecycle, engine: Any, drain_timeout: float
    ) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        self.drain_timeout = drain_timeout
        self._drain_started = threading.Lock()
        faulted = getattr(engine, "faulted", None)
        if faulted is not None:
            threading.Thread(
                target=self._drain_on, args=(faulted,), name="sgl-fault-watch", daemon=True
            ).start()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.lifecycle.draining:  # a second signal: stop now
            self.force_exit = True
            super().handle_exit(sig, frame)
            return
        logger.info(
            "signal %d: draining (new requests get 503) for up to %.0f s", sig, self.drain_timeout
        )
        self._drain()

    def _drain_on(self, faulted: threading.Event) -> None:
        faulted.wait()
        logger.error("the engine failed: draining, then exiting 1 for a restart")
        self._drain()

    def _drain(self) -> None:
        if not self._drain_started.acquire(blocking=False):
            return
        self.lifecycle.start_drain()
        threading.Thread(target=self._stop_when_idle, name="sgl-drain", daemon=True).start()

    def _stop_when_idle(self) -> None:
        start = time.monotonic()
        if not self.lifecycle.wait_idle(self.drain_timeout):
            logger.warning(
                "drain timeout: %d requests still in flight are cancelled", self.lifecycle.in_flight
            )
        # what is left of the drain time is uvicorn's own grace for the connections still open
        self.config.timeout_graceful_shutdown = max(
            1.0, self.drain_timeout - (time.monotonic() - start)
        )
        self.should_exit = True
