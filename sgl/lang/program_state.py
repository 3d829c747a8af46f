"""The user's side of a running program: `ProgramState` (the `s` of a program: add
expressions, read results, fork) and `ProgramStateGroup` (a fork's branches and their join),
over a `StreamExecutor` (executor.py) that runs them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

from sgl.lang import ir
from sgl.lang.building import BranchGroup, StateBuilder
from sgl.lang.executor import Call, ForkPoint, StreamExecutor


async def iterate_in_thread(it: Iterator[Any]) -> AsyncIterator[Any]:
    """A blocking iterator's items for asyncio, each `next` on a worker thread."""
    done = object()
    while True:
        item = await asyncio.to_thread(next, it, done)
        if item is done:
            return
        yield item


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

    def fork(self, size: int = 1) -> ProgramStateGroup:
        """Split into `size` branches that continue from the current text, concurrently."""
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"fork size must be a positive integer, got {size!r}")
        parent = self.stream_executor
        branches = [
            ProgramState(
                StreamExecutor(parent.backend, parent.defaults, parent.stream, parent=parent)
            )
            for _ in range(size)
        ]
        for i, b in enumerate(branches):
            b.stream_executor.branch_path = parent.branch_path + ((parent.forks_made, i),)
        parent.submit(ForkPoint([b.stream_executor for b in branches]))
        parent.forks_made += 1
        parent.children.extend(b.stream_executor for b in branches)
        return ProgramStateGroup(branches, self)

    # -- reading -------------------------------------------------------------------

    def sync(self) -> ProgramState:
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
            raise KeyError(
                f"no variable {name!r} in this program state (variables: {known})"
            ) from None

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

    async def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
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
    if (
        meta is None
        or "output_token_logprobs" not in meta
        or "output_token_logprobs_length" in meta
    ):
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
            raise ValueError(
                f"join mode must be 'gather_variable' or 'concate_and_append', got {mode!r}"
            )
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

        self.parent.stream_executor.submit(Call(merge))
