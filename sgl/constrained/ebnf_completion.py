"""Distances to acceptance in a grammar network: what budget-aware masks need.

For every network state, the shortest byte string that finishes its rule (rule calls cost
their own shortest member) is found by Knuth's generalization of Dijkstra's algorithm (a
call edge costs the callee's length plus the rest after it: a sum of two unknowns, still
monotone). A parse configuration (kernel state on a stack of return states) then finishes
with the kernel's tail followed by each frame's tail, so the tokens it needs are at most the
sum of those strings' fewest-token covers (:class:`TokenCover`): a real tokenization of a
real completion, so an upper bound. A parse state (a set of configurations) needs the least
of its configurations, plus EOS. That per-state figure is cheap but loose where a token
would span two rules; the state a request is in gets a tight one (``TablesBase.settle``).
"""

from __future__ import annotations

import heapq

from sgl.constrained.ebnf_automaton import Network

INF = float("inf")
# bytes of a shortest completion covered by tokens; the rest at one token a byte (an upper bound)
TAIL_WINDOW = 256


def shortest_tails(net: Network) -> tuple[list[float], list[tuple]]:
    """(bytes from each state to the end of its rule, the move that achieves it).

    Moves: ``("end",)``, ``("eps", y)``, ``("byte", b, y)``, ``("call", rule, ret)``."""
    n = net.n_states
    dist: list[float] = [INF] * n
    move: list[tuple] = [()] * n
    preds: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]  # y -> (x, weight, byte or -1)
    call_by_start: dict[int, list[tuple[int, int, int]]] = {}  # start state -> (x, rule, ret)
    call_by_ret: dict[int, list[tuple[int, int, int]]] = {}
    for x in range(n):
        for y in net.eps[x]:
            preds[y].append((x, 0, -1))
        for lo, hi, y in net.byte_edges[x]:
            preds[y].append((x, 1, _representative(lo, hi)))
        for rule, ret in net.calls[x]:
            start = net.rule_start[rule]
            call_by_start.setdefault(start, []).append((x, rule, ret))
            call_by_ret.setdefault(ret, []).append((x, rule, ret))
    heap: list[tuple[float, int]] = []
    for f in net.rule_final:
        dist[f], move[f] = 0, ("end",)
        heap.append((0, f))
    heapq.heapify(heap)
    done = [False] * n

    def offer(x: int, d: float, how: tuple) -> None:
        if d < dist[x]:
            dist[x], move[x] = d, how
            heapq.heappush(heap, (d, x))

    while heap:
        d, y = heapq.heappop(heap)
        if done[y] or d > dist[y]:
            continue
        done[y] = True
        for x, w, b in preds[y]:
            offer(x, d + w, ("eps", y) if b < 0 else ("byte", b, y))
        for x, rule, ret in call_by_start.get(y, ()):  # the callee's length is now known
            if done[ret]:
                offer(x, d + dist[ret], ("call", rule, ret))
        for x, rule, ret in call_by_ret.get(y, ()):
            start = net.rule_start[rule]
            if done[start]:
                offer(x, dist[start] + d, ("call", rule, ret))
    return dist, move


def _representative(lo: int, hi: int) -> int:
    """A byte of [lo, hi] for the completion text: printable ASCII where the range has it."""
    for b in (0x20, 0x30, 0x61):
        if lo <= b <= hi:
            return b
    return lo


class Completions:
    """Token costs of finishing, per network state and per parse state (memoized)."""

    def __init__(self, net: Network, cover: TokenCover) -> None:
        self.net = net
        self.cover = cover
        self.dist, self.move = shortest_tails(net)
        self._tokens: dict[int, float] = {}

    def tail_bytes(self, state: int, limit: float = INF) -> bytes | None:
        """The shortest bytes finishing ``state``'s rule, the first ``limit`` of them (None:
        none)."""
        if self.dist[state] == INF:
            return None
        out = bytearray()
        todo = [state]  # states whose tails are still to be written, next on top
        while todo and len(out) < limit:
            s = todo.pop()
            m = self.move[s]
            if m[0] == "byte":
                out.append(m[1])
                todo.append(m[2])
            elif m[0] == "eps":
                todo.append(m[1])
            elif m[0] == "call":
                todo.append(m[2])  # after the callee: the rest of this rule
                todo.append(self.net.rule_start[m[1]])
        return bytes(out)

    def tail_tokens(self, state: int) -> float:
        """Tokens that finish ``state``'s rule, at most."""
        hit = self._tokens.get(state)
        if hit is None:
            d = self.dist[state]
            data = self.tail_bytes(state, TAIL_WINDOW)
            if data is None:
                hit = INF
            else:
                head = data[:TAIL_WINDOW]
                hit = min(float(len(head)), self.cover.count(head)) + (d - len(head))
            self._tokens[state] = hit
        return hit


class TokenCover:
    """The fewest vocabulary tokens that spell some bytes exactly (a dynamic program over
    positions, each extended along the tokens' prefixes): every such token is allowed by
    a grammar mask wherever the bytes are valid text, so the count is a number of steps
    that really finishes the text. Greedy longest-match is not minimal (and a byte-pair
    tokenizer's own split need not be either); this is, for the given bytes."""

    def __init__(self, tokens: frozenset[bytes]) -> None:
        self.pieces: dict[
            bytes, bool
        ] = {}  # every prefix of a token -> whether it is a token itself
        for t in tokens:
            for j in range(1, len(t)):
                self.pieces.setdefault(t[:j], False)
        for t in tokens:
            self.pieces[t] = True
        self.longest = max(map(len, tokens), default=1)

    def count(self, data: bytes) -> float:
        return self.plan(data)[0]

    def plan(self, data: bytes) -> tuple[float, int]:
        """(fewest tokens spelling ``data``, the byte length of the first of them); (inf, 0)
        when some byte is in no token, (0, 0) for no bytes."""
        n, pieces, longest = len(data), self.pieces, self.longest
        best = [INF] * n + [0.0]
        first = [0] * (n + 1)
        for i in range(n - 1, -1, -1):
            for k in range(1, min(longest, n - i) + 1):
                is_token = pieces.get(data[i : i + k])
                if is_token is None:
                    break
                if is_token and best[i + k] + 1 < best[i]:
                    best[i], first[i] = best[i + k] + 1, k
        return best[0], first[0]
