"""`Engine`: the in-process entry point. Tokenizes and validates on the caller's thread,
hands requests to the scheduler thread, and turns its events into result dicts.

Result shape (the server's /generate returns exactly this):
    {"text", "output_ids", "meta_info": {"id", "prompt_tokens", "completion_tokens",
     "cached_tokens", "finish_reason", "e2e_latency", "ttft", [logprobs...]}}
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import os
import threading
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterator

import torch

from sgl.runtime.errors import InvalidRequestError
from sgl.runtime.request import AsyncSink, GenerateRequest, QueueSink, ReqEvent
from sgl.runtime.sampling import SamplingParams
from sgl.runtime.scheduler import SCHEDULE_POLICIES, Scheduler, SchedulerConfig
from sgl.runtime.session import SessionParams, SessionRegistry

logger = logging.getLogger(__name__)

# Engines still open when the interpreter exits are shut down first: a scheduler thread
# caught inside torch code while the process tears down aborts it ("terminate called ...").
_live_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()


@atexit.register
def _shutdown_live_engines() -> None:
    for engine in list(_live_engines):
        try:
            engine.shutdown()
        except Exception:  # pragma: no cover - best effort at exit
            pass


def _on_fresh_thread(fn: Any) -> None:
    """Run fn on a thread that then exits, re-raising its exception here.

    Loading the weights and allocating the KV pool run parallel torch ops. On the caller's
    thread they would give it a lasting OpenMP thread pool; with the scheduler thread's own
    pool, libgomp then sees more threads than cores and stops spinning between parallel
    regions, so every op of every step pays a thread wake-up (measured on 2 cores: small
    parallel ops 5-16x slower in the scheduler thread). A thread's pool is freed when it exits.
    """
    error: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # re-raised on the caller's thread
            error.append(e)

    t = threading.Thread(target=run, name="sgl-engine-init", daemon=True)  # Ctrl-C can still exit
    t.start()
    t.join()
    if error:
        raise error[0]


@dataclass
class EngineConfig:
    """Engine options. Defaults suit a CPU; CUDA gets bf16 and memory-sized pools."""

    model_path: str = "default"
    tokenizer_path: str | None = None
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda
    max_total_tokens: int | None = None  # KV pool capacity; default from free memory
    mem_fraction_static: float | None = None  # share of free memory for the KV pool
    max_running_requests: int = 256
    chunked_prefill_size: int | None = 2048  # None or <= 0 disables chunking
    max_prefill_tokens: int = 16384
    schedule_policy: str = "lpm"
    disable_radix_cache: bool = False
    disable_jump_forward: bool = False  # constrained decoding: emit forced text token by token
    attention_backend: str = "auto"  # auto | cpu | torch_native | triton | flashinfer
    context_length: int | None = None
    random_seed: int | None = None
    load_format: str = "auto"  # auto (the checkpoint) | dummy (random weights from a config or named shape)
    cuda_graph_max_bs: int = 160  # decode steps of up to this many requests replay CUDA graphs
    disable_cuda_graph: bool = False

    def validate(self) -> None:
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {self.schedule_policy!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.max_total_tokens is not None and self.max_total_tokens < 16:
            raise ValueError(f"max_total_tokens must be >= 16, got {self.max_total_tokens}")
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise ValueError(f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}")
        from sgl.runtime.attention import ATTENTION_BACKENDS

        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}")
        if self.cuda_graph_max_bs < 1:
            raise ValueError(
                f"cuda_graph_max_bs must be >= 1, got {self.cuda_graph_max_bs}; use disable_cuda_graph=True to turn graphs off"
            )


LOAD_FORMATS = ("auto", "dummy")
DEFAULT_MEM_FRACTION = {"cuda": 0.85, "cpu": 0.2}
# Kept free on CUDA besides one step's activations: the CUDA context's own allocations,
# cuBLAS and attention workspaces, and the CUDA graphs' memory pool.
CUDA_FIXED_HEADROOM_BYTES = 1 << 30


def activation_headroom_bytes(mc: Any, dtype: torch.dtype, max_step_tokens: int, max_running_requests: int) -> int:
    """Memory one forward step needs besides weights and KV, generously: per token, the MLP's
    gate/up/activation tensors, the fused QKV and attention output, the residual stream and
    norms, and RoPE's float32 temporaries; per running request, float32 logits and the
    sampler's copies of them (softmax, sort); plus the fixed CUDA headroom."""
    elem = torch.empty((), dtype=dtype).element_size()
    qkv = mc.q_size + 2 * mc.kv_size
    per_token = elem * (4 * mc.intermediate_size + 2 * qkv + 4 * mc.hidden_size) + 4 * (3 * mc.q_size + 2 * mc.hidden_size)
    logits = 4 * 4 * mc.vocab_size * max_running_requests
    return max_step_tokens * per_token + logits + CUDA_FIXED_HEADROOM_BYTES


def kv_pool_tokens(free_bytes: int, fraction: float, bytes_per_token: int, headroom_bytes: int) -> int:
    """KV pool capacity in tokens: `fraction` of the memory free once the weights are loaded,
    less the headroom for activations (and, on CUDA, workspaces and graphs), divided by the
    KV bytes of one token (2 x layers x kv_heads x head_dim x element size)."""
    return max(int(free_bytes * fraction) - headroom_bytes, 0) // bytes_per_token


def cuda_graph_max_bs(cfg: EngineConfig, device: torch.device) -> int:
    """The largest decode batch replayed from a CUDA graph; 0 turns graphs off (not CUDA, or disabled)."""
    if device.type != "cuda" or cfg.disable_cuda_graph:
        return 0
    return min(cfg.cuda_graph_max_bs, cfg.max_running_requests)


def _available_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


class Engine:
    """Generate with a local model: `Engine(model_path="default").generate("Hi", {"max_new_tokens": 8})`."""

    def __init__(self, model_path: str = "default", **kwargs: Any) -> None:
        names = {f.name for f in dataclasses.fields(EngineConfig)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown Engine option(s) {unknown}; valid options: {sorted(names)}")
        self.config = EngineConfig(model_path=model_path, **kwargs)
        self.config.validate()
        cfg = self.config
        if cfg.random_seed is not None:
            torch.manual_seed(cfg.random_seed)
        device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                              ("cpu" if cfg.device == "auto" else cfg.device))
        dtype_name = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
        dtype = getattr(torch, dtype_name)
        self.device, self.dtype = device, dtype

        _on_fresh_thread(lambda: self._load(device, dtype))
        self.scheduler.start()
        self._closed = False
        _live_engines.add(self)

    def _load(self, device: torch.device, dtype: torch.dtype) -> None:
        """Load the model and tokenizer, size the KV pool and build the scheduler."""
        cfg = self.config
        from sgl.runtime.model.loader import load_model, resolve_model_path
        from sgl.runtime.tokenizer import load_tokenizer

        if cfg.load_format == "dummy":
            from sgl.runtime.model.dummy import byte_level_tokenizer, dummy_tokenizer_source, load_dummy_model

            self.model_path = cfg.model_path
            self.model, self.model_config = load_dummy_model(cfg.model_path, dtype, device, seed=cfg.random_seed or 0)
            tok_path = cfg.tokenizer_path or dummy_tokenizer_source(cfg.model_path)
        else:
            path = resolve_model_path(cfg.model_path)
            self.model_path = path
            self.model, self.model_config = load_model(path, dtype, device)
            tok_path = cfg.tokenizer_path or path
        if tok_path is None:
            logger.warning("no tokenizer found for the dummy model %r: using a byte-level one", cfg.model_path)
            self.tokenizer = byte_level_tokenizer()
        elif tok_path.endswith(".gguf"):
            self.tokenizer = load_tokenizer(os.path.dirname(tok_path), gguf_file=os.path.basename(tok_path))
        else:
            self.tokenizer = load_tokenizer(tok_path)
        self._tokenizer_lock = threading.Lock()
        self._grammar_compiler: Any = None  # built on the first constrained request
        self._compiler_lock = threading.Lock()

        mc = self.model_config
        context_len = cfg.context_length or mc.max_position_embeddings
        if context_len > mc.max_position_embeddings:
            raise ValueError(
                f"context_length {context_len} exceeds the model's max_position_embeddings {mc.max_position_embeddings}"
            )
        from sgl.runtime.memory import TokenToKVPool

        bytes_per_token = TokenToKVPool.bytes_per_token_for(mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim, dtype)
        max_total = cfg.max_total_tokens
        self.memory_plan: dict[str, Any] = {"kv_bytes_per_token": bytes_per_token, "max_total_tokens_given": max_total}
        if max_total is None:
            fraction = cfg.mem_fraction_static or DEFAULT_MEM_FRACTION["cuda" if device.type == "cuda" else "cpu"]
            headroom = 0
            if device.type == "cuda":
                torch.cuda.empty_cache()  # blocks the allocator kept from loading are free memory too
                chunk = cfg.chunked_prefill_size
                step_tokens = chunk if chunk and chunk > 0 else cfg.max_prefill_tokens
                headroom = activation_headroom_bytes(mc, dtype, step_tokens + cfg.max_running_requests, cfg.max_running_requests)
            free = _available_memory_bytes(device)
            max_total = kv_pool_tokens(free, fraction, bytes_per_token, headroom)
            if device.type == "cpu":
                max_total = min(max_total, 1 << 17)
            max_total = max(max_total, 1024)
            self.memory_plan.update(free_bytes_after_weights=free, mem_fraction_static=fraction, headroom_bytes=headroom)
            logger.info(
                "KV pool: %d tokens x %d B = %.2f GiB (%.2f GiB free after the weights x %.2f - %.2f GiB headroom)",
                max_total, bytes_per_token, max_total * bytes_per_token / 2**30, free / 2**30, fraction, headroom / 2**30,
            )
        self.memory_plan["max_total_tokens"] = max_total
        eos = set(mc.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = sorted(eos)
        self.context_len = context_len
        self.sessions = SessionRegistry(context_len)
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_total_tokens=max_total,
                max_running_requests=cfg.max_running_requests,
                max_context_len=context_len,
                chunked_prefill_size=cfg.chunked_prefill_size,
                max_prefill_tokens=cfg.max_prefill_tokens,
                schedule_policy=cfg.schedule_policy,
                disable_radix_cache=cfg.disable_radix_cache,
                attention_backend=cfg.attention_backend,
                enable_jump_forward=not cfg.disable_jump_forward,
                device=device,
                dtype=dtype,
                cuda_graph_max_bs=cuda_graph_max_bs(cfg, device),
            ),
            self.model,
            self.tokenizer,
            self.eos_token_ids,
            self.sessions,
        )

    # ------------------------------------------------------------------ request building

    def encode(self, text: str) -> list[int]:
        with self._tokenizer_lock:
            return list(self.tokenizer(text).input_ids)

    def _build_requests(
        self,
        prompt: str | list[str] | None,
        sampling_params: Any,
        input_ids: list[int] | list[list[int]] | None,
        return_logprob: bool,
        logprob_start_len: int,
        top_logprobs_num: int,
        stream: bool,
        rid: str | list[str] | None,
        return_text_in_logprobs: bool,
        session_params: Any = None,
    ) -> tuple[list[GenerateRequest], bool]:
        """Validated requests, plus whether the caller passed a batch (so returns a list)."""
        if (prompt is None) == (input_ids is None):
            raise InvalidRequestError("give exactly one of prompt (text) and input_ids", param="prompt")
        if prompt is not None:
            is_batch = isinstance(prompt, (list, tuple))
            texts = list(prompt) if is_batch else [prompt]
            for t in texts:
                if not isinstance(t, str):
                    raise InvalidRequestError(f"prompt must be a string or a list of strings, got {type(t).__name__}", "prompt")
            id_lists = [self.encode(t) for t in texts]
        else:
            if not isinstance(input_ids, (list, tuple)):
                raise InvalidRequestError("input_ids must be a list of ints or a list of lists", "input_ids")
            is_batch = bool(input_ids) and isinstance(input_ids[0], (list, tuple))
            id_lists = [list(x) for x in input_ids] if is_batch else [list(input_ids)]
        n_prompts = len(id_lists)
        if n_prompts == 0:
            raise InvalidRequestError("the batch is empty", param="prompt")

        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != n_prompts:
                raise InvalidRequestError(
                    f"sampling_params has {len(sampling_params)} entries for {n_prompts} prompts", "sampling_params"
                )
            sp_list = list(sampling_params)
        else:
            sp_list = [sampling_params] * n_prompts
        params = []
        for sp in sp_list:
            p = dataclasses.replace(sp) if isinstance(sp, SamplingParams) else SamplingParams.from_dict(sp)
            params.append(p.validate(self.model_config.vocab_size))

        if rid is not None:
            rids = list(rid) if isinstance(rid, (list, tuple)) else [rid]
            if len(rids) != n_prompts:
                raise InvalidRequestError(f"rid has {len(rids)} entries for {n_prompts} prompts", "rid")
        else:
            rids = [uuid.uuid4().hex for _ in range(n_prompts)]
        if len(set(rids)) != len(rids):
            raise InvalidRequestError("rid values must be unique within a batch", "rid")
        vocab = self.model_config.vocab_size
        session: SessionParams | None = None
        if session_params is not None:
            session = SessionParams.from_any(session_params)
            if n_prompts != 1:
                raise InvalidRequestError("session_params takes one prompt, not a batch", "session_params")
        if not isinstance(top_logprobs_num, int) or isinstance(top_logprobs_num, bool) or not 0 <= top_logprobs_num <= vocab:
            raise InvalidRequestError(
                f"top_logprobs_num must be an integer in [0, {vocab}], got {top_logprobs_num!r}", "top_logprobs_num"
            )

        capacity = self.scheduler.kv_pool.capacity
        reqs: list[GenerateRequest] = []
        for ids, p, r in zip(id_lists, params, rids):
            if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in ids):
                raise InvalidRequestError(f"input_ids must be integers in [0, {vocab})", "input_ids")
            if session is not None:  # the continued turn's tokens come first
                ids = self.sessions.resolve(session, ids, p.max_new_tokens, self.tokenizer.bos_token_id)
            if not ids:
                raise InvalidRequestError("the prompt is empty: give at least one token", "prompt")
            if len(ids) >= self.context_len:
                raise InvalidRequestError(
                    f"the prompt has {len(ids)} tokens; the context length is {self.context_len}", "prompt"
                )
            if len(ids) + p.max_new_tokens > self.context_len:
                raise InvalidRequestError(
                    f"prompt ({len(ids)} tokens) + max_new_tokens ({p.max_new_tokens}) exceeds the context length "
                    f"{self.context_len}; lower max_new_tokens",
                    "max_new_tokens",
                )
            if len(ids) + p.max_new_tokens * p.n > capacity - 1:
                raise InvalidRequestError(
                    f"prompt ({len(ids)} tokens) + max_new_tokens ({p.max_new_tokens}) x n ({p.n}) does not fit in the "
                    f"KV pool ({capacity} tokens); lower max_new_tokens or raise max_total_tokens",
                    "max_new_tokens",
                )
            if return_logprob and logprob_start_len >= len(ids):
                raise InvalidRequestError(
                    f"logprob_start_len ({logprob_start_len}) must be < the prompt length ({len(ids)})", "logprob_start_len"
                )
            grammar = self._compile_constraint(p)
            for i in range(p.n):
                sub = p
                if p.n > 1:
                    sub = dataclasses.replace(p, n=1, seed=None if p.seed is None else p.seed + i)
                reqs.append(
                    GenerateRequest(
                        rid=r if p.n == 1 else f"{r}-{i}",
                        parent_rid=r if p.n > 1 else None,
                        input_ids=ids,
                        sampling_params=sub,
                        return_logprob=return_logprob,
                        logprob_start_len=logprob_start_len if return_logprob else -1,
                        top_logprobs_num=top_logprobs_num if return_logprob else 0,
                        stream=stream,
                        return_text_in_logprobs=return_text_in_logprobs,
                        grammar=grammar,
                        session_id=session.id if session is not None else None,
                    )
                )
        if len(reqs) > len(rids) and len({r.rid for r in reqs} | set(rids)) != len(reqs) + len(rids):
            raise InvalidRequestError("rid values (and their n > 1 sample ids rid-i) must be unique", "rid")
        return reqs, is_batch or len(reqs) > 1

    def _compile_constraint(self, p: SamplingParams) -> Any:
        """Compile the request's regex / json_schema / ebnf (cached) on the caller's thread,
        so a bad spec is rejected at submit time and a slow compile never stalls the
        scheduler loop."""
        if p.regex is not None:
            kind, spec = "regex", p.regex
        elif p.json_schema is not None:
            kind, spec = "json_schema", p.json_schema
        elif p.ebnf is not None:
            kind, spec = "ebnf", p.ebnf
        elif p.json_object:
            kind, spec = "json_object", ""
        else:
            return None
        from sgl.constrained.errors import GrammarError

        try:
            return self.grammar_compiler.compile(kind, spec)
        except GrammarError as e:
            raise InvalidRequestError(str(e), param=e.param) from e

    @property
    def grammar_compiler(self) -> Any:
        with self._compiler_lock:
            if self._grammar_compiler is None:
                from sgl.constrained.compiler import GrammarCompiler
                from sgl.constrained.vocab import TokenVocabulary

                vocab = TokenVocabulary.from_tokenizer(
                    self.tokenizer, vocab_size=self.model_config.vocab_size, eos_token_ids=self.eos_token_ids
                )
                self._grammar_compiler = GrammarCompiler(vocab)
            return self._grammar_compiler

    # ------------------------------------------------------------------ generate

    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | SamplingParams | list | None = None,
        *,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        stream: bool = False,
        rid: str | list[str] | None = None,
        return_text_in_logprobs: bool = False,
        session_params: dict | SessionParams | None = None,
    ) -> dict | list[dict] | Iterator[dict]:
        """Generate for one prompt (returns a dict) or a batch / n > 1 (returns a list).

        With `stream=True` (one prompt, n == 1) returns an iterator of chunks whose "text" is
        the new text since the previous chunk; the last chunk has meta_info.finish_reason.
        `session_params={"id": sid, "rid": earlier_rid}` makes the request a turn of an open
        session (see `open_session`): the prompt is then only the new input.
        """
        self._check_open()
        reqs, is_batch = self._build_requests(
            prompt, sampling_params, input_ids, return_logprob, logprob_start_len, top_logprobs_num, stream, rid,
            return_text_in_logprobs, session_params,
        )
        if stream:
            if len(reqs) != 1:
                raise InvalidRequestError("stream=True takes one prompt with n == 1", "stream")
            return self._stream(reqs[0])
        sink = QueueSink()
        for r in reqs:
            self.scheduler.submit(r, sink)
        results: dict[str, dict] = {}
        try:
            while len(results) < len(reqs):
                event = sink.get()
                if event.finished:
                    results[event.rid] = self._result(event)
        except BaseException:
            for r in reqs:
                if r.rid not in results:
                    self.scheduler.abort(r.rid)
            raise
        out = [results[r.rid] for r in reqs]
        return out if is_batch else out[0]

    def _stream(self, req: GenerateRequest) -> Iterator[dict]:
        sink = QueueSink()
        self.scheduler.submit(req, sink)

        def chunks() -> Iterator[dict]:
            finished = False
            try:
                while not finished:
                    event = sink.get()
                    finished = event.finished
                    yield self._result(event)
            finally:
                if not finished:  # the consumer stopped early: free the request's KV
                    self.scheduler.abort(req.rid)

        return chunks()

    @staticmethod
    def _result(event: ReqEvent) -> dict:
        if event.error is not None and event.finished:
            raise RuntimeError(f"request {event.rid} failed: {event.error}") from event.error
        meta = dict(event.meta_info or {})
        return {"text": event.text, "output_ids": event.output_ids, "meta_info": meta}

    async def async_generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | SamplingParams | list | None = None,
        *,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        stream: bool = False,
        rid: str | list[str] | None = None,
        return_text_in_logprobs: bool = False,
        session_params: dict | SessionParams | None = None,
    ) -> dict | list[dict] | AsyncIterator[dict]:
        """Like `generate`, awaitable; with stream=True returns an async iterator of chunks."""
        self._check_open()
        # Tokenizing and compiling constraints can take a while: keep them off the event loop.
        reqs, is_batch = await asyncio.to_thread(
            self._build_requests, prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
            top_logprobs_num, stream, rid, return_text_in_logprobs, session_params,
        )
        sink = AsyncSink(asyncio.get_running_loop())
        if stream:
            if len(reqs) != 1:
                raise InvalidRequestError("stream=True takes one prompt with n == 1", "stream")
            self.scheduler.submit(reqs[0], sink)
            return self._astream(reqs[0].rid, sink)
        for r in reqs:
            self.scheduler.submit(r, sink)
        results: dict[str, dict] = {}
        try:
            while len(results) < len(reqs):
                event = await sink.queue.get()
                if event.finished:
                    results[event.rid] = self._result(event)
        except BaseException:  # cancelled: free what is still running
            for r in reqs:
                if r.rid not in results:
                    self.scheduler.abort(r.rid)
            raise
        out = [results[r.rid] for r in reqs]
        return out if is_batch else out[0]

    async def _astream(self, rid: str, sink: AsyncSink) -> AsyncIterator[dict]:
        finished = False
        try:
            while not finished:
                event = await sink.queue.get()
                finished = event.finished
                yield self._result(event)
        finally:
            if not finished:
                self.scheduler.abort(rid)

    # ------------------------------------------------------------------ sessions

    def open_session(self, capacity_tokens: int | None = None, session_id: str | None = None,
                     timeout: float | None = None) -> str:
        """Open a session and return its id. Requests with `session_params={"id": ...}` are
        its turns: each finished turn's KV stays pinned in the radix cache (safe from
        eviction) until `close_session` or `timeout` seconds without use (default 600).
        `capacity_tokens` caps one turn's history + input + max_new_tokens (default: the
        context length). Sessions pin at most half the KV pool together: past that, and when
        running requests would otherwise stall, the least recently used are unpinned (they
        stay open; their next turn recomputes what was evicted)."""
        self._check_open()
        return self.sessions.open(capacity_tokens, session_id, timeout)

    def close_session(self, session_id: str) -> bool:
        """Close a session: its unfinished turns are aborted and its KV unpinned. False if it
        was not open (closed or timed out)."""
        self._check_open()
        closed = self.sessions.close(session_id)
        if closed:
            self.scheduler.close_session(session_id)
        return closed

    # ------------------------------------------------------------------ control

    def abort(self, rid: str) -> None:
        """Abort a request by id (with n > 1, all its samples); it finishes with finish_reason
        type 'abort' and frees its KV."""
        self.scheduler.abort(rid)

    def flush_cache(self) -> bool:
        """Drop the radix cache. Refused (False) while requests are in flight."""
        self._check_open()
        return self.scheduler.call(self.scheduler.flush_cache)

    def get_server_info(self) -> dict[str, Any]:
        self._check_open()
        info = self.scheduler.call(self.scheduler.info)
        mc = self.model_config
        info.update(
            {
                "model_path": self.model_path,
                "device": str(self.device),
                "dtype": str(self.dtype).replace("torch.", ""),
                "context_length": self.context_len,
                "vocab_size": mc.vocab_size,
                "num_layers": mc.num_hidden_layers,
                "num_kv_heads": mc.num_key_value_heads,
                "head_dim": mc.head_dim,
                "schedule_policy": self.config.schedule_policy,
                "chunked_prefill_size": self.config.chunked_prefill_size,
                "disable_radix_cache": self.config.disable_radix_cache,
                "max_running_requests": self.config.max_running_requests,
                "load_format": self.config.load_format,
                "memory_plan": dict(self.memory_plan),
            }
        )
        return info

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the engine is shut down")

    def shutdown(self) -> None:
        if not getattr(self, "_closed", True):
            self._closed = True
            self.scheduler.shutdown()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.shutdown()
        except Exception:
            pass
