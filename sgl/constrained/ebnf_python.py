"""The EBNF recognizer in Python (:class:`Tables`): interned stacks and parse states, the lazy
DFA table and the numpy mask walk. Grammars run on it where the C++ recognizer
(``ebnf_native.NativeTables``) cannot be built, and the tests hold the C++ one to it.
"""

from __future__ import annotations

import logging

import numpy as np

from sgl.constrained import ebnf_runtime as rt
from sgl.constrained.ebnf_automaton import Network
from sgl.constrained.ebnf_runtime import DEAD
from sgl.constrained.ebnf_tables import TablesBase
from sgl.constrained.ebnf_trie import VocabTrie

logger = logging.getLogger(__name__)

__all__ = ["Tables"]


class Tables(TablesBase):
    """The recognizer in Python: interned stacks and parse states, the lazy DFA table (the
    numpy walk's tables, and the reference the C++ ones are tested against)."""

    def __init__(self, net: Network, byte_class: np.ndarray, class_rep: list[int]) -> None:
        super().__init__(net, byte_class, class_rep)
        self.class_rep_arr = np.asarray(class_rep, dtype=np.int64)
        self.stack_ret: list[int] = [-1]  # stack 0 is the empty stack
        self.stack_parent: list[int] = [-1]
        self.stack_ids: dict[tuple[int, int], int] = {}
        self.popinto: dict[int, frozenset[int]] = {}
        self.dstates: list[frozenset[int]] = [frozenset()]
        self.dstate_ids: dict[frozenset[int], int] = {frozenset(): DEAD}
        self.table = np.full((64, len(class_rep)), -1, dtype=np.int32)
        self.table[DEAD] = DEAD
        self.groups: dict[int, np.ndarray] = {}  # dstate -> byte class -> group (see _class_groups)
        self.kernel_groups: dict[frozenset[int], np.ndarray] = {}
        self.edge_signatures: dict[int, np.ndarray] = {}
        self.overflowed = False

    def n_dstates(self) -> int:
        return len(self.dstates)

    def configs(self, did: int):
        return self.dstates[did]

    def stack_frame(self, stack: int) -> tuple[int, int]:
        return self.stack_ret[stack], self.stack_parent[stack]

    def too_big(self) -> bool:
        return len(self.dstates) > rt.MAX_DSTATES or len(self.stack_ret) > rt.MAX_STACKS

    # -- stacks --------------------------------------------------------------------

    def push(self, stack: int, frames: tuple[int, ...]) -> int:
        ids = self.stack_ids
        for ret in frames:
            key = (ret, stack)
            sid = ids.get(key)
            if sid is None:
                sid = len(self.stack_ret)
                ids[key] = sid
                self.stack_ret.append(ret)
                self.stack_parent.append(stack)
            stack = sid
        return stack

    def _pop_into(self, stack: int) -> frozenset[int]:
        """Configurations after the rule on top of `stack` returns (to the frame on top)."""
        hit = self.popinto.get(stack)
        if hit is not None:
            return hit
        out: set[int] = set()
        s = stack
        M, closure, push = self.M, self.net.closure, self.push
        while True:
            if s == 0:
                out.add(self.ACCEPT)
                break
            ret, parent = self.stack_ret[s], self.stack_parent[s]
            kernels, pops = closure(ret)
            for k, frames in kernels:
                out.add((push(parent, frames) if frames else parent) * M + k)
            if not pops:
                break
            s = parent
        result = frozenset(out)
        self.popinto[stack] = result
        return result

    # -- dstates -------------------------------------------------------------------

    def intern(self, configs: frozenset[int]) -> int:
        did = self.dstate_ids.get(configs)
        if did is None:
            did = len(self.dstates)
            self.dstates.append(configs)
            self.dstate_ids[configs] = did
            if did >= self.table.shape[0]:
                grown = np.full((self.table.shape[0] * 2, self.table.shape[1]), -1, dtype=np.int32)
                grown[: self.table.shape[0]] = self.table
                self.table = grown
            # Classes no configuration can read lead to DEAD: known now, so only the few
            # readable ones ever take the Python step (a mask's first walk tries every class).
            self.table[did, ~self._readable_classes(did)] = DEAD
        return did

    def _readable_classes(self, did: int) -> np.ndarray:
        bits = self.allowed_bytes(did)
        readable = np.unpackbits(
            np.frombuffer(bits.to_bytes(32, "little"), dtype=np.uint8), bitorder="little"
        )
        return readable[self.class_rep_arr].astype(bool)

    def initial(self) -> int:
        net = self.net
        kernels, pops = net.closure(net.rule_start[net.root])
        out = {self.push(0, frames) * self.M + k for k, frames in kernels}
        if pops:
            out.add(self.ACCEPT)
        return self.intern(frozenset(out))

    def transition(self, did: int, cls: int) -> int:
        nxt = int(self.table[did, cls])
        if nxt >= 0:
            return nxt
        byte = self.class_rep[cls]
        M, ACCEPT, step, push = self.M, self.ACCEPT, self.net.step, self.push
        byte_bits, bit = self.net.byte_bits, 1 << byte
        out: set[int] = set()
        for cfg in self.dstates[did]:
            k = cfg % M
            if k == ACCEPT or not byte_bits[k] & bit:  # most configurations cannot read this byte
                continue
            stack = cfg // M
            kernels, pops = step(k, byte)
            for kk, frames in kernels:
                out.add((push(stack, frames) if frames else stack) * M + kk)
            if pops:
                out.update(self._pop_into(stack))
        if len(out) > rt.MAX_CONFIGS:
            if not self.overflowed:
                logger.warning(
                    "EBNF grammar is too ambiguous: a parse state would hold %d stacks (limit %d); "
                    "text leading there is treated as not allowed",
                    len(out),
                    rt.MAX_CONFIGS,
                )
                self.overflowed = True
            out = set()
        nxt = self.intern(frozenset(out))
        groups = self._class_groups(did)
        self.table[did, groups == groups[cls]] = (
            nxt  # the classes this state reads alike: same successor
        )
        return nxt

    def _class_groups(self, did: int) -> np.ndarray:
        """A group id per byte class: classes that every kernel of ``did`` reads with the
        same edge targets lead to the same parse state, so one transition computed fills its
        whole group. (Byte classes are global: a grammar with many literals has ~100, while
        a state inside a string tells apart a handful.)"""
        hit = self.groups.get(did)
        if hit is not None:
            return hit
        M, ACCEPT = self.M, self.ACCEPT
        kernels = frozenset(cfg % M for cfg in self.dstates[did]) - {ACCEPT}
        groups = self.kernel_groups.get(kernels)  # they depend on the kernels only, not the stacks
        if groups is None:
            distinct = {sig.tobytes(): sig for sig in map(self._edge_signature, kernels)}
            groups = np.zeros(len(self.class_rep), dtype=np.int64)
            for sig in distinct.values():  # mixed radix: equal iff equal in every signature
                radix = int(sig.max()) + 1
                if int(groups.max()) * radix >= 1 << 62:
                    groups = np.unique(groups, return_inverse=True)[1].reshape(-1)
                groups = groups * radix + sig
            self.kernel_groups[kernels] = groups
        self.groups[did] = groups
        return groups

    def _edge_signature(self, k: int) -> np.ndarray:
        """Per byte class, an id of the set of targets kernel ``k``'s edges reach on it."""
        hit = self.edge_signatures.get(k)
        if hit is None:
            bc = self.byte_class
            hit = np.zeros(len(self.class_rep), dtype=np.int64)  # 0: no edge
            edges = sorted(self.net.byte_edges[k])
            if all(
                a[1] < b[0] for a, b in zip(edges, edges[1:])
            ):  # disjoint ranges (the usual case)
                ids: dict = {}
                for lo, hi, t in edges:
                    hit[bc[lo] : bc[hi] + 1] = ids.setdefault(t, len(ids) + 1)
            else:
                targets: dict[int, list[int]] = {}
                for lo, hi, t in edges:
                    for c in range(int(bc[lo]), int(bc[hi]) + 1):
                        targets.setdefault(c, []).append(t)
                ids = {}
                for c, ts in targets.items():
                    hit[c] = ids.setdefault(tuple(sorted(set(ts))), len(ids) + 1)
            self.edge_signatures[k] = hit
        return hit

    def advance(self, did: int, data: bytes) -> int:
        cls = self.byte_class
        for b in data:
            did = self.transition(did, int(cls[b]))
            if did == DEAD:
                return DEAD
        return did

    def accepting(self, did: int) -> bool:
        return self.ACCEPT in self.dstates[did]

    def allowed_bytes(self, did: int) -> int:
        """Bit b set iff byte b can come next."""
        bits = 0
        M, byte_bits = self.M, self.net.byte_bits
        ACCEPT = self.ACCEPT
        for cfg in self.dstates[did]:
            k = cfg % M
            if k != ACCEPT:
                bits |= byte_bits[k]
        return bits

    # -- moving a parse state between tables ----------------------------------------

    def export(self, did: int) -> frozenset[tuple[int, tuple[int, ...]]]:
        out = set()
        for cfg in self.dstates[did]:
            k, s = cfg % self.M, cfg // self.M
            frames = []
            while s:
                frames.append(self.stack_ret[s])
                s = self.stack_parent[s]
            out.add((k, tuple(reversed(frames))))
        return frozenset(out)

    def import_(self, portable: frozenset[tuple[int, tuple[int, ...]]]) -> int:
        return self.intern(frozenset(self.push(0, frames) * self.M + k for k, frames in portable))

    # -- masks ---------------------------------------------------------------------

    def compute_mask(
        self, did: int, trie: VocabTrie, node_class: np.ndarray, kernel_route: bool
    ) -> np.ndarray:
        return self._pack(did, self.walk(did, trie, node_class)[trie.token_node] != DEAD, trie)

    def walk(self, did: int, trie: VocabTrie, node_class: np.ndarray) -> np.ndarray:
        """The parse state after each trie node's bytes (DEAD where they are not allowed);
        index ``n_nodes`` (the sentinel of tokens without bytes) is DEAD."""
        node_ds = np.zeros(trie.n_nodes + 1, dtype=np.int32)
        node_ds[0] = did  # the root (no token ends there)
        live = np.zeros(1, dtype=np.int64)  # the root
        live_ds = np.full(1, did, dtype=np.int32)
        child_count, child_start = trie.child_count, trie.child_start
        depth = 0
        # Sparse phase: expand only the children of live nodes (cheap while few are alive).
        while live.size and live.size <= rt.DENSE_SWITCH:
            cnt = child_count[live]
            has = cnt > 0
            if not has.all():
                live, live_ds, cnt = live[has], live_ds[has], cnt[has]
                if not live.size:
                    break
            total = int(cnt.sum())
            ends = np.cumsum(cnt)
            nodes = np.repeat(child_start[live] - (ends - cnt), cnt) + np.arange(total)
            nxt = self._step_nodes(np.repeat(live_ds, cnt), node_class[nodes])
            ok = nxt != DEAD
            live, live_ds = nodes[ok], nxt[ok]
            node_ds[live] = live_ds
            depth += 1
        if live.size:
            # Dense phase: many nodes alive (e.g. inside a string): walk whole levels, whose
            # nodes are contiguous, so parents and classes are plain slices.
            parent, level_start = trie.parent, trie.level_start
            for d in range(depth + 1, len(level_start) - 1):
                a, b = int(level_start[d]), int(level_start[d + 1])
                cur = node_ds[parent[a:b]]
                if not cur.any():
                    break
                node_ds[a:b] = self._step_nodes(cur, node_class[a:b])
        return node_ds

    def _step_nodes(self, cur: np.ndarray, classes: np.ndarray) -> np.ndarray:
        """table[cur, classes], computing the transitions not known yet."""
        nxt = self.table[cur, classes]
        unknown = nxt < 0
        if unknown.any():
            keys = np.unique(cur[unknown].astype(np.int64) * 65536 + classes[unknown])
            for key in keys.tolist():
                self.transition(key >> 16, key & 0xFFFF)
            nxt[unknown] = self.table[cur[unknown], classes[unknown]]
        return nxt
