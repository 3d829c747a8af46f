"""`POST /run_program`: a static program's IR (`sgl.lang.ir_json`) run on the server's
engine with the same interpreter as in process, in one round trip.

Body: `{"program": IR}` or `{"programs": [IR, ...]}` (a batch, run concurrently), `"arguments"`
(values of `argument` nodes; one object, or one per program; a list with one program is the
batch form: that program once per argument set, concurrently), `"sampling"` (the run's
defaults, as `f.run(temperature=...)` takes them) and `"stream"` (one program: SSE events
`{"var", "text"}` as pieces are produced, with `"branch"` for the text of fork branches, then
`{"result": ...}`). A result is
`{"text", "messages", "variables", "meta_info", "usage"}` (`usage`: the program's gens'
calls, prompt and completion tokens); in a batch, a failed program's is `{"error": {...}}`.
Malformed IR is a 400 naming the node path; every gen's sampling is checked as /generate checks it,
before anything runs. A client that disconnects cancels the
program: its states' sessions are closed, which aborts their running generations.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Union

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sgl.lang import ir
from sgl.lang.backends.engine import EngineBackend
from sgl.lang.interpreter import ProgramError, run_program
from sgl.lang.ir_json import IRFormatError, program_from_json
from sgl.lang.shipping import leading_text, replay, shared_prefix
from sgl.runtime.errors import InvalidRequestError
from sgl.runtime.sampling import SamplingParams
from sgl.server.encoding import JSONBody
from sgl.server.errors import APIError, error_body, internal_error_body, refusal_headers
from sgl.server.protocol import (
    ErrorResponse,
    ProgramResult,
    ProgramResultEvent,
    ProgramTextEvent,
    RunProgramRequest,
    error_responses,
    sse_responses,
)
from sgl.server.state import get_state
from sgl.server.streaming import client_gone, sse, sse_response

router = APIRouter(tags=["programs"])
RESPONSES = {
    **sse_responses(
        ProgramTextEvent,
        ProgramResultEvent,
        ErrorResponse,
        description=(
            "One program's result, or a list in order for a batch (a failed program's item is an "
            "error body); "
            "with `stream: true`, server-sent events `{var, text}` as pieces are produced (`{var, "
            "text, branch}` "
            "for fork branches' text), then `{result}` (or `{error}`), then `[DONE]`."
        ),
    ),
    **error_responses(
        400,
        404,
        descriptions={
            404: "A session the program's generations ran in was closed under it (it timed out)."
        },
    ),
}
MAX_NODES = 20_000  # in one request, all programs and branches together
MAX_PROGRAMS = 1024
MAX_BRANCHES = 256  # of one fork: each branch is a state with its own worker
DISCONNECT_POLL_S = 0.5


class CancellableBackend(EngineBackend):
    """The engine backend of one request: `cancel()` closes every session its states opened
    (aborting their running generations) and makes every later call fail."""

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.cancelled = False
        self._sessions: set[str] = set()
        self._sessions_lock = threading.Lock()

    def _check(self) -> None:
        if self.cancelled:
            raise ProgramError("the program was cancelled (its client disconnected)")

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return super().generate(*args, **kwargs)

    def generate_stream(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return super().generate_stream(*args, **kwargs)

    def select(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return super().select(*args, **kwargs)

    def cache_prefix(self, text: str) -> None:
        self._check()
        super().cache_prefix(text)

    def open_session(self) -> str | None:
        self._check()
        sid = super().open_session()
        with self._sessions_lock:
            self._sessions.add(sid)
        return sid

    def close_session(self, session: str) -> None:
        with self._sessions_lock:
            self._sessions.discard(session)
        super().close_session(session)

    def cancel(self) -> None:
        self.cancelled = True
        with self._sessions_lock:
            sessions, self._sessions = list(self._sessions), set()
        for sid in sessions:
            self.engine.close_session(sid)


def _parse(req: RunProgramRequest) -> tuple[list[list[ir.Expr]], list[dict | None], dict[str, Any]]:
    """(each program's nodes, its arguments, the defaults), or APIError 400 naming the field."""
    if (req.program is None) == (req.programs is None):
        raise APIError(400, "give exactly one of program and programs", "program")
    if req.program is not None and isinstance(
        req.arguments, list
    ):  # the batch form: one program, many sets
        if len(req.arguments) > MAX_PROGRAMS:
            raise APIError(
                400,
                f"at most {MAX_PROGRAMS} argument sets per request; split the batch",
                "arguments",
            )
        raw, args = [req.program], req.arguments
    else:
        raw = [req.program] if req.program is not None else req.programs
        if len(raw) > MAX_PROGRAMS:
            raise APIError(
                400, f"at most {MAX_PROGRAMS} programs per request; split the batch", "programs"
            )
        args = req.arguments if isinstance(req.arguments, list) else [req.arguments] * len(raw)
        if len(args) != len(raw):
            raise APIError(
                400, f"arguments has {len(args)} entries for {len(raw)} programs", "arguments"
            )
    if req.stream and not _is_single(req):
        raise APIError(
            400,
            "stream takes one program and one argument set; send a batch without stream",
            "stream",
        )
    defaults = dict(req.sampling or {})
    unknown = sorted(set(defaults) - set(ir.SAMPLING_KEYS) - set(ir.LOGPROB_KEYS))
    if unknown:
        raise APIError(400, f"unknown sampling default {unknown[0]!r}", f"sampling.{unknown[0]}")
    programs = []
    for k, data in enumerate(raw):
        where = "program" if req.program is not None else f"programs[{k}]"
        try:
            programs.append(program_from_json(data))
        except IRFormatError as e:
            raise APIError(400, f"{where}.{e.path}: {e.detail}", f"{where}.{e.path}") from e
        _check_gens(programs[-1], defaults, f"{where}.nodes")
    label = "program" if req.program is not None else "programs[{}]"
    runs = (
        len(args) if req.program is not None else 1
    )  # the batch form runs its one program per set
    nodes = sum(_count(p, f"{label.format(k)}.nodes") for k, p in enumerate(programs))
    if nodes * runs > MAX_NODES:
        raise APIError(
            400,
            f"the programs have more than {MAX_NODES} nodes together; split the request",
            "programs",
        )
    return programs * runs, args, defaults


def _is_single(req: RunProgramRequest) -> bool:
    """One program run once: answered with one result (else a list, in order)."""
    return req.program is not None and not isinstance(req.arguments, list)


def _count(nodes: list[ir.Expr], path: str) -> int:
    """Nodes in the program, branches included; a fork wider than MAX_BRANCHES is a 400."""
    total = 0
    for i, n in enumerate(nodes):
        total += 1
        if isinstance(n, ir.Fork):
            if len(n.branches) > MAX_BRANCHES:
                raise APIError(
                    400,
                    f"a fork has at most {MAX_BRANCHES} branches, this one {len(n.branches)}",
                    f"{path}[{i}].branches",
                )
            total += sum(_count(b, f"{path}[{i}].branches[{k}]") for k, b in enumerate(n.branches))
    return total


def _check_gens(nodes: list[ir.Expr], defaults: dict[str, Any], path: str) -> None:
    """Each gen's sampling (over the defaults), validated as /generate would."""
    base = {k: v for k, v in defaults.items() if k in ir.SAMPLING_KEYS and v is not None}
    for i, n in enumerate(nodes):
        if isinstance(n, ir.Gen):
            try:
                SamplingParams.from_dict({**base, **n.sampling})
            except InvalidRequestError as e:
                raise APIError(
                    400, f"{path}[{i}]: {e.message}", f"{path}[{i}].sampling.{e.param}"
                ) from e
        elif isinstance(n, ir.Fork):
            for b, branch in enumerate(n.branches):
                _check_gens(branch, defaults, f"{path}[{i}].branches[{b}]")


def _result(state: Any) -> dict[str, Any]:
    ex = state.stream_executor
    return {
        "text": ex.text_,
        "messages": [dict(m) for m in ex.messages_],
        "variables": dict(ex.variables),
        "meta_info": dict(ex.meta_info),
    }


def _error_of(future: Any) -> dict[str, Any] | None:
    """A batch item's error body, or None if it ran."""
    e = future.exception()
    if e is None:
        return None
    if not isinstance(e, ProgramError):
        raise e
    return _error(e)


def _error(e: BaseException) -> dict[str, Any]:
    cause = e.__cause__ if isinstance(e, ProgramError) and e.__cause__ is not None else e
    if isinstance(cause, InvalidRequestError):
        return error_body(cause.status, cause.message, cause.param)
    if isinstance(e, ProgramError):
        return error_body(400, str(e))
    return internal_error_body(e, "/run_program")


@router.post(
    "/run_program",
    response_model=Union[ProgramResult, list[ProgramResult | ErrorResponse]],  # noqa: UP007 (runtime value)
    responses=RESPONSES,
)
async def run_program_endpoint(req: RunProgramRequest, request: Request) -> Response:
    """Run a shipped program (or a batch of them) on the server's engine; see the module doc."""
    programs, args, defaults = _parse(req)
    engine = get_state(request).engine
    backends = [
        CancellableBackend(engine) for _ in programs
    ]  # one per program: its usage, and cancel all

    def cancel() -> None:
        for b in backends:
            b.cancel()

    if req.stream:
        return sse_response(request, _stream(backends[0], programs[0], args[0], defaults), cancel)

    def run_one(k: int) -> dict[str, Any]:
        state = run_program(replay, backends[k], (programs[k], args[k]), {}, defaults)
        return {**_result(state), "usage": backends[k].token_usage.snapshot()}

    def run() -> Any:
        if _is_single(req):
            return run_one(0)
        if not programs:
            return []
        template = backends[
            0
        ].chat_template()  # the batch's shared opening, computed into the cache once
        prefix = shared_prefix([leading_text(p, template) for p in programs])
        if len(programs) > 1 and prefix:
            backends[0].cache_prefix(prefix)
        with ThreadPoolExecutor(
            max_workers=min(64, len(programs)), thread_name_prefix="sgl-run-program"
        ) as pool:
            futures = [pool.submit(run_one, k) for k in range(len(programs))]
        return [_error_of(f) or f.result() for f in futures]

    task = asyncio.ensure_future(asyncio.to_thread(run))
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            break
        if await request.is_disconnected():
            cancel()  # their generations abort, so the worker threads end soon
            return client_gone()
    try:
        return JSONBody(task.result())
    except ProgramError as e:
        body = _error(e)
        cause = e.__cause__
        headers = refusal_headers(cause) if isinstance(cause, InvalidRequestError) else None
        return JSONBody(body, status_code=body["error"]["code"], headers=headers)


async def _stream(
    backend: CancellableBackend,
    nodes: list[ir.Expr],
    arguments: dict | None,
    defaults: dict[str, Any],
) -> AsyncIterator[str]:
    """The program's text events as produced: the root state's `{var, text}` and its fork
    branches' `{var, text, branch}` (`branch`: per fork level [which fork of the parent state,
    which branch]), in the order they happen; then the result (or the error). Producers are
    the program's threads; they hand events to this loop, so waiting holds no thread."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    root_done: list[
        BaseException | None
    ] = []  # set (with the root's error or None) when its events end

    def put(item: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is going away
            loop.call_soon_threadsafe(events.put_nowait, item)

    def on_branch(path: tuple[tuple[int, int], ...], var: str | None, text: str) -> None:
        put({"var": var, "text": text, "branch": [list(level) for level in path]})

    state = await asyncio.to_thread(
        run_program, replay, backend, (nodes, arguments), {}, defaults, True, None, on_branch
    )

    def pump_root() -> None:
        error: BaseException | None = None
        try:
            for var, text, _meta in state.stream_executor.events():
                put({"var": var, "text": text})
        except BaseException as e:  # the program's error, raised at the end of its events
            error = e
        root_done.append(error)
        put(root_done)

    threading.Thread(target=pump_root, name="sgl-program-events", daemon=True).start()
    while (event := await events.get()) is not root_done:
        yield sse(event)
    try:
        if root_done[0] is not None:
            raise root_done[0]
        await asyncio.to_thread(state.sync)
    except ProgramError as e:
        yield sse(_error(e))
        return
    while not events.empty():  # branches of a fork never joined may end after the root's last text
        yield sse(events.get_nowait())
    yield sse({"result": {**_result(state), "usage": backend.token_usage.snapshot()}})
