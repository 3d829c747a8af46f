"""The scheduler loop: messages in, next batch, forward, results out.

One thread owns every piece of mutable engine state: the KV memory and prefix cache
(kv_manager.py), the queues (batch.py), the model runner (model_runner.py), per-token
output state (output.py) and the sessions (session.py). Callers reach it only through
typed messages (messages.py) in `inbox`; it answers only through `emit`. Each step:
drain the inbox, expire idle sessions, build the next batch, run it, and turn the sampled
tokens into events. A step that raises is a fault: it is logged under an incident id, every
request in flight fails with it (their KV returned), `faulted` is set and later requests are
refused: the state a failed step leaves is not trusted, so the process that owns the engine
is expected to drain and restart it (the server does), not to go on serving.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable

import torch

from sgl.runtime.attention import backend_name
from sgl.runtime.batch import BatchBuilder, BatchItem
from sgl.runtime.config import SchedulerConfig
from sgl.runtime.errors import EngineFault, InvalidRequestError, new_incident_id
from sgl.runtime.kv_manager import KVManager
from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool
from sgl.runtime.messages import (
    AbortRequest,
    CloseSession,
    FinishReason,
    FlushCache,
    Profile,
    GetInfo,
    OpenSession,
    Reply,
    SchedulerMessage,
    SchedulerOutput,
    Shutdown,
    SubmitRequest,
)
from sgl.runtime.model_runner import ModelRunner, StepInput
from sgl.runtime.output import OutputProcessor, TokenOutput
from sgl.runtime.profiler import StepProfiler
from sgl.runtime.request import Req
from sgl.runtime.request_builder import check_fit
from sgl.runtime.session import SessionRegistry

logger = logging.getLogger(__name__)

SESSION_EXPIRY_CHECK_S = 1.0


class Scheduler:
    def __init__(self, config: SchedulerConfig, runner: ModelRunner, tokenizer: Any, eos_token_ids: list[int],
                 emit: Callable[[SchedulerOutput], None]) -> None:
        self.config = config
        self.runner = runner
        self.emit = emit
        self.eos_token_ids = sorted(set(eos_token_ids))
        mc = runner.model.config
        pool = TokenToKVPool(config.max_total_tokens, mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim,
                             config.dtype, config.device)
        table = ReqToTokenPool(config.engine.max_running_requests + runner.padding_rows, config.max_context_len + 1,
                               config.device)
        runner.bind(pool, table)
        self.sessions = SessionRegistry(config.max_context_len)
        self.kv = KVManager(pool, table, not config.engine.disable_radix_cache, self.sessions)
        self.batches = BatchBuilder(config, self.kv)
        self.output = OutputProcessor(tokenizer, self.eos_token_ids, self.kv, config.device,
                                      lambda: not config.engine.disable_jump_forward)
        self.tokenizer = tokenizer
        self.stats = {"forward_steps": 0, "decode_tokens": 0, "prefill_tokens": 0, "finished_requests": 0}
        self.inbox: queue.Queue[SchedulerMessage] = queue.Queue()
        self._next_expiry_check = 0.0
        self._stop = False
        self._thread: threading.Thread | None = None
        self.fault: EngineFault | None = None  # the first step failure; then every new request is refused
        self.faulted = threading.Event()
        self._handlers: dict[type, Callable[[Any], None]] = {
            SubmitRequest: self._on_submit, AbortRequest: self._on_abort, OpenSession: self._on_open_session,
            CloseSession: self._on_close_session, FlushCache: self._on_flush, GetInfo: self._on_info,
            Profile: self._on_profile, Shutdown: self._on_shutdown,
        }
        self.profiler = StepProfiler()

    # ------------------------------------------------------------------ the loop

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sgl-scheduler", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        if self.config.device.type == "cuda" and self.config.device.index is not None:
            torch.cuda.set_device(self.config.device)  # this thread's kernels and graph replays go there
        while not self._stop:
            try:
                self._drain_inbox(block=not (self.batches.waiting or self.batches.running))
                if self._stop:
                    break
                self._expire_sessions()
                self.step()
            except Exception as e:  # the loop survives to answer every caller, but the engine is done
                self._on_fault(e)
        self._fail_all(RuntimeError("engine shut down"))
        self._refuse_late_messages()

    def _on_fault(self, error: Exception) -> None:
        incident = new_incident_id()
        logger.error("incident %s: scheduler step failed; the engine refuses new requests", incident, exc_info=error)
        fault = EngineFault(incident)
        fault.__cause__ = error
        if self.fault is None:
            self.fault = fault
            self.faulted.set()
        self._fail_all(fault)

    def _refuse_late_messages(self) -> None:
        """Messages that arrived after the last drain: every request and query still gets an answer."""
        error = RuntimeError("engine shut down")
        while True:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(msg, SubmitRequest):
                req = Req(msg.request, msg.request.input_ids)
                req.finish = FinishReason.abort(f"engine error: {error}")
                self.emit(self.output.final_event(req, None, error))
            elif getattr(msg, "reply_id", None) is not None:
                self.emit(Reply(msg.reply_id, error=error))

    def _drain_inbox(self, block: bool) -> None:
        while True:
            try:
                msg = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            self._handlers[type(msg)](msg)

    def step(self) -> bool:
        """Build and run one batch; False when there was nothing to run."""
        items = self.batches.next_batch()
        if not items:
            return False
        starts = [it.req.kv_len for it in items]
        hidden = self.runner.forward(StepInput([it.req for it in items], [it.extend_len for it in items]),
                                     self.kv.step_slots)
        self.stats["forward_steps"] += 1
        self.stats["prefill_tokens"] += sum(it.extend_len for it in items if it.prefill)
        self.stats["decode_tokens"] += sum(1 for it in items if not it.prefill)
        self.output.input_logprobs(hidden, [(it.req, start, it.extend_len) for it, start in zip(items, starts)],
                                   self.runner.score)
        self._sample(self.batches.advance(items), hidden)
        if self.profiler.running:
            self.profiler.after_step()
        return True

    def _sample(self, ready: list[tuple[BatchItem, int]], hidden: torch.Tensor) -> None:
        now = time.monotonic()
        for it, _ in ready:  # max_new_tokens == 0: scoring only (e.g. select); finish without sampling
            if it.req.sampling_params.max_new_tokens == 0:
                self._finish(it.req, FinishReason.of_length(0))
        ready = [(it, row) for it, row in ready if it.req.sampling_params.max_new_tokens > 0]
        if not ready:
            return
        reqs = [it.req for it, _ in ready]
        out = self.runner.sample(hidden, reqs, [row for _, row in ready], self.eos_token_ids)
        for i, r in enumerate(reqs):
            lp = out.logprobs[i] if out.logprobs else None
            token = self.output.process_token(r, out.token_ids[i], lp, out.top_logprobs[i], now)
            if token.finish is not None:
                self._finish(r, token.finish, token)
            elif r.stream:
                event = self.output.stream_event(r, token)
                if event is not None:
                    self.emit(event)

    # ------------------------------------------------------------------ requests

    def _on_submit(self, msg: SubmitRequest) -> None:
        request = msg.request
        req = Req(request, request.input_ids)
        if self.fault is not None:  # sent before the caller could see the fault
            self._finish(req, FinishReason.abort(f"engine error: {self.fault}"), error=self.fault)
            return
        if request.session is not None:  # prepend the continued turn, then check the whole prompt fits
            try:
                req.origin_input_ids = self.sessions.resolve(request.session, request.input_ids,
                                                             request.sampling_params.max_new_tokens or 0,
                                                             getattr(self.tokenizer, "bos_token_id", None))
                check_fit(req.origin_input_ids, request.sampling_params, request.logprobs,
                          self.config.max_context_len, self.kv.pool.capacity, self.config.engine.max_new_tokens_limit)
            except InvalidRequestError as e:  # e.g. the session closed before this turn arrived
                self._finish(req, FinishReason.abort(e.message), error=e)
                return
        self.output.init_request(req)
        self.batches.waiting.append(req)

    def _on_abort(self, msg: AbortRequest) -> None:
        self._abort_where(lambda r: msg.rid in (r.rid, r.parent_rid), msg.message)

    def _abort_where(self, match: Callable[[Req], bool], message: str) -> None:
        for req in [r for r in self.batches.waiting + self.batches.running if match(r)]:
            self._finish(req, FinishReason.abort(message))

    def _finish(self, r: Req, reason: FinishReason, delta: TokenOutput | None = None,
                error: BaseException | None = None) -> None:
        """End a request: its KV goes to the prefix cache, a session turn is recorded and
        pinned, and the caller gets the final event."""
        self.batches.remove(r)
        r.finish = reason
        self.stats["finished_requests"] += 1
        sid = r.session_id
        if sid is not None and error is None and not reason.is_abort:
            if self.sessions.record(sid, r.rid, r.origin_input_ids, r.output_ids):
                self.kv.pin_turn(sid, r.fill_ids)
        self.emit(self.output.final_event(r, delta, error))

    def _fail_all(self, error: BaseException) -> None:
        """After an internal error: end every request with it, returning all their KV."""
        for req in self.batches.fail_all():
            req.finish = FinishReason.abort(f"engine error: {error}")
            self.stats["finished_requests"] += 1
            self.emit(self.output.final_event(req, None, error))

    # ------------------------------------------------------------------ sessions

    def _on_open_session(self, msg: OpenSession) -> None:
        self._reply(msg.reply_id, lambda: self.sessions.open(msg.capacity_tokens, msg.session_id, msg.timeout))

    def _on_close_session(self, msg: CloseSession) -> None:
        """Its unfinished turns are aborted (as SGLang does) and its KV unpinned."""
        closed = self.sessions.close(msg.session_id)
        if closed:
            self._abort_where(lambda r: r.session_id == msg.session_id, "aborted: its session was closed")
            self.kv.unpin_session(msg.session_id)
        if msg.reply_id is not None:
            self.emit(Reply(msg.reply_id, closed))

    def _expire_sessions(self) -> None:
        """Close sessions idle past their timeout (checked about once a second)."""
        now = time.monotonic()
        if now < self._next_expiry_check:
            return
        self._next_expiry_check = now + SESSION_EXPIRY_CHECK_S
        busy = {r.session_id for r in self.batches.waiting + self.batches.running if r.session_id is not None}
        for sid in self.sessions.expire(busy, now):
            self.kv.unpin_session(sid)

    # ------------------------------------------------------------------ queries

    def _reply(self, reply_id: str, compute: Callable[[], Any]) -> None:
        """Answer a query; its failure goes to its caller (a query touches no request's state,
        so it is not an engine fault)."""
        try:
            value = compute()
        except Exception as e:
            self.emit(Reply(reply_id, error=e))
            return
        self.emit(Reply(reply_id, value))

    def _on_flush(self, msg: FlushCache) -> None:
        """Refused (False) while requests are in flight."""
        busy = bool(self.batches.running or self.batches.waiting)
        self.emit(Reply(msg.reply_id, False if busy else self.kv.flush()))

    def _on_profile(self, msg: Profile) -> None:
        if msg.options is None:
            self._reply(msg.reply_id, self.profiler.stop)
        else:
            self._reply(msg.reply_id, lambda: self.profiler.start(**msg.options))

    def _on_info(self, msg: GetInfo) -> None:
        self.emit(Reply(msg.reply_id, self.info()))

    def _on_shutdown(self, msg: Shutdown) -> None:
        self._stop = True

    def info(self) -> dict[str, Any]:
        b = self.batches
        return {
            **self.kv.info(),
            "num_running_reqs": len(b.running),
            "num_waiting_reqs": len(b.waiting),
            "num_open_sessions": len(self.sessions),
            "new_token_ratio": b.new_token_ratio,
            "attention_backend": backend_name(self.runner.attn_backend),
            "cuda_graph_batch_sizes": self.runner.graph_runner.capture_sizes if self.runner.graph_runner else [],
            **self.stats,
            "cached_tokens": b.cached_tokens,
            "retractions": b.retractions,
            "jump_forward_tokens": self.output.jump_forward_tokens,
            "cuda_graph_steps": self.runner.cuda_graph_steps,
            "torch_compile": {**(self.runner.compiled_decode.info if self.runner.compiled_decode else {"enabled": False}),
                              "steps": dict(self.runner.compiled_steps)},
        }

