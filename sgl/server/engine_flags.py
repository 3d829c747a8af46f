"""The engine's command-line flags: one per `EngineConfig` field, `--kebab-case` of its name
(then SGLang's / vLLM's names for it). A flag's default is the field's default and its choices
are the registry the field is validated against, so neither is said twice; the only default
of our own is in `SERVER_DEFAULTS`. Apart from `launch` so the table reads on its own.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from sgl.constrained.backends import BACKENDS as GRAMMAR_BACKENDS
from sgl.runtime.attention import ATTENTION_BACKENDS
from sgl.runtime.config import DTYPES, LOAD_FORMATS, SCHEDULE_POLICIES, EngineConfig
from sgl.runtime.model.dense_copy import DENSE_COPY_MODES
from sgl.runtime.model.quant import INT4_GROUP_SIZES, QUANTIZATIONS
from sgl.runtime.speculative import MAX_DRAFT_TOKENS, SPECULATIVE_ALGORITHMS
from sgl.server.launch_compat import DTYPE_ALIASES


def int_in_range(value: str, low: int, high: int) -> int:
    """An argparse type: an integer in [low, high], refused while parsing (the error names
    the flag) rather than by the engine after start-up began."""
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or not low <= number <= high:
        raise argparse.ArgumentTypeError(f"must be an integer from {low} to {high}, got {value!r}")
    return number


# flag names -> (EngineConfig field, argparse kwargs but the default)
ENGINE_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "--model-path --model": (
        "model_path",
        dict(
            help="'default' (the embedded SmolLM2-135M-Instruct), "
            "an HF model directory or a .gguf file"
        ),
    ),
    "--tokenizer-path": ("tokenizer_path", dict(help="tokenizer directory (default: the model's)")),
    "--dtype": (
        "dtype",
        dict(
            type=lambda v: DTYPE_ALIASES.get(v, v),
            choices=DTYPES,
            help="auto: bfloat16 on CUDA and on CPUs with AMX-BF16 or AVX512-BF16, else float32 "
            "(SGLang's and vLLM's half = float16, float = float32)",
        ),
    ),
    "--quantization": (
        "quantization",
        dict(
            choices=QUANTIZATIONS,
            help="weights: auto (a quantized GGUF stays quantized: Q4_* -> int4, "
            "Q8_0/Q6_K/Q5_* -> int8), none (dense in --dtype), int8 (per output "
            "channel) or int4 (groups of --int4-group-size)",
        ),
    ),
    "--int4-group-size": ("int4_group_size", dict(type=int, choices=INT4_GROUP_SIZES)),
    "--dense-copy": (
        "dense_copy",
        dict(
            choices=DENSE_COPY_MODES,
            help="a dense bf16 copy beside each quantized layer, taken from the row "
            "count where it is faster (batched decode); auto: where bf16 matmuls are "
            "native and the copies fit 20%% of available memory (at most 4 GiB)",
        ),
    ),
    "--device": ("device", dict(help="auto, cpu, cuda or cuda:N")),
    "--max-total-tokens": ("max_total_tokens", dict(type=int, help="KV pool capacity in tokens")),
    "--mem-fraction-static": (
        "mem_fraction_static",
        dict(type=float, help="share of free memory for the KV pool"),
    ),
    "--max-running-requests": ("max_running_requests", dict(type=int)),
    "--chunked-prefill-size": (
        "chunked_prefill_size",
        dict(type=int, help="max prompt tokens per step; -1 disables chunking"),
    ),
    "--max-prefill-tokens": ("max_prefill_tokens", dict(type=int)),
    "--schedule-policy": ("schedule_policy", dict(choices=SCHEDULE_POLICIES)),
    "--disable-radix-cache": ("disable_radix_cache", dict(action="store_true")),
    "--disable-jump-forward": ("disable_jump_forward", dict(action="store_true")),
    "--constraint-compile-timeout": (
        "constraint_compile_timeout",
        dict(
            type=float,
            help="CPU seconds a regex/JSON-schema constraint may take to compile, "
            "3x in wall time (a 400 past it)",
        ),
    ),
    "--constraint-compile-memory-gb": (
        "constraint_compile_memory_gb",
        dict(type=float, help="memory cap of the process that compiles constraints"),
    ),
    "--grammar-backend": (
        "grammar_backend",
        dict(
            choices=GRAMMAR_BACKENDS,
            help="who compiles regex/JSON-schema/EBNF constraints: sgl (exact, budget-aware), "
            "or llguidance / xgrammar when installed",
        ),
    ),
    "--attention-backend": (
        "attention_backend",
        dict(
            choices=ATTENTION_BACKENDS,
            help="auto: flashinfer, else triton on CUDA when installed; on CPU our C++ kernel "
            "(cpu; float32/bf16/fp16 KV), built on first use; torch_native otherwise",
        ),
    ),
    "--context-length": ("context_length", dict(type=int, help="cap on prompt + output tokens")),
    "--random-seed": ("random_seed", dict(type=int)),
    "--load-format": (
        "load_format",
        dict(
            choices=LOAD_FORMATS,
            help="dummy: random weights; --model-path is then a named shape (llama3-8b, "
            "smollm2-135m, tiny-llama), a directory holding config.json, or a config .json file",
        ),
    ),
    "--cuda-graph-max-bs": (
        "cuda_graph_max_bs",
        dict(type=int, help="decode steps of up to this many requests replay CUDA graphs"),
    ),
    "--disable-cuda-graph": ("disable_cuda_graph", dict(action="store_true")),
    "--max-queued-requests": (
        "max_queued_requests",
        dict(
            type=int,
            help="requests that may wait beyond --max-running-requests; "
            "past it a 429 with Retry-After",
        ),
    ),
    "--max-prompt-tokens": (
        "max_prompt_tokens",
        dict(
            type=int,
            help="longest prompt taken, in tokens (a 413 past it; default: the context length)",
        ),
    ),
    "--max-new-tokens-limit": (
        "max_new_tokens_limit",
        dict(
            type=int,
            help="largest max_tokens / max_new_tokens taken "
            "(a 413 past it; default: the context length)",
        ),
    ),
    "--max-n": ("max_n", dict(type=int, help="largest n (samples per prompt) taken")),
    "--max-top-logprobs": ("max_top_logprobs", dict(type=int, help="largest top_logprobs taken")),
    "--scheduler-process": (
        "scheduler_process",
        dict(
            action=argparse.BooleanOptionalAction,
            help="run the scheduler and the model in their own process (default), so "
            "HTTP work and model steps do not share a GIL; --no-scheduler-process "
            "runs them on a thread of the server",
        ),
    ),
    "--tp-size --tensor-parallel-size --tp": (
        "tp_size",
        dict(
            type=int,
            help="tensor parallelism: shard the model over this many scheduler processes "
            "(gloo on CPU, NCCL on CUDA; on CPU each gets cores / N threads)",
        ),
    ),
    "--torch-compile --enable-torch-compile": (
        "torch_compile",
        dict(
            action="store_true",
            help="CPU: compile the decode forwards (batch 1, batch 2+) with "
            "torch.compile at start-up (SmolLM2-135M on a 2-core EPYC: ~210 s the "
            "first time, ~12 s once inductor's disk cache holds them)",
        ),
    ),
    "--speculative-algorithm": (
        "speculative_algorithm",
        dict(
            type=str.upper,
            choices=SPECULATIVE_ALGORITHMS,
            help="speculative decoding, verified exactly: NGRAM drafts by prompt lookup (each "
            "request's own prompt and output), STANDALONE with a draft model; off by default",
        ),
    ),
    "--speculative-num-draft-tokens": (
        "speculative_num_draft_tokens",
        dict(
            type=lambda v: int_in_range(v, 1, MAX_DRAFT_TOKENS),
            help=f"most tokens drafted per request and step (1 to {MAX_DRAFT_TOKENS})",
        ),
    ),
    "--speculative-num-steps": (
        "speculative_num_steps",
        dict(
            type=lambda v: int_in_range(v, 1, MAX_DRAFT_TOKENS),
            help="STANDALONE: draft model steps (tokens drafted) per verify step",
        ),
    ),
    "--speculative-draft-model-path --speculative-draft-model": (
        "speculative_draft_model_path",
        dict(help="STANDALONE: the draft model (default: the target's own weights, int4)"),
    ),
    "--speculative-draft-model-quantization": (
        "speculative_draft_model_quantization",
        dict(
            choices=QUANTIZATIONS,
            help="STANDALONE: the draft's weights (default: int4 for the target's own "
            "weights, else auto)",
        ),
    ),
}

# field -> the server's default where it differs from `Engine`'s
SERVER_DEFAULTS: dict[str, Any] = {
    "scheduler_process": True,  # HTTP work and model steps in separate processes, not sharing a GIL
}


def flag_default(field: str) -> Any:
    """The default of `field`'s flag: the server's own, else `EngineConfig`'s."""
    if field in SERVER_DEFAULTS:
        return SERVER_DEFAULTS[field]
    return next(f.default for f in dataclasses.fields(EngineConfig) if f.name == field)


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    engine = parser.add_argument_group("engine")
    for flags, (field, kwargs) in ENGINE_FLAGS.items():
        # the first name is ours, the rest SGLang's / vLLM's
        engine.add_argument(*flags.split(), default=flag_default(field), **kwargs)


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {field: getattr(args, field) for _flags, (field, _kw) in ENGINE_FLAGS.items()}
