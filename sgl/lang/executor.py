"""`StreamExecutor`: executes one program state's expressions, in order, on a worker thread,
and holds the state's text, messages, variables and stream events. `s += expr` only enqueues
(so a program body runs ahead of the model and forked branches generate concurrently);
reading a result waits for the expressions before it. An error in an expression is recorded,
the rest of that state's expressions are skipped, and the error is raised to whoever waits.
How gen and select call the backend is generation.py; the user's `s` is program_state.py.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from sgl.lang import ir
from sgl.lang.backends.base import Backend
from sgl.lang.chat_template import ChatTemplate
from sgl.lang.errors import ProgramError
from sgl.lang.generation import GenerationMixin
from sgl.lang.speculative import Speculation

logger = logging.getLogger(__name__)

_END = object()  # end of a state's expression stream


class _WorkerPool:
    """Reusable daemon threads for executor loops, so a program run starts no thread (and a
    thread's first call into the engine, slower than later ones, is paid once). The pool
    grows to the peak number of live program states; idle threads wait for the next one."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], None]) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
        self._tasks.put(fn)
        if spawn:
            threading.Thread(target=self._work, name="sgl-program", daemon=True).start()

    def _work(self) -> None:
        while True:
            fn = self._tasks.get()
            try:
                fn()
            finally:
                with self._lock:
                    self._idle += 1


_WORKERS = _WorkerPool()


class StreamExecutor(GenerationMixin):
    """Executes one state's expressions on its own thread and holds the state's results; its
    gen and select (the calls to the backend) are `GenerationMixin`'s."""

    def __init__(
        self,
        backend: Backend,
        defaults: dict[str, Any],
        stream: bool = False,
        parent: StreamExecutor | None = None,
        spec_tokens: int | None = None,
    ) -> None:
        self.backend = backend
        self.defaults = defaults  # program-wide sampling and logprob defaults
        self.stream = stream
        # num_api_spec_tokens, for backends that speculate (completion APIs); see speculative.py
        self.spec_tokens = parent.spec_tokens if parent else spec_tokens
        self.spec: Speculation | None = None
        # Text added outside any role: a chat backend (wants_messages) would never see it.
        self.loose_text = False
        self.sid = uuid.uuid4().hex
        self.text_ = ""
        self.messages_: list[dict[str, str]] = []
        self.variables: dict[str, Any] = {}
        self.assigned: dict[
            str, None
        ] = {}  # variables this state set itself (ordered set), for join
        self.meta_info: dict[str, Any] = {}
        self.role: str | None = None
        self.role_start = 0
        self.roles_seen = 0
        self.scopes: dict[str, int] = {}
        self.fork_start = 0  # where this branch's own text starts
        self.children: list[StreamExecutor] = []  # fork branches: ended when this state ends
        # Where this state sits in the fork tree: per fork level, (which fork of the parent,
        # which branch of it); () for the root. A stream's branch events go to
        # `branch_listener(path, variable, text)` (the server streams them); set on the root.
        self.branch_path: tuple[tuple[int, int], ...] = ()
        self.forks_made = 0
        self.branch_listener: (
            Callable[[tuple[tuple[int, int], ...], str | None, str], None] | None
        ) = parent.branch_listener if parent else None
        self.error: BaseException | None = None
        self._template: ChatTemplate | None = None
        self._queue: queue.Queue = queue.Queue()
        self._pending = 0
        self._cond = threading.Condition()
        self._closed = False
        # Stream events, (variable name or None, text piece), kept so that every reader
        # (text_iter of all text, of one variable, a second pass) sees all of them.
        self._events: list[
            tuple[str | None, str, dict | None]
        ] = []  # (variable, text, its meta so far)
        self._events_done = False  # set when the state's expressions have all run
        self._events_cond = threading.Condition()
        self.body_thread: threading.Thread | None = None  # stream mode: runs the program body
        # The backend session pinning this state's KV: opened at the first generation,
        # closed when the state ends (None: not opened yet, or the backend has none).
        self._session: str | None = None
        self._session_asked = False
        self.finished = threading.Event()  # set when the worker is done with this state
        # A fork branch (parent given) takes the parent's text, variables and roles later, on
        # the parent's thread (`ForkPoint`): reading them here would race its generations.
        _WORKERS.run(self._loop)

    def inherit(self, parent: StreamExecutor) -> None:
        """Continue from the parent's state as it is now (a fork branch's start)."""
        self.spec, self.loose_text, self._template = (
            parent.spec,
            parent.loose_text,
            parent._template,
        )
        self.text_, self.messages_ = parent.text_, [dict(m) for m in parent.messages_]
        self.variables, self.meta_info = dict(parent.variables), dict(parent.meta_info)
        self.role, self.role_start, self.roles_seen = (
            parent.role,
            parent.role_start,
            parent.roles_seen,
        )
        self.scopes = dict(parent.scopes)
        self.fork_start = len(self.text_)

    # ------------------------------------------------------------------ submission

    def submit(self, expr: ir.Expr) -> None:
        if self._closed:
            raise ProgramError("this program state has ended; no more text can be added to it")
        with self._cond:
            self._pending += 1
        self._queue.put(expr)

    @property
    def ended(self) -> bool:
        """end() was called: no expression can be submitted any more."""
        return self._closed

    def end(self) -> None:
        """No more expressions: the stream iterators finish once the queue drains, and the
        worker threads (this state's and its unjoined fork branches') exit."""
        with self._cond:  # counted, so sync() after end() also waits for the session to close
            first = not self._closed
            if first:
                self._closed = True
                self._pending += 1
        if first:
            self._queue.put(_END)
        for child in self.children:
            child.end()

    def _wait_for_body(self) -> None:
        # A streamed program's body runs on its own thread: a reader outside it waits for
        # the body to finish, so it sees the whole program (and its errors), not a prefix.
        body = self.body_thread
        if body is not None and body is not threading.current_thread():
            body.join()

    def sync(self) -> None:
        """Wait until every submitted expression ran; raise the state's error, if any."""
        self._wait_for_body()
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0)
        self.raise_error()

    def sync_quietly(self) -> None:
        """Wait for the submitted expressions without raising (the error stays recorded)."""
        self._wait_for_body()
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0)

    def raise_error(self) -> None:
        if self.error is not None:
            raise ProgramError(f"program failed: {self.error}") from self.error

    def fail(self, error: BaseException) -> None:
        """Record an error raised outside the executor (e.g. in the program body)."""
        if self.error is None:
            self.error = error
        self.end()

    # ------------------------------------------------------------------ the worker

    def _loop(self) -> None:
        while True:
            expr = self._queue.get()
            if expr is _END:
                self._close_session()
                with self._events_cond:
                    self._events_done = True
                    self._events_cond.notify_all()
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()
                self.finished.set()
                return
            try:
                if self.error is None or isinstance(expr, ForkPoint):
                    self._execute(expr)
            except BaseException as e:  # recorded; the rest of this state's expressions are skipped
                self.error = e
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()

    def _execute(self, expr: ir.Expr) -> None:
        if isinstance(expr, ir.ExprList):
            for item in expr.items:
                self._execute(item)
        elif isinstance(expr, ir.Text):
            self.loose_text = self.loose_text or (self.role is None and bool(expr.text))
            self._append(expr.text)
        elif isinstance(expr, ir.Gen):
            self._gen(expr)
        elif isinstance(expr, ir.Select):
            self._select(expr)
        elif isinstance(expr, ir.RoleBegin):
            self._role_begin(expr.role)
        elif isinstance(expr, ir.RoleEnd):
            self._role_end(expr.role)
        elif isinstance(expr, ir.VarScopeBegin):
            self.scopes[expr.name] = len(self.text_)
        elif isinstance(expr, ir.VarScopeEnd):
            if expr.name not in self.scopes:
                raise ProgramError(f"var_scope {expr.name!r} ended but never began")
            self.set_variable(expr.name, self.text_[self.scopes.pop(expr.name) :])
        elif isinstance(expr, ir.SetVar):
            self.set_variable(expr.name, expr.value)
        elif isinstance(expr, ForkPoint):
            expr.reached(self)
        elif isinstance(expr, Call):
            expr.fn(self)
        else:
            raise TypeError(f"cannot execute {expr!r}")

    def set_variable(self, name: str, value: Any) -> None:
        self.variables[name] = value
        self.assigned[name] = None

    def _append(self, text: str, var: str | None = None, meta: dict | None = None) -> None:
        self.text_ += text
        if self.spec is not None:  # kept only while the program writes what the model wrote
            self.spec = self.spec.after(text)
        if self.stream:
            with self._events_cond:
                self._events.append((var, text, meta))
                self._events_cond.notify_all()
            if self.branch_path and self.branch_listener is not None:
                self.branch_listener(self.branch_path, var, text)

    @property
    def template(self) -> ChatTemplate:
        if self._template is None:
            self._template = self.backend.chat_template()
        return self._template

    def _role_begin(self, role: str) -> None:
        if self.role is not None:
            raise ProgramError(
                f"role {role!r} begins inside role {self.role!r}; end that role first"
            )
        self._append(self.template.role_prefix(role, first=self.roles_seen == 0))
        self.roles_seen += 1
        self.role, self.role_start = role, len(self.text_)

    def _role_end(self, role: str) -> None:
        if self.role != role:
            raise ProgramError(f"role {role!r} ends but the open role is {self.role!r}")
        self.messages_.append({"role": role, "content": self.text_[self.role_start :]})
        self.role = None
        self._append(self.template.role_suffix(role))

    # ------------------------------------------------------------------ streaming

    def events(self) -> Iterator[tuple[str | None, str, dict | None]]:
        i = 0
        while True:
            with self._events_cond:
                self._events_cond.wait_for(lambda i=i: i < len(self._events) or self._events_done)
                if i >= len(self._events):  # done, and this reader has seen every event
                    break
                ev = self._events[i]
            i += 1
            yield ev
        self.raise_error()


class Call(ir.Expr):
    """Run a function on the executor's thread, in order with the expressions (internal)."""

    def __init__(self, fn: Callable[[StreamExecutor], None]) -> None:
        self.fn = fn


class ForkPoint(ir.Expr):
    """Where a fork's branches start, in the parent's stream (internal). The fork does not wait
    for the parent: the parent's thread, on reaching this point (after everything submitted
    before the fork), hands its state to the branches, whose threads wait for it. So a program
    can go on building (a second fork, the next branch's text) while a generation runs. Run
    even after the parent failed: the branches then take its error instead of hanging."""

    def __init__(self, branches: list[StreamExecutor]) -> None:
        self.branches = branches
        self._ready = threading.Event()
        for b in branches:
            b.submit(Call(self._start))

    def reached(self, parent: StreamExecutor) -> None:
        for b in self.branches:
            b.inherit(parent)
            b.error = parent.error
        self._ready.set()

    def _start(self, branch: StreamExecutor) -> None:
        # a failed parent's error is then the branch's: its expressions are skipped
        self._ready.wait()
