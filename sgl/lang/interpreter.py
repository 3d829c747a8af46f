"""Runs programs: `run_program` and `run_program_batch`, the entry points of the only code
that executes the IR.

Each program state has a `StreamExecutor` (executor.py; its gen and select calls are
generation.py) that executes its expressions, in order, on a worker thread; the program's
`s` is a `ProgramState` (program_state.py). `s += expr` only enqueues, so a program body
runs ahead of the model and forked branches (each with its own executor) generate
concurrently; reading a result (`s["v"]`, `s.text()`) waits for the expressions before it.
An error in an expression is recorded, the rest of that state's expressions are skipped, and
the error is raised to whoever waits on the state: `run` (or `sync`, `s["v"]`, `text()`, the
stream iterators). The names other modules import from here are re-exported.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from sgl.lang.backends.base import Backend
from sgl.lang.errors import ProgramError
from sgl.lang.executor import StreamExecutor
from sgl.lang.generation import DTYPE_REGEX, DTYPE_STOP, parsed_calls
from sgl.lang.program_state import ProgramState, ProgramStateGroup, iterate_in_thread

__all__ = [
    "DTYPE_REGEX",
    "DTYPE_STOP",
    "ProgramError",
    "ProgramState",
    "ProgramStateGroup",
    "StreamExecutor",
    "iterate_in_thread",
    "parsed_calls",
    "run_program",
    "run_program_batch",
]


def run_program(
    func: Callable[..., Any],
    backend: Backend,
    args: tuple,
    kwargs: dict[str, Any],
    defaults: dict[str, Any],
    stream: bool = False,
    spec_tokens: int | None = None,
    branch_listener: Callable[[tuple[tuple[int, int], ...], str | None, str], None] | None = None,
) -> ProgramState:
    """Run one program. Without stream, waits and raises the program's error; with stream,
    runs the body on a thread and returns at once (errors surface when the state is read;
    `branch_listener` gets the text of fork branches as it is produced)."""
    state = ProgramState(StreamExecutor(backend, defaults, stream=stream, spec_tokens=spec_tokens))
    state.stream_executor.branch_listener = branch_listener

    def body() -> None:
        try:
            state.ret_value = func(state, *args, **kwargs)
        except BaseException as e:
            state.stream_executor.fail(e)
            raise
        finally:
            state.stream_executor.end()

    if stream:

        def quiet_body() -> None:
            with contextlib.suppress(BaseException):
                body()

        body_thread = threading.Thread(target=quiet_body, name="sgl-program-body", daemon=True)
        state.stream_executor.body_thread = body_thread
        body_thread.start()
        return state
    try:
        body()
    except ProgramError:
        raise
    except BaseException:
        state.stream_executor.sync_quietly()
        raise
    state.sync()
    return state


def run_program_batch(
    func: Callable[..., Any],
    backend: Backend,
    batch: list[tuple[tuple, dict[str, Any]]],
    defaults: dict[str, Any],
    num_threads: int | str = "auto",
    progress_bar: bool = False,
    spec_tokens: int | None = None,
) -> list[ProgramState]:
    """Run the program once per (args, kwargs) item on a thread pool; results in input order.

    A failing item does not stop the others: its state records the error (`state.error`)
    and raises it when read.
    """
    if num_threads == "auto":
        num_threads = max(1, min(64, len(batch)))
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive integer or 'auto', got {num_threads!r}")

    def one(item: tuple[tuple, dict[str, Any]]) -> ProgramState:
        args, kwargs = item
        state = ProgramState(StreamExecutor(backend, defaults, spec_tokens=spec_tokens))
        try:
            state.ret_value = func(state, *args, **kwargs)
        except BaseException as e:
            state.stream_executor.fail(e)
        state.stream_executor.end()
        state.stream_executor.sync_quietly()
        return state

    bar = None
    if progress_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(batch), desc="run_batch")
    results: list[ProgramState | None] = [None] * len(batch)
    with ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="sgl-run-batch") as pool:
        futures = {pool.submit(one, item): i for i, item in enumerate(batch)}
        for fut in as_completed(futures):
            results[futures[fut]] = fut.result()
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return results  # type: ignore[return-value]
