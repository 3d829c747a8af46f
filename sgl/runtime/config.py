"""Engine options (`EngineConfig`, what the user sets) and what the scheduler runs with
(`SchedulerConfig`: the same options, by reference, plus the values resolved at start-up)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCHEDULE_POLICIES = ("lpm", "fcfs", "dfs-weight")
LOAD_FORMATS = ("auto", "dummy")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class EngineConfig:
    """Engine options. Defaults suit a CPU; CUDA gets bf16 and memory-sized pools."""

    model_path: str = "default"
    tokenizer_path: str | None = None
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16 (auto: see resolve_dtype)
    # Weights: auto (a quantized GGUF stays quantized, int4 / int8 by its types) | none (dense
    # in `dtype`) | int8 (per output channel) | int4 (groups of int4_group_size inputs).
    quantization: str = "auto"
    int4_group_size: int = 32  # 32 | 64 | 128
    # A dense bf16 copy beside each quantized layer, used from the row count where it is faster
    # (batched decode): auto (where bf16 is native and the copies fit a share of memory) | on | off.
    dense_copy: str = "auto"
    device: str = "auto"  # auto | cpu | cuda
    max_total_tokens: int | None = None  # KV pool capacity; default from free memory
    mem_fraction_static: float | None = None  # share of free memory for the KV pool
    max_running_requests: int = 256
    chunked_prefill_size: int | None = 2048  # None or <= 0 disables chunking
    max_prefill_tokens: int = 16384
    schedule_policy: str = "lpm"
    disable_radix_cache: bool = False
    disable_jump_forward: bool = False  # constrained decoding: emit forced text token by token
    # Compiling a constraint runs in a child process under these limits (a 400 past them).
    constraint_compile_timeout: float = 30.0  # CPU seconds (3x in wall time)
    constraint_compile_memory_gb: float = 4.0
    grammar_backend: str = (
        "sgl"  # sgl | llguidance | xgrammar (when installed): who compiles constraints
    )
    attention_backend: str = "auto"  # auto | cpu | torch_native | triton | flashinfer
    context_length: int | None = None
    random_seed: int | None = None
    load_format: str = (
        "auto"  # auto (the checkpoint) | dummy (random weights from a config or named shape)
    )
    cuda_graph_max_bs: int = 160  # decode steps of up to this many requests replay CUDA graphs
    disable_cuda_graph: bool = False
    # Admission limits: past them a request is refused (EngineOverloadedError /
    # RequestTooLargeError, a 429 / 413 from the server), so what a burst of clients can make the
    # engine hold stays bounded.
    max_queued_requests: int | None = 1024  # in flight beyond max_running_requests; None: no limit
    max_prompt_tokens: int | None = None  # None: up to the context length
    max_new_tokens_limit: int | None = None  # None: up to the context length
    max_n: int = 128  # samples per prompt (OpenAI's bound)
    max_top_logprobs: int = 20  # top logprobs per token (OpenAI's bound)
    # CPU: compile the batch-1 decode forward with torch.compile (inductor) at start-up
    # (15-45 s the first time, cached on disk by inductor); other steps run eagerly.
    torch_compile: bool = False
    # Run the scheduler and the model in a child process (`Engine`'s default: a thread of the
    # caller's process; the server's: a process, see `sgl.server.engine_flags`).
    scheduler_process: bool = False
    # Tensor parallelism: the model sharded over this many scheduler processes (one per rank;
    # implies scheduler_process). On CPU each rank gets cores // tp_size threads.
    tp_size: int = 1
    # Speculative decoding (SGLang's names): NGRAM drafts by prompt lookup (the request's own
    # prompt and output), STANDALONE with a draft model; None: off. At most
    # speculative_num_draft_tokens drafted per request and step (a draft model: at most
    # speculative_num_steps, when set), fewer where acceptance is poor (speculative/).
    speculative_algorithm: str | None = None
    speculative_num_draft_tokens: int = 4
    speculative_num_steps: int | None = None
    # STANDALONE: the draft model (None: the target's own weights, quantized as below) and its
    # weights' layout (None: int4 for the target's own weights, else "auto").
    speculative_draft_model_path: str | None = None
    speculative_draft_model_quantization: str | None = None

    @property
    def in_processes(self) -> bool:
        return self.scheduler_process or self.tp_size > 1

    def validate(self) -> None:
        if not isinstance(self.tp_size, int) or isinstance(self.tp_size, bool) or self.tp_size < 1:
            raise ValueError(f"tp_size must be a positive integer, got {self.tp_size!r}")
        self._validate_speculative()
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(
                f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {self.schedule_policy!r}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(
                f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}"
            )
        from sgl.runtime.model.quant import INT4_GROUP_SIZES, QUANTIZATIONS

        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}"
            )
        from sgl.runtime.model.dense_copy import DENSE_COPY_MODES

        if self.dense_copy not in DENSE_COPY_MODES:
            raise ValueError(
                f"dense_copy must be one of {DENSE_COPY_MODES}, got {self.dense_copy!r}"
            )
        if self.int4_group_size not in INT4_GROUP_SIZES:
            raise ValueError(
                f"int4_group_size must be one of {INT4_GROUP_SIZES}, got {self.int4_group_size}"
            )
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.max_total_tokens is not None and self.max_total_tokens < 16:
            raise ValueError(f"max_total_tokens must be >= 16, got {self.max_total_tokens}")
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        for name in ("max_queued_requests", "max_prompt_tokens", "max_new_tokens_limit"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or value < (0 if name == "max_queued_requests" else 1)
            ):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if self.max_n < 1 or self.max_top_logprobs < 0:
            raise ValueError(
                f"max_n must be >= 1 and max_top_logprobs >= 0, got {self.max_n}, "
                f"{self.max_top_logprobs}"
            )
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise ValueError(
                f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}"
            )
        from sgl.runtime.attention import ATTENTION_BACKENDS

        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {ATTENTION_BACKENDS}, got "
                f"{self.attention_backend!r}"
            )
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}")
        if not self.constraint_compile_timeout > 0:
            raise ValueError(
                "constraint_compile_timeout must be > 0 seconds, got "
                f"{self.constraint_compile_timeout}"
            )
        if not self.constraint_compile_memory_gb >= 0.5:
            raise ValueError(
                "constraint_compile_memory_gb must be >= 0.5, got "
                f"{self.constraint_compile_memory_gb}"
            )
        from sgl.constrained.backends import BACKENDS, available_backends

        if self.grammar_backend not in BACKENDS:
            raise ValueError(
                f"grammar_backend must be one of {BACKENDS}, got {self.grammar_backend!r}"
            )
        if self.grammar_backend not in available_backends():
            raise ValueError(
                f"grammar_backend {self.grammar_backend!r} is not installed: pip install "
                f"{self.grammar_backend} (available: {available_backends()})"
            )
        if self.cuda_graph_max_bs < 1:
            raise ValueError(
                f"cuda_graph_max_bs must be >= 1, got {self.cuda_graph_max_bs}; use "
                "disable_cuda_graph=True to turn graphs off"
            )

    def _validate_speculative(self) -> None:
        from sgl.runtime.speculative import MAX_DRAFT_TOKENS, SPECULATIVE_ALGORITHMS

        algo = self.speculative_algorithm
        if algo is not None:
            if not isinstance(algo, str) or algo.upper() not in SPECULATIVE_ALGORITHMS:
                raise ValueError(
                    f"speculative_algorithm must be one of {SPECULATIVE_ALGORITHMS} or None, "
                    f"got {algo!r} (EAGLE is not built)"
                )
            self.speculative_algorithm = algo.upper()
        for name in ("speculative_num_draft_tokens", "speculative_num_steps"):
            k = getattr(self, name)
            if k is None and name == "speculative_num_steps":
                continue
            if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_DRAFT_TOKENS:
                raise ValueError(f"{name} must be an integer in [1, {MAX_DRAFT_TOKENS}], got {k!r}")
        from sgl.runtime.model.quant import QUANTIZATIONS

        quant = self.speculative_draft_model_quantization
        if quant is not None and quant not in QUANTIZATIONS:
            raise ValueError(
                f"speculative_draft_model_quantization must be one of {QUANTIZATIONS} or None, "
                f"got {quant!r}"
            )
        if self.speculative_algorithm == "STANDALONE" and self.tp_size > 1:
            raise ValueError(
                "speculative_algorithm STANDALONE runs with tp_size 1 only (the draft model is "
                "not sharded yet); use NGRAM with tensor parallelism"
            )

    def draft_length(self) -> int:
        """Most tokens a request drafts per step."""
        steps = self.speculative_num_steps
        if self.speculative_algorithm == "STANDALONE" and steps is not None:
            return min(steps, self.speculative_num_draft_tokens)
        return self.speculative_num_draft_tokens

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolve_dtype(self, device: torch.device) -> tuple[torch.dtype, str]:
        """The dtype of weights, activations and KV, and why it was picked."""
        if self.dtype != "auto":
            return getattr(torch, self.dtype), "set by the dtype option"
        if device.type == "cuda":
            return torch.bfloat16, "auto: bfloat16 on CUDA"
        from sgl.runtime.cpu_features import bf16_matmul_support

        why = bf16_matmul_support()
        if why is not None:
            return torch.bfloat16, f"auto: this CPU has {why}"
        return (
            torch.float32,
            "auto: this CPU has no AMX-BF16 or AVX512-BF16 (bf16 matmuls would be emulated)",
        )

    @property
    def chunk_size(self) -> int | None:
        """The prefill chunk in tokens; None: chunking off."""
        return (
            self.chunked_prefill_size
            if self.chunked_prefill_size and self.chunked_prefill_size > 0
            else None
        )

    @property
    def max_in_flight(self) -> int | None:
        """Requests admitted at once (running + queued); None: no limit."""
        if self.max_queued_requests is None:
            return None
        return self.max_running_requests + self.max_queued_requests


def cuda_graph_max_bs(cfg: EngineConfig, device: torch.device) -> int:
    """The largest decode batch replayed from a CUDA graph; 0 turns graphs off (not CUDA, or
    disabled)."""
    if device.type != "cuda" or cfg.disable_cuda_graph:
        return 0
    return min(cfg.cuda_graph_max_bs, cfg.max_running_requests)


@dataclass
class SchedulerConfig:
    """What the scheduler runs with. `engine` is the scheduler's own copy of the user's
    `EngineConfig` (changed only by `UpdateOptions` messages); the rest is resolved once the
    model is loaded."""

    engine: EngineConfig
    max_total_tokens: int
    max_context_len: int
    device: torch.device
    dtype: torch.dtype

    @property
    def cuda_graph_max_bs(self) -> int:
        return cuda_graph_max_bs(self.engine, self.device)
