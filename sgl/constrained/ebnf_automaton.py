"""EBNF AST -> a byte-level recursive transition network (the middle of
:mod:`sgl.constrained.ebnf`).

Every rule becomes a small NFA over *bytes*: character classes are expanded into
the UTF-8 byte sequences of their code points (so tokens that end in the middle of a
character need no special case), and a rule reference becomes a *call edge* that
names the callee and the state to return to. Repetition is built in place, as
loops, so ``x*`` needs no recursion and no stack.

The network is then checked and trimmed once (:mod:`sgl.constrained.ebnf_analysis`): afterwards
every reachable configuration can still be completed to a sentence.

The recognizer itself (:mod:`sgl.constrained.ebnf_runtime`) reads the network
through :meth:`Network.closure` and :meth:`Network.step`: both work relative to the
caller's stack and are memoized per state, so they are shared by every request.
"""

from __future__ import annotations

import functools
import math

from sgl.constrained.ebnf_analysis import analyse_network
from sgl.constrained.ebnf_parse import Alt, CharSet, Expr, Lit, Ref, Repeat, RuleDef, Seq
from sgl.constrained.errors import GrammarError

MAX_STATES = 1_000_000  # after expanding bounded repetitions
# A repetition counted past BLOCKED_REPEAT is built from blocks of REPEAT_BLOCK copies in a
# helper rule, called where needed (x{0,65535}: ~1k call states, not 65535 inline copies).
# Within a block all but the last SHARE_HORIZON + 1 copies share their mask walks, so the
# bigger the block the fewer walks, but the more states (and compile time) per bound.
REPEAT_BLOCK = 64
BLOCKED_REPEAT = 128
# Tokens of up to this many bytes cannot tell apart copies of a counted repetition that
# have as many copies left (or more than this): their mask walks are shared (see
# Network.share). Longer tokens (~0.3% of a vocabulary) are walked from the real state.
SHARE_HORIZON = 16

# ---------------------------------------------------------------------------
# UTF-8: code point ranges -> byte range sequences
# ---------------------------------------------------------------------------

_UTF8_BOUNDS = ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, 0x10FFFF))


def _encode(cp: int) -> bytes:
    return chr(cp).encode("utf-8", "surrogatepass")


def _split_same_length(lo: int, hi: int, out: list) -> None:
    """Append byte-range tuples for [lo, hi] (same encoded length), each a cross product of byte
    ranges."""
    n = len(_encode(lo))
    for i in range(1, n):
        m = (1 << (6 * i)) - 1  # the low bits held by the last i continuation bytes
        if lo & ~m != hi & ~m:
            if lo & m:
                _split_same_length(lo, lo | m, out)
                _split_same_length((lo | m) + 1, hi, out)
                return
            if hi & m != m:
                _split_same_length(lo, (hi & ~m) - 1, out)
                _split_same_length(hi & ~m, hi, out)
                return
    a, b = _encode(lo), _encode(hi)
    out.append(tuple(zip(a, b)))


@functools.lru_cache(maxsize=4096)
def utf8_sequences(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Byte-range sequences matching exactly the UTF-8 encodings of the code points in `ranges`.

    Surrogates (U+D800..U+DFFF) are not characters and match nothing. Cached: a generated
    grammar (a JSON schema's) repeats the same classes thousands of times.
    """
    return tuple(_utf8_sequences(ranges))


def _utf8_sequences(ranges) -> list[tuple[tuple[int, int], ...]]:
    out: list = []
    for lo, hi in ranges:
        for blo, bhi in _UTF8_BOUNDS:
            a, b = max(lo, blo), min(hi, bhi)
            if a > b:
                continue
            for sa, sb in ((a, min(b, 0xD7FF)), (max(a, 0xE000), b)) if blo == 0x800 else ((a, b),):
                if sa <= sb:
                    _split_same_length(sa, sb, out)
    return out


# ---------------------------------------------------------------------------
# The network
# ---------------------------------------------------------------------------


class Network:
    """Rules as byte NFAs with call edges. States are ints; per-state data lives in lists."""

    def __init__(self) -> None:
        self.byte_edges: list[list[tuple[int, int, int]]] = []  # (lo, hi, target)
        self.eps: list[list[int]] = []
        self.calls: list[list[tuple[int, int]]] = []  # (rule index, return state)
        self.rule_of: list[int] = []
        self.rule_names: list[str] = []
        self.rule_start: list[int] = []
        self.rule_final: list[int] = []
        self.root = -1
        # per state: the state whose kernel walk stands for its own (see _share_copies)
        self.share: list[int] = []
        self.share_horizon = SHARE_HORIZON
        # filled by finish()
        self.pure_return: list[bool] = []
        self.byte_bits: list[int] = []  # per state: bit b set iff some byte edge reads b
        self._closure: dict[int, tuple[tuple[tuple[int, tuple[int, ...]], ...], bool]] = {}
        self._step: dict[tuple[int, int], tuple[tuple[tuple[int, tuple[int, ...]], ...], bool]] = {}

    @property
    def n_states(self) -> int:
        return len(self.eps)

    def new_state(self, rule: int) -> int:
        if len(self.eps) >= MAX_STATES:
            raise GrammarError(
                f"EBNF grammar is too large: more than {MAX_STATES} automaton states after "
                "expanding "
                "repetitions; use smaller {m,n} bounds",
                param="ebnf",
            )
        self.byte_edges.append([])
        self.eps.append([])
        self.calls.append([])
        self.rule_of.append(rule)
        return len(self.eps) - 1

    # -- runtime queries (memoized; relative to the caller's stack) --------------------

    def closure(self, state: int):
        """Configurations reachable from `state` without reading a byte, relative to the caller.

        Returns ``(kernels, pops)``: `kernels` are ``(state, frames)`` pairs where `state`
        has byte edges and `frames` are return states pushed on top of the caller's stack
        (outermost first); `pops` says whether the rule of `state` can finish, handing
        control back to the caller's stack.
        """
        hit = self._closure.get(state)
        if hit is not None:
            return hit
        eps, calls, byte_edges = self.eps, self.calls, self.byte_edges
        rule_of, rule_final, rule_start, pure = (
            self.rule_of,
            self.rule_final,
            self.rule_start,
            self.pure_return,
        )
        seen: set = set()
        todo = [(state, ())]
        kernels = []
        pops = False
        while todo:
            item = todo.pop()
            if item in seen:
                continue
            seen.add(item)
            s, frames = item
            if byte_edges[s]:
                kernels.append(item)
            for t in eps[s]:
                todo.append((t, frames))
            for rule, ret in calls[s]:
                todo.append((rule_start[rule], frames if pure[ret] else frames + (ret,)))
            if s == rule_final[rule_of[s]]:
                if frames:
                    todo.append((frames[-1], frames[:-1]))
                else:
                    pops = True
        result = (tuple(sorted(set(kernels))), pops)
        self._closure[state] = result
        return result

    def step(self, state: int, byte: int):
        """Like :meth:`closure`, for the configurations after `state` reads `byte`."""
        key = (state, byte)
        hit = self._step.get(key)
        if hit is not None:
            return hit
        kernels: set = set()
        pops = False
        for lo, hi, target in self.byte_edges[state]:
            if lo <= byte <= hi:
                k, p = self.closure(target)
                kernels.update(k)
                pops = pops or p
        result = (tuple(sorted(kernels)), pops)
        self._step[key] = result
        return result


class _Builder:
    def __init__(self, rules: dict[str, RuleDef]) -> None:
        self.rules = rules
        self.net = Network()
        self.index = {name: i for i, name in enumerate(rules)}
        net = self.net
        net.rule_names = list(rules)
        for i in range(len(rules)):
            net.rule_start.append(net.new_state(i))
            net.rule_final.append(net.new_state(i))
        net.root = self.index["root"]
        self.helpers: dict[tuple[Expr, int], str] = {}
        # counted repetitions' copies: (first state of each copy, states per copy, each
        # copy's (mandatory, most) copies after it); inner repetitions come first
        self.copy_runs: list[tuple[list[int], int, list[tuple[int, float]]]] = []

    def build(self) -> Network:
        net = self.net
        for i, rule in enumerate(self.rules.values()):
            self.rule = i
            entry, exit_ = self.fragment(rule.expr)
            net.eps[net.rule_start[i]].append(entry)
            net.eps[exit_].append(net.rule_final[i])
        net.share = _share_copies(net.n_states, self.copy_runs, net.share_horizon)
        return net

    def copies(
        self, item: Expr, n: int, cur: int, exit_: int | None = None
    ) -> tuple[int, list[int]]:
        """``n`` copies of ``item`` in a chain after ``cur`` (each may first leave to
        ``exit_``); returns the last state and each copy's first state."""
        net, starts = self.net, []
        for _ in range(n):
            if exit_ is not None:
                net.eps[cur].append(exit_)
            starts.append(net.n_states)
            e, x = self.fragment(item)
            net.eps[cur].append(e)
            cur = x
        return cur, starts

    def note_copies(
        self, item: Expr, starts: list[int], counts: list[tuple[int, float]], end: int
    ) -> None:
        """Record a repetition's copies for _share_copies: only where each copy reads at
        least a byte and calls nothing (so a token of h bytes reads at most h copies),
        and all copies have the same states (a helper rule made in the first would not)."""
        if len(starts) <= 1 or not _solid(item):
            return
        size = (end - starts[0]) // len(starts)
        if all(b - a == size for a, b in zip(starts, starts[1:] + [end])):
            self.copy_runs.append((starts, size, counts))

    def fragment(self, expr: Expr) -> tuple[int, int]:
        """Build `expr` as a fresh sub-automaton of the current rule; returns (entry, exit)."""
        net, rule = self.net, self.rule
        if isinstance(expr, Lit):
            entry = cur = net.new_state(rule)
            for b in expr.text.encode("utf-8"):
                nxt = net.new_state(rule)
                net.byte_edges[cur].append((b, b, nxt))
                cur = nxt
            return entry, cur
        if isinstance(expr, CharSet):
            entry, exit_ = net.new_state(rule), net.new_state(rule)
            # a trie over the byte-range sequences, so the class stays deterministic
            children: dict[tuple[int, tuple[int, int]], int] = {}
            for seq in utf8_sequences(expr.ranges):
                cur = entry
                for j, rng in enumerate(seq):
                    if j == len(seq) - 1:
                        net.byte_edges[cur].append((rng[0], rng[1], exit_))
                    else:
                        key = (cur, rng)
                        if key not in children:
                            children[key] = net.new_state(rule)
                            net.byte_edges[cur].append((rng[0], rng[1], children[key]))
                        cur = children[key]
            return entry, exit_
        if isinstance(expr, Ref):
            entry, exit_ = net.new_state(rule), net.new_state(rule)
            net.calls[entry].append((self.index[expr.name], exit_))
            return entry, exit_
        if isinstance(expr, Seq):
            if not expr.items:
                s = net.new_state(rule)
                return s, s
            entry, cur = self.fragment(expr.items[0])
            for item in expr.items[1:]:
                e, x = self.fragment(item)
                net.eps[cur].append(e)
                cur = x
            return entry, cur
        if isinstance(expr, Alt):
            entry, exit_ = net.new_state(rule), net.new_state(rule)
            for option in expr.options:
                e, x = self.fragment(option)
                net.eps[entry].append(e)
                net.eps[x].append(exit_)
            return entry, exit_
        if isinstance(expr, Repeat) and max(expr.min, expr.max or 0) > BLOCKED_REPEAT:
            return self.fragment(self.blocked(expr))
        if isinstance(expr, Repeat):
            entry = cur = net.new_state(rule)
            if expr.max is None:
                # {m,}: m-1 copies, then one copy that may repeat (x+), or a plain loop (x*)
                cur, starts = self.copies(expr.item, expr.min - 1, cur)
                self.note_copies(
                    expr.item,
                    starts,
                    [(expr.min - 1 - i, math.inf) for i in range(len(starts))],
                    net.n_states,
                )
                loop = net.new_state(rule)
                e, x = self.fragment(expr.item)
                net.eps[loop].append(e)
                if expr.min == 0:
                    net.eps[cur].append(loop)
                    net.eps[x].append(loop)
                    return entry, loop
                done = net.new_state(rule)
                net.eps[cur].append(loop)
                net.eps[x].append(done)
                net.eps[done].append(loop)
                return entry, done
            cur, firsts = self.copies(expr.item, expr.min, cur)
            end = net.n_states
            exit_ = net.new_state(rule)
            cur, rest = self.copies(expr.item, expr.max - expr.min, cur, exit_)
            net.eps[cur].append(exit_)
            # the mandatory copies, then the optional ones (exit_ lies between the two runs)
            self.note_copies(
                expr.item,
                firsts,
                [(expr.min - 1 - i, expr.max - 1 - i) for i in range(len(firsts))],
                end,
            )
            self.note_copies(
                expr.item,
                rest,
                [(0, expr.max - expr.min - 1 - i) for i in range(len(rest))],
                net.n_states,
            )
            return entry, exit_
        raise AssertionError(expr)

    def blocked(self, expr: Repeat) -> Expr:
        """``item{lo,hi}`` (or ``{lo,}``) over blocks ``b = item{B}`` (a helper rule): ``lo``
        copies are ``b{lo // B} item{lo % B}``; the ``K = hi - lo`` optional ones are
        ``b{0,Q-1} item{0,B-1} | b{Q} item{0,R}`` (``K = Q*B + R``): each count has one
        parse, so a parse state holds a few stacks, not one per way to split the count."""
        item, lo, hi, size = expr.item, expr.min, expr.max, REPEAT_BLOCK
        blk = Ref(self.helper(item, size), 0, 0)
        mandatory = Seq((Repeat(blk, lo // size, lo // size), Repeat(item, lo % size, lo % size)))
        if hi is None:
            return Seq((mandatory, Repeat(item, 0, None)))
        q, r = divmod(hi - lo, size)
        options: list[Expr] = [Seq((Repeat(blk, q, q), Repeat(item, 0, r)))]
        if q:
            options.insert(0, Seq((Repeat(blk, 0, q - 1), Repeat(item, 0, size - 1))))
        return Seq((mandatory, Alt(tuple(options))))

    def helper(self, item: Expr, n: int) -> str:
        """The name of a rule matching exactly ``item{n}`` (one per item and count)."""
        key = (item, n)
        name = self.helpers.get(key)
        if name is not None:
            return name
        net = self.net
        index = len(net.rule_names)
        name = f"{net.rule_names[self.rule]}~{n}x{len(self.helpers)}"
        self.helpers[key] = name
        self.index[name] = index
        net.rule_names.append(name)
        net.rule_start.append(net.new_state(index))
        net.rule_final.append(net.new_state(index))
        saved, self.rule = self.rule, index
        entry, exit_ = self.fragment(Repeat(item, n, n))
        net.eps[net.rule_start[index]].append(entry)
        net.eps[exit_].append(net.rule_final[index])
        self.rule = saved
        return name


def _solid(expr: Expr) -> bool:
    """Whether every match of ``expr`` reads a byte and it calls no rule (nor makes a helper)."""
    if isinstance(expr, Lit):
        return bool(expr.text)
    if isinstance(expr, CharSet):
        return True
    if isinstance(expr, Seq):
        return all(map(_no_calls, expr.items)) and any(map(_solid, expr.items))
    if isinstance(expr, Alt):
        return all(map(_solid, expr.options))
    if isinstance(expr, Repeat):
        return expr.min > 0 and _solid(expr.item) and _no_calls(expr)
    return False


def _no_calls(expr: Expr) -> bool:
    if isinstance(expr, (Lit, CharSet)):
        return True
    if isinstance(expr, Seq):
        return all(map(_no_calls, expr.items))
    if isinstance(expr, Alt):
        return all(map(_no_calls, expr.options))
    if isinstance(expr, Repeat):
        return max(expr.min, expr.max or 0) <= BLOCKED_REPEAT and _no_calls(expr.item)
    return False


def _share_copies(n_states: int, runs: list, horizon: int) -> list[int]:
    """Per state, the state whose kernel walk (its mask walk up to the end of its rule, see
    ebnf_native) is its own for every token of up to ``horizon`` bytes.

    The copies of ``x{lo,hi}`` are the same states, each followed by the copies left: from
    the j-th state of copy i the rule reads the rest of x, then x at least ``a`` and at
    most ``b`` more times, then what follows the repetition. A token of h <= horizon bytes
    reads at most h copies (each reads a byte), so it cannot tell ``a`` or ``b`` from any
    count past the horizon: copies whose (a, b) agree once clamped there are one kernel
    walk. Inside a ``maxLength: 100`` string that is one walk for the first 83 characters,
    not one per character. Inner repetitions come first in ``runs``; an outer copy maps to
    the state its representative's inner copies map to."""
    share = list(range(n_states))
    cap = horizon + 1
    for starts, size, counts in runs:
        first: dict[tuple[float, float], int] = {}
        for start, (a, b) in zip(starts, counts):
            rep = first.setdefault((min(a, cap), min(b, cap)), start)
            if rep != start:
                share[start : start + size] = share[rep : rep + size]
    return share


def build_network(rules: dict[str, RuleDef]) -> Network:
    """Compile parsed rules into a trimmed, checked network (raises GrammarError)."""
    net = _Builder(rules).build()
    analyse_network(net)
    return net
