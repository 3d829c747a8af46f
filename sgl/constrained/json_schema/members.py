"""The member automaton of an object with declared properties: members in schema order,
optional ones skippable, commas only between written members, ``minProperties`` /
``maxProperties`` counted, ``dependentRequired`` and ``not: {required}`` tracked by the set
of names written, and a tail of pattern or undeclared members.

Separate: one function, the largest piece of regex construction, with its own size limit
(``MAX_DEPENDENT_NAMES``) and its own sharing of continuations (regex vs grammar).
"""

from __future__ import annotations

from typing import Any

from sgl.constrained.errors import GrammarError
from sgl.constrained.json_schema.keywords import PARAM
from sgl.constrained.json_schema.lexical import _SEP
from sgl.constrained.regex import Rx, rx_alt, rx_cat, rx_lit, rx_rep

MAX_DEPENDENT_NAMES = (
    10  # properties in dependentRequired: the member automaton tracks which were written
)


def _members(
    members: list[tuple[str, Rx, bool]],
    lo: int = 0,
    hi: int | None = None,
    deps: dict[str, list[str]] | None = None,
    share: Any = None,
    forbid: list[frozenset] | None = None,
    tail: Rx | None = None,
) -> Rx | None:
    """Members in order, optional ones skippable, then any number of ``tail`` members
    (pattern keys, or undeclared members), commas only between written members; between ``lo`` and
    ``hi`` of them written, each written name of ``deps`` with the names it requires written too,
    and no set of ``forbid`` written whole. ``share`` turns a continuation used twice into one rule
    (grammar mode)."""
    deps, forbid = deps or {}, forbid or []
    tracked = {n for k, v in deps.items() for n in [k, *v]} | {n for f in forbid for n in f}
    relevant = sorted(tracked & {m[0] for m in members})
    if len(relevant) > MAX_DEPENDENT_NAMES:
        raise GrammarError(
            f"json_schema: dependentRequired (and not-required) involve {len(relevant)} "
            "properties; at most "
            f"{MAX_DEPENDENT_NAMES} are supported",
            PARAM,
        )
    n = len(members)
    cap = max(lo, hi or 0)  # counts past this are all alike
    memo: dict[tuple, Rx | None] = {}

    def done(count: int, written: frozenset) -> Rx | None:
        if count < lo or any(k in written and not set(v) <= written for k, v in deps.items()):
            return None
        if any(f <= written for f in forbid):
            return None
        return rx_lit("")

    def more(first: bool, count: int, written: frozenset) -> Rx | None:
        """After the declared members: stop here, or another tail member."""
        if done(max(count, lo), written) is None:
            return None  # a dependency unmet: tail members cannot meet it
        lead = rx_lit("") if first else _SEP
        if hi is None and count >= lo:  # any number more
            return rx_rep(rx_cat(lead, tail, rx_rep(rx_cat(_SEP, tail), 0, None)), 0, 1)
        again = (
            None
            if hi is not None and count >= hi
            else rx_cat(lead, tail, build(n, False, min(count + 1, cap), written))
        )
        return rx_alt(done(count, written), again)

    def build(
        i: int, first: bool, count: int, written: frozenset, goal: tuple | None = None
    ) -> Rx | None:
        """Members ``i..`` from this state; with ``goal``, only the paths that end the
        declared members in that state (and nothing after them)."""
        key = (i, first, count, written, goal)
        if key in memo:
            return memo[key]
        if i == n:
            if goal is not None:
                out = rx_lit("") if (first, count, written) == goal else None
            else:
                out = done(count, written) if tail is None else more(first, count, written)
        else:
            name, member, is_required = members[i]
            take: Rx | None = None
            if hi is None or count < hi:
                w = written | {name} if name in relevant else written
                take = rx_cat(
                    rx_lit("") if first else _SEP,
                    member,
                    build(i + 1, False, min(count + 1, cap), w, goal),
                )
            skip = None if is_required else build(i + 1, first, count, written, goal)
            if (
                not first
                and take is not None
                and skip is not None
                and take.text == rx_cat(_SEP, member, skip).text
            ):
                out = rx_cat(
                    rx_rep(rx_cat(_SEP, member), 0, 1), skip
                )  # the tail is shared: quadratic, not exponential
            else:
                out = rx_alt(take, skip)
        if share is not None and i > 0:
            out = share(out)
        memo[key] = out
        return out

    def ends() -> list[tuple]:
        """The states the declared members can end in, in order."""
        level = {(True, 0, frozenset()): None}
        for name, _, is_required in members:
            nxt: dict = {}
            for first, count, written in level:
                if hi is None or count < hi:
                    nxt[
                        (
                            False,
                            min(count + 1, cap),
                            written | {name} if name in relevant else written,
                        )
                    ] = None
                if not is_required:
                    nxt[(first, count, written)] = None
            level = nxt
        return list(level)

    if tail is not None and share is None:
        # A regex cannot share text: the tail members written once per end state of the
        # declared ones, not once per path (open objects would grow quadratically in text).
        return rx_alt(
            *(rx_cat(build(0, True, 0, frozenset(), goal), more(*goal)) for goal in ends())
        )
    return build(0, True, 0, frozenset())
