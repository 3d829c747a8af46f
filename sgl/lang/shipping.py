"""Static programs shipped to the server whole: one round trip per program (or per batch).

Client side, `SglFunction.run` / `run_batch` with a backend that can run programs
(`RuntimeEndpoint.run_program`) trace the program on its real arguments in strict mode
(`tracer.trace_static`): a program whose structure depends on generated values (it compares,
converts, tests or otherwise reads one, or reads the state's text) raises
DynamicProgramError and, under `ship="auto"`, runs client-side as before. The IR goes out
as JSON (`ir_json`); the result comes back as a `ShippedState`, read like a ProgramState.

Server side, `replay` runs the IR with the same interpreter on the server's engine: each
node is added to the state as the program added it, forks and joins included, and a
variable node adds that variable's value (from the branch it was read in).

The cache plan: a batch's shared opening (`leading_text` of each program) is computed into
the prefix cache once before its items start, as `run_batch` does in process. A fork's
branches are submitted together and the scheduler admits one request per uncached shared
prefix per step, so the fork's prefix is computed once and the other branches hit the
cache a step later. A separate prefill request at the fork point would cost a forward step
in which no branch advances (measured: 18 steps instead of 17 and 4-7% slower for a 4-way
fork over a 220-token document), so the fork point issues none.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from sgl.lang import ir
from sgl.lang.errors import ProgramError
from sgl.lang.program_state import iterate_in_thread


def replay(
    s: Any,
    nodes: list[ir.Expr],
    arguments: dict[str, str] | None = None,
    states: dict[tuple, Any] | None = None,
    path: tuple = (),
) -> None:
    """Add `nodes` to the running state `s` (at `path` in the fork tree), as the traced
    program did."""
    states = {} if states is None else states
    states[path] = s
    group = None
    for node in nodes:
        if isinstance(node, ir.Fork):
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
                raise ProgramError(
                    f"variable {node.name!r} is read from fork branch {node.source}, which the "
                    "program has not created"
                )
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


def batch_template(
    function: Any, items: list[tuple[tuple, dict[str, Any]]], programs: list[dict[str, Any]]
) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """One program and an argument set per item, for a batch whose items differ only in the
    text their arguments add; None when they differ otherwise (`programs` are the items'
    own IR JSON, traced on their real arguments).

    The program is traced once more with the arguments that vary as placeholders. That trace
    is used only if, with each item's values put in (as the server renders them), it equals
    the item's own trace: a program that tests, converts or formats an argument, or makes
    its structure depend on one, fails that check instead of being trusted."""
    from sgl.lang.ir_json import IRFormatError, program_to_json
    from sgl.lang.tracer import DynamicProgramError, _Placeholder, trace_static

    named = [_named_arguments(function, a, k) for a, k in items]
    if any(n is None for n in named) or len({tuple(sorted(n)) for n in named}) != 1:
        return None
    varying = sorted(k for k in named[0] if any(_differs(n[k], named[0][k]) for n in named))
    if not all(_is_scalar(n[k]) for n in named for k in varying):
        return None
    placeholders = {**named[0], **{k: _Placeholder("arg", k) for k in varying}}
    try:
        template = program_to_json(trace_static(function, (), placeholders))
    except (DynamicProgramError, IRFormatError):
        return None
    arguments = [{k: n[k] for k in varying} for n in named]
    for args, own in zip(arguments, programs):
        if _merged(_substituted(template["nodes"], args)) != _merged(own["nodes"]):
            return None
    return template, arguments


def _named_arguments(function: Any, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    if len(args) > len(function.arg_names):
        return None
    named = dict(zip(function.arg_names, args))
    return None if set(named) & set(kwargs) else {**named, **kwargs}


def _differs(a: Any, b: Any) -> bool:
    try:
        return bool(a != b)
    except Exception:  # values without a plain comparison (arrays, say) count as varying
        return True


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def _substituted(nodes: list[dict[str, Any]], arguments: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for n in nodes:
        if n["type"] == "argument" and n["name"] in arguments:
            out.append({"type": "text", "text": _text_of(arguments[n["name"]], n["name"])})
        elif n["type"] == "fork":
            out.append({**n, "branches": [_substituted(b, arguments) for b in n["branches"]]})
        else:
            out.append(n)
    return out


def _merged(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adjacent text nodes as one (the state's text is the same either way); no empty ones."""
    out: list[dict[str, Any]] = []
    for n in nodes:
        if n["type"] == "fork":
            n = {**n, "branches": [_merged(b) for b in n["branches"]]}
        if n["type"] == "text":
            if not n["text"]:
                continue
            if out and out[-1]["type"] == "text" and set(out[-1]) == set(n) == {"type", "text"}:
                out[-1] = {"type": "text", "text": out[-1]["text"] + n["text"]}
                continue
        out.append(n)
    return out


def _text_of(value: Any, name: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ProgramError(
        f"variable {name!r} holds a {type(value).__name__}, which cannot be added as text"
    )


class ShippedState:
    """The result of a program run on the server, read like a ProgramState: `s["v"]`,
    `get_meta_info`, `text()`, `messages()`, `text_iter` (streamed: as the server sends
    events). `error` holds what stopped it, raised when the state is read."""

    def __init__(
        self, events: Iterator[dict[str, Any]] | None = None, result: dict[str, Any] | None = None
    ) -> None:
        self.ret_value = None
        self.error: BaseException | None = None
        self._result = result
        self._pieces: list[tuple[str | None, str]] = []
        self._done = threading.Event()
        self._cond = threading.Condition()
        if result is not None:
            self._done.set()
        else:
            threading.Thread(
                target=self._consume, args=(events,), name="sgl-shipped-stream", daemon=True
            ).start()

    def _consume(self, events: Iterator[dict[str, Any]]) -> None:
        try:
            for event in events:
                if "result" in event:
                    self._result = event["result"]
                elif "branch" not in event:  # text_iter is the root state's text, as in process
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

    def sync(self) -> ShippedState:
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

    def __setitem__(self, name: str, value: Any) -> None:
        """Set a variable on the finished state (SGLang's `state["x"] = int(state["x"])`)."""
        self.sync()._result["variables"][name] = value

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
        return SimpleNamespace(
            variables=r["variables"],
            meta_info=r["meta_info"],
            text_=r["text"],
            messages_=r["messages"],
        )

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        i = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda i=i: i < len(self._pieces) or self._done.is_set())
                if i >= len(self._pieces):
                    break
                var, piece = self._pieces[i]
            i += 1
            if var_name is None or var == var_name:
                yield piece
        if self._result is not None and not self._pieces:  # not streamed: the whole value once
            yield self.get_var(var_name) if var_name is not None else self._result["text"]
        self.sync()

    async def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
    ) -> Any:
        """`text_iter` for asyncio; with `return_meta_data`, (piece, None): a shipped stream
        carries text only (the meta info comes with the result)."""
        async for piece in iterate_in_thread(self.text_iter(var_name)):
            yield (piece, None) if return_meta_data else piece

    def __repr__(self) -> str:
        state = "running" if not self._done.is_set() else "failed" if self.error else "done"
        return f"ShippedState({state})"
