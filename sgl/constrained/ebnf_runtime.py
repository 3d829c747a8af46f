"""The EBNF recognizer and its token masks (the back half of :mod:`sgl.constrained.ebnf`): how
they work, the limits both recognizers read, and which one a grammar gets.

A *configuration* is a network state that reads bytes plus the stack of return states
below it; the parse state after some text is the SET of configurations the text can
lead to (a GLR-style frontier). Stacks are hash-consed into ids, configurations are
packed into ints (``stack_id * M + state``) and every distinct set is interned as a
*dstate* id, so the recognizer becomes a DFA built lazily over dstates: a transition
is computed once and then read from a table forever after.

Token masks come from walking a byte trie of the vocabulary one level at a time
(``table[dstate, byte_class]`` for each live node); a subtree is dropped as soon as
its dstate is dead. Bytes that every edge of the grammar treats alike share one *byte
class*, which keeps the table narrow; classes a new dstate cannot read are marked dead
when it is interned, so only readable ones are ever computed. Finished masks are cached
per dstate (LRU).

Two recognizers implement this: :class:`~sgl.constrained.ebnf_python.Tables` (Python; the
walk in numpy, all live nodes of a level at once) and ``ebnf_native.NativeTables`` (the same
algorithm in C++, ``csrc/ebnf_native.cpp``, with masks by per-kernel walks), used wherever it
builds; they give the same masks, and the tests hold the C++ one to the Python one. What they
share (mask cache, budget-aware masks, forced text) is
:class:`~sgl.constrained.ebnf_tables.TablesBase`; the vocabulary trie they walk is
:mod:`~sgl.constrained.ebnf_trie`'s. This module holds what both read: the limits below, the
C++ module's build (:func:`native_walk`), the byte classes, and :func:`make_tables`, which
picks one.

All of this is per grammar, shared by its matchers, and bounded: when the tables
grow past their limits they are replaced, and each matcher re-interns its own
history the next time it is used.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sgl.constrained.ebnf_automaton import Network

if TYPE_CHECKING:
    from sgl.constrained.ebnf_tables import TablesBase

logger = logging.getLogger(__name__)

DEAD = 0  # the empty configuration set
MAX_CONFIGS = 4096  # stacks per parse state; a token leading past this is not allowed
MAX_DSTATES = 32_768  # tables are replaced past this many parse states ...
MAX_STACKS = 1_000_000  # ... or this many distinct stacks
MASK_CACHE_SIZE = 512
KERNEL_MASK_CACHE_BYTES = 32 << 20  # kernel walks kept per grammar (LRU past it)
KERNEL_ROUTE = True  # native masks through the kernel tables (see NativeTables.native_mask)
DENSE_SWITCH = 2048  # live trie nodes in one level beyond which whole levels are processed
FORCED_LIMIT = 256  # bytes of jump-forward text computed at most
PLAN_LIMIT = (
    4096  # bytes of a completion a request's state is planned with (longer: the per-state figure)
)
PLAN_CONFIGS = 8  # configurations of a state planned: those the per-state figure ranks best
PLANS_KEPT = 8192  # planned completions kept per grammar (LRU)


_NATIVE_SOURCE = Path(__file__).parent / "csrc" / "ebnf_native.cpp"
_native_lock = threading.Lock()
_native: list = []  # [module or None], once tried


def native_walk():
    """The C++ recognizer and mask walks (csrc/ebnf_native.cpp), built on first use (~30 s
    once per machine, then cached); None where it cannot be built or ``SGL_NATIVE_MASKS=0``:
    grammars then run on the Python tables and the numpy walk, the same masks, slower."""
    with _native_lock:
        if not _native:
            module = None
            if os.environ.get("SGL_NATIVE_MASKS", "1") != "0":
                try:
                    from sgl import native

                    module = native.build(
                        "sgl_ebnf_native",
                        _NATIVE_SOURCE,
                        ["-O3", "-march=native"],
                        python_module=True,
                    )
                except Exception as e:  # no compiler, no ninja, no torch: the numpy walk
                    logger.warning(
                        "the native EBNF recognizer could not be built (%s); using the Python one",
                        e,
                    )
            _native.append(module)
        return _native[0]


def byte_classes(net: Network) -> tuple[np.ndarray, list[int]]:
    """Partition bytes 0..255 into classes no edge of `net` tells apart."""
    cuts = {0, 256}
    for edges in net.byte_edges:
        for lo, hi, _ in edges:
            cuts.add(lo)
            cuts.add(hi + 1)
    bounds = sorted(cuts)
    byte_class = np.zeros(256, dtype=np.int32)
    reps: list[int] = []
    for c, (a, b) in enumerate(zip(bounds, bounds[1:])):
        byte_class[a:b] = c
        reps.append(a)
    return byte_class, reps


def make_tables(net: Network, byte_class: np.ndarray, class_rep: list[int]) -> TablesBase:
    """A grammar's recognizer: the C++ one where it builds, else the Python one."""
    if native_walk() is not None:
        from sgl.constrained.ebnf_native import NativeTables

        return NativeTables(net, byte_class, class_rep)
    from sgl.constrained.ebnf_python import Tables

    return Tables(net, byte_class, class_rep)
