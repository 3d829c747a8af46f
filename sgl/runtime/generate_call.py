"""`GenerateCall`: one generate call on its way through the engine, apart from `Engine` because
sync and async callers (and streams) drive the same object: its requests' rids, the results
that came back, and what to abort when the caller stops waiting."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sgl.runtime.errors import InvalidRequestError
from sgl.runtime.messages import GenerateRequest, ReqEvent, SubmitRequest
from sgl.runtime.request_builder import constraint_of
from sgl.runtime.results import event_to_dict

if TYPE_CHECKING:
    from sgl.runtime.engine import Engine


class GenerateCall:
    """One generate call on its way: its requests' rids, what has come back, and what to
    abort if the caller stops waiting. Sync and async callers drive the same object."""

    def __init__(self, engine: Engine, reqs: list[GenerateRequest], is_batch: bool) -> None:
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
        return any(
            r.session is not None or constraint_of(r.sampling_params) is not None for r in self.reqs
        )

    def output(self) -> dict | list[dict]:
        return self.results if self.is_batch else self.results[0]  # type: ignore[return-value]

    def abort_rest(self) -> None:
        """The caller stopped waiting (error, cancellation, an abandoned stream): free the rest."""
        rest, self.pending = list(self.pending), set()
        self.engine._router.unregister(rest)
        for rid in rest:
            self.engine.abort(rid)
