"""`SchedulerControl`: the scheduler's answers to control messages, i.e. sessions (open, close,
expiry), the queries (flush, profile, info, live options, shutdown) and the load and stats it
reports. A mixin of `Scheduler`, apart from the loop and the request lifecycle (scheduler.py)
because none of it runs a batch: each handler reads or changes state and emits one `Reply`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sgl.runtime.attention import backend_name
from sgl.runtime.errors import InvalidRequestError
from sgl.runtime.messages import (
    LIVE_OPTIONS,
    CloseSession,
    FlushCache,
    GetInfo,
    OpenSession,
    Profile,
    Reply,
    Shutdown,
    UpdateOptions,
)
from sgl.runtime.request import Req

SESSION_EXPIRY_CHECK_S = 1.0


class SchedulerControl:
    """`Scheduler`'s control handlers (it provides the queues, KV, sessions, profiler, `emit`)."""

    # ------------------------------------------------------------------ sessions

    def _on_open_session(self, msg: OpenSession) -> None:
        self._reply(
            msg.reply_id,
            lambda: self.sessions.open(msg.capacity_tokens, msg.session_id, msg.timeout),
        )

    def _on_close_session(self, msg: CloseSession) -> None:
        """Its unfinished turns are aborted (as SGLang does) and its KV unpinned."""
        closed = self.sessions.close(msg.session_id)
        if closed:
            self._abort_where(
                lambda r: r.session_id == msg.session_id, "aborted: its session was closed"
            )
            self.kv.unpin_session(msg.session_id)
        if msg.reply_id is not None:
            self.emit(Reply(msg.reply_id, closed))

    def _expiring_sessions(self) -> list[str]:
        """Close sessions idle past their timeout (checked about once a second); their ids."""
        now = time.monotonic()
        if now < self._next_expiry_check:
            return []
        self._next_expiry_check = now + SESSION_EXPIRY_CHECK_S
        busy = {r.session_id for r in self._in_flight() if r.session_id is not None}
        return self.sessions.expire(busy, now)

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

    def _in_flight(self) -> list[Req]:
        return (
            self.batches.waiting + self.batches.running + [req for req, _ in self.grammars.pending]
        )

    def _on_flush(self, msg: FlushCache) -> None:
        """Refused (False) while requests are in flight."""
        busy = bool(self._in_flight())
        self.emit(Reply(msg.reply_id, False if busy else self.kv.flush()))

    def _on_profile(self, msg: Profile) -> None:
        if msg.options is None:
            self._reply(msg.reply_id, self.profiler.stop)
        else:
            self._reply(msg.reply_id, lambda: self.profiler.start(**msg.options))

    def _on_info(self, msg: GetInfo) -> None:
        self.emit(Reply(msg.reply_id, self.info()))

    def _on_update_options(self, msg: UpdateOptions) -> None:
        def update() -> dict[str, Any]:
            unknown = sorted(set(msg.values) - set(LIVE_OPTIONS))
            if unknown:
                raise InvalidRequestError(
                    f"options {unknown} cannot change while the engine runs; "
                    f"these can: {list(LIVE_OPTIONS)}",
                    unknown[0],
                )
            for name, value in msg.values.items():
                setattr(self.config.engine, name, value)
            return {name: getattr(self.config.engine, name) for name in LIVE_OPTIONS}

        self._reply(msg.reply_id, update)

    def _on_shutdown(self, msg: Shutdown) -> None:
        self._stop = True

    def load_tokens(self) -> int:
        """Tokens of work on this engine: the running requests' prompt and output so far, and the
        waiting requests' prompts (SGLang's `/get_load` `num_tokens`, read by the router)."""
        b = self.batches
        return sum(len(r.origin_input_ids) + len(r.output_ids) for r in b.running) + sum(
            len(r.origin_input_ids) for r in b.waiting
        )

    def info(self) -> dict[str, Any]:
        b = self.batches
        return {
            **self.kv.info(),
            "num_running_reqs": len(b.running),
            "num_waiting_reqs": len(b.waiting) + len(self.grammars),
            "num_load_tokens": self.load_tokens(),
            "num_compiling_reqs": len(self.grammars),
            "num_open_sessions": len(self.sessions),
            "new_token_ratio": b.new_token_ratio,
            "attention_backend": backend_name(self.runner.attn_backend),
            "cuda_graph_batch_sizes": self.runner.graph_runner.capture_sizes
            if self.runner.graph_runner
            else [],
            **self.stats,
            "cached_tokens": b.cached_tokens,
            "retractions": b.retractions,
            "jump_forward_tokens": self.output.jump_forward_tokens,
            "cuda_graph_steps": self.runner.cuda_graph_steps,
            "torch_compile": {
                **(
                    self.runner.compiled_decode.info
                    if self.runner.compiled_decode
                    else {"enabled": False}
                ),
                "steps": dict(self.runner.compiled_steps),
            },
            "speculative": self.spec.info() if self.spec else {"algorithm": None},
            # SGLang's place for it (its benchmarks read internal_states[0])
            "internal_states": [
                {"avg_spec_accept_length": self.spec.stats.as_dict()["avg_spec_accept_length"]}
                if self.spec
                else {}
            ],
        }
