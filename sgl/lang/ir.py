"""The program IR: plain data that `s += ...` appends and only the interpreter executes.

A program is a sequence of expressions added to a state: literal text, generation,
choice among strings, chat-role boundaries, variable scopes. Expressions concatenate with
`+` into an `ExprList`, so `s += "Q: " + q + sgl.gen("a")` is one statement.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from sgl.runtime.sampling.params import PARAMS

# SGLang's patterns for gens of a type (`sglang.lang.ir`), for programs that import them.
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

# Sampling parameters a program (run defaults) or a gen() call can set; names follow SGLang.
# (From the runtime's parameter table: the rows the DSL exposes.)
SAMPLING_KEYS = tuple(p.name for p in PARAMS if p.dsl is not None)
# Logprob options of a generation call (passed beside the sampling parameters).
LOGPROB_KEYS = (
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
)


class Expr:
    """Base of everything a program can add to a state."""

    def __repr__(self) -> str:  # the fields, positionally: `RoleBegin('user')`, `SetVar('v', 1)`
        return (
            f"{type(self).__name__}({', '.join(repr(getattr(self, f.name)) for f in fields(self))})"
        )

    def __add__(self, other: Any) -> ExprList:
        return ExprList([self, to_expr(other)])

    def __radd__(self, other: Any) -> ExprList:
        return ExprList([to_expr(other), self])


@dataclass(repr=False)
class ExprList(Expr):
    items: list[Expr] = field(default_factory=list)

    def __add__(self, other: Any) -> ExprList:
        return ExprList([*self.items, to_expr(other)])

    def __radd__(self, other: Any) -> ExprList:
        return ExprList([to_expr(other), *self.items])

    def __repr__(self) -> str:
        return " + ".join(repr(x) for x in self.items)


@dataclass(repr=False)
class Text(Expr):
    text: str


@dataclass(repr=False)
class Gen(Expr):
    """Generate text into variable `name` (None: text only).

    `sampling` holds only the parameters the call set; the program's defaults fill the rest.
    """

    name: str | None
    sampling: dict[str, Any] = field(default_factory=dict)
    logprobs: dict[str, Any] = field(default_factory=dict)
    dtype: str | None = None  # "int" | "float" | "bool" | "str": a regex constraint
    tool_format: str | None = (
        None  # with tools: the call format; the variable holds the parsed calls
    )

    def __repr__(self) -> str:
        args = [repr(self.name)] + [
            f"{k}={v!r}" for k, v in {**self.sampling, **self.logprobs}.items()
        ]
        if self.dtype:
            args.append(f"dtype={self.dtype}")
        if self.tool_format:
            args.append(f"tool_format={self.tool_format}")
        return f"Gen({', '.join(args)})"


@dataclass(repr=False)
class Select(Expr):
    """Pick one of `choices` by the model's likelihood and store it in `name`."""

    name: str | None
    choices: list[str]
    temperature: float = 0.0
    choices_method: Any = None  # a ChoicesMethod; None: token_length_normalized

    def __repr__(self) -> str:
        return f"Select({self.name!r}, {self.choices!r})"


@dataclass(repr=False)
class RoleBegin(Expr):
    role: str


@dataclass(repr=False)
class RoleEnd(Expr):
    role: str


@dataclass(repr=False)
class VarScopeBegin(Expr):
    name: str


@dataclass(repr=False)
class VarScopeEnd(Expr):
    name: str


@dataclass(repr=False)
class SetVar(Expr):
    name: str
    value: Any


@dataclass(repr=False)
class Fork(Expr):
    """Recorded by the tracer: the state split into `len(branches)` branches. `fork_id`
    (unique in the program) is how a Variable read from a branch names it."""

    branches: list[list[Expr]]
    fork_id: int = 0

    def __repr__(self) -> str:
        return f"Fork({len(self.branches)})"


@dataclass(repr=False)
class Join(Expr):
    """Recorded by the tracer: the branches of the last fork joined back."""

    mode: str


@dataclass(repr=False)
class Argument(Expr):
    """Recorded by the tracer: text that depends on the program argument `name`."""

    name: str


@dataclass(repr=False)
class Variable(Expr):
    """Recorded by the tracer: text that depends on variable `name`, read mid-program.
    `source` (fork_id, branch) when it was read from a fork branch other than the state it
    is added to (`forks[i]["v"]` added to the parent); None: the state's own variable."""

    name: str
    source: tuple[int, int] | None = None

    def __repr__(self) -> str:
        return (
            f"Variable({self.name!r})"
            if self.source is None
            else f"Variable({self.name!r}, {self.source!r})"
        )


def to_expr(x: Any) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, str):
        return Text(x)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return Text(str(x))
    raise TypeError(
        f"cannot add {type(x).__name__} to a program state: add a str, a number, or an sgl "
        "expression "
        "(sgl.gen, sgl.select, sgl.user(...), ...)"
    )


def flatten(expr: Expr) -> list[Expr]:
    if isinstance(expr, ExprList):
        out: list[Expr] = []
        for item in expr.items:
            out.extend(flatten(item))
        return out
    return [expr]
