"""`python -m sgl.launch_server`: load an engine and serve it with uvicorn.

Engine options are the `EngineConfig` fields as `--kebab-case` flags. SIGTERM (or Ctrl-C)
stops accepting connections, lets in-flight requests finish for up to
`--graceful-shutdown-timeout` seconds (streams still open then are cancelled, which
aborts their requests), shuts the engine down and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from typing import Any

logger = logging.getLogger("sgl.server")

# flag -> (EngineConfig field, argparse kwargs)
ENGINE_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "--model-path": ("model_path", dict(default="default",
                     help="'default' (the embedded SmolLM2-135M-Instruct), an HF model directory or a .gguf file")),
    "--tokenizer-path": ("tokenizer_path", dict(default=None, help="tokenizer directory (default: the model's)")),
    "--dtype": ("dtype", dict(default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                help="auto: bfloat16 on CUDA and on CPUs with AMX-BF16 or AVX512-BF16, else float32")),
    "--quantization": ("quantization", dict(
        default="auto", choices=["auto", "none", "int8", "int4"],
        help="weights: auto (a quantized GGUF stays quantized: Q4_* -> int4, Q8_0/Q6_K/Q5_* -> int8), none "
             "(dense in --dtype), int8 (per output channel) or int4 (groups of --int4-group-size)")),
    "--int4-group-size": ("int4_group_size", dict(type=int, default=32, choices=[32, 64, 128])),
    "--device": ("device", dict(default="auto", help="auto, cpu, cuda or cuda:N")),
    "--max-total-tokens": ("max_total_tokens", dict(type=int, default=None, help="KV pool capacity in tokens")),
    "--mem-fraction-static": ("mem_fraction_static", dict(type=float, default=None,
                              help="share of free memory for the KV pool")),
    "--max-running-requests": ("max_running_requests", dict(type=int, default=256)),
    "--chunked-prefill-size": ("chunked_prefill_size", dict(type=int, default=2048,
                               help="max prompt tokens per step; -1 disables chunking")),
    "--max-prefill-tokens": ("max_prefill_tokens", dict(type=int, default=16384)),
    "--schedule-policy": ("schedule_policy", dict(default="lpm", choices=["lpm", "fcfs", "dfs-weight"])),
    "--disable-radix-cache": ("disable_radix_cache", dict(action="store_true")),
    "--disable-jump-forward": ("disable_jump_forward", dict(action="store_true")),
    "--constraint-compile-timeout": ("constraint_compile_timeout", dict(
        type=float, default=30.0, help="CPU seconds a regex/JSON-schema constraint may take to compile, 3x in wall time (a 400 past it)")),
    "--constraint-compile-memory-gb": ("constraint_compile_memory_gb", dict(
        type=float, default=4.0, help="memory cap of the process that compiles constraints")),
    "--grammar-backend": ("grammar_backend", dict(
        default="sgl", choices=["sgl", "llguidance", "xgrammar"],
        help="who compiles regex/JSON-schema/EBNF constraints: sgl (exact, budget-aware), or llguidance / "
             "xgrammar when installed")),
    "--attention-backend": ("attention_backend", dict(
        default="auto", choices=["auto", "cpu", "torch_native", "triton", "flashinfer"],
        help="auto: flashinfer, else triton on CUDA when installed; on CPU our C++ kernel (cpu; "
             "float32/bf16/fp16 KV), built on first use; torch_native otherwise")),
    "--context-length": ("context_length", dict(type=int, default=None, help="cap on prompt + output tokens")),
    "--random-seed": ("random_seed", dict(type=int, default=None)),
    "--load-format": ("load_format", dict(
        default="auto", choices=["auto", "dummy"],
        help="dummy: random weights; --model-path is then a named shape (llama3-8b, smollm2-135m, tiny-llama), "
             "a directory holding config.json, or a config .json file")),
    "--cuda-graph-max-bs": ("cuda_graph_max_bs", dict(type=int, default=160,
                            help="decode steps of up to this many requests replay CUDA graphs")),
    "--disable-cuda-graph": ("disable_cuda_graph", dict(action="store_true")),
    "--torch-compile": ("torch_compile", dict(
        action="store_true", help="CPU: compile the batch-1 decode forward with torch.compile at start-up "
                                  "(15-45 s the first time, cached on disk)")),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sgl.launch_server", description="Serve an sgl engine over HTTP.")
    engine = p.add_argument_group("engine")
    for flag, (_field, kwargs) in ENGINE_FLAGS.items():
        engine.add_argument(flag, **kwargs)
    server = p.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=30000)
    server.add_argument("--api-key", default=os.environ.get("SGL_API_KEY"),
                        help="require 'Authorization: Bearer <key>' on every endpoint but /health "
                             "(default: $SGL_API_KEY; a key on the command line shows in `ps`: prefer "
                             "the variable or --api-key-file)")
    server.add_argument("--api-key-file", default=os.environ.get("SGL_API_KEY_FILE"),
                        help="read the API key from this file (default: $SGL_API_KEY_FILE)")
    server.add_argument("--cors-allow-origins", nargs="+", default=None, metavar="ORIGIN",
                        help="answer browsers from these origins ('*' for any); default: no CORS headers")
    server.add_argument("--served-model-name", default=None,
                        help="the model name clients use (default: the model file or directory name)")
    server.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"])
    server.add_argument("--graceful-shutdown-timeout", type=float, default=30.0,
                        help="seconds in-flight requests get to finish on SIGTERM")
    server.add_argument("--profile-dir", default=os.environ.get("SGL_TORCH_PROFILER_DIR"),
                        help="enable /start_profile and /stop_profile; torch profiler traces are written "
                             "under this directory (default: $SGL_TORCH_PROFILER_DIR; unset: profiling off)")
    server.add_argument("--tool-call-parser", default=None, choices=["hermes", "llama3_json", "mistral", "pythonic"],
                        help="the format of tool calls in the model's output (default: the one its chat "
                             "template uses; hermes when it names none)")
    server.add_argument("--reasoning-parser", default=None, choices=["qwen3", "deepseek-r1"],
                        help="split the model's <think> reasoning into reasoning_content")
    return p


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {field: getattr(args, field) for _flag, (field, _kw) in ENGINE_FLAGS.items()}


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


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        api_key = resolve_api_key(args)
    except ValueError as e:
        parser.error(str(e))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from sgl.runtime.engine import Engine
    from sgl.server.app import create_app

    kwargs = engine_kwargs(args)
    logger.info("loading the engine: %s", {k: v for k, v in kwargs.items() if v is not None})
    engine = Engine(**kwargs)
    try:
        name = args.served_model_name or default_served_name(engine.model_path)
        app = create_app(engine, name, api_key=api_key, profile_dir=args.profile_dir,
                         tool_call_parser=args.tool_call_parser, reasoning_parser=args.reasoning_parser,
                         cors_allow_origins=args.cors_allow_origins)
        logger.info("serving %r (%s) on http://%s:%d", name, engine.model_path, args.host, args.port)
        # uvicorn handles SIGTERM / SIGINT while it runs (stop accepting, drain, stop) and then
        # re-raises the signal under the handler found before it; a no-op one lets us exit 0.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: None)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                    timeout_graceful_shutdown=args.graceful_shutdown_timeout)
        logger.info("server stopped; shutting the engine down")
    finally:
        engine.shutdown()
