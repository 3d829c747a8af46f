"""How `s` and fork groups build a program: shared by running states and the tracer.

A state only needs `_add(expr)`: executing it (interpreter) or recording it (tracer).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from sgl.lang import ir


class StateBuilder(ABC):
    """`s += ...`, `s.set_var`, roles (`s.user(expr)` or `with s.user():`) and `s.var_scope`."""

    @abstractmethod
    def _add(self, expr: ir.Expr) -> None:
        """Execute (a running state) or record (the tracer) one expression."""

    def __iadd__(self, other: Any):
        self._add(ir.to_expr(other))
        return self

    def set_var(self, name: str, value: Any) -> None:
        self._add(ir.SetVar(name, value))

    def __setitem__(self, name: str, value: Any) -> None:
        """`s["x"] = v` is `s.set_var("x", v)` (in order with the other expressions; SGLang
        programs write it this way)."""
        self.set_var(name, value)

    @contextlib.contextmanager
    def role(self, role: str) -> Iterator[None]:
        self._add(ir.RoleBegin(role))
        try:
            yield
        finally:
            self._add(ir.RoleEnd(role))

    def system(self, expr: Any = None):
        return self._role_or_block("system", expr)

    def user(self, expr: Any = None):
        return self._role_or_block("user", expr)

    def assistant(self, expr: Any = None):
        return self._role_or_block("assistant", expr)

    def _role_or_block(self, role: str, expr: Any):
        if expr is None:
            return self.role(role)
        self._add(ir.ExprList([ir.RoleBegin(role), ir.to_expr(expr), ir.RoleEnd(role)]))
        return None

    @contextlib.contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        self._add(ir.VarScopeBegin(name))
        try:
            yield
        finally:
            self._add(ir.VarScopeEnd(name))


class BranchGroup:
    """The branches of `s.fork(n)`: indexing, iteration, and `forks += expr | lambda i: expr`."""

    def __init__(self, states: list, parent: Any) -> None:
        self.states = states
        self.parent = parent

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, i: int):
        return self.states[i]

    def __setitem__(self, i: int, state: Any) -> None:  # `forks[i] += ...` stores back
        if state is not self.states[i]:
            raise TypeError(
                "fork branches cannot be replaced; add text to them with forks[i] += ..."
            )

    def __iter__(self) -> Iterator:
        return iter(self.states)

    def __iadd__(self, other: Any):
        """`forks += expr` adds to every branch; `forks += lambda i: expr` adds expr(i) to branch
        i."""
        for i, s in enumerate(self.states):
            s += other(i) if callable(other) else other
        return self
