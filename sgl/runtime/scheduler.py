"""The scheduler loop: messages in, next batch, forward, results out.

One thread owns every piece of mutable engine state: the KV memory and prefix cache
(kv_manager.py), the queues (batch.py), the model runner (model_runner.py), per-token
output state (output.py), the sessions (session.py) and the constraints being compiled
(grammar_queue.py). Callers reach it only through typed messages (messages.py) in `inbox`,
put there by a transport (transport.py); it answers only through `emit`, once per loop
turn, with the list of outputs that turn made. Each turn: drain the inbox, admit requests
whose constraint compiled, expire idle sessions, build the next batch, run it, and turn the
sampled tokens into events. A step that raises is a fault: it is logged under an incident
id, every request in flight fails with it (their KV returned), an `EngineFaulted` goes out
and later requests are refused: the state a failed step leaves is not trusted, so the
process that owns the engine is expected to drain and restart it (the server does), not to
go on serving.

This module is the loop and the request lifecycle (submit, admit, step, sample, finish); the
answers to control messages (sessions, queries, info and stats) are scheduler_control.py.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from sgl.runtime.batch import BatchBuilder, BatchItem
from sgl.runtime.config import SchedulerConfig
from sgl.runtime.cpu_share import CpuShare
from sgl.runtime.errors import EngineFault, InvalidRequestError, new_incident_id
from sgl.runtime.grammar_queue import GrammarQueue
from sgl.runtime.kv_manager import KVManager
from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool
from sgl.runtime.messages import (
    AbortRequest,
    CloseSession,
    EngineFaulted,
    FinishReason,
    FlushCache,
    GetInfo,
    OpenSession,
    Profile,
    Reply,
    SchedulerMessage,
    SchedulerOutput,
    Shutdown,
    SubmitRequest,
    UpdateOptions,
)
from sgl.runtime.model_runner import ModelRunner, Sampled, StepInput
from sgl.runtime.output import OutputProcessor, TokenOutput
from sgl.runtime.profiler import StepProfiler
from sgl.runtime.rank_sync import RankGroup, SingleRank, Turn
from sgl.runtime.request import Req
from sgl.runtime.request_builder import check_fit
from sgl.runtime.scheduler_control import SchedulerControl
from sgl.runtime.session import SessionRegistry
from sgl.runtime.speculative import Speculator, cost_rationing, expand_rows

logger = logging.getLogger(__name__)


class _Wake:
    """An inbox message that only ends a blocking wait (a constraint finished compiling)."""


class Scheduler(SchedulerControl):
    """The engine's one owner of mutable state, driven by `run` (see the module docstring).

    Its size (~370 lines, the loop and the request lifecycle: admit, step, sample and commit,
    finish, fault) is one concern; sessions, queries and info live in `SchedulerControl`,
    batch building in `batch.py`, KV in `kv_manager.py`, per-token work in `output.py`,
    drafting and acceptance in `speculative/`."""

    def __init__(
        self,
        config: SchedulerConfig,
        runner: ModelRunner,
        tokenizer: Any,
        eos_token_ids: list[int],
        emit: Callable[[list[SchedulerOutput]], None],
        ranks: SingleRank | RankGroup | None = None,
        draft_model: Any = None,
    ) -> None:
        self.config = config
        self.ranks = (
            ranks or SingleRank()
        )  # tensor parallel: rank 0 decides, the others follow (rank_sync.py)
        self.runner = runner
        self._send_outputs = emit
        self._outputs: list[SchedulerOutput] = []
        self.eos_token_ids = sorted(set(eos_token_ids))
        mc = runner.model.config
        pool = TokenToKVPool(
            config.max_total_tokens,
            mc.num_hidden_layers,
            runner.num_kv_heads,
            mc.head_dim,
            config.dtype,
            config.device,
        )
        table = ReqToTokenPool(
            config.engine.max_running_requests + runner.padding_rows,
            config.max_context_len + 1,
            config.device,
        )
        runner.bind(pool, table)
        self.sessions = SessionRegistry(config.max_context_len)
        self.kv = KVManager(pool, table, not config.engine.disable_radix_cache, self.sessions)
        self.batches = BatchBuilder(config, self.kv)
        self.output = OutputProcessor(
            tokenizer,
            self.eos_token_ids,
            self.kv,
            lambda: not config.engine.disable_jump_forward,
        )
        self.tokenizer = tokenizer
        self.stats = {
            "forward_steps": 0,
            "decode_tokens": 0,
            "prefill_tokens": 0,
            "finished_requests": 0,
        }
        self.inbox: queue.Queue[SchedulerMessage | _Wake] = queue.Queue()
        self.grammars = GrammarQueue(
            lambda: make_grammar_compiler(
                config.engine, tokenizer, mc.vocab_size, self.eos_token_ids
            ),
            lambda: self.inbox.put(_Wake()),
        )
        self._next_expiry_check = 0.0
        self._stop = False
        self._thread: threading.Thread | None = None
        self._fault: EngineFault | None = (
            None  # the first step failure; then every new request is refused
        )
        self._handlers: dict[type, Callable[[Any], None]] = {
            SubmitRequest: self._on_submit,
            AbortRequest: self._on_abort,
            OpenSession: self._on_open_session,
            CloseSession: self._on_close_session,
            FlushCache: self._on_flush,
            GetInfo: self._on_info,
            Profile: self._on_profile,
            UpdateOptions: self._on_update_options,
            Shutdown: self._on_shutdown,
            _Wake: lambda msg: None,
        }
        self.profiler = StepProfiler()
        spec = config.engine.speculative_algorithm  # STANDALONE: `draft_model` drafts
        self.spec = (
            Speculator(
                config.engine.draft_length(),
                tokenizer,
                draft_model,
                self.kv.cache,
                measure_cost=cost_rationing(config.engine.tp_size),
            )
            if spec
            else None
        )

    # ------------------------------------------------------------------ the loop

    def start(self) -> None:
        """Run the loop on a thread of this process (thread mode); `run` is the loop itself."""
        self._thread = threading.Thread(target=self.run, name="sgl-scheduler", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def emit(self, out: SchedulerOutput) -> None:
        """Queue an output; the turn's outputs go to the callers together (`_flush`)."""
        self._outputs.append(out)

    def _flush(self) -> None:
        if self._outputs:
            outputs, self._outputs = self._outputs, []
            self._send_outputs(outputs)

    def run(self) -> None:
        if self.config.device.type == "cuda" and self.config.device.index is not None:
            torch.cuda.set_device(
                self.config.device
            )  # this thread's kernels and graph replays go there
        cpu_share = CpuShare.for_this_thread() if self.config.device.type == "cpu" else None
        while not self._stop:
            if cpu_share is not None:
                cpu_share.tick()
            try:
                self._take_messages()
                if self._stop:
                    break
                self._admit_and_expire()
                # this turn's replies (a session opened, info) do not wait for the step
                self._flush()
                self.step()
            except (
                Exception
            ) as e:  # the loop survives to answer every caller, but the engine is done
                self._on_fault(e)
            self._flush()
        self._fail_all(RuntimeError("engine shut down"))
        self._refuse_late_messages()
        self.grammars.shutdown()
        self._flush()

    def _on_fault(self, error: Exception) -> None:
        incident = new_incident_id()
        logger.error(
            "incident %s: scheduler step failed; the engine refuses new requests",
            incident,
            exc_info=error,
        )
        fault = EngineFault(incident)
        fault.__cause__ = error
        if self._fault is None:
            self._fault = fault
            self.emit(EngineFaulted(incident))
        self._fail_all(fault)
        if not isinstance(
            self.ranks, SingleRank
        ):  # ranks may be out of step (or gone): this one stops
            self._stop = True

    def _refuse_late_messages(self) -> None:
        """Messages that arrived after the last drain: every request and query still gets an
        answer."""
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

    def _take_messages(self) -> None:
        """Handle what arrived since the last turn (rank 0's inbox, on every rank). An idle
        loop waits for a message up to half a second (then looks at session expiry)."""
        messages: list[Any] = []
        if self.ranks.is_leader:
            block = not (self.batches.waiting or self.batches.running)
            while True:
                try:
                    msg = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
                except queue.Empty:
                    break
                block = False
                if not isinstance(msg, _Wake):
                    messages.append(msg)
        else:  # only wake-ups arrive here (this rank's own compiles): nothing waits on them
            while not self.inbox.empty():
                self.inbox.get_nowait()
        for msg in self.ranks.share_turn(Turn(messages=messages)).messages:
            self._handlers[type(msg)](msg)

    def _admit_and_expire(self) -> None:
        """Requests whose constraint compiled join the queue (or fail with its error), and idle
        sessions expire: rank 0 decides which, the other ranks do the same."""
        if self.ranks.is_leader:
            compiled = self.grammars.ready()
            expired = self._expiring_sessions()
            self.ranks.share_turn(
                Turn(
                    compiled=[(req.rid, error is None) for req, _, error in compiled],
                    expired_sessions=expired,
                )
            )
        else:
            turn = self.ranks.share_turn(None)
            compiled, expired = (
                self.grammars.take([rid for rid, _ in turn.compiled]),
                turn.expired_sessions,
            )
            if [error is None for _, _, error in compiled] != [ok for _, ok in turn.compiled]:
                raise RuntimeError(
                    "a constraint compiled on rank 0 failed on this rank (or the other way): "
                    "the ranks would run different batches"
                )
            for sid in expired:
                self.sessions.close(sid)
        for req, grammar, error in compiled:
            self._start(req, grammar, error)
        for sid in expired:
            self.kv.unpin_session(sid)

    def step(self) -> bool:
        """Build and run one batch; False when there was nothing to run."""
        if self.spec is not None:  # drafts first: the batch reserves their KV slots
            self.spec.propose([r for r in self.batches.running if self.batches.is_generating(r)])
        items = self.batches.next_batch()
        if not items:
            return False
        starts = [it.req.kv_len for it in items]
        began = time.perf_counter()
        hidden = self.runner.forward(
            StepInput([it.req for it in items], [it.extend_len for it in items]), self.kv.step_slots
        )
        model_seconds = time.perf_counter() - began
        self.stats["forward_steps"] += 1
        self.stats["prefill_tokens"] += sum(it.extend_len for it in items if it.prefill)
        self.stats["decode_tokens"] += sum(1 for it in items if not it.prefill)
        self.output.input_logprobs(
            hidden,
            [(it.req, start, it.extend_len) for it, start in zip(items, starts)],
            self.runner.score,
        )
        model_seconds += self._sample(self.batches.advance(items), hidden)
        if self.spec is not None and not any(it.prefill for it in items):
            # the model's part of a step (forward, logits, draws), not the per-token output
            # work every token costs once however it is decoded
            self.spec.observe_step(sum(it.extend_len for it in items), model_seconds)
        if self.profiler.running:
            self.profiler.after_step()
        return True

    def _sample(self, ready: list[tuple[BatchItem, int]], hidden: torch.Tensor) -> float:
        """Draw the ready requests' tokens and commit them; returns the seconds the drawing
        took (logits and sampler)."""
        now = time.monotonic()
        for (
            it,
            _,
        ) in ready:  # max_new_tokens == 0: scoring only (e.g. select); finish without sampling
            if it.req.sampling_params.max_new_tokens == 0:
                self._finish(it.req, FinishReason.of_length(0))
        ready = [(it, row) for it, row in ready if it.req.sampling_params.max_new_tokens > 0]
        if not ready:
            return 0.0
        reqs = [it.req for it, _ in ready]
        rows = [row for _, row in ready]
        drafts = [r.draft_ids for r in reqs] if any(r.draft_ids for r in reqs) else None
        began = time.perf_counter()
        if self.ranks.is_leader:
            out = self.runner.sample(hidden, reqs, rows, self.eos_token_ids, drafts)
            self.ranks.share_tokens(out.token_ids)
        else:  # the logits are computed together (the LM head is split); the tokens are rank 0's
            self.runner.logits(hidden, expand_rows(rows, drafts) if drafts else rows)
            tokens = self.ranks.share_tokens(None)
            out = Sampled(tokens, None, [None] * len(tokens))
        seconds = time.perf_counter() - began
        at = 0
        for it, _ in ready:
            r = it.req
            picks = out.picks(at, len(r.draft_ids) + 1)
            at += len(picks)
            verified: list[int] = []
            if self.spec is not None and not it.prefill:  # a decode step: a verify step
                picks, verified = self.spec.verify(r, picks, self.kv)
            r.draft_ids = []
            self._commit(r, picks, verified, now)
        return seconds

    def _commit(self, r: Req, picks: list[tuple], verified: list[int], now: float) -> None:
        """Append the step's tokens to a request in order (one, or a verified draft's accepted
        tokens and the draw after them), until one ends it or a jump-forward appends forced
        text (the tokens after it were drawn for another sequence); then the K/V the request
        keeps is cut to the tokens it really has, and the events go out."""
        base, held = r.seq_len, len(r.output_ids)
        tokens: list[TokenOutput] = []
        for tid, lp, top in picks:
            token = self.output.process_token(r, tid, lp, top, now)
            tokens.append(token)
            if token.finish is not None or len(token.ids) != 1:  # ended, or forced text came
                break
        if verified:  # K/V of verified positions whose token the request did not keep goes
            new = r.output_ids[held:]
            kept = 0
            while kept < min(len(new), len(verified)) and new[kept] == verified[kept]:
                kept += 1
            # (forced text may repeat verified tokens; the newest token must still be fed)
            last = r.seq_len if tokens[-1].finish is not None else r.seq_len - 1
            self.kv.truncate(r, min(r.kv_len, base + kept, last))
        for token in tokens:
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
        if self._fault is not None:  # sent before the caller could see the fault
            self._finish(req, FinishReason.abort(f"engine error: {self._fault}"), error=self._fault)
            return
        if (
            request.session is not None
        ):  # prepend the continued turn, then check the whole prompt fits
            try:
                req.origin_input_ids = self.sessions.resolve(
                    request.session,
                    request.input_ids,
                    request.sampling_params.max_new_tokens or 0,
                    getattr(self.tokenizer, "bos_token_id", None),
                )
                check_fit(
                    req.origin_input_ids,
                    request.sampling_params,
                    request.logprobs,
                    self.config.max_context_len,
                    self.kv.pool.capacity,
                    self.config.engine.max_new_tokens_limit,
                )
            except InvalidRequestError as e:  # e.g. the session closed before this turn arrived
                self._finish(req, FinishReason.abort(e.message), error=e)
                return
        self.grammars.submit(req)  # started by `_admit_and_expire` when its constraint is compiled

    def _start(self, req: Req, grammar: Any, error: InvalidRequestError | None) -> None:
        """Queue a request whose constraint (if any) is compiled; a bad one ends it with its
        error."""
        if error is not None:
            self._finish(req, FinishReason.abort(error.message), error=error)
            return
        self.output.init_request(req, grammar)
        self.batches.waiting.append(req)

    def _on_abort(self, msg: AbortRequest) -> None:
        self._abort_where(lambda r: msg.rid in (r.rid, r.parent_rid), msg.message)

    def _abort_where(self, match: Callable[[Req], bool], message: str) -> None:
        for req in [
            r for r in self.batches.waiting + self.batches.running if match(r)
        ] + self.grammars.remove(match):
            self._finish(req, FinishReason.abort(message))

    def _finish(
        self,
        r: Req,
        reason: FinishReason,
        delta: TokenOutput | None = None,
        error: BaseException | None = None,
    ) -> None:
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
        for req in self.batches.fail_all() + self.grammars.remove(lambda r: True):
            req.finish = FinishReason.abort(f"engine error: {error}")
            self.stats["finished_requests"] += 1
            self.emit(self.output.final_event(req, None, error))


def make_grammar_compiler(
    cfg: Any, tokenizer: Any, vocab_size: int, eos_token_ids: list[int]
) -> Any:
    """The scheduler's constraint compiler: its vocabulary from the scheduler's tokenizer; the
    regex index built in a capped child process (`isolate`), under the engine's limits."""
    from sgl.constrained.compiler import GrammarCompiler
    from sgl.constrained.vocab import TokenVocabulary

    vocab = TokenVocabulary.from_tokenizer(
        tokenizer, vocab_size=vocab_size, eos_token_ids=eos_token_ids
    )
    return GrammarCompiler(
        vocab,
        isolate=True,
        compile_timeout_s=cfg.constraint_compile_timeout,
        compile_memory_bytes=int(cfg.constraint_compile_memory_gb * 2**30),
        backend=cfg.grammar_backend,
        tokenizer=tokenizer,
    )
