"""Runs programs: the only place that executes the IR.

Each program state has a `StreamExecutor` that executes its expressions, in order, on a
worker thread. `s += expr` only enqueues, so a program body runs ahead of the model and
forked branches (each with its own executor) generate concurrently; reading a result
(`s["v"]`, `s.text()`) waits for the expressions before it. An error in an expression is
recorded, the rest of that state's expressions are skipped, and the error is raised to
whoever waits on the state: `run` (or `sync`, `s["v"]`, `text()`, the stream iterators).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, AsyncIterator, Callable, Iterator

from sgl.lang import ir
from sgl.lang.backends.base import Backend
from sgl.lang.building import BranchGroup, StateBuilder
from sgl.lang.chat_template import ChatTemplate
from sgl.lang.choices import token_length_normalized
from sgl.lang.speculative import Speculation, speculable, speculative_meta
from sgl.tool_calls import get_parser

CONSTRAINTS = ("regex", "json_schema", "ebnf", "structural_tag")


def parsed_calls(text: str, tool_format: str) -> list[dict[str, Any]]:
    """A gen's tool calls as [{"name", "arguments": dict}] (the constraint made them valid)."""
    return [{"name": c.name, "arguments": json.loads(c.arguments)} for c in get_parser(tool_format).parse(text)[1]]


# dtype= of gen: the regex that constrains the output (bounded, so it always terminates). Numbers
# and strings are spelled as JSON spells them (no leading zeros, no "+", no control characters),
# so a program can write them into JSON; they are also Python literals.
DTYPE_REGEX = {
    "int": r"-?(0|[1-9][0-9]{0,17})[ \n]?",
    "float": r"-?(0|[1-9][0-9]{0,14})(\.[0-9]{1,15})?[ \n]?",
    "bool": r"(True|False)",
    "str": r'"[^"\\\x00-\x1f]{0,256}"',
}
# As SGLang does, a number may end at a space or newline: stop strings, so the value holds neither.
# A small model ends a number where it would write a separator far more readily than with EOS.
DTYPE_STOP = {"int": [" ", "\n"], "float": [" ", "\n"]}

logger = logging.getLogger(__name__)

_END = object()  # end of a state's expression stream


class ProgramError(RuntimeError):
    """A program failed; the original exception is the __cause__."""


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


class StreamExecutor:
    """Executes one state's expressions on its own thread and holds the state's results."""

    def __init__(
        self,
        backend: Backend,
        defaults: dict[str, Any],
        stream: bool = False,
        parent: "StreamExecutor | None" = None,
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
        self.assigned: dict[str, None] = {}  # variables this state set itself (ordered set), for join
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
        self.branch_listener: Callable[[tuple[tuple[int, int], ...], str | None, str], None] | None = (
            parent.branch_listener if parent else None)
        self.error: BaseException | None = None
        self._template: ChatTemplate | None = None
        self._queue: queue.Queue = queue.Queue()
        self._pending = 0
        self._cond = threading.Condition()
        self._closed = False
        # Stream events, (variable name or None, text piece), kept so that every reader
        # (text_iter of all text, of one variable, a second pass) sees all of them.
        self._events: list[tuple[str | None, str, dict | None]] = []  # (variable, text, its meta so far)
        self._events_done = False  # set when the state's expressions have all run
        self._events_cond = threading.Condition()
        self.body_thread: threading.Thread | None = None  # stream mode: runs the program body
        # The backend session pinning this state's KV: opened at the first generation,
        # closed when the state ends (None: not opened yet, or the backend has none).
        self._session: str | None = None
        self._session_asked = False
        self.finished = threading.Event()  # set when the worker is done with this state
        # A fork branch (parent given) takes the parent's text, variables and roles later, on
        # the parent's thread (`_ForkPoint`): reading them here would race its generations.
        _WORKERS.run(self._loop)

    def inherit(self, parent: "StreamExecutor") -> None:
        """Continue from the parent's state as it is now (a fork branch's start)."""
        self.spec, self.loose_text, self._template = parent.spec, parent.loose_text, parent._template
        self.text_, self.messages_ = parent.text_, [dict(m) for m in parent.messages_]
        self.variables, self.meta_info = dict(parent.variables), dict(parent.meta_info)
        self.role, self.role_start, self.roles_seen = parent.role, parent.role_start, parent.roles_seen
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
                if self.error is None or isinstance(expr, _ForkPoint):
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
        elif isinstance(expr, _ForkPoint):
            expr.reached(self)
        elif isinstance(expr, _Call):
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
            raise ProgramError(f"role {role!r} begins inside role {self.role!r}; end that role first")
        self._append(self.template.role_prefix(role, first=self.roles_seen == 0))
        self.roles_seen += 1
        self.role, self.role_start = role, len(self.text_)

    def _role_end(self, role: str) -> None:
        if self.role != role:
            raise ProgramError(f"role {role!r} ends but the open role is {self.role!r}")
        self.messages_.append({"role": role, "content": self.text_[self.role_start :]})
        self.role = None
        self._append(self.template.role_suffix(role))

    def _params(self, gen: ir.Gen) -> tuple[dict[str, Any], dict[str, Any]]:
        sampling = {k: v for k, v in self.defaults.items() if k in ir.SAMPLING_KEYS and v is not None}
        logprobs = {k: v for k, v in self.defaults.items() if k in ir.LOGPROB_KEYS and v is not None}
        sampling.update(gen.sampling)
        logprobs.update(gen.logprobs)
        if gen.dtype is not None:
            if any(sampling.get(k) is not None for k in CONSTRAINTS):
                raise ValueError(f"gen {gen.name!r}: dtype cannot be combined with regex, json_schema or ebnf")
            sampling["regex"] = DTYPE_REGEX[gen.dtype]
            if gen.dtype in DTYPE_STOP:
                stop = sampling.get("stop") or []
                sampling["stop"] = [*([stop] if isinstance(stop, str) else stop), *DTYPE_STOP[gen.dtype]]
        if sum(sampling.get(k) is not None for k in CONSTRAINTS) > 1:
            raise ValueError(f"gen {gen.name!r}: give at most one of regex, json_schema, ebnf and tools")
        if logprobs.get("return_logprob") and "logprob_start_len" not in logprobs:
            logprobs["logprob_start_len"] = -1  # output logprobs only, unless asked for the prompt's
        if not logprobs.get("return_logprob"):
            logprobs = {}
        return sampling, logprobs

    def _session_kwargs(self) -> dict[str, Any]:
        if not self._session_asked:
            self._session_asked = True
            try:
                self._session = self.backend.open_session()
            except Exception:  # sessions only pin the cache: run without one
                logger.warning("could not open a backend session; running without", exc_info=True)
        return {"session": self._session} if self._session is not None else {}

    def _close_session(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            try:
                self.backend.close_session(session)
            except Exception:  # the backend times it out anyway
                logger.warning("could not close backend session %s", session, exc_info=True)

    def _chat_messages(self, what: str) -> dict[str, Any]:
        """`messages=` for a backend that takes the conversation (a chat API), else nothing.

        A chat API writes a whole assistant message after the conversation, so the gen or
        select must open an assistant turn, and no text may lie outside the roles."""
        if not getattr(self.backend, "wants_messages", False):
            return {}
        if self.role != "assistant" or len(self.text_) != self.role_start:
            where = ("outside any role" if self.role is None else
                     f"inside a {self.role} turn" if self.role != "assistant" else
                     "after text already in the assistant turn")
            raise ProgramError(
                f"{what}: this backend is a chat model, which answers with a whole assistant message, so a gen or "
                f"select must be the first thing in an assistant turn (s += sgl.assistant(sgl.gen(...))); this one "
                f"is {where}. Move that text into the user turn, or use a completion model (is_chat_model=False).")
        if self.loose_text:
            raise ProgramError(
                f"{what}: this backend is a chat model and receives only the role messages, but the program added "
                f"text outside any role, which it would never see. Put that text inside sgl.system/user/assistant, "
                f"or use a completion model (is_chat_model=False).")
        return {"messages": [dict(m) for m in self.messages_]}

    def _gen(self, gen: ir.Gen) -> None:
        sampling, logprobs = self._params(gen)
        if self._speculative_gen(gen, sampling, logprobs):
            return
        try:
            text, meta = self._generate(gen, sampling, logprobs, self._session_kwargs())
        except ValueError as e:  # the backends' request errors name their field in `param`
            if self._session is None or getattr(e, "param", None) != "session_params.id":
                raise
            # The session is gone (it timed out while the program sat idle). It only pinned
            # the cache, so the state goes on without one; nothing was generated yet.
            self._session = None
            text, meta = self._generate(gen, sampling, logprobs, {})
        self.backend.record_usage(meta)
        logger.debug("gen %r: %r (%s prompt tokens, %s completion tokens)", gen.name, text[:80],
                     meta.get("prompt_tokens"), meta.get("completion_tokens"))
        if gen.tool_format is not None:  # the variable holds the calls: [{"name", "arguments"}]
            meta = {**meta, "tool_calls": parsed_calls(text, gen.tool_format)}
        if gen.name is not None:
            self.set_variable(gen.name, meta["tool_calls"] if gen.tool_format is not None else text)
            self.meta_info[gen.name] = meta

    def _generate(self, gen: ir.Gen, sampling: dict[str, Any], logprobs: dict[str, Any],
                  session: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Run one gen on the backend, appending its text (piece by piece when streaming)."""
        kwargs = {**session, **self._chat_messages(f"gen {gen.name!r}")}
        if not self.stream:
            text, meta = self.backend.generate(self.text_, sampling, logprobs, **kwargs)
            self._append(text, gen.name)
            return text, meta
        pieces = []
        meta: dict[str, Any] = {}
        for piece, m in self.backend.generate_stream(self.text_, sampling, logprobs, **kwargs):
            if m is not None:  # the meta info so far (completion tokens, logprobs), final on the last piece
                meta = m
            if piece:
                pieces.append(piece)
                self._append(piece, gen.name, meta)
        return "".join(pieces), meta

    def _select(self, sel: ir.Select) -> None:
        method = sel.choices_method or token_length_normalized
        decision = self.backend.select(self.text_, list(sel.choices), sel.temperature, method,
                                       **self._chat_messages(f"select {sel.name!r}"))
        self._append(decision.decision, sel.name)
        if sel.name is not None:
            self.set_variable(sel.name, decision.decision)
            self.meta_info[sel.name] = decision.meta_info

    def _speculative_gen(self, gen: ir.Gen, sampling: dict[str, Any], logprobs: dict[str, Any]) -> bool:
        """Fill the gen from the speculation, making one call for it first if there is none
        that fits; False (nothing done) where speculation does not apply or cannot be proven."""
        if not (self.spec_tokens and getattr(self.backend, "supports_speculation", False)) or self.stream \
                or logprobs or not speculable(sampling) or sampling.get("max_new_tokens") is None:
            return False
        filled = self.spec.take(sampling) if self.spec is not None else None
        call_meta: dict[str, Any] = {}
        if filled is None:
            wide = {**sampling, "max_new_tokens": max(sampling["max_new_tokens"], self.spec_tokens)}
            wide.pop("stop", None)
            text, call_meta = self.backend.generate(
                self.text_, wide, {"return_logprob": True, "top_logprobs_num": 0, "logprob_start_len": -1})
            self.spec = Speculation.from_result(text, call_meta, wide)
            if self.spec is None:  # the endpoint gave no token boundaries: stop speculating here
                self.spec_tokens = None
            filled = self.spec.take(sampling) if self.spec is not None else None
            if filled is None:  # this gen's own call decides
                return False
        text, meta = filled
        meta = ({**{k: call_meta.get(k) for k in ("id", "prompt_tokens", "cached_tokens")}, **meta} if call_meta
                else speculative_meta(meta))
        self._append(text, gen.name)
        if gen.name is not None:
            self.set_variable(gen.name, text)
            self.meta_info[gen.name] = meta
        return True

    # ------------------------------------------------------------------ streaming

    def events(self) -> Iterator[tuple[str | None, str, dict | None]]:
        i = 0
        while True:
            with self._events_cond:
                self._events_cond.wait_for(lambda: i < len(self._events) or self._events_done)
                if i >= len(self._events):  # done, and this reader has seen every event
                    break
                ev = self._events[i]
            i += 1
            yield ev
        self.raise_error()


async def iterate_in_thread(it: Iterator[Any]) -> AsyncIterator[Any]:
    """A blocking iterator's items for asyncio, each `next` on a worker thread."""
    done = object()
    while True:
        item = await asyncio.to_thread(next, it, done)
        if item is done:
            return
        yield item


class _Call(ir.Expr):
    """Run a function on the executor's thread, in order with the expressions (internal)."""

    def __init__(self, fn: Callable[[StreamExecutor], None]) -> None:
        self.fn = fn


class _ForkPoint(ir.Expr):
    """Where a fork's branches start, in the parent's stream (internal). The fork does not wait
    for the parent: the parent's thread, on reaching this point (after everything submitted
    before the fork), hands its state to the branches, whose threads wait for it. So a program
    can go on building (a second fork, the next branch's text) while a generation runs. Run
    even after the parent failed: the branches then take its error instead of hanging."""

    def __init__(self, branches: list[StreamExecutor]) -> None:
        self.branches = branches
        self._ready = threading.Event()
        for b in branches:
            b.submit(_Call(self._start))

    def reached(self, parent: StreamExecutor) -> None:
        for b in self.branches:
            b.inherit(parent)
            b.error = parent.error
        self._ready.set()

    def _start(self, branch: StreamExecutor) -> None:
        self._ready.wait()  # a failed parent's error is then the branch's: its expressions are skipped


class ProgramState(StateBuilder):
    """The `s` of a program: add expressions to it, read results from it."""

    def __init__(self, executor: StreamExecutor) -> None:
        self.stream_executor = executor
        self.ret_value: Any = None

    # -- building (StateBuilder: +=, set_var, roles, var_scope) ----------------------

    def _add(self, expr: ir.Expr) -> None:
        self.stream_executor.submit(expr)

    def set_var(self, name: str, value: Any) -> None:
        """In order with the program's expressions while it runs; on a state whose program has
        ended (the one `run()` returned) it sets the variable once the program has finished,
        without reopening it (SGLang's `state["x"] = int(state["x"])`): the text is unchanged."""
        ex = self.stream_executor
        if not ex.ended:
            super().set_var(name, value)
            return
        ex.sync()
        ex.set_variable(name, value)

    def fork(self, size: int = 1) -> "ProgramStateGroup":
        """Split into `size` branches that continue from the current text, concurrently."""
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"fork size must be a positive integer, got {size!r}")
        parent = self.stream_executor
        branches = [ProgramState(StreamExecutor(parent.backend, parent.defaults, parent.stream, parent=parent))
                    for _ in range(size)]
        for i, b in enumerate(branches):
            b.stream_executor.branch_path = parent.branch_path + ((parent.forks_made, i),)
        parent.submit(_ForkPoint([b.stream_executor for b in branches]))
        parent.forks_made += 1
        parent.children.extend(b.stream_executor for b in branches)
        return ProgramStateGroup(branches, self)

    # -- reading -------------------------------------------------------------------

    def sync(self) -> "ProgramState":
        self.stream_executor.sync()
        return self

    def text(self) -> str:
        self.sync()
        return self.stream_executor.text_

    def messages(self) -> list[dict[str, str]]:
        self.sync()
        return [dict(m) for m in self.stream_executor.messages_]

    def get_var(self, name: str) -> Any:
        self.sync()
        try:
            return self.stream_executor.variables[name]
        except KeyError:
            known = ", ".join(sorted(self.stream_executor.variables)) or "none"
            raise KeyError(f"no variable {name!r} in this program state (variables: {known})") from None

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self.stream_executor.variables

    def get_meta_info(self, name: str) -> dict[str, Any]:
        self.sync()
        if name not in self.stream_executor.meta_info:
            raise KeyError(f"no generation named {name!r} in this program state")
        return self.stream_executor.meta_info[name]

    @property
    def error(self) -> BaseException | None:
        """The exception that stopped this program, if any (does not wait)."""
        return self.stream_executor.error

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Text pieces as they are produced (all text, or only variable `var_name`'s).

        Without stream=True there are no pieces to wait for: yields the final text once.
        """
        for piece, _meta in self._pieces(var_name):
            yield piece

    def _pieces(self, var_name: str | None) -> Iterator[tuple[str, dict | None]]:
        """(text, meta info so far of the generation it came from, or None) as produced."""
        ex = self.stream_executor
        if not ex.stream:
            if var_name is None:
                yield self.text(), None
            else:
                yield self.get_var(var_name), self.stream_executor.meta_info.get(var_name)
            return
        for var, piece, meta in ex.events():
            if var_name is None or var == var_name:
                yield piece, _with_logprobs_length(meta)

    async def text_async_iter(self, var_name: str | None = None, return_meta_data: bool = False
                              ) -> AsyncIterator[Any]:
        """`text_iter` for asyncio. With `return_meta_data` (give `var_name`) each item is
        (text, meta): the generation's meta info so far (completion tokens, and logprobs when
        asked for, up to this piece); without streaming, the final value and meta once."""
        async for item in iterate_in_thread(self._pieces(var_name)):
            yield item if return_meta_data else item[0]

    def __repr__(self) -> str:
        ex = self.stream_executor
        return f"ProgramState(text={ex.text_[-60:]!r}, variables={sorted(ex.variables)})"


def _with_logprobs_length(meta: dict | None) -> dict | None:
    """SGLang's streamed meta also counts the output logprob entries so far."""
    if meta is None or "output_token_logprobs" not in meta or "output_token_logprobs_length" in meta:
        return meta
    return {**meta, "output_token_logprobs_length": len(meta["output_token_logprobs"])}


class ProgramStateGroup(BranchGroup):
    """The branches of `s.fork(n)`."""

    def join(self, mode: str = "gather_variable") -> None:
        """Bring every branch's results back to the parent once the branches are done (as SGLang
        does). It does not block the program body: the parent's stream waits, and reading the
        parent (a variable, its text) waits for the merge; a branch's error becomes the parent's.

        "gather_variable" (the default): every variable a branch set after the fork becomes,
        in the parent, the list of the branches' values in fork order; the parent's text is
        unchanged. "concate_and_append": each branch's new text is appended to the parent's,
        in fork order; variables stay in the branches (`forks[i]["v"]`).
        """
        if mode not in ("gather_variable", "concate_and_append"):
            raise ValueError(f"join mode must be 'gather_variable' or 'concate_and_append', got {mode!r}")
        for s in self.states:
            s.stream_executor.end()
        executors = [s.stream_executor for s in self.states]

        def merge(parent: StreamExecutor) -> None:
            # On the parent's thread, in order: the program body goes on building (the next
            # branch of an outer fork, say) while these branches run.
            for ex in executors:
                ex.sync_quietly()
            failed = next((ex.error for ex in executors if ex.error is not None), None)
            if failed is not None:
                raise failed  # the parent's error now: its later expressions are skipped
            # The variables some branch set after the fork (not those it inherited: a value
            # equal to, or even the same object as, the parent's still counts as set).
            if mode == "concate_and_append":
                for ex in executors:
                    parent.loose_text = parent.loose_text or ex.loose_text
                    parent._append(ex.text_[ex.fork_start :])
                return
            names: dict[str, None] = {}
            for ex in executors:
                names.update(ex.assigned)
            for k in names:
                parent.set_variable(k, [ex.variables.get(k) for ex in executors])
                if any(k in ex.meta_info for ex in executors):
                    parent.meta_info[k] = [ex.meta_info.get(k) for ex in executors]

        self.parent.stream_executor.submit(_Call(merge))


# ---------------------------------------------------------------------- running programs


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
