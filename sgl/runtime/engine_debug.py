"""`EngineDebugHooks`: the engine's documented test hooks, one surface through which tests
observe queue depths and hold or fail a chosen step, instead of reaching into private
attributes of the engine, its scheduler or its model runner. When those internals move, the
hooks follow and the tests do not change. Not for production use: wrapping a step replaces a
method of a live object, and the scheduler's counts are read from another thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


def _compiler(engine: Any) -> Any:
    compiler = engine.debug_scheduler().grammars.compiler
    if compiler is None:
        raise RuntimeError("no constraint compiler yet: the first constrained request builds it")
    return compiler


# What `debug_wrap` can intercept: name -> (the object that owns it, the attribute wrapped).
_WRAP_POINTS: dict[str, Callable[[Any], tuple[Any, str]]] = {
    "send": lambda engine: (engine, "_send"),
    "build_requests": lambda engine: (engine, "_build_requests"),
    "step": lambda engine: (engine.debug_scheduler(), "step"),
    "forward": lambda engine: (engine.debug_scheduler().runner, "forward"),
    "compile_async": lambda engine: (_compiler(engine), "compile_async"),
}


class EngineDebugHooks:
    """`Engine`'s test hooks (it provides `_router`, `scheduler` and the wrapped methods)."""

    def debug_scheduler(self) -> Any:
        """Test hook: the scheduler object, in thread mode only (with `scheduler_process=True` it
        lives in another process and cannot be inspected)."""
        if self.scheduler is None:
            raise RuntimeError(
                "the scheduler runs in another process (scheduler_process=True or tp_size > 1): "
                "only the thread mode's scheduler can be inspected"
            )
        return self.scheduler

    def debug_state(self) -> dict[str, int]:
        """Test hook: counts as they are now, without a query through the scheduler's loop.

        `in_flight`: requests this engine registered and that have not finished (what
        `max_in_flight` caps). Thread mode adds the scheduler's `waiting` and `running` queues,
        `inbox` (messages not taken yet) and `req_to_token_rows` (the request-to-token table's
        rows; the KV pool's size is `get_server_info()["max_total_tokens"]`)."""
        state = {"in_flight": self._router.in_flight()}
        if self.scheduler is not None:
            s = self.scheduler
            state.update(
                waiting=len(s.batches.waiting),
                running=len(s.batches.running),
                inbox=s.inbox.qsize(),
                req_to_token_rows=s.kv.req_to_token.size,
            )
        return state

    @contextlib.contextmanager
    def debug_wrap(
        self, point: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> Iterator[None]:
        """Test hook: while the block runs, `point` is replaced by `wrap(original)`.

        Points: "send" (each message to the scheduler, on the caller's thread), "build_requests"
        (turning a generate call's inputs into requests), and in thread mode "step" (one
        scheduler batch step, `() -> bool`), "forward" (the model runner's forward pass, whose
        first argument has the batch's `reqs`) and "compile_async" (the scheduler's constraint
        compiler, built by the first constrained request)."""
        if point not in _WRAP_POINTS:
            raise ValueError(
                f"unknown debug_wrap point {point!r}; the points are {sorted(_WRAP_POINTS)}"
            )
        owner, name = _WRAP_POINTS[point](self)
        had_own = name in vars(owner)
        original = getattr(owner, name)
        setattr(owner, name, wrap(original))
        try:
            yield
        finally:
            if had_own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
