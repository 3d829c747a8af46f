"""Constraint compilation is bounded: the automaton is built in a child process capped in
memory and time; past a limit the request gets a GrammarError naming it, and the compiler
keeps working."""

from __future__ import annotations

import random

import pytest
from test_constrained_support import allowed_set, make_vocab

from sgl.constrained import GrammarCompiler, GrammarError

EXPLOSIVE = "(a|b)*a(a|b){24}"  # its DFA has 2**25 states


@pytest.fixture(scope="module")
def vocab():
    return make_vocab("byte_level")


def test_isolated_masks_equal_in_process_masks(vocab) -> None:
    isolated = GrammarCompiler(vocab, isolate=True)
    local = GrammarCompiler(vocab)
    rng = random.Random(0)
    try:
        for pattern in (
            "[a-z]+@[a-z]+\\.(com|org)",
            "(ab|cd){2,4}x?",
            "[0-9]{1,3}(\\.[0-9]{1,3}){3}",
        ):
            a, b = (
                isolated.compile("regex", pattern).matcher(),
                local.compile("regex", pattern).matcher(),
            )
            for _ in range(12):
                allowed = allowed_set(a, vocab)
                assert allowed == allowed_set(b, vocab)
                choices = sorted(t for t in allowed if t not in vocab.eos_token_ids)
                if not choices:
                    break
                tid = rng.choice(choices)
                assert a.accept(tid) and b.accept(tid)
    finally:
        isolated.shutdown()


def test_time_limit_gives_a_grammar_error_and_the_compiler_recovers(vocab) -> None:
    comp = GrammarCompiler(vocab, isolate=True, compile_timeout_s=1.0)
    try:
        with pytest.raises(GrammarError, match="longer than 1 s") as info:
            comp.compile("regex", EXPLOSIVE)
        assert info.value.param == "regex"
        assert comp.compile("regex", "x[0-9]{3}").matcher().accept_text("x123")  # a fresh child
    finally:
        comp.shutdown()


def test_memory_limit_gives_a_grammar_error_and_the_compiler_recovers(vocab) -> None:
    comp = GrammarCompiler(
        vocab, isolate=True, compile_timeout_s=600, compile_memory_bytes=300 << 20
    )
    try:
        with pytest.raises(GrammarError, match="compile memory limit") as info:
            comp.compile("regex", EXPLOSIVE)
        assert info.value.param == "regex"
        assert comp.compile("regex", "y+").matcher().accept_text("yy")
    finally:
        comp.shutdown()


def test_a_json_schema_over_the_regex_limits_takes_the_grammar_route(vocab) -> None:
    from sgl.constrained.ebnf import EbnfGrammar

    comp = GrammarCompiler(vocab, isolate=True)
    try:
        g = comp.compile("json_schema", {"type": "string", "pattern": f"^{EXPLOSIVE}$"})
        assert isinstance(g, EbnfGrammar) and g.kind == "json_schema"
        m = g.matcher()
        assert m.accept_text('"' + "b" * 5 + "a" + "ab" * 12 + '"') and m.is_accepting()
        assert not g.matcher().accept_text(
            '"' + "a" + "b" * 25 + '"'
        )  # its 'a' is not 25th from the end
    finally:
        comp.shutdown()


def test_a_long_regex_skips_the_regex_route(vocab) -> None:
    """Past REGEX_ROUTE_MAX_TEXT characters the regex route is not tried (its index would
    not build in time); shorter ones still get it."""
    from sgl.constrained import compiler as compiler_mod
    from sgl.constrained.ebnf import EbnfGrammar
    from sgl.constrained.json_schema import json_schema_to_rx
    from sgl.constrained.regex import RegexGrammar

    wide = {"type": "object", "properties": {f"name_{i}": {"type": "boolean"} for i in range(40)}}
    assert len(json_schema_to_rx(wide).text) > compiler_mod.REGEX_ROUTE_MAX_TEXT
    comp = GrammarCompiler(vocab, isolate=True)
    try:
        g = comp.compile("json_schema", wide)
        assert isinstance(g, EbnfGrammar)
        assert g.matcher().accept_text('{"name_3": true, "other": [1]}')
        assert isinstance(
            comp.compile(
                "json_schema",
                {
                    "type": "object",
                    "properties": {"a": {"type": "boolean"}},
                    "additionalProperties": False,
                },
            ),
            RegexGrammar,
        )
    finally:
        comp.shutdown()
