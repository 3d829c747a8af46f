"""GrammarCompiler (cache, async, errors, dispatch) and the bitmask helpers."""

from __future__ import annotations

import threading

import pytest
import torch
from test_constrained_support import make_vocab

import sgl.constrained.regex.index as regex_mod
from sgl.constrained import (
    Grammar,
    GrammarCompiler,
    GrammarError,
    Matcher,
    allocate_bitmask,
    apply_bitmask_,
    bitmask_to_bool,
)


@pytest.fixture()
def compiler():
    c = GrammarCompiler(make_vocab("byte_level"), cache_size=2)
    yield c
    c.shutdown()


def test_cache_hits_and_lru_eviction(compiler: GrammarCompiler) -> None:
    a = compiler.compile("regex", "a+")
    assert compiler.compile("regex", "a+") is a
    b = compiler.compile("regex", "b+")
    compiler.compile("regex", "a+")  # touch a: b is now the oldest
    compiler.compile("regex", "c+")
    assert compiler.compile("regex", "a+") is a
    assert compiler.compile("regex", "b+") is not b  # evicted, rebuilt
    assert compiler.cache_info()["size"] == 2
    assert isinstance(a, Grammar) and isinstance(a.matcher(), Matcher)
    assert a.kind == "regex" and a.spec == "a+"


def test_async_compile(compiler: GrammarCompiler) -> None:
    fut = compiler.compile_async("json_schema", {"type": "integer"})
    g = fut.result(timeout=30)
    assert g.kind == "json_schema"
    again = compiler.compile_async("json_schema", '{"type": "integer"}')
    assert again.done() and again.result() is g  # cached: an already-completed future
    bad = compiler.compile_async("regex", "(?=x)")
    with pytest.raises(GrammarError) as info:
        bad.result(timeout=30)
    assert info.value.param == "regex"
    assert compiler.compile_async("regex", "(?=x)").done()  # failures are cached too


def test_malformed_requests_raise_synchronously(compiler: GrammarCompiler) -> None:
    with pytest.raises(GrammarError):
        compiler.compile_async("yaml", "x")
    with pytest.raises(GrammarError) as info:
        compiler.compile_async("json_schema", "{not json")
    assert info.value.param == "json_schema"
    with pytest.raises(GrammarError):
        compiler.compile("regex", {"a": 1})


def test_concurrent_compiles_of_one_spec_build_once(monkeypatch: pytest.MonkeyPatch) -> None:
    compiler = GrammarCompiler(make_vocab("byte_level"), max_workers=4)
    built: list[str] = []
    real = regex_mod.RegexGrammar.__init__
    gate = threading.Event()

    def slow_init(self, *args, **kwargs):
        built.append(args[1])
        gate.wait(5)
        real(self, *args, **kwargs)

    monkeypatch.setattr(regex_mod.RegexGrammar, "__init__", slow_init)
    futures = [compiler.compile_async("regex", "[0-9]{4}") for _ in range(5)]
    results: list = []
    t = threading.Thread(target=lambda: results.append(compiler.compile("regex", "[0-9]{4}")))
    t.start()
    gate.set()
    t.join(10)
    grammars = {id(f.result(timeout=10)) for f in futures} | {id(r) for r in results}
    assert len(grammars) == 1 and built == ["[0-9]{4}"]
    compiler.shutdown()


def test_ebnf_and_json_object_dispatch(compiler: GrammarCompiler) -> None:
    ebnf = pytest.importorskip("sgl.constrained.ebnf")
    g = compiler.compile("ebnf", 'root ::= "yes" | "no"')
    m = g.matcher()
    assert isinstance(m, Matcher)
    vocab = make_vocab("byte_level")
    y = vocab.token_bytes.index(b"y")
    assert m.accept(y) and not m.is_accepting()
    j = compiler.compile("json_object", "")
    assert j is compiler.compile("json_object", {"ignored": True})
    assert hasattr(ebnf, "JSON_GRAMMAR")


def test_bitmask_helpers() -> None:
    gen = torch.Generator().manual_seed(0)
    for vocab_size in (1, 31, 32, 33, 100, 1000):
        allowed = torch.rand(3, vocab_size, generator=gen) < 0.3
        mask = allocate_bitmask(3, vocab_size)
        assert (
            mask.dtype == torch.int32
            and mask.shape == (3, (vocab_size + 31) // 32)
            and not mask.any()
        )
        for b in range(3):
            for i in torch.nonzero(allowed[b]).flatten().tolist():
                word = int(mask[b, i // 32]) & 0xFFFFFFFF
                word |= 1 << (i % 32)
                mask[b, i // 32] = word - (1 << 32) if word >= 1 << 31 else word
        assert torch.equal(bitmask_to_bool(mask, vocab_size), allowed)
        assert torch.equal(bitmask_to_bool(mask[1], vocab_size), allowed[1])
        logits = torch.randn(3, vocab_size, generator=gen)
        expect = logits.masked_fill(~allowed, float("-inf"))
        assert torch.equal(apply_bitmask_(logits, mask), expect)
    with pytest.raises(ValueError):
        bitmask_to_bool(allocate_bitmask(1, 32), 33)


def test_gc_is_paused_during_a_compile_and_restored_after(
    compiler: GrammarCompiler, monkeypatch
) -> None:
    """Compiles run with the cyclic collector off (sgl.constrained.gcpause); it comes back on
    afterwards, also after a failed compile, and stays off if it was off before."""
    import gc

    import sgl.constrained.compiler as compiler_mod

    seen: list[bool] = []
    real = compiler_mod.GrammarCompiler._build

    def spy(self, *args):
        seen.append(gc.isenabled())
        return real(self, *args)

    monkeypatch.setattr(compiler_mod.GrammarCompiler, "_build", spy)
    assert gc.isenabled()
    compiler.compile("regex", "[ab]+")
    with pytest.raises(GrammarError):
        compiler.compile("regex", "(")
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        compiler.compile("regex", "c+")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_gc_pause_nests_across_threads() -> None:
    """Overlapping pauses (concurrent compiles): the collector returns when the last one ends."""
    import gc

    from sgl.constrained.gcpause import gc_paused

    inside, release = threading.Event(), threading.Event()

    def worker() -> None:
        with gc_paused():
            inside.set()
            release.wait(30)

    t = threading.Thread(target=worker)
    with gc_paused():
        t.start()
        assert inside.wait(30)
    assert not gc.isenabled()  # the worker's pause is still open
    release.set()
    t.join(30)
    assert gc.isenabled()


def test_overlapping_pauses_still_collect(monkeypatch) -> None:
    """Back-to-back overlapping compiles cannot keep the collector off for good: a pause that
    ends past MAX_PAUSE_S while another is open runs a collection."""
    import gc

    from sgl.constrained import gcpause

    calls: list[int] = []
    monkeypatch.setattr(gcpause, "MAX_PAUSE_S", 0.0)
    monkeypatch.setattr(gcpause.gc, "collect", lambda *a: calls.append(1) or 0)
    with gcpause.gc_paused():
        with gcpause.gc_paused():
            pass
        assert calls == [1] and not gc.isenabled()
    assert gc.isenabled()
