"""Tracing: run a program on placeholder arguments and record its IR instead of executing it.

The trace shows a program's structure (`print(f.trace())`) and its constant prefix: the
text every run starts with, before the first argument, generation or choice. `run_batch`
computes that prefix into the cache once, so each item starts with a cache hit.
Placeholders are strings, so f-strings and `+` work on them; a program that computes on
its arguments in other ways (parsing, indexing) may not trace, and then has no prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sgl.lang import ir
from sgl.lang.backends.base import Backend
from sgl.lang.building import BranchGroup, StateBuilder

_MARK = "\x00"
_PLACEHOLDER = re.compile(r"\x00(arg|var):([^\x00]*)\x00")


class _Placeholder(str):
    """An argument (or variable) value during tracing: marked text."""

    def __new__(cls, kind: str, name: str) -> "_Placeholder":
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
    """Stands in for ProgramState while tracing: records instead of running."""

    def __init__(self, nodes: list[ir.Expr]) -> None:
        self.nodes = nodes

    def _add(self, expr: ir.Expr) -> None:
        for e in ir.flatten(expr):
            if isinstance(e, ir.Text):
                self.nodes.extend(_split_text(e.text))
            else:
                self.nodes.append(e)

    def fork(self, size: int = 1) -> "TracingGroup":
        fork = ir.Fork([[] for _ in range(size)])
        self.nodes.append(fork)
        return TracingGroup([TracingState(b) for b in fork.branches], self)

    def get_var(self, name: str) -> Any:
        return _Placeholder("var", name)

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def get_meta_info(self, name: str) -> dict[str, Any]:
        return {}

    def text(self) -> str:
        return "".join(n.text if isinstance(n, ir.Text) else "" for n in self.nodes)

    def messages(self) -> list[dict[str, str]]:
        return []

    def sync(self) -> "TracingState":
        return self


class TracingGroup(BranchGroup):
    def join(self, mode: str = "gather_variable") -> None:
        self.parent.nodes.append(ir.Join(mode))


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
