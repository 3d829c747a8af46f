"""Static programs shipped to the server whole: one round trip per program (or per batch).

Client side, `SglFunction.run` / `run_batch` with a backend that can run programs
(`RuntimeEndpoint.run_program`) trace the program on its real arguments in strict mode
(`tracer.trace_static`): a program whose structure depends on generated values (it compares,
converts, tests or otherwise reads one, or reads the state's text) raises
DynamicProgramError and, under `ship="auto"`, runs client-side as before. The IR goes out
as JSON (`ir_json`); the result comes back as a `ShippedState`, read like a ProgramState.

Server side, `replay` runs the IR with the same interpreter on the server's engine: each
node is added to the state as the program added it, forks and joins included, and a
variable node adds that variable's value (from the branch it was read in). Before a fork
the state's text is computed into the prefix cache once (`cache_prefix`), so the branches
start from a cache hit: the IR's fork points are the cache plan.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any, Iterator

from sgl.lang import ir
from sgl.lang.interpreter import ProgramError, iterate_in_thread


def replay(s: Any, nodes: list[ir.Expr], arguments: dict[str, str] | None = None,
           states: dict[tuple, Any] | None = None, path: tuple = ()) -> None:
    """Add `nodes` to the running state `s` (at `path` in the fork tree), as the traced
    program did."""
    states = {} if states is None else states
    states[path] = s
    group = None
    for node in nodes:
        if isinstance(node, ir.Fork):
            s.stream_executor.backend.cache_prefix(s.text())  # the branches' shared prefix, computed once
            group = s.fork(len(node.branches))
            for i, branch in enumerate(node.branches):
                replay(group[i], branch, arguments, states, path + ((node.fork_id, i),))
        elif isinstance(node, ir.Join):
            if group is None:
                raise ProgramError("a join without a fork before it")
            group.join(node.mode)
        elif isinstance(node, ir.Variable):
            source = states.get(tuple(node.source)) if node.source else s
            if source is None:
                raise ProgramError(f"variable {node.name!r} is read from fork branch {node.source}, which the "
                                   "program has not created")
            s += _text_of(source[node.name], node.name)
        elif isinstance(node, ir.Argument):
            if arguments is None or node.name not in arguments:
                raise ProgramError(f"argument {node.name!r} has no value; give it in 'arguments'")
            s += _text_of(arguments[node.name], node.name)
        else:
            s += node


def leading_text(nodes: list[ir.Expr], template: Any) -> str:
    """The text a program starts with before its first gen, select, fork or variable (roles
    rendered with `template`, a ChatTemplate): what every run of it computes first."""
    out, roles_seen = [], 0
    for node in nodes:
        if isinstance(node, ir.Text):
            out.append(node.text)
        elif isinstance(node, ir.RoleBegin):
            out.append(template.role_prefix(node.role, first=roles_seen == 0))
            roles_seen += 1
        elif isinstance(node, ir.RoleEnd):
            out.append(template.role_suffix(node.role))
        elif not isinstance(node, (ir.VarScopeBegin, ir.VarScopeEnd)):
            break
    return "".join(out)


def shared_prefix(texts: list[str]) -> str:
    """The longest prefix all `texts` share."""
    if not texts:
        return ""
    lo, hi = min(texts), max(texts)
    n = 0
    while n < len(lo) and lo[n] == hi[n]:
        n += 1
    return lo[:n]


def _text_of(value: Any, name: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ProgramError(f"variable {name!r} holds a {type(value).__name__}, which cannot be added as text")


class ShippedState:
    """The result of a program run on the server, read like a ProgramState: `s["v"]`,
    `get_meta_info`, `text()`, `messages()`, `text_iter` (streamed: as the server sends
    events). `error` holds what stopped it, raised when the state is read."""

    def __init__(self, events: Iterator[dict[str, Any]] | None = None, result: dict[str, Any] | None = None) -> None:
        self.ret_value = None
        self.error: BaseException | None = None
        self._result = result
        self._pieces: list[tuple[str | None, str]] = []
        self._done = threading.Event()
        self._cond = threading.Condition()
        if result is not None:
            self._done.set()
        else:
            threading.Thread(target=self._consume, args=(events,), name="sgl-shipped-stream", daemon=True).start()

    def _consume(self, events: Iterator[dict[str, Any]]) -> None:
        try:
            for event in events:
                if "result" in event:
                    self._result = event["result"]
                else:
                    with self._cond:
                        self._pieces.append((event.get("var"), event.get("text", "")))
                        self._cond.notify_all()
            if self._result is None:
                raise ProgramError("the server's program stream ended without a result")
        except BaseException as e:  # the server's error event, or the connection
            self.error = e if isinstance(e, ProgramError) else ProgramError(str(e))
        finally:
            with self._cond:
                self._done.set()
                self._cond.notify_all()

    def sync(self) -> "ShippedState":
        self._done.wait()
        if self.error is not None:
            raise self.error
        return self

    def text(self) -> str:
        return self.sync()._result["text"]

    def messages(self) -> list[dict[str, str]]:
        return [dict(m) for m in self.sync()._result["messages"]]

    def get_var(self, name: str) -> Any:
        variables = self.sync()._result["variables"]
        if name not in variables:
            known = ", ".join(sorted(variables)) or "none"
            raise KeyError(f"no variable {name!r} in this program state (variables: {known})")
        return variables[name]

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def __contains__(self, name: str) -> bool:
        return name in self.sync()._result["variables"]

    def get_meta_info(self, name: str) -> dict[str, Any]:
        meta = self.sync()._result["meta_info"]
        if name not in meta:
            raise KeyError(f"no generation named {name!r} in this program state")
        return meta[name]

    @property
    def stream_executor(self) -> Any:
        """The result's fields under the interpreter's names (`variables`, `meta_info`,
        `text_`, `messages_`), for code that reads a ProgramState's executor."""
        r = self.sync()._result
        return SimpleNamespace(variables=r["variables"], meta_info=r["meta_info"], text_=r["text"],
                               messages_=r["messages"])

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        i = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: i < len(self._pieces) or self._done.is_set())
                if i >= len(self._pieces):
                    break
                var, piece = self._pieces[i]
            i += 1
            if var_name is None or var == var_name:
                yield piece
        if self._result is not None and not self._pieces:  # not streamed: the whole value once
            yield self.get_var(var_name) if var_name is not None else self._result["text"]
        self.sync()

    async def text_async_iter(self, var_name: str | None = None, return_meta_data: bool = False) -> Any:
        """`text_iter` for asyncio; with `return_meta_data`, (piece, None): a shipped stream
        carries text only (the meta info comes with the result)."""
        async for piece in iterate_in_thread(self.text_iter(var_name)):
            yield (piece, None) if return_meta_data else piece

    def __repr__(self) -> str:
        state = "running" if not self._done.is_set() else "failed" if self.error else "done"
        return f"ShippedState({state})"
