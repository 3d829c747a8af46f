"""Tracing: run a program on placeholder arguments and record its IR instead of executing it.

The trace shows a program's structure (`print(f.trace())`) and its constant prefix: the
text every run starts with, before the first argument, generation or choice. `run_batch`
computes that prefix into the cache once, so each item starts with a cache hit.
Placeholders are strings, so f-strings and `+` work on them; a program that computes on
its arguments in other ways (parsing, indexing) may not trace, and then has no prefix.
"""

from __future__ import annotations

import os
import re
import traceback
from dataclasses import dataclass, field
from typing import Any

from sgl.lang import ir
from sgl.lang.backends.base import Backend
from sgl.lang.building import BranchGroup, StateBuilder

_MARK = "\x00"
_PLACEHOLDER = re.compile(r"\x00(arg|var):([^\x00]*)\x00")


class _Placeholder(str):
    """An argument (or variable) value during tracing: marked text."""

    def __new__(cls, kind: str, name: str) -> _Placeholder:
        return super().__new__(cls, f"{_MARK}{kind}:{name}{_MARK}")


def _split_text(text: str) -> list[ir.Expr]:
    out: list[ir.Expr] = []
    pos = 0
    for m in _PLACEHOLDER.finditer(text):
        if m.start() > pos:
            out.append(ir.Text(text[pos : m.start()]))
        out.append(ir.Argument(m.group(2)) if m.group(1) == "arg" else ir.Variable(m.group(2)))
        pos = m.end()
    if pos < len(text):
        out.append(ir.Text(text[pos:]))
    return out


@dataclass
class TraceGraph:
    """The recorded IR of one program run on placeholders."""

    name: str
    nodes: list[ir.Expr] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"program {self.name}:"]

        def walk(nodes: list[ir.Expr], depth: int) -> None:
            for n in nodes:
                lines.append("  " * depth + repr(n))
                if isinstance(n, ir.Fork):
                    for i, branch in enumerate(n.branches):
                        lines.append("  " * (depth + 1) + f"branch {i}:")
                        walk(branch, depth + 2)

        walk(self.nodes, 1)
        return "\n".join(lines)


class TracingState(StateBuilder):
    """Stands in for ProgramState while tracing: records instead of running. With `strict`
    (a `StaticCheck`, when tracing to ship a program), a variable read is a `GeneratedValue`
    that refuses every use but being added to the program text, and reading the state's text,
    messages or meta info is refused: the program's structure must not depend on them."""

    def __init__(
        self,
        nodes: list[ir.Expr],
        strict: StaticCheck | None = None,
        path: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self.nodes = nodes
        self.strict = strict
        self.path = path  # (fork_id, branch) pairs from the root state to this one

    def _add(self, expr: ir.Expr) -> None:
        for e in ir.flatten(expr):
            if isinstance(e, ir.Text):
                self.nodes.extend(self._split(e.text))
            elif isinstance(e, GeneratedValue):
                self.nodes.append(e.added_to(self.path))
            else:
                self.nodes.append(e)

    def _split(self, text: str) -> list[ir.Expr]:
        if self.strict is None:
            return _split_text(text)
        return [
            self.strict.resolve(e.name).added_to(self.path) if isinstance(e, ir.Variable) else e
            for e in _split_text(text)
        ]

    def fork(self, size: int = 1) -> TracingGroup:
        fork_id = self.strict.new_fork_id() if self.strict is not None else 0
        fork = ir.Fork([[] for _ in range(size)], fork_id)
        self.nodes.append(fork)
        return TracingGroup(
            [
                TracingState(b, self.strict, self.path + ((fork_id, i),))
                for i, b in enumerate(fork.branches)
            ],
            self,
        )

    def get_var(self, name: str) -> Any:
        if self.strict is not None:
            return self.strict.read(name, self.path)
        return _Placeholder("var", name)

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def _refuse(self, what: str) -> None:
        if self.strict is not None:
            raise DynamicProgramError(f"the program reads {what} while it runs", _user_line())

    def __contains__(self, name: str) -> bool:
        self._refuse(f"whether variable {name!r} is set")
        return True

    def get_meta_info(self, name: str) -> dict[str, Any]:
        self._refuse(f"the meta info of {name!r}")
        return {}

    def text(self) -> str:
        self._refuse("the state's text")
        return "".join(n.text if isinstance(n, ir.Text) else "" for n in self.nodes)

    def messages(self) -> list[dict[str, str]]:
        self._refuse("the state's messages")
        return []

    def sync(self) -> TracingState:
        return self


class TracingGroup(BranchGroup):
    def join(self, mode: str = "gather_variable") -> None:
        self.parent.nodes.append(ir.Join(mode))


# ---------------------------------------------------------------------- static programs


class DynamicProgramError(ValueError):
    """The program's structure depends on what the model generates (it compares, converts or
    otherwise reads a generated value, or the state's text): it cannot run as a shipped IR."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(f"{message} ({where}): it cannot be shipped as a static program")
        self.where = where


def _user_line() -> str:
    """file:line of the innermost frame outside sgl.lang: where the program did it."""
    here = os.path.dirname(os.path.abspath(__file__))
    for frame in reversed(traceback.extract_stack()):
        if not os.path.abspath(frame.filename).startswith(here):
            return f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"
    return "unknown line"


class GeneratedValue(ir.Variable):
    """What `s["v"]` gives while tracing a program to ship: the IR node of the value, usable
    only as text added to the program (`+`, f-strings, `s += v`). Any other use (compare,
    test, convert, index, call a method, str()) raises DynamicProgramError naming the line;
    a value read but never added (given to a tool, say) is caught at the end of the trace."""

    def __init__(self, name: str, path: tuple, marker: str, where: str) -> None:
        super().__init__(name, None)
        self.path, self.marker, self.where, self.flowed = path, marker, where, False

    def added_to(self, path: tuple) -> ir.Variable:
        """The plain IR node, as added to the state at `path`: read from that state (or an
        ancestor it inherited the value from) or, else, from the state it was read in."""
        self.flowed = True
        own = path[: len(self.path)] == self.path
        return ir.Variable(self.name, None if own else self.path)

    def _dynamic(self, what: str) -> Any:
        raise DynamicProgramError(
            f"the program {what} the generated value {self.name!r}", _user_line()
        )

    def __format__(self, spec: str) -> str:
        if spec:
            self._dynamic(f"formats (with {spec!r})")
        return self.marker

    def __eq__(self, other: Any) -> bool:
        return self._dynamic("compares")

    def __ne__(self, other: Any) -> bool:
        return self._dynamic("compares")

    __lt__ = __le__ = __gt__ = __ge__ = __ne__
    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return self._dynamic("tests")

    def __len__(self) -> int:
        return self._dynamic("measures")

    def __iter__(self) -> Any:
        return self._dynamic("iterates over")

    def __contains__(self, item: Any) -> bool:
        return self._dynamic("searches")

    def __getitem__(self, key: Any) -> Any:
        return self._dynamic("indexes")

    def __int__(self) -> int:
        return self._dynamic("converts")

    __float__ = __index__ = __int__

    def __str__(self) -> str:
        return self._dynamic("converts (str())")

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return self._dynamic(f"calls .{attr}() on")


class StaticCheck:
    """The bookkeeping of one strict trace: fork ids and every generated value read."""

    def __init__(self) -> None:
        self.values: dict[str, GeneratedValue] = {}
        self.forks = 0

    def new_fork_id(self) -> int:
        self.forks += 1
        return self.forks

    def read(self, name: str, path: tuple) -> GeneratedValue:
        key = str(len(self.values))
        value = GeneratedValue(name, path, f"{_MARK}var:{key}{_MARK}", _user_line())
        self.values[key] = value
        return value

    def resolve(self, key: str) -> GeneratedValue:
        return self.values[key]

    def check_all_added(self) -> None:
        for value in self.values.values():
            if not value.flowed:
                raise DynamicProgramError(
                    f"the generated value {value.name!r} is read but never added to the "
                    "program's text (it is used some other way)",
                    value.where,
                )


def trace_static(function: Any, args: tuple, kwargs: dict[str, Any]) -> list[ir.Expr]:
    """The IR of `function` run on these arguments, if its structure cannot depend on what
    the model generates; else DynamicProgramError (from any error the trace meets, too)."""
    nodes: list[ir.Expr] = []
    check = StaticCheck()
    try:
        returned = function.func(
            TracingState(nodes, check), *args, **{**function.bind_arguments, **kwargs}
        )
    except DynamicProgramError:
        raise
    except Exception as e:
        raise DynamicProgramError(
            f"tracing the program raised {type(e).__name__}: {e}", _user_line()
        ) from e
    if returned is not None:
        raise DynamicProgramError(
            "the program returns a value, which only running it on the client gives",
            function.func.__name__,
        )
    check.check_all_added()
    return nodes


def trace_program(function: Any, arguments: dict[str, Any]) -> TraceGraph:
    """Trace `function` (an SglFunction); arguments not given are placeholders."""
    graph = TraceGraph(function.func.__name__)
    values = {name: _Placeholder("arg", name) for name in function.arg_names}
    values.update(function.bind_arguments)
    values.update(arguments)
    function.func(TracingState(graph.nodes), **values)
    return graph


def constant_prefix(function: Any, backend: Backend) -> str:
    """The text every run of `function` starts with (as the backend renders roles); "" if the
    program does not trace."""
    try:
        graph = trace_program(function, {})
    except Exception:
        return ""
    template = None
    text, roles_seen = [], 0
    for node in graph.nodes:
        if isinstance(node, ir.Text):
            text.append(node.text)
        elif isinstance(node, (ir.RoleBegin, ir.RoleEnd)):
            template = template or backend.chat_template()
            if isinstance(node, ir.RoleBegin):
                text.append(template.role_prefix(node.role, first=roles_seen == 0))
                roles_seen += 1
            else:
                text.append(template.role_suffix(node.role))
        elif isinstance(node, (ir.VarScopeBegin, ir.VarScopeEnd)):
            continue
        else:
            break
    return "".join(text)
