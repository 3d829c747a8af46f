"""The OpenAI backend's pure parts: when a speculation may fill a gen, each server kind's
constraint fields, and retry waits. No server, no model."""

from __future__ import annotations

import itertools
import re

import pytest

from sgl.lang.backends.base import TokenUsage
from sgl.lang.backends.openai_dialects import (
    DTYPE_GBNF,
    UnsupportedParameterError,
    choice_fields,
    constraint_fields,
    extra_sampling_fields,
    version_tuple,
)
from sgl.lang.backends.openai_http import Http, retry_after_seconds
from sgl.lang.generation import DTYPE_REGEX
from sgl.lang.speculative import Speculation, earliest_stop, sampling_key

GREEDY = {"temperature": 0.0, "top_p": 1.0}


def spec(tokens: list[str], eos: bool = False, pos: int = 0) -> Speculation:
    ends, n = [], 0
    for t in tokens:
        n += len(t)
        ends.append(n)
    return Speculation("".join(tokens), tuple(ends), eos, sampling_key(GREEDY), pos)


def gen(max_new: int, stop=None) -> dict:
    return {**GREEDY, "max_new_tokens": max_new, "stop": stop}


def test_fill_up_to_the_stop_counting_tokens_through_it():
    s = spec([" Carol", "\n", "Age", ":", " 35", "\n"])
    text, meta = s.take(gen(8, "\n"))
    assert text == " Carol"
    assert (
        meta["finish_reason"] == {"type": "stop", "matched": "\n"}
        and meta["completion_tokens"] == 2
    )


def test_the_limit_before_the_stop_is_a_length_finish_at_a_token_boundary():
    s = spec([" Car", "ol", " Smith", "\n"])
    assert s.take(gen(2, "\n")) == (
        " Carol",
        {"finish_reason": {"type": "length", "length": 2}, "completion_tokens": 2},
    )


def test_no_fill_when_it_cannot_be_proven():
    s = spec([" Car", "ol", "\n"])
    # A longer stop starting earlier could still complete past the speculation's end.
    assert s.take(gen(8, ["\n", "Carol\nX"])) is None
    # The earlier-starting stop is undecided when the limit comes.
    assert spec([" Car", "ol", "\n", "A"]).take(gen(3, ["\n", "ol\nA"])) is None
    assert (
        s.take(gen(2, "\n"))[1]["finish_reason"]["type"] == "length"
    )  # the stop's token is never made
    assert (
        spec([" a", " b"]).take(gen(5, "\n")) is None
    )  # cut by the limit before this gen's own limit
    assert s.take({**gen(8, "\n"), "temperature": 0.7}) is None  # other sampling parameters
    assert s.take({**gen(8, "\n"), "regex": "x"}) is None  # constrained gens are never filled
    assert spec([" Car", "ol", "\n"], pos=2).take(gen(8, "\n")) is None  # starts mid-token


def test_after_follows_the_program_text_and_drops_on_a_difference():
    s = spec([" Carol", "\n", "Age", ":", " 35", "\n"])
    later = s.after(" Carol").after("\nAge:")
    assert later.pos == len(" Carol\nAge:")
    assert later.take(gen(4, "\n"))[0] == " 35"
    assert s.after(" Carol").after("\nYears:") is None


def test_eos_ends_a_gen_within_its_budget():
    s = spec([" yes", "."], eos=True)
    assert s.take(gen(8)) == (
        " yes.",
        {"finish_reason": {"type": "stop", "matched": None}, "completion_tokens": 2},
    )
    assert spec([" yes", "."], eos=False).take(gen(8)) is None


def test_earliest_stop_is_the_smallest_start_then_the_shortest():
    assert earliest_stop("abcd", ["c", "abcd"]) == (0, "abcd")
    assert earliest_stop("xab", ["ab", "a"]) == (1, "a")
    assert earliest_stop("xyz", ["q"]) is None


@pytest.mark.parametrize(
    "kind, sampling, chat, want",
    [
        ("sgl", {"regex": r"\d+"}, False, {"regex": r"\d+"}),
        (
            "sgl",
            {"json_schema": '{"type": "object"}'},
            False,
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": {"type": "object"}},
                }
            },
        ),
        (
            "sglang",
            {"json_schema": {"type": "object"}},
            False,
            {"json_schema": '{"type": "object"}'},
        ),
        ("vllm", {"regex": r"\d+"}, False, {"structured_outputs": {"regex": r"\d+"}}),
        ("llama.cpp", {"regex": DTYPE_REGEX["int"]}, False, {"grammar": DTYPE_GBNF["int"]}),
        (
            "llama.cpp",
            {"json_schema": {"type": "object"}},
            True,
            {"json_schema": {"type": "object"}},
        ),
        (
            "openai",
            {"json_schema": {"type": "object"}},
            True,
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": {"type": "object"}},
                }
            },
        ),
    ],
)
def test_constraint_fields_per_server_kind(kind, sampling, chat, want):
    assert constraint_fields(kind, sampling, chat) == want


@pytest.mark.parametrize(
    "name, alphabet",
    [("int", "-019. \n"), ("float", "-09.e \n"), ("bool", "TrFalse"), ("str", '"a\\\n\x1f\x7fé')],
)
def test_dtype_grammars_for_llama_cpp_are_the_dtype_regexes(name, alphabet):
    """Each GBNF, compiled by sgl's own EBNF compiler (llama.cpp's grammar syntax), accepts exactly
    the strings its regex fullmatches: brute force over short strings, fed byte by byte."""
    from sgl.constrained import TokenVocabulary
    from sgl.constrained.ebnf import compile_ebnf

    vocab = TokenVocabulary(
        token_bytes=(None, *(bytes([b]) for b in range(256))), eos_token_ids=(0,), vocab_size=257
    )
    grammar = compile_ebnf(DTYPE_GBNF[name], vocab)
    for text in ("".join(p) for n in range(6) for p in itertools.product(alphabet, repeat=n)):
        m = grammar.matcher()
        fed = all(m.accept(b + 1) for b in text.encode())
        assert (fed and m.is_accepting()) == (re.fullmatch(DTYPE_REGEX[name], text) is not None), (
            name,
            text,
        )


def test_old_vllm_gets_guided_fields_and_refusals_name_the_parameter():
    assert constraint_fields("vllm", {"json_schema": {}}, True, version_tuple("0.8.5")) == {
        "guided_json": {}
    }
    assert choice_fields("vllm", ["a", "b"], version_tuple("0.6.3.post1")) == {
        "guided_choice": ["a", "b"]
    }
    for kind, sampling, param in (
        ("openai", {"regex": "x"}, "regex"),
        ("openai", {"ebnf": "x"}, "ebnf"),
        ("openai", {"json_schema": {}}, "json_schema"),
        ("llama.cpp", {"regex": "x"}, "regex"),
        ("openai", {"regex": DTYPE_REGEX["bool"]}, "dtype"),
    ):
        with pytest.raises(UnsupportedParameterError) as info:
            constraint_fields(kind, sampling, chat=False)
        assert info.value.param == param
    with pytest.raises(UnsupportedParameterError, match="min_new_tokens"):
        extra_sampling_fields("llama.cpp", {"min_new_tokens": 3})
    assert extra_sampling_fields("openai", {"top_k": -1, "min_p": 0.0, "ignore_eos": False}) == {}


def test_choice_fields_escape_the_choices():
    assert choice_fields("sgl", ["a.b", " c|d"]) == {"regex": r"(a\.b| c\|d)"}
    assert choice_fields("llama.cpp", ['say "hi"', "no"]) == {
        "grammar": 'root ::= "say \\"hi\\"" | "no"'
    }
    assert choice_fields("openai", ["a"]) is None


class _Resp:
    def __init__(self, retry_after):
        self.headers = {"Retry-After": retry_after} if retry_after is not None else {}


def test_retry_wait_honours_retry_after_within_the_cap():
    http = Http(
        "http://127.0.0.1:1/v1",
        None,
        5.0,
        3,
        retry_backoff=0.5,
        max_retry_wait=10.0,
        usage=TokenUsage(),
    )
    assert http.retry_wait(0, _Resp("7")) == 7.0
    assert http.retry_wait(0, _Resp("120")) == 10.0
    assert (
        0.25 <= http.retry_wait(0, _Resp(None)) <= 0.5
        and 1.0 <= http.retry_wait(2, _Resp(None)) <= 2.0
    )
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert retry_after_seconds("soon") is None
