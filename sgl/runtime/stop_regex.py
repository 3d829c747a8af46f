"""`stop_regex`: stop a request where its output first matches a pattern (SGLang's field).

Semantics, as SGLang's: after each token, the output so far is searched; the leftmost match
stops the request and the output is trimmed before it (`no_stop_trim` keeps everything), the
finish reason's `matched` being the match (the shortest one at that start). Patterns are read
by the constraint compiler's normaliser (`constrained.regex`), so their syntax and meaning
are those of `regex=` constraints (Python's `re` with ASCII classes; no look-around,
back-references or word boundaries) and every engine reads them alike; `^` means the start of
the output, and `$` is refused (where tokens end would decide whether it matches).

Matching runs a Thompson NFA built from the normalised pattern over the streamed text,
keeping for each NFA state the earliest start that reaches it: linear in the text times the
pattern size, with no backtracking, so no pattern can stall the scheduler thread (Python's
`re` on a hostile pattern could), and streaming holds back only text from the earliest start
that could still become a match.
"""

from __future__ import annotations

from typing import Any

from sgl.runtime.errors import InvalidRequestError

MAX_POSITIONS = 256  # character positions (bounded repeats unrolled) of one pattern


def _compile(pattern: str) -> _Nfa:
    from sgl.constrained import ebnf_parse as ast
    from sgl.constrained.errors import GrammarError
    from sgl.constrained.regex import translate_regex

    try:
        rx, at_start, at_end = translate_regex(
            pattern, param="stop_regex", search=True, what="stop_regex"
        )
    except GrammarError as e:
        raise InvalidRequestError(f"stop_regex {pattern!r}: {e}", param="stop_regex") from e
    if at_end:
        raise InvalidRequestError(
            f"stop_regex {pattern!r}: an end anchor ($, \\Z) would depend on where tokens "
            "end; remove it",
            param="stop_regex",
        )
    if rx is None:
        raise InvalidRequestError(f"stop_regex {pattern!r} matches nothing", param="stop_regex")
    if rx.size > MAX_POSITIONS:
        raise InvalidRequestError(
            f"stop_regex {pattern!r} is too large: {rx.size} character positions after "
            f"expanding bounded repetitions (at most {MAX_POSITIONS})",
            param="stop_regex",
        )
    nfa = _Nfa()
    nfa.anchored = at_start
    nfa.final = nfa.build(rx.node, nfa.start, ast)
    nfa.close()
    if nfa.final in nfa.closure[nfa.start]:
        raise InvalidRequestError(
            f"stop_regex {pattern!r} matches the empty string, so it would stop at once",
            param="stop_regex",
        )
    return nfa


def check_stop_regex(pattern: str) -> None:
    """Raise InvalidRequestError (param stop_regex) unless `pattern` can be matched."""
    _compile(pattern)


class _Nfa:
    """States 0..n-1: epsilon moves, and moves on a character in sorted inclusive ranges."""

    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.moves: list[list[tuple[tuple[tuple[int, int], ...], int]]] = []
        self.start = self.new()
        self.final = -1
        self.anchored = False  # "^": a match may start only where the output starts
        self.closure: list[tuple[int, ...]] = []

    def new(self) -> int:
        self.eps.append([])
        self.moves.append([])
        return len(self.eps) - 1

    def _fresh_after(self, state: int) -> int:
        s = self.new()
        self.eps[state].append(s)
        return s

    def build(self, node: Any, start: int, ast: Any) -> int:
        """Add `node`'s automaton from `start`; returns its end state. Every sub-automaton
        starts in a fresh state, so a loop in one never reaches its neighbours."""
        if isinstance(node, ast.Lit):
            for ch in node.text:
                nxt = self.new()
                self.moves[start].append((((ord(ch), ord(ch)),), nxt))
                start = nxt
            return start
        if isinstance(node, ast.CharSet):
            nxt = self.new()
            self.moves[start].append((node.ranges, nxt))
            return nxt
        if isinstance(node, ast.Seq):
            for item in node.items:
                start = self.build(item, self._fresh_after(start), ast)
            return start
        if isinstance(node, ast.Alt):
            end = self.new()
            for option in node.options:
                self.eps[self.build(option, self._fresh_after(start), ast)].append(end)
            return end
        if isinstance(node, ast.Repeat):
            return self._repeat(node, start, ast)
        raise InvalidRequestError(
            f"stop_regex: unsupported construct {type(node).__name__}", param="stop_regex"
        )

    def _repeat(self, node: Any, start: int, ast: Any) -> int:
        cur = start
        for _ in range(node.min):
            cur = self.build(node.item, self._fresh_after(cur), ast)
        if node.max is None:
            loop = self._fresh_after(cur)
            self.eps[self.build(node.item, self._fresh_after(loop), ast)].append(loop)
            return loop
        end = self.new()
        for _ in range(node.max - node.min):
            self.eps[cur].append(end)
            cur = self.build(node.item, self._fresh_after(cur), ast)
        self.eps[cur].append(end)
        return end

    def close(self) -> None:
        """Epsilon closure of every state."""
        for s in range(len(self.eps)):
            seen, todo = {s}, [s]
            while todo:
                for t in self.eps[todo.pop()]:
                    if t not in seen:
                        seen.add(t)
                        todo.append(t)
            self.closure.append(tuple(sorted(seen)))


def _in(ranges: tuple[tuple[int, int], ...], cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in ranges)


class StopRegexMatcher:
    """Feed the output text piece by piece (one piece per token); `feed` returns the text
    safe to emit and whether a pattern matched (then `matched_text` is the match)."""

    def __init__(self, patterns: list[str], no_stop_trim: bool = False) -> None:
        self.nfas = [_compile(p) for p in patterns]
        self.no_stop_trim = no_stop_trim
        self.text = ""
        self.emitted = 0
        # Per pattern: NFA state -> earliest start of a run in that state.
        self.active: list[dict[int, int]] = [{} for _ in self.nfas]
        self.matched_text: str | None = None

    @property
    def matched(self) -> bool:
        return self.matched_text is not None

    def feed(self, piece: str) -> tuple[str, bool]:
        if self.matched:
            return "", True
        best: tuple[int, int] | None = None  # (start, end) of the leftmost match in this piece
        for ch in piece:
            pos = len(self.text)
            self.text += ch
            for nfa, active in zip(self.nfas, self.active):
                for start, end in self._step(nfa, active, pos, ord(ch)):
                    if best is None or start < best[0]:
                        best = (start, end)
        if best is not None:
            start, end = best
            self.matched_text = self.text[start:end]
            stop_at = len(self.text) if self.no_stop_trim else start
            out, self.emitted = self.text[self.emitted : stop_at], max(self.emitted, stop_at)
            return out, True
        hold = min((s for active in self.active for s in active.values()), default=len(self.text))
        out, self.emitted = self.text[self.emitted : hold], max(self.emitted, hold)
        return out, False

    @staticmethod
    def _step(nfa: _Nfa, active: dict[int, int], pos: int, cp: int) -> list[tuple[int, int]]:
        """Start a run at `pos`, advance every run over code point `cp`; the (start, end) of
        runs that reach the final state."""
        if pos == 0 or not nfa.anchored:
            for q in nfa.closure[nfa.start]:
                active.setdefault(q, pos)
        nxt: dict[int, int] = {}
        for state, start in active.items():
            for ranges, to in nfa.moves[state]:
                if _in(ranges, cp):
                    for q in nfa.closure[to]:
                        if start < nxt.get(q, pos + 1):
                            nxt[q] = start
        active.clear()
        active.update(nxt)
        return [(nxt[nfa.final], pos + 1)] if nfa.final in nxt else []

    def flush(self) -> str:
        """At the end of the request: the text still held back (no match can complete now)."""
        if self.matched:
            return ""
        out, self.emitted = self.text[self.emitted :], len(self.text)
        return out
