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

import atexit
import dataclasses
import logging
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from sgl.runtime import request_builder as rb
from sgl.runtime.chat import render_messages, validate_messages
from sgl.runtime.config import EngineConfig
from sgl.runtime.engine_async import EngineAsync
from sgl.runtime.engine_control import EngineControl
from sgl.runtime.engine_debug import EngineDebugHooks
from sgl.runtime.errors import (
    EngineFault,
    EngineOverloadedError,
    EngineUnavailableError,
    InvalidRequestError,
)
from sgl.runtime.generate_call import GenerateCall
from sgl.runtime.messages import EngineFaulted, GenerateRequest, SchedulerMessage
from sgl.runtime.results import QueueSink, ResultRouter
from sgl.runtime.sampling import SamplingParams
from sgl.runtime.session import SessionParams
from sgl.runtime.transport import ProcessTransport, ThreadTransport
from sgl.runtime.worker import (
    ModelInfo,
    build_scheduler,
    load_engine_tokenizer,
    on_fresh_thread,
    private_config,
)

logger = logging.getLogger(__name__)

# Engines still open when the interpreter exits are shut down first: a scheduler thread
# caught inside torch code while the process tears down aborts it ("terminate called ...").
_live_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _shutdown_live_engines() -> None:
    for engine in list(_live_engines):
        try:
            engine.shutdown()
        except Exception:  # pragma: no cover - best effort at exit
            pass


# SGLang's Engine / ServerArgs option names that differ from ours (a newcomer's code runs as is)
SGLANG_OPTION_NAMES = {"enable_torch_compile": "torch_compile"}


class Engine(EngineAsync, EngineControl, EngineDebugHooks):
    """Generate with a local model: `Engine(model_path="default").generate("Hi", {"max_new_tokens":
    8})`.

    `tokenizer` is the callers' copy (the scheduler has its own); the engine's uses of its
    encoder and decoder hold one lock, so concurrent callers are safe through `encode`,
    `decode` and `render_messages` (which renders the template without the encoder).

    `scheduler_process=True` runs the scheduler and the model in a child process (HTTP work
    and model steps no longer share a GIL); `tp_size=N` shards the model over N such processes
    (tensor parallelism). The default runs the scheduler on a thread of this process, where
    `engine.model` and `engine.scheduler` can also be inspected (benchmarks); tests use the
    documented hooks, `debug_state` and `debug_wrap` (engine_debug.py).

    The control queries (sessions, profiling, cache flush, server info, live options) are
    `EngineControl` (engine_control.py); one generate call in flight is a `GenerateCall`.
    """

    def __init__(self, model_path: str = "default", **kwargs: Any) -> None:
        for sglang_name, ours in SGLANG_OPTION_NAMES.items():
            if sglang_name in kwargs:
                kwargs[ours] = kwargs.pop(sglang_name)
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
            self._transport: ThreadTransport | ProcessTransport = ProcessTransport(
                self._on_outputs, self._on_dead
            )
            info = self._transport.start(private_config(self.config))
            try:
                self.tokenizer = load_engine_tokenizer(info.tokenizer_path)
            except BaseException:
                self._transport.close()
                raise
        else:
            self._transport = ThreadTransport(self._on_outputs)
            self.scheduler, info, self.tokenizer = on_fresh_thread(
                lambda: build_scheduler(private_config(self.config), self._transport.emit)
            )
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
            except (
                Exception
            ):  # e.g. a reply whose waiter was cancelled: the next outputs still go out
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

    def render_messages(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """A conversation as prompt text, with the model's chat template (see runtime/chat.py)."""
        # Rendering is Jinja over the messages (tokenize=False): it reads the tokenizer's
        # template and special tokens but never its (not thread-safe) Rust encoder, so it
        # needs no lock, and concurrent requests do not queue behind each other's render.
        return render_messages(
            self.tokenizer,
            validate_messages(messages),
            add_generation_prompt,
            tools,
            template_kwargs,
        )

    # ------------------------------------------------------------------ request building

    def _build_requests(
        self,
        prompt: Any,
        messages: Any,
        input_ids: Any,
        sampling_params: Any,
        return_logprob: bool,
        logprob_start_len: int,
        top_logprobs_num: Any,
        stream: bool,
        rid: Any,
        return_text_in_logprobs: bool,
        session_params: Any,
    ) -> GenerateCall:
        """Normalize the inputs, check each fits, compile its constraint, expand n."""
        self._check_admission()
        if messages is not None:
            if prompt is not None:
                raise InvalidRequestError("give one of prompt and messages, not both", "messages")
            convs = messages if messages and isinstance(messages[0], (list, tuple)) else None
            prompt = (
                [self.render_messages(c) for c in convs]
                if convs
                else self.render_messages(messages)
            )
        vocab = self.model_config.vocab_size
        inputs = rb.normalize_inputs(
            prompt, input_ids, sampling_params, rid, session_params, self.encode, vocab
        )
        logprobs = rb.logprob_options(
            return_logprob, logprob_start_len, top_logprobs_num, return_text_in_logprobs, vocab
        )
        rb.check_limits(inputs, logprobs, self.config)
        capacity = self.memory_plan["max_total_tokens"]
        reqs: list[GenerateRequest] = []
        for ids, p, r in zip(inputs.id_lists, inputs.params, inputs.rids):
            if (
                inputs.session is None
            ):  # a session turn is checked with its history, by the scheduler
                rb.check_fit(
                    ids, p, logprobs, self.context_len, capacity, self.config.max_new_tokens_limit
                )
            reqs.extend(rb.expand_n(r, ids, p, logprobs, stream, inputs.session))
        rb.check_unique(reqs, inputs.rids)
        return GenerateCall(self, reqs, inputs.is_batch or len(reqs) > 1)

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
        call = self._build_requests(
            prompt,
            messages,
            input_ids,
            sampling_params,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            stream,
            rid,
            return_text_in_logprobs,
            session_params,
        )
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

    def _stream(self, call: GenerateCall, sink: QueueSink, first: dict | None) -> Iterator[dict]:
        try:
            if first is not None:
                yield first
            while not call.done:
                yield call.take(sink.get())
        finally:
            call.abort_rest()  # nothing left when it ran to the end

    def add_finish_listener(self, fn: Any) -> None:
        """Call `fn(event: ReqEvent)` for every request that finishes, aborted ones included
        (on the transport's delivery thread: keep it short and thread-safe). The server's
        metrics use it."""
        self._router.add_finish_listener(fn)

    # ------------------------------------------------------------------ the scheduler

    def _send(self, msg: SchedulerMessage) -> None:
        self._transport.send(msg)

    # ------------------------------------------------------------------ lifecycle

    @property
    def fault(self) -> BaseException | None:
        """Why the engine stopped serving, or None: the scheduler's first step
        failure (`EngineFault`) or its process's death (`EngineDeadError`);
        `incident` names the log entry."""
        return self._fault

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the engine is shut down")

    def _check_admission(self) -> None:
        """Refuse a new request early (before tokenizing) when the engine failed or is full."""
        self._check_open()
        fault = self._fault
        if fault is not None:
            raise EngineUnavailableError(
                f"the engine failed (incident {fault.incident}) and takes no new requests; "
                "the server restarts it",
                fault.incident,
            )
        max_in_flight = self.config.max_in_flight
        if max_in_flight is not None and self._router.in_flight() >= max_in_flight:
            raise EngineOverloadedError(
                f"the server is at capacity ({max_in_flight} requests in flight); retry later"
            )

    def shutdown(self) -> None:
        if not getattr(self, "_closed", True):
            self._closed = True
            self._transport.close()
            self._router.fail_waiters(RuntimeError("the engine is shut down"))

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.shutdown()
        except Exception:
            pass
