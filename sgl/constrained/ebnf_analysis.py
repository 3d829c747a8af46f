"""The checks and passes a freshly built network (:mod:`sgl.constrained.ebnf_automaton`) goes
through, once, before any recognizer reads it:

* left recursion (a rule that can reach a call of itself without reading a byte)
  is rejected, naming the cycle, since a top-down recognizer would never stop;
* rules that can never finish are cut off, and every state that cannot reach the
  end of its rule is removed. Afterwards every reachable configuration can still
  be completed to a sentence, which is what makes the token masks exact: "still
  alive" is the same as "a prefix of some sentence";
* the finished network gets what the recognizers read per state: the bytes it can
  read, calls that return to the end of their epsilon chain, and pure (tail-call) returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sgl.constrained.errors import GrammarError

if TYPE_CHECKING:
    from sgl.constrained.ebnf_automaton import Network

__all__ = ["analyse_network"]


def analyse_network(net: Network) -> None:
    """Check ``net`` and trim it in place (raises GrammarError), then add what the
    recognizers read."""
    used = _used_rules(net)
    nullable = _fixed_point(net, used, via_bytes=False)
    _check_left_recursion(net, used, nullable)
    productive = _fixed_point(net, used, via_bytes=True)
    if net.root not in productive:
        raise GrammarError(
            "EBNF grammar: 'root' can never produce a complete sentence (every alternative "
            "recurses forever without an alternative that ends); add a base case",
            param="ebnf",
        )
    _trim(net, productive)
    _finish(net)


def _reach_final(
    net: Network, rule: int, *, via_bytes: bool, callable_rules: set[int]
) -> tuple[bool, set[int]]:
    """From `rule`'s start, follow eps edges, byte edges (if `via_bytes`) and calls
    of `callable_rules` (jumping to the return state). Returns (final reached, rules
    called on the way)."""
    start, final = net.rule_start[rule], net.rule_final[rule]
    seen = {start}
    todo = [start]
    called: set[int] = set()
    while todo:
        s = todo.pop()
        nxt = list(net.eps[s])
        if via_bytes:
            nxt.extend(t for _, _, t in net.byte_edges[s])
        for callee, ret in net.calls[s]:
            called.add(callee)
            if callee in callable_rules:
                nxt.append(ret)
        for t in nxt:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return final in seen, called


def _fixed_point(net: Network, used: list[int], via_bytes: bool) -> set[int]:
    good: set[int] = set()
    changed = True
    while changed:
        changed = False
        for r in used:
            if r not in good and _reach_final(net, r, via_bytes=via_bytes, callable_rules=good)[0]:
                good.add(r)
                changed = True
    return good


def _used_rules(net: Network) -> list[int]:
    """Rules reachable from root through call edges (unused rules are not compiled further)."""
    by_rule: dict[int, set[int]] = {}
    for s in range(net.n_states):
        for callee, _ in net.calls[s]:
            by_rule.setdefault(net.rule_of[s], set()).add(callee)
    seen = {net.root}
    todo = [net.root]
    while todo:
        r = todo.pop()
        for c in by_rule.get(r, ()):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return sorted(seen)


def _check_left_recursion(net: Network, used: list[int], nullable: set[int]) -> None:
    """Reject a cycle of calls that reads no byte (iterative DFS, so deep grammars are fine)."""
    graph = {
        r: sorted(_reach_final(net, r, via_bytes=False, callable_rules=nullable)[1]) for r in used
    }
    color: dict[int, int] = {}  # 1: on the DFS path, 2: done
    for root in used:
        if root in color:
            continue
        path = [root]
        color[root] = 1
        iters = [iter(graph.get(root, ()))]
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                iters.pop()
                color[path.pop()] = 2
                continue
            if color.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt]
                names = " -> ".join(net.rule_names[x] for x in cycle)
                raise GrammarError(
                    f"EBNF grammar: rule '{net.rule_names[nxt]}' is left-recursive ({names} "
                    "without "
                    "reading any text), which this matcher does not support; rewrite it with "
                    "repetition, "
                    'e.g. \'expr ::= term ("+" term)*\' instead of \'expr ::= expr "+" term | '
                    "term'",
                    param="ebnf",
                )
            if nxt not in color:
                color[nxt] = 1
                path.append(nxt)
                iters.append(iter(graph.get(nxt, ())))


def _trim(net: Network, productive: set[int]) -> None:
    """Drop calls of rules that never finish, then every edge into a state that cannot finish its
    rule."""
    n = net.n_states
    for s in range(n):
        if net.calls[s]:
            net.calls[s] = [(c, r) for c, r in net.calls[s] if c in productive]
    # backward reachability to each rule's final state
    preds: list[list[int]] = [[] for _ in range(n)]
    for s in range(n):
        for t in net.eps[s]:
            preds[t].append(s)
        for _, _, t in net.byte_edges[s]:
            preds[t].append(s)
        for _, ret in net.calls[s]:
            preds[ret].append(s)
    alive = [False] * n
    todo = list(net.rule_final)
    for f in todo:
        alive[f] = True
    while todo:
        t = todo.pop()
        for s in preds[t]:
            if not alive[s]:
                alive[s] = True
                todo.append(s)
    for s in range(n):
        net.eps[s] = [t for t in net.eps[s] if alive[t]]
        net.byte_edges[s] = [e for e in net.byte_edges[s] if alive[e[2]]]
        net.calls[s] = [(c, r) for c, r in net.calls[s] if alive[r]]


def _finish(net: Network) -> None:
    n = net.n_states
    is_final = [False] * n
    for f in net.rule_final:
        is_final[f] = True
    net.byte_bits = [0] * n
    for s in range(n):
        bits = 0
        for lo, hi, _ in net.byte_edges[s]:
            bits |= ((1 << (hi - lo + 1)) - 1) << lo
        net.byte_bits[s] = bits
    _canonical_returns(net, is_final)
    # a return state is "pure" if returning there can only finish the rule: a call that
    # returns to it is a tail call and needs no stack frame (keeps right recursion flat).
    pure = [False] * n
    returns = {ret for calls in net.calls for _, ret in calls}
    for s in returns:
        seen = {s}
        todo = [s]
        ok, final = True, False
        while todo and ok:
            t = todo.pop()
            if net.byte_edges[t] or net.calls[t]:
                ok = False
            final = final or is_final[t]
            for u in net.eps[t]:
                if u not in seen:
                    seen.add(u)
                    todo.append(u)
        pure[s] = ok and final
    net.pure_return = pure


def _canonical_returns(net: Network, is_final: list[bool]) -> None:
    """Each call returns to the first state of its epsilon-only chain that does something:
    a return state whose one move is an epsilon edge is the state it leads to. Calls at the
    ends of alternatives (the branches of a character trie, each ending in a call to the same
    string rule) then push the same frame, so the parse states after them are one state,
    whose transitions and mask walks are made once, not once per branch."""
    canon: dict[int, int] = {}

    def target(s: int) -> int:
        path = []
        while (
            s not in canon
            and len(net.eps[s]) == 1
            and not net.byte_edges[s]
            and not net.calls[s]
            and not is_final[s]
            and s not in path
        ):
            path.append(s)
            s = net.eps[s][0]
        end = canon.get(s, s)
        for t in path:
            canon[t] = end
        return end

    for s in range(net.n_states):
        if net.calls[s]:
            net.calls[s] = list(dict.fromkeys((rule, target(ret)) for rule, ret in net.calls[s]))
