"""`Engine`: the in-process entry point, i.e. the caller side of the runtime. It builds and
validates requests on the caller's thread, sends them to the scheduler through a transport
(transport.py: a thread of this process, or a scheduler process with `scheduler_process=True`)
and turns the events that come back into result dicts.

Result shape (the server's /generate returns exactly this):
    {"text", "output_ids", "meta_info": {"id", "prompt_tokens", "completion_tokens",
     "cached_tokens", "finish_reason", "e2e_latency", "ttft", [logprobs...]}}
Streams of several requests (a batch, or n > 1) add "index": the request's place in the
flattened list of (prompt, sample).
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import threading
import uuid
import weakref
from typing import Any, AsyncIterator, Iterator

import torch

from sgl.runtime.chat import render_messages, validate_messages
from sgl.runtime.config import EngineConfig
from sgl.runtime.errors import (EngineDeadError, EngineFault, EngineOverloadedError, EngineUnavailableError,
                                InvalidRequestError)
from sgl.runtime.messages import (
    AbortRequest,
    CloseSession,
    EngineFaulted,
    FlushCache,
    GenerateRequest,
    GetInfo,
    Profile,
    OpenSession,
    ReqEvent,
    SchedulerMessage,
    SubmitRequest,
    UpdateOptions,
)
from sgl.runtime.results import AsyncSink, QueueSink, ResultRouter, event_to_dict
from sgl.runtime.request_builder import constraint_of
from sgl.runtime.sampling import SamplingParams
from sgl.runtime.session import SessionParams
from sgl.runtime.transport import ProcessTransport, ThreadTransport
from sgl.runtime.worker import ModelInfo, build_scheduler, load_engine_tokenizer, on_fresh_thread, private_config
from sgl.runtime import request_builder as rb

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


QUERY_TIMEOUT_S = 60.0


class _Call:
    """One generate call on its way: its requests' rids, what has come back, and what to
    abort if the caller stops waiting. Sync and async callers drive the same object."""

    def __init__(self, engine: "Engine", reqs: list[GenerateRequest], is_batch: bool) -> None:
        self.engine = engine
        self.reqs = reqs
        self.is_batch = is_batch
        self.index = {r.rid: i for i, r in enumerate(reqs)}
        self.results: list[dict | None] = [None] * len(reqs)
        self.pending = set(self.index)
        self.multi = len(reqs) > 1

    def submit(self, sink: Any) -> None:
        self.engine._router.register(list(self.index), sink, self.engine.config.max_in_flight)
        for r in self.reqs:
            self.engine._send(SubmitRequest(r))

    def take(self, event: ReqEvent) -> dict:
        """The event as a result dict; raises the request's error."""
        if event.finished:
            self.pending.discard(event.rid)
        if event.error is not None:
            self.abort_rest()
            if isinstance(event.error, InvalidRequestError):
                raise event.error
            raise RuntimeError(f"request {event.rid} failed: {event.error}") from event.error
        i = self.index[event.rid]
        out = event_to_dict(event, i if self.multi and self.reqs[i].stream else None)
        if event.finished:
            self.results[i] = out
        return out

    @property
    def done(self) -> bool:
        return not self.pending

    @property
    def errors_come_late(self) -> bool:
        """Whether the scheduler may refuse the call (a session turn checked with its history, a
        constraint that does not compile): a stream then waits for its first event, so the
        error is raised before the stream starts."""
        return any(r.session is not None or constraint_of(r.sampling_params) is not None for r in self.reqs)

    def output(self) -> dict | list[dict]:
        return self.results if self.is_batch else self.results[0]  # type: ignore[return-value]

    def abort_rest(self) -> None:
        """The caller stopped waiting (error, cancellation, an abandoned stream): free the rest."""
        rest, self.pending = list(self.pending), set()
        self.engine._router.unregister(rest)
        for rid in rest:
            self.engine.abort(rid)


class Engine:
    """Generate with a local model: `Engine(model_path="default").generate("Hi", {"max_new_tokens": 8})`.

    `tokenizer` is the callers' copy (the scheduler has its own); the engine's uses of its
    encoder and decoder hold one lock, so concurrent callers are safe through `encode`,
    `decode` and `render_messages` (which renders the template without the encoder).

    `scheduler_process=True` runs the scheduler and the model in a child process (HTTP work
    and model steps no longer share a GIL); `tp_size=N` shards the model over N such processes
    (tensor parallelism). The default runs the scheduler on a thread of this process, where
    `engine.model` and `engine.scheduler` can also be inspected (tests, benchmarks).
    """

    def __init__(self, model_path: str = "default", **kwargs: Any) -> None:
        names = {f.name for f in dataclasses.fields(EngineConfig)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown Engine option(s) {unknown}; valid options: {sorted(names)}")
        self.config = EngineConfig(model_path=model_path, **kwargs)
        self.config.validate()
        if self.config.random_seed is not None:
            torch.manual_seed(self.config.random_seed)
        self.device = self.config.resolve_device()
        self.dtype, self.dtype_reason = self.config.resolve_dtype(self.device)
        self._router = ResultRouter()
        self._tokenizer_lock = threading.Lock()
        self._fault: BaseException | None = None  # EngineFault or EngineDeadError, once
        self.faulted = threading.Event()  # set with `fault`: the server drains and exits on it
        self._closed = True
        self.model: Any = None
        self.scheduler: Any = None
        if self.config.in_processes:
            self._transport: ThreadTransport | ProcessTransport = ProcessTransport(self._on_outputs, self._on_dead)
            info = self._transport.start(private_config(self.config))
            try:
                self.tokenizer = load_engine_tokenizer(info.tokenizer_path)
            except BaseException:
                self._transport.close()
                raise
        else:
            self._transport = ThreadTransport(self._on_outputs)
            self.scheduler, info, self.tokenizer = on_fresh_thread(
                lambda: build_scheduler(private_config(self.config), self._transport.emit))
            self.model = self.scheduler.runner.model
            self._transport.start(self.scheduler)
        self._take_model_info(info)
        self._closed = False
        _live_engines.add(self)

    def _take_model_info(self, info: ModelInfo) -> None:
        self.model_info = info
        self.model_config = info.model_config
        self.model_path = info.model_path
        self.context_len = info.context_len
        self.memory_plan = info.memory_plan
        self.eos_token_ids = info.eos_token_ids

    @property
    def scheduler_pids(self) -> list[int]:
        """The scheduler processes' pids (empty in thread mode)."""
        return getattr(self._transport, "pids", [])

    def _on_outputs(self, outputs: list) -> None:
        """The transport's delivery thread: events and replies to their callers."""
        for out in outputs:
            try:
                if isinstance(out, EngineFaulted):
                    self._set_fault(EngineFault(out.incident))
                else:
                    self._router.deliver(out)
            except Exception:  # e.g. a reply whose waiter was cancelled: the next outputs still go out
                logger.exception("could not deliver a scheduler output")

    def _on_dead(self, error: BaseException) -> None:
        """The scheduler process died: every waiting and later call fails with `error`."""
        self._set_fault(error)
        self._router.fail_waiters(error)

    def _set_fault(self, fault: BaseException) -> None:
        if self._fault is None:
            self._fault = fault
            self.faulted.set()

    # ------------------------------------------------------------------ the callers' tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        with self._tokenizer_lock:
            return list(self.tokenizer(text, add_special_tokens=add_special_tokens).input_ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        with self._tokenizer_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def render_messages(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                        tools: list[dict[str, Any]] | None = None, template_kwargs: dict[str, Any] | None = None) -> str:
        """A conversation as prompt text, with the model's chat template (see runtime/chat.py)."""
        # Rendering is Jinja over the messages (tokenize=False): it reads the tokenizer's
        # template and special tokens but never its (not thread-safe) Rust encoder, so it
        # needs no lock, and concurrent requests do not queue behind each other's render.
        return render_messages(self.tokenizer, validate_messages(messages), add_generation_prompt, tools,
                               template_kwargs)

    # ------------------------------------------------------------------ request building

    def _build_requests(self, prompt: Any, messages: Any, input_ids: Any, sampling_params: Any,
                        return_logprob: bool, logprob_start_len: int, top_logprobs_num: Any, stream: bool, rid: Any,
                        return_text_in_logprobs: bool, session_params: Any) -> _Call:
        """Normalize the inputs, check each fits, compile its constraint, expand n."""
        self._check_admission()
        if messages is not None:
            if prompt is not None:
                raise InvalidRequestError("give one of prompt and messages, not both", "messages")
            convs = messages if messages and isinstance(messages[0], (list, tuple)) else None
            prompt = [self.render_messages(c) for c in convs] if convs else self.render_messages(messages)
        vocab = self.model_config.vocab_size
        inputs = rb.normalize_inputs(prompt, input_ids, sampling_params, rid, session_params, self.encode, vocab)
        logprobs = rb.logprob_options(return_logprob, logprob_start_len, top_logprobs_num, return_text_in_logprobs,
                                      vocab)
        rb.check_limits(inputs, logprobs, self.config)
        capacity = self.memory_plan["max_total_tokens"]
        reqs: list[GenerateRequest] = []
        for ids, p, r in zip(inputs.id_lists, inputs.params, inputs.rids):
            if inputs.session is None:  # a session turn is checked with its history, by the scheduler
                rb.check_fit(ids, p, logprobs, self.context_len, capacity, self.config.max_new_tokens_limit)
            reqs.extend(rb.expand_n(r, ids, p, logprobs, stream, inputs.session))
        rb.check_unique(reqs, inputs.rids)
        return _Call(self, reqs, inputs.is_batch or len(reqs) > 1)

    # ------------------------------------------------------------------ generate

    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | SamplingParams | list | None = None,
        *,
        messages: list[dict] | list[list[dict]] | None = None,
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

        Give one of `prompt` (text), `messages` (a chat conversation, or a list of them,
        rendered with the model's chat template) and `input_ids`. With `stream=True` returns
        an iterator of chunks whose "text" is the new text since the previous chunk of the
        same request; the last chunk of each has meta_info.finish_reason. With several
        requests each chunk has "index". `session_params={"id": sid, "rid": earlier_rid}`
        makes the request a turn of an open session (see `open_session`): the prompt is then
        only the new input.
        """
        call = self._build_requests(prompt, messages, input_ids, sampling_params, return_logprob, logprob_start_len,
                                    top_logprobs_num, stream, rid, return_text_in_logprobs, session_params)
        sink = QueueSink()
        call.submit(sink)
        if stream:
            first = None
            if call.errors_come_late:  # raise them here, before the stream starts
                try:
                    first = call.take(sink.get())
                except BaseException:
                    call.abort_rest()
                    raise
            return self._stream(call, sink, first)
        try:
            while not call.done:
                call.take(sink.get())
        except BaseException:
            call.abort_rest()
            raise
        return call.output()

    def _stream(self, call: _Call, sink: QueueSink, first: dict | None) -> Iterator[dict]:
        try:
            if first is not None:
                yield first
            while not call.done:
                yield call.take(sink.get())
        finally:
            call.abort_rest()  # nothing left when it ran to the end

    async def async_generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | SamplingParams | list | None = None,
        *,
        messages: list[dict] | list[list[dict]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        stream: bool = False,
        rid: str | list[str] | None = None,
        return_text_in_logprobs: bool = False,
        session_params: dict | SessionParams | None = None,
    ) -> dict | list[dict] | AsyncIterator[dict]:
        """Like `generate`, awaitable; with stream=True returns an async iterator of chunks.

        Tokenizing and rendering run in a worker thread, off the event loop. If the caller is
        cancelled meanwhile, nothing is submitted."""
        self._check_admission()  # refuse on the event loop at once, not after a worker thread frees up
        call = await asyncio.to_thread(
            self._build_requests, prompt, messages, input_ids, sampling_params, return_logprob, logprob_start_len,
            top_logprobs_num, stream, rid, return_text_in_logprobs, session_params)
        sink = AsyncSink(asyncio.get_running_loop())
        call.submit(sink)
        if stream:
            if call.errors_come_late:  # raise them here, before the stream starts
                first = await self._first_event(call, sink)
                return self._astream(call, sink, first)
            return self._astream(call, sink, None)
        try:
            while not call.done:
                call.take(await sink.get())
        except BaseException:  # cancelled: free what is still running
            call.abort_rest()
            raise
        return call.output()

    @staticmethod
    async def _first_event(call: _Call, sink: AsyncSink) -> dict:
        try:
            return call.take(await sink.get())
        except BaseException:
            call.abort_rest()
            raise

    @staticmethod
    async def _astream(call: _Call, sink: AsyncSink, first: dict | None) -> AsyncIterator[dict]:
        try:
            if first is not None:
                yield first
            while not call.done:
                yield call.take(await sink.get())
        finally:
            call.abort_rest()

    def add_finish_listener(self, fn: Any) -> None:
        """Call `fn(event: ReqEvent)` for every request that finishes, aborted ones included
        (on the transport's delivery thread: keep it short and thread-safe). The server's
        metrics use it."""
        self._router.add_finish_listener(fn)

    # ------------------------------------------------------------------ sessions and queries

    def _send(self, msg: SchedulerMessage) -> None:
        self._transport.send(msg)

    def _query(self, make: Any) -> Any:
        self._check_open()
        reply_id = uuid.uuid4().hex
        fut = self._router.expect_reply(reply_id)
        self._send(make(reply_id))
        return fut

    def open_session(self, capacity_tokens: int | None = None, session_id: str | None = None,
                     timeout: float | None = None) -> str:
        """Open a session and return its id. Requests with `session_params={"id": ...}` are
        its turns: each finished turn's KV stays pinned in the radix cache (safe from
        eviction) until `close_session` or `timeout` seconds without use (default 600).
        `capacity_tokens` caps one turn's history + input + max_new_tokens (default: the
        context length). Sessions pin at most half the KV pool together: past that, and when
        running requests would otherwise stall, the least recently used are unpinned (they
        stay open; their next turn recomputes what was evicted)."""
        session_id = uuid.uuid4().hex if session_id is None else session_id  # the same on every rank
        return self._query(lambda rid: OpenSession(rid, capacity_tokens, session_id, timeout)).result(QUERY_TIMEOUT_S)

    def close_session(self, session_id: str) -> bool:
        """Close a session: its unfinished turns are aborted and its KV unpinned. False if it
        was not open (closed or timed out)."""
        return self._query(lambda rid: CloseSession(rid, session_id)).result(QUERY_TIMEOUT_S)

    async def async_open_session(self, capacity_tokens: int | None = None, session_id: str | None = None,
                                 timeout: float | None = None) -> str:
        session_id = uuid.uuid4().hex if session_id is None else session_id
        return await asyncio.wrap_future(self._query(lambda rid: OpenSession(rid, capacity_tokens, session_id,
                                                                             timeout)))

    async def async_close_session(self, session_id: str) -> bool:
        return await asyncio.wrap_future(self._query(lambda rid: CloseSession(rid, session_id)))

    def abort(self, rid: str) -> None:
        """Abort a request by id (with n > 1, all its samples); it finishes with finish_reason
        type 'abort' and frees its KV. On a dead scheduler process there is nothing to abort."""
        try:
            self._send(AbortRequest(rid))
        except EngineDeadError:
            pass

    def start_profile(self, output_dir: str, num_steps: int | None = None, activities: list[str] | None = None,
                      record_shapes: bool = False, with_stack: bool = False) -> str:
        """Record the scheduler's forward steps with the torch profiler until `stop_profile`
        (or `num_steps` steps); `activities` from "CPU", "GPU". The trace goes to `output_dir`."""
        options = dict(output_dir=output_dir, num_steps=num_steps, activities=activities,
                       record_shapes=record_shapes, with_stack=with_stack)
        return self._query(lambda rid: Profile(rid, options)).result(QUERY_TIMEOUT_S)

    def stop_profile(self) -> str:
        """End the running profile; returns the Chrome trace file it wrote."""
        return self._query(lambda rid: Profile(rid, None)).result(QUERY_TIMEOUT_S)

    def flush_cache(self) -> bool:
        """Drop the radix cache. Refused (False) while requests are in flight."""
        return self._query(FlushCache).result(QUERY_TIMEOUT_S)

    def get_server_info(self) -> dict[str, Any]:
        info = self._query(GetInfo).result(QUERY_TIMEOUT_S)
        mc, cfg = self.model_config, self.config
        info.update({
            "model_path": self.config.model_path,  # as given (clients pick chat templates by it)
            "resolved_model_path": str(self.model_path),
            "architecture": mc.arch,
            "attention_features": sorted(mc.attention_features),
            "num_experts": mc.num_experts,
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            "dtype_reason": self.dtype_reason,
            "quantization": cfg.quantization,
            "weight_layouts": self.model_info.weight_layouts,
            "dense_copy": cfg.dense_copy,
            "dense_copy_bytes": self.model_info.dense_copy_bytes,
            "scheduler_process": cfg.in_processes,
            "tp_size": cfg.tp_size,
            "scheduler_pids": self.scheduler_pids,
            "context_length": self.context_len,
            "vocab_size": mc.vocab_size,
            "num_layers": mc.num_hidden_layers,
            "num_kv_heads": mc.num_key_value_heads,
            "head_dim": mc.head_dim,
            "schedule_policy": cfg.schedule_policy,
            "chunked_prefill_size": cfg.chunked_prefill_size,
            "disable_radix_cache": cfg.disable_radix_cache,
            "max_running_requests": cfg.max_running_requests,
            "load_format": cfg.load_format,
            "grammar_backend": cfg.grammar_backend,
            "memory_plan": dict(self.memory_plan),
            "rank_memory": [{"rank": rank, "weight_bytes": r.weight_bytes,
                             "kv_pool_bytes": r.memory_plan["kv_bytes_per_token"] * r.memory_plan["max_total_tokens"]}
                            for rank, r in enumerate(getattr(self._transport, "rank_infos", None) or [self.model_info])],
        })
        return info

    # ------------------------------------------------------------------ lifecycle

    def update_options(self, **values: Any) -> dict[str, Any]:
        """Change options the scheduler allows to change while running (`messages.LIVE_OPTIONS`,
        e.g. `disable_jump_forward`); returns their values now. `engine.config` is the caller's
        record and follows."""
        result = self._query(lambda rid: UpdateOptions(rid, dict(values))).result(QUERY_TIMEOUT_S)
        for name, value in result.items():
            setattr(self.config, name, value)
        return result

    @property
    def fault(self) -> BaseException | None:
        """Why the engine stopped serving, or None: the scheduler's first step failure
        (`EngineFault`) or its process's death (`EngineDeadError`); `incident` names the log entry."""
        return self._fault

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the engine is shut down")

    def _check_admission(self) -> None:
        """Refuse a new request early (before tokenizing) when the engine failed or is full."""
        self._check_open()
        fault = self._fault
        if fault is not None:
            raise EngineUnavailableError(f"the engine failed (incident {fault.incident}) and takes no new requests; "
                                         "the server restarts it", fault.incident)
        max_in_flight = self.config.max_in_flight
        if max_in_flight is not None and self._router.in_flight() >= max_in_flight:
            raise EngineOverloadedError(f"the server is at capacity ({max_in_flight} requests in flight); retry later")

    def shutdown(self) -> None:
        if not getattr(self, "_closed", True):
            self._closed = True
            self._transport.close()
            self._router.fail_waiters(RuntimeError("the engine is shut down"))

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.shutdown()
        except Exception:
            pass
