"""Caller-side delivery of what the scheduler emits.

The transport's delivery thread calls `ResultRouter.deliver` with each `ReqEvent` or `Reply`;
the router hands it to the sink registered for that request id (or the waiter of that reply
id) and tells the finish listeners (e.g. server metrics) about every finished request,
including those whose caller has gone. Sinks are thread-safe queues.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from sgl.runtime.errors import EngineOverloadedError
from sgl.runtime.messages import FinishReason, Reply, ReqEvent, RequestStats, SchedulerOutput

logger = logging.getLogger(__name__)


class ResultSink(Protocol):
    def put(self, event: ReqEvent) -> None: ...


class QueueSink:
    """Delivers events to a thread blocked on `get`."""

    def __init__(self) -> None:
        self.queue: queue.Queue[ReqEvent] = queue.Queue()

    def put(self, event: ReqEvent) -> None:
        self.queue.put(event)

    def get(self, timeout: float | None = None) -> ReqEvent:
        return self.queue.get(timeout=timeout)


class AsyncSink:
    """Delivers events into an asyncio queue owned by the caller's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[ReqEvent] = asyncio.Queue()

    def put(self, event: ReqEvent) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the caller's loop is gone; nobody is listening
            pass

    async def get(self) -> ReqEvent:
        return await self.queue.get()


class ResultRouter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sinks: dict[str, ResultSink] = {}
        self._replies: dict[str, Future] = {}
        self._finish_listeners: list[Callable[[ReqEvent], None]] = []

    def register(self, rids: list[str], sink: ResultSink, max_in_flight: int | None = None) -> None:
        """Route `rids`' events to `sink`; EngineOverloadedError (nothing registered) when that
        would make more than `max_in_flight` requests whose callers are waiting."""
        with self._lock:
            if max_in_flight is not None and len(self._sinks) + len(rids) > max_in_flight:
                raise EngineOverloadedError(
                    f"the server is at capacity ({len(self._sinks)} requests in flight, at most "
                    f"{max_in_flight}); "
                    "retry later"
                )
            for rid in rids:
                self._sinks[rid] = sink

    def in_flight(self) -> int:
        """Requests whose callers are waiting for their final event."""
        return len(self._sinks)

    def unregister(self, rids: list[str]) -> None:
        with self._lock:
            for rid in rids:
                self._sinks.pop(rid, None)

    def expect_reply(self, reply_id: str) -> Future:
        fut: Future = Future()
        with self._lock:
            self._replies[reply_id] = fut
        return fut

    def add_finish_listener(self, fn: Callable[[ReqEvent], None]) -> None:
        with self._lock:
            self._finish_listeners.append(fn)

    def deliver(self, out: SchedulerOutput) -> None:
        if isinstance(out, Reply):
            with self._lock:
                fut = self._replies.pop(out.reply_id, None)
            if fut is not None and not fut.done():  # done: its waiter was cancelled
                fut.set_exception(out.error) if out.error is not None else fut.set_result(out.value)
            return
        if not out.finished:  # the hot path (a streamed token): one dict read, atomic under the GIL
            sink = self._sinks.get(out.rid)
            if sink is not None:
                sink.put(out)
            return
        with self._lock:
            sink = self._sinks.pop(out.rid, None)
            listeners = list(self._finish_listeners)
        if sink is not None:
            sink.put(out)
        for fn in listeners:
            try:
                fn(out)
            except Exception:  # a listener's bug must not stop the delivery of other outputs
                logger.exception("finish listener failed")

    def fail_waiters(self, error: BaseException) -> None:
        """The scheduler is gone: no reply or event will come; wake everyone still waiting."""
        with self._lock:
            replies, self._replies = self._replies, {}
            sinks, self._sinks = self._sinks, {}
        for fut in replies.values():
            if not fut.done():
                fut.set_exception(error)
        for rid, sink in sinks.items():
            sink.put(
                ReqEvent(
                    rid, "", [], RequestStats(0, 0, 0, 0.0), FinishReason.abort(str(error)), error
                )
            )


LOGPROB_KEYS = (
    "input_token_logprobs",
    "input_top_logprobs",
    "output_token_logprobs",
    "output_top_logprobs",
)


def merge_logprobs(into: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """Append a streamed chunk's logprob entries (meta_info) to `into` (the entries so far);
    returns `into`. Concatenated in order they equal the non-streamed result's."""
    for key in LOGPROB_KEYS:
        if key in meta:
            into.setdefault(key, []).extend(meta[key])
    return into


def event_to_dict(event: ReqEvent, index: int | None = None) -> dict[str, Any]:
    """The public result shape: {"text", "output_ids", "meta_info"} (+ "index" in multi-streams)."""
    s = event.stats
    meta: dict[str, Any] = {
        "id": event.rid,
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "cached_tokens": s.cached_tokens,
        "finish_reason": event.finish.to_dict() if event.finish is not None else None,
        "e2e_latency": s.e2e_latency,
    }
    if s.ttft is not None:
        meta["ttft"] = s.ttft
    if s.num_retractions:
        meta["num_retractions"] = s.num_retractions
    if s.spec_verify_ct:  # as SGLang: tokens per verify step = completion_tokens / spec_verify_ct
        meta["spec_verify_ct"] = s.spec_verify_ct
        meta["spec_accept_length"] = s.completion_tokens / s.spec_verify_ct
        meta["spec_draft_tokens"] = s.spec_draft_tokens
        meta["spec_accepted_tokens"] = s.spec_accepted_tokens
    if (
        event.logprob_top_n is not None
    ):  # asked for: this event's entries (streamed: its own tokens')
        if event.input_token_logprobs is not None:  # the request's first event
            meta["input_token_logprobs"] = event.input_token_logprobs
            if event.input_top_logprobs is not None:
                meta["input_top_logprobs"] = event.input_top_logprobs
        meta["output_token_logprobs"] = event.output_token_logprobs
        if event.logprob_top_n > 0:
            meta["output_top_logprobs"] = event.output_top_logprobs
    out: dict[str, Any] = {"text": event.text, "output_ids": event.output_ids, "meta_info": meta}
    if index is not None:
        out["index"] = index
    return out
