"""Constraints compiled where they are used: beside the scheduler loop, never on it.

A request arrives with its constraint as a spec in its sampling params (regex text, a JSON
schema, EBNF, a structural tag). The scheduler hands it here: a cached grammar is ready at
once; otherwise it is compiled on this queue's worker thread while the loop keeps stepping,
and the request joins the waiting queue when its grammar is done (or finishes with the
`InvalidRequestError` naming the field). The compiler, built on first use from the
scheduler's own tokenizer, caches by spec, so one schema sent by many requests is compiled
once per scheduler.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from sgl.runtime.errors import InvalidRequestError
from sgl.runtime.request import Req
from sgl.runtime.request_builder import constraint_of

Compiled = tuple[Req, Any, InvalidRequestError | None]  # (request, grammar or None, error or None)


class GrammarQueue:
    def __init__(self, make_compiler: Callable[[], Any], wake: Callable[[], None]) -> None:
        self._make_compiler = make_compiler
        self._wake = (
            wake  # called (on the worker thread) when a compile finishes: the loop looks at `ready`
        )
        self._compiler: Any = None
        self._lock = threading.Lock()  # guards the compiler's construction (worker vs loop)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="sgl-grammar")
        self.pending: list[tuple[Req, Future]] = []

    def __len__(self) -> int:
        return len(self.pending)

    @property
    def compiler(self) -> Any:
        """The constraint compiler, None until the first constraint builds it (for test hooks)."""
        return self._compiler

    def submit(self, req: Req) -> None:
        """Start compiling `req`'s constraint; `ready` (or `take`) yields the request when it is
        compiled: in the same loop turn when there is none, it is cached, or the spec is bad."""
        constraint = constraint_of(req.sampling_params)
        if constraint is None:
            fut: Future = Future()
            fut.set_result(None)
        elif self._compiler is not None:
            try:
                fut = self._compiler.compile_async(*constraint)
            except Exception as e:
                fut = Future()
                fut.set_exception(e)
        # the first constraint: the compiler (vocabulary, index builder) is built off the loop
        else:
            fut = self._pool.submit(self._compile_first, constraint)
        self.pending.append((req, fut))
        if not fut.done():
            fut.add_done_callback(lambda _: self._wake())

    def ready(self) -> list[Compiled]:
        """The requests whose compile finished, in submission order."""
        if not self.pending or not any(fut.done() for _, fut in self.pending):
            return []
        done = [(req, fut) for req, fut in self.pending if fut.done()]
        self.pending = [(req, fut) for req, fut in self.pending if not fut.done()]
        return [self._result(req, fut) for req, fut in done]

    def take(self, rids: list[str]) -> list[Compiled]:
        """The requests `rids`, in that order, waiting for their compiles (a tensor-parallel rank
        starts what rank 0 started; its own compile of the same spec may finish a little later)."""
        by_rid = {req.rid: (req, fut) for req, fut in self.pending}
        taken = [by_rid[rid] for rid in rids]
        self.pending = [(req, fut) for req, fut in self.pending if req.rid not in set(rids)]
        return [self._result(req, fut) for req, fut in taken]

    def remove(self, match: Callable[[Req], bool]) -> list[Req]:
        """Take the still-compiling requests that `match` (aborted, failed): their compile
        goes on to the cache, nobody waits for it."""
        taken = [req for req, _ in self.pending if match(req)]
        self.pending = [(req, fut) for req, fut in self.pending if not match(req)]
        return taken

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._compiler is not None:
            self._compiler.shutdown(wait=False)

    def _compile_first(self, constraint: tuple[str, Any]) -> Any:
        with self._lock:
            if self._compiler is None:
                self._compiler = self._make_compiler()
        return self._compiler.compile(*constraint)

    @staticmethod
    def _result(req: Req, fut: Future) -> Compiled:
        error = fut.exception()  # waits for a compile still running (`take` only)
        if error is not None:
            return req, None, _as_request_error(error)
        return req, fut.result(), None


def _as_request_error(error: BaseException) -> InvalidRequestError:
    """A compile failure as the request's error: a bad constraint names its field; anything
    else (a bug in a compiler) is reported without its internals."""
    from sgl.constrained.errors import GrammarError

    if isinstance(error, InvalidRequestError):
        return error
    if isinstance(error, GrammarError):
        return InvalidRequestError(str(error), param=error.param)
    return InvalidRequestError(
        f"the constraint could not be compiled ({type(error).__name__}: {error})"
    )
