"""Jump-forward: the text a constraint forces, read off the token automaton itself.

When every continuation of the current text starts with the same characters (the
rest of a JSON key, ``":`` after it), the engine can append them without running the
model token by token (SGLang's "compressed FSM").

We compute that string on the same byte automaton that produces the masks, rather
than on a second, character-level automaton of the regex: it cannot disagree with the
masks, and it is cheap. Every byte-level BPE and byte-fallback vocabulary has a token
for each single byte, so "which bytes may come next in state s" is 250 look-ups of
single-byte tokens in the Rust index. A state forces a byte when it is not accepting
and exactly one byte may follow; the forced string is the chain of forced bytes, cut
back to whole UTF-8 characters. (Building interegular's character DFA of a JSON
schema regex took 0.4-0.8 s per schema; this walk takes 20-40 ms.)

"May follow" is judged by what the vocabulary can spell: a byte that starts no token
can never be generated, so it does not count as an alternative. A byte that starts
some tokens but has no single-byte token of its own ends the chain (we cannot step
past it), so the result is never longer than what is truly forced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["ByteJumpForward", "single_byte_tokens", "split_complete_utf8"]

NextState = Callable[[int, int], "int | None"]


class ByteJumpForward:
    """Forced strings of the states of a token index, computed once per state."""

    def __init__(
        self,
        next_state: NextState,
        is_final: Callable[[int], bool],
        byte_tokens: dict[int, int],
        orphan_tokens: dict[int, list[int]],
    ) -> None:
        """``byte_tokens``: byte -> a token that is exactly that byte. ``orphan_tokens``:
        first byte -> tokens starting with it, for bytes without a single-byte token."""
        self._next = next_state
        self._is_final = is_final
        self._bytes = sorted(byte_tokens.items())
        self._orphans = orphan_tokens
        # state -> (byte, next state) when exactly one byte may follow, else None
        self._succ: dict[int, tuple[int, int] | None] = {}
        self._forced: dict[int, bytes] = {}
        self.distance: dict[int, int] = {}  # state -> fewest bytes to acceptance (explore fills it)

    def _outs(self, state: int) -> list[tuple[int, int]]:
        nxt = self._next
        return [(b, n) for b, tid in self._bytes if (n := nxt(state, tid)) is not None]

    def _successor(
        self, state: int, outs: list[tuple[int, int]] | None = None
    ) -> tuple[int, int] | None:
        hit = self._succ.get(state, False)
        if hit is not False:
            return hit  # type: ignore[return-value]
        if outs is None:
            outs = self._outs(state)
        single: tuple[int, int] | None = (
            outs[0] if len(outs) == 1 and not self._is_final(state) else None
        )
        if single is not None:
            # A token starting with an orphan byte would be another way to go on.
            for tokens in self._orphans.values():
                if any(self._next(state, t) is not None for t in tokens):
                    single = None
                    break
        self._succ[state] = single
        return single

    def explore(self, start: int) -> set[int]:
        """Visit every state reachable from ``start``, precompute its successor and its
        distance to acceptance (:attr:`distance`).

        Returns the states; run at compile time so the scheduler never pays.
        """
        seen = {start}
        stack = [start]
        preds: dict[int, list[int]] = {}
        while stack:
            state = stack.pop()
            outs = self._outs(state)
            self._successor(state, outs)
            for _, n in outs:
                preds.setdefault(n, []).append(state)
                if n not in seen:
                    seen.add(n)
                    stack.append(n)
        self.distance = _distances([s for s in seen if self._is_final(s)], preds)
        return seen

    def shortest_completion(self, state: int) -> tuple[bytes, int] | None:
        """The shortest bytes from ``state`` to an accepting state, and that state (None:
        no completion by single-byte tokens). Follows :attr:`distance` down by one each byte."""
        d = self.distance.get(state)
        if d is None:
            return None
        out = bytearray()
        while d > 0:
            b, state = next((b, n) for b, n in self._outs(state) if self.distance.get(n) == d - 1)
            out.append(b)
            d -= 1
        return bytes(out), state

    def forced_bytes(self, state: int) -> bytes:
        """The forced byte chain from ``state`` (possibly ending inside a character)."""
        hit = self._forced.get(state)
        if hit is not None:
            return hit
        chain: list[tuple[int, int]] = []
        s = state
        seen: set[int] = set()
        while s not in self._forced and s not in seen:
            seen.add(s)
            step = self._successor(s)
            if step is None:
                self._forced[s] = b""
                break
            chain.append((s, step[0]))
            s = step[1]
        tail = self._forced.get(s, b"")
        for st, b in reversed(chain):  # memoise every state on the chain
            tail = bytes([b]) + tail
            self._forced[st] = tail
        return self._forced[state]

    def forced_text(self, state: int) -> str:
        """The forced string from ``state``, whole characters only."""
        return split_complete_utf8(self.forced_bytes(state))[0]


def _distances(finals: list[int], preds: dict[int, list[int]]) -> dict[int, int]:
    """Fewest bytes from each state to an accepting one (a BFS backwards from the accepting
    states); states that reach one only through bytes without a single-byte token are absent.
    With a single-byte token for every such byte, it bounds the tokens a completion needs."""
    dist = {s: 0 for s in finals}
    frontier = list(finals)
    while frontier:
        nxt = []
        for s in frontier:
            for p in preds.get(s, ()):
                if p not in dist:
                    dist[p] = dist[s] + 1
                    nxt.append(p)
        frontier = nxt
    return dist


def single_byte_tokens(
    token_bytes: Iterable[tuple[int, bytes]],
) -> tuple[dict[int, int], dict[int, list[int]]]:
    """(byte -> single-byte token id, first byte -> tokens for bytes that lack one)."""
    singles: dict[int, int] = {}
    by_first: dict[int, list[int]] = {}
    for tid, data in token_bytes:
        if len(data) == 1:
            singles.setdefault(data[0], tid)
        by_first.setdefault(data[0], []).append(tid)
    orphans = {b: tids for b, tids in by_first.items() if b not in singles}
    return singles, orphans


def split_complete_utf8(data: bytes) -> tuple[str, bytes]:
    """Decode the complete characters of ``data``; return them and the incomplete tail.

    Tokens may end inside a character; text is only ever reported in whole characters.
    """
    n = len(data)
    cut = n
    # A trailing incomplete sequence is at most 3 bytes: find its lead byte.
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        need = (
            1
            if b < 0x80
            else 2
            if b >> 5 == 0b110
            else 3
            if b >> 4 == 0b1110
            else 4
            if b >> 3 == 0b11110
            else 1
        )
        if back < need:
            cut = n - back
        break
    return data[:cut].decode("utf-8", errors="replace"), data[cut:]
