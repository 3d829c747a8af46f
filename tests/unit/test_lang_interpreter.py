"""The interpreter run against a deterministic fake backend: text, gen, select, roles,
variables, errors, binding and the default backend. No model, no torch."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys

import pytest
from lang_fakes import CHATML, FakeBackend, FakeBackendError, within

import sgl
import sgl.lang.api
from sgl.lang import ir
from sgl.lang.choices import ChoiceScores, decide
from sgl.lang.generation import DTYPE_REGEX

TYPE_HINT = "add a str, a number, or an sgl expression"


def captured():
    """A list the program appends its state to, to inspect it after run raised."""
    return []


# --------------------------------------------------------------------------- text


@within(10)
def test_text_concatenation_and_numbers():
    @sgl.function
    def prog(s):
        s += "a"
        s += "b" + "c"
        s += 3
        s += 2.5
        s += "|" + sgl.gen("v") + "|"
        s += 7 + sgl.gen("w")

    fake = FakeBackend(default="G")
    state = prog.run(backend=fake)
    assert state.text() == "abc32.5|G|7G"
    assert state["v"] == "G" and state["w"] == "G"
    # Each gen continues exactly the text before it.
    assert [c.text for c in fake.gen_calls] == ["abc32.5|", "abc32.5|G|7"]


def test_expressions_concatenate_into_one_list():
    e = "Q: " + sgl.gen("a") + "\n" + 1
    assert isinstance(e, ir.ExprList)
    assert [type(x).__name__ for x in ir.flatten(e)] == ["Text", "Gen", "Text", "Text"]
    assert ir.flatten(e)[-1].text == "1"


@pytest.mark.parametrize("bad", [None, True, ["x"], b"bytes", {"k": 1}, object()])
@within(10)
def test_bad_types_raise_type_error_naming_the_fix(bad):
    @sgl.function
    def prog(s):
        s += "ok"
        s += bad

    with pytest.raises(TypeError, match=TYPE_HINT):
        prog.run(backend=FakeBackend())
    with pytest.raises(TypeError, match=TYPE_HINT):
        sgl.gen("v") + bad


# --------------------------------------------------------------------------- gen


@within(10)
def test_gen_sets_variable_and_meta_info():
    @sgl.function
    def prog(s, q):
        s += "Q: " + q + "\nA:" + sgl.gen("answer", max_tokens=5)
        s += "\nWhy:" + sgl.gen("why", stop="\n")
        s += "\nDone:" + sgl.gen("done")

    fake = FakeBackend(replies={"A:": " hello world", "Why:": " because\nmore", "Done:": "ok"})
    state = prog.run("hi", backend=fake)
    assert state["answer"] == " hell"
    assert state["why"] == " because"
    assert state["done"] == "ok"
    assert state.text() == "Q: hi\nA: hell\nWhy: because\nDone:ok"

    meta = state.get_meta_info("answer")
    assert meta["finish_reason"] == {"type": "length", "length": 5}
    assert meta["completion_tokens"] == 5
    assert meta["prompt_tokens"] == len("Q: hi\nA:")
    assert state.get_meta_info("why")["finish_reason"] == {"type": "stop", "matched": "\n"}
    assert state.get_meta_info("done")["finish_reason"] == {"type": "stop", "matched": None}
    assert state.get_meta_info("answer")["id"] != state.get_meta_info("why")["id"]
    with pytest.raises(KeyError, match="nope"):
        state.get_meta_info("nope")


@within(10)
def test_program_defaults_merge_with_per_gen_overrides():
    @sgl.function
    def prog(s):
        s += "1:" + sgl.gen("a")
        s += "2:" + sgl.gen("b", max_tokens=3, temperature=0.9, stop="X", top_k=5)
        s += "3:" + sgl.gen("c", max_new_tokens=4, min_tokens=1, seed=11, repetition_penalty=1.1)

    fake = FakeBackend()
    prog.run(max_new_tokens=7, temperature=0.3, stop=["END"], top_p=0.8, backend=fake)
    a, b, c = (call.sampling for call in fake.gen_calls)

    assert (
        a["max_new_tokens"] == 7
        and a["temperature"] == 0.3
        and a["stop"] == ["END"]
        and a["top_p"] == 0.8
    )
    assert (
        b["max_new_tokens"] == 3
        and b["temperature"] == 0.9
        and b["stop"] == "X"
        and b["top_k"] == 5
    )
    assert b["top_p"] == 0.8  # not overridden: the program's default
    assert c["max_new_tokens"] == 4 and c["min_new_tokens"] == 1 and c["seed"] == 11
    assert c["repetition_penalty"] == 1.1 and c["temperature"] == 0.3 and c["stop"] == ["END"]
    for s in (a, b, c):
        assert set(s) <= set(ir.SAMPLING_KEYS)
        assert None not in s.values()
        assert not {"regex", "json_schema", "ebnf"} & set(s)
    # Without return_logprob no logprob options are sent.
    assert all(call.logprobs == {} for call in fake.gen_calls)


@within(10)
def test_run_defaults_when_nothing_is_given():
    @sgl.function
    def prog(s):
        s += sgl.gen("a")

    fake = FakeBackend()
    prog.run(backend=fake)
    sampling = fake.gen_calls[0].sampling
    assert sampling["max_new_tokens"] == 128 and sampling["temperature"] == 1.0
    assert "stop" not in sampling


def test_max_tokens_alias():
    assert sgl.gen("a", max_tokens=9).sampling == {"max_new_tokens": 9}
    assert sgl.gen("a", max_new_tokens=9).sampling == {"max_new_tokens": 9}
    assert sgl.gen("a", max_tokens=9, max_new_tokens=9).sampling == {"max_new_tokens": 9}
    assert sgl.gen("a", min_tokens=2).sampling == {"min_new_tokens": 2}
    with pytest.raises(ValueError, match="max_tokens or max_new_tokens"):
        sgl.gen("a", max_tokens=3, max_new_tokens=4)


@within(10)
def test_logprob_options():
    @sgl.function
    def prog(s):
        s += "a" + sgl.gen("a", return_logprob=True)
        s += "b" + sgl.gen("b", return_logprob=True, logprob_start_len=0, top_logprobs_num=3)
        s += "c" + sgl.gen("c")

    fake = FakeBackend(default="xy")
    state = prog.run(backend=fake)
    a, b, c = (call.logprobs for call in fake.gen_calls)
    assert a == {"return_logprob": True, "logprob_start_len": -1}
    assert b == {"return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3}
    assert c == {}
    assert len(state.get_meta_info("a")["output_token_logprobs"]) == 2
    assert "output_token_logprobs" not in state.get_meta_info("c")

    fake = FakeBackend()
    prog.run(backend=fake, return_logprob=True, top_logprobs_num=2)
    assert fake.gen_calls[2].logprobs == {
        "return_logprob": True,
        "logprob_start_len": -1,
        "top_logprobs_num": 2,
    }


@pytest.mark.parametrize(
    "dtype,name,value",
    [
        (int, "int", "42"),
        (float, "float", "3.25"),
        (bool, "bool", "True"),
        (str, "str", '"fake"'),
        ("int", "int", "42"),
    ],
)
@within(10)
def test_dtype_becomes_regex(dtype, name, value):
    @sgl.function
    def prog(s):
        s += "x = " + sgl.gen("x", dtype=dtype, max_tokens=20)

    fake = FakeBackend()
    state = prog.run(backend=fake)
    assert fake.gen_calls[0].sampling["regex"] == DTYPE_REGEX[name]
    assert fake.gen_calls[0].sampling.get("stop") == (
        [" ", "\n"] if name in ("int", "float") else None
    )
    assert state["x"] == value


def test_number_dtypes_keep_the_callers_stop_strings():
    @sgl.function
    def prog(s):
        s += sgl.gen("a", dtype=int, stop=";") + sgl.gen("b", dtype=float, stop=["x", "y"])

    fake = FakeBackend()
    prog.run(backend=fake)
    assert [c.sampling["stop"] for c in fake.gen_calls] == [[";", " ", "\n"], ["x", "y", " ", "\n"]]


def _strings(alphabet: str, longest: int):
    return ("".join(p) for n in range(longest + 1) for p in itertools.product(alphabet, repeat=n))


def _json_value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


@pytest.mark.parametrize(
    "name, alphabet, is_json",
    [
        ("int", "-+0159.e \n", lambda v, t: type(v) is int),
        ("float", "-+019.e \n", lambda v, t: type(v) in (int, float) and "e" not in t),
        ("str", '"a\\\n\t\x1f\x7fé ', lambda v, t: type(v) is str and "\\" not in t),
    ],
)
def test_dtype_values_are_exactly_json_literals(name, alphabet, is_json):
    """Brute force over short strings: dtype values and JSON literals match both ways.

    A value the dtype regex gives (its trailing space or newline is a stop string, cut off) is a
    JSON literal of that type, and every such literal (no exponent, no escapes: the regexes spell
    neither) is one it can give. So a program can write it into JSON."""
    for text in _strings(alphabet, 5):
        value = text[:-1] if name != "str" and text[-1:] in (" ", "\n") else text
        full = re.fullmatch(DTYPE_REGEX[name], text) is not None
        if full:
            assert value.strip() == value and is_json(_json_value(value), value), (name, text)
        elif text == value and value.strip() == value:
            assert not is_json(_json_value(value), value), (name, text)


@within(10)
def test_gen_int_and_gen_string():
    @sgl.function
    def prog(s):
        s += "n = " + sgl.gen_int("n") + ", s = " + sgl.gen_string("s", max_tokens=30)

    fake = FakeBackend()
    state = prog.run(backend=fake)
    assert [c.sampling["regex"] for c in fake.gen_calls] == [DTYPE_REGEX["int"], DTYPE_REGEX["str"]]
    assert fake.gen_calls[1].sampling["max_new_tokens"] == 30
    assert state.text() == 'n = 42, s = "fake"'


def test_bad_dtype_is_rejected():
    with pytest.raises(ValueError, match="dtype"):
        sgl.gen("x", dtype=list)
    with pytest.raises(ValueError, match="dtype"):
        sgl.gen("x", dtype="complex")


@pytest.mark.parametrize(
    "extra", [{"regex": "[a-z]+"}, {"json_schema": "{}"}, {"ebnf": 'root ::= "a"'}]
)
@within(10)
def test_dtype_plus_constraint_is_an_error(extra):
    holder = captured()

    @sgl.function
    def prog(s):
        holder.append(s)
        s += "before" + sgl.gen("x", dtype=int, **extra)
        s += "after"

    fake = FakeBackend()
    with pytest.raises(sgl.ProgramError) as info:
        prog.run(backend=fake)
    assert isinstance(info.value.__cause__, ValueError)
    assert "dtype" in str(info.value.__cause__)
    assert fake.gen_calls == []  # nothing was sent
    assert "after" not in holder[0].stream_executor.text_


@within(10)
def test_two_constraints_are_an_error():
    @sgl.function
    def prog(s):
        s += sgl.gen("x", regex="a+", json_schema="{}")

    fake = FakeBackend()
    with pytest.raises(sgl.ProgramError, match="at most one"):
        prog.run(backend=fake)
    assert fake.gen_calls == []


@within(10)
def test_regex_reaches_backend():
    @sgl.function
    def prog(s):
        s += "ip: " + sgl.gen("ip", regex=r"\d+\.\d+")

    fake = FakeBackend(replies={"ip: ": "1.2"})
    assert prog.run(backend=fake)["ip"] == "1.2"
    assert fake.gen_calls[0].sampling["regex"] == r"\d+\.\d+"


# --------------------------------------------------------------------------- select

CHOICES = ["cat", "tiger", "dog"]
# Means of the conditional logprobs: cat -2.0, tiger -1.2, dog -1.5 -> token_length_normalized:
# tiger. First token: cat -0.4 is the most likely -> greedy_token_selection: cat.
TABLE = {"cat": [-0.4, -3.6], "tiger": [-1.0, -1.2, -1.4], "dog": [-1.5, -1.5]}
# cond - uncond: cat [0.1, -0.1] -> 0.0; tiger [-0.8, -1.0, -1.2] -> -1.0; dog [1.5, 1.5] -> 1.5
# -> unconditional_likelihood_normalized: dog.
UNCOND = {"cat": [-0.5, -3.5], "tiger": [-0.2, -0.2, -0.2], "dog": [-3.0, -3.0]}


def _select_prog(**kwargs):
    @sgl.function
    def prog(s):
        s += "Animal:" + sgl.select("animal", choices=CHOICES, **kwargs) + "."

    return prog


@pytest.mark.parametrize(
    "method,expected",
    [
        (None, "tiger"),
        (sgl.token_length_normalized, "tiger"),
        (sgl.greedy_token_selection, "cat"),
        (sgl.unconditional_likelihood_normalized, "dog"),
    ],
)
@within(10)
def test_select_methods(method, expected):
    fake = FakeBackend(table=TABLE, uncond=UNCOND)
    state = _select_prog(choices_method=method).run(backend=fake)
    assert state["animal"] == expected
    assert state.text() == f"Animal:{expected}."
    (call,) = fake.select_calls
    assert call.text == "Animal:" and call.choices == CHOICES and call.temperature == 0.0
    assert call.method is (method or sgl.token_length_normalized)
    meta = state.get_meta_info("animal")
    assert meta["normalized_prompt_logprobs"] == pytest.approx([-2.0, -1.2, -1.5])
    assert meta["input_token_logprobs"] == [TABLE[c] for c in CHOICES]
    if method is sgl.unconditional_likelihood_normalized:
        assert meta["normalized_unconditional"] == pytest.approx([0.0, -1.0, 1.5])
        assert meta["unconditional_token_logprobs"] == [UNCOND[c] for c in CHOICES]
    assert fake.gen_calls == []


def test_greedy_token_selection_pads_short_choices_with_their_mean():
    # "ab" ties "abc" on both of its tokens; at position 2 it is padded with its mean (-1.0),
    # which beats "abc"'s third token (-3.0).
    scores = ChoiceScores(["ab", "abc"], [[-0.5, -1.5], [-0.5, -1.5, -3.0]])
    assert decide(sgl.greedy_token_selection, scores, 0.0).decision == "ab"
    scores = ChoiceScores(["ab", "abc"], [[-0.5, -1.5], [-0.5, -1.5, -0.1]])
    assert decide(sgl.greedy_token_selection, scores, 0.0).decision == "abc"


def test_unconditional_needs_unconditional_scores():
    with pytest.raises(ValueError, match="unconditional"):
        decide(sgl.unconditional_likelihood_normalized, ChoiceScores(["a"], [[-1.0]]), 0.0)


@within(10)
def test_select_with_temperature_samples_within_the_choices():
    @sgl.function
    def prog(s):
        for i in range(40):
            s += sgl.select(f"c{i}", choices=CHOICES, temperature=1.0) + " "

    fake = FakeBackend(table=TABLE, seed=1)
    state = prog.run(backend=fake)
    picks = [state[f"c{i}"] for i in range(40)]
    assert set(picks) <= set(CHOICES)
    assert len(set(picks)) > 1  # sampled, not always the argmax
    assert all(c.temperature == 1.0 for c in fake.select_calls)


@within(10)
def test_gen_with_choices_is_a_select():
    expr = sgl.gen("animal", choices=CHOICES, choices_method=sgl.greedy_token_selection)
    assert isinstance(expr, ir.Select)

    @sgl.function
    def prog(s):
        s += "Animal:" + sgl.gen("animal", choices=CHOICES)

    fake = FakeBackend(table=TABLE)
    assert prog.run(backend=fake)["animal"] == "tiger"
    assert fake.gen_calls == [] and len(fake.select_calls) == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"choices": []},
        {"choices": None},
        {"choices": "abc"},
        {"choices": ["a", ""]},
        {"choices": ["a", 3]},
        {"choices": ["a"], "temperature": -1},
        {"choices": ["a"], "choices_method": "greedy"},
    ],
)
def test_invalid_choices_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        sgl.select("x", **kwargs)


@within(10)
def test_invalid_choices_in_a_program_reach_run():
    @sgl.function
    def prog(s):
        s += sgl.gen("x", choices=[])

    with pytest.raises(ValueError, match="choices"):
        prog.run(backend=FakeBackend())


# --------------------------------------------------------------------------- roles

SYS = CHATML.default_system


@within(10)
def test_roles_with_default_system():
    @sgl.function
    def prog(s):
        s += sgl.user("hi")
        s += sgl.assistant(sgl.gen("a"))

    fake = FakeBackend(replies={"<|im_start|>assistant\n": "hello!"})
    state = prog.run(backend=fake)
    assert state.text() == (
        SYS + "<|im_start|>user\nhi<|im_end|>\n" + "<|im_start|>assistant\nhello!<|im_end|>\n"
    )
    assert state.messages() == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello!"},
    ]
    assert fake.gen_calls[0].text == SYS + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@within(10)
def test_no_default_system_when_the_first_role_is_system():
    @sgl.function
    def prog(s):
        s += sgl.system("Be brief.")
        s += sgl.user("hi")
        s += sgl.assistant("yo")

    state = prog.run(backend=FakeBackend())
    assert state.text() == (
        "<|im_start|>system\nBe "
        "brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
    )
    assert "You are a fake assistant." not in state.text()
    assert state.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
    ]


@within(10)
def test_role_blocks_and_methods():
    @sgl.function
    def prog(s):
        with s.user():
            s += "What is "
            s += "2+2?"
        s.assistant("4")
        s += sgl.user_begin() + "again" + sgl.user_end()
        with s.assistant():
            s += sgl.gen("a", max_tokens=3)

    fake = FakeBackend(default="four")
    state = prog.run(backend=fake)
    assert state.messages() == [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "fou"},
    ]
    assert state.text().startswith(SYS + "<|im_start|>user\nWhat is 2+2?<|im_end|>\n")
    assert state.text().endswith("<|im_start|>assistant\nfou<|im_end|>\n")
    assert state.text().count("You are a fake assistant.") == 1


@within(10)
def test_plain_chat_template():
    plain = sgl.ChatTemplate.plain()
    assert plain.role_prefix("user", first=True) == "User: "
    assert plain.role_suffix("assistant") == "\n"

    @sgl.function
    def prog(s):
        s += sgl.system("sys")
        s += sgl.user("hi")
        s += sgl.assistant(sgl.gen("a"))

    state = prog.run(backend=FakeBackend(template=plain, replies={"Assistant: ": "hello"}))
    assert state.text() == "System: sys\nUser: hi\nAssistant: hello\n"
    assert state["a"] == "hello"


def test_chat_template_rejects_unknown_roles():
    with pytest.raises(ValueError, match="role must be one of"):
        CHATML.role_prefix("tool", first=False)
    with pytest.raises(ValueError, match="role must be one of"):
        CHATML.role_suffix("tool")


@pytest.mark.parametrize(
    "body,message",
    [
        (lambda s: s.__iadd__(sgl.user_begin() + sgl.assistant_begin()), "end that role first"),
        (lambda s: s.__iadd__(sgl.user_begin() + "x" + sgl.assistant_end()), "open role is 'user'"),
        (lambda s: s.__iadd__(sgl.user_end()), "open role is None"),
        (lambda s: s.__iadd__(sgl.user(sgl.user("x"))), "end that role first"),
        (lambda s: s.__iadd__(ir.RoleBegin("tool")), "role must be one of"),
    ],
)
@within(10)
def test_bad_role_nesting_is_recorded_on_the_state(body, message):
    holder = captured()

    @sgl.function
    def prog(s):
        holder.append(s)
        s += "start "
        body(s)
        s += "after"

    fake = FakeBackend()
    with pytest.raises(sgl.ProgramError, match=message):
        prog.run(backend=fake)
    state = holder[0]
    assert state.error is not None and message in str(state.error)
    assert "after" not in state.stream_executor.text_
    with pytest.raises(sgl.ProgramError):
        state.text()


def test_role_function_needs_content():
    with pytest.raises(ValueError, match="with s.user"):
        sgl.user()


# --------------------------------------------------------------------------- variables


@within(10)
def test_var_scope_and_set_var():
    payload = {"tool": "calc", "args": [1, 2]}

    @sgl.function
    def prog(s):
        s += "Intro. "
        with s.var_scope("block"):
            s += "Name: " + sgl.gen("name", stop=".")
            s += "."
        s.set_var("payload", payload)
        s += ir.SetVar("n", 3)

    state = prog.run(backend=FakeBackend(replies={"Name: ": "Ada. Lovelace"}))
    assert state["block"] == "Name: Ada."
    assert state["name"] == "Ada"
    assert state["payload"] is payload
    assert state["n"] == 3
    assert "payload" in state and "missing" not in state
    assert state.text() == "Intro. Name: Ada."


@within(10)
def test_reading_a_variable_mid_program_tool_use():
    @sgl.function
    def prog(s):
        s += "Expr: 6*7\nTool call:" + sgl.gen("call", stop="\n")
        a, b = (
            int(x) for x in s["call"].strip().split("*")
        )  # runs the "tool" on the model's output
        s += f"\nResult: {a * b}\nAnswer:" + sgl.gen("answer")
        return a * b

    fake = FakeBackend(replies={"Tool call:": " 6*7\nignored", "Answer:": " forty-two"})
    state = prog.run(backend=fake)
    assert state.ret_value == 42
    assert state.text() == "Expr: 6*7\nTool call: 6*7\nResult: 42\nAnswer: forty-two"
    assert fake.gen_calls[1].text.endswith("Result: 42\nAnswer:")


@within(10)
def test_missing_variable_key_error_names_known_variables():
    @sgl.function
    def prog(s):
        s += sgl.gen("alpha") + sgl.gen("beta")
        s["gamma"]

    with pytest.raises(KeyError, match=r"'gamma'.*alpha, beta"):
        prog.run(backend=FakeBackend())

    state = (sgl.function(lambda s: None)).run(backend=FakeBackend())
    with pytest.raises(KeyError, match="variables: none"):
        state["x"]


# --------------------------------------------------------------------------- errors


@within(10)
def test_exception_in_the_body_reaches_run():
    fake = FakeBackend()
    holder = captured()

    @sgl.function
    def prog(s):
        holder.append(s)
        s += "x" + sgl.gen("a")
        raise ZeroDivisionError("body failed")

    with pytest.raises(ZeroDivisionError, match="body failed"):
        prog.run(backend=fake)
    # The error is recorded on the state (the gen may or may not have run before it: the
    # body raced ahead of the executor), and reading the state raises it.
    state = holder[0]
    assert isinstance(state.error, ZeroDivisionError)
    assert len(fake.gen_calls) <= 1
    with pytest.raises(sgl.ProgramError) as info:
        state.text()
    assert isinstance(info.value.__cause__, ZeroDivisionError)


@within(10)
def test_backend_error_becomes_program_error_and_skips_the_rest():
    holder = captured()

    @sgl.function
    def prog(s):
        holder.append(s)
        s += "1:" + sgl.gen("a")
        s += "2:" + sgl.gen("b")
        s += "3:" + sgl.gen("c")
        s += sgl.select("d", choices=["x", "y"])
        s += "tail"

    fake = FakeBackend(fail_on=lambda call: call.text.endswith("2:"))
    with pytest.raises(sgl.ProgramError) as info:
        prog.run(backend=fake)
    assert isinstance(info.value.__cause__, FakeBackendError)
    assert [c.text[-2:] for c in fake.gen_calls] == ["1:", "2:"]  # "3:" was never asked for
    assert fake.select_calls == []
    state = holder[0]
    assert isinstance(state.error, FakeBackendError)
    assert "tail" not in state.stream_executor.text_
    assert state.stream_executor.variables.keys() == {"a"}
    with pytest.raises(sgl.ProgramError):
        state["a"]
    with pytest.raises(sgl.ProgramError):
        state.messages()


@within(10)
def test_body_reading_after_a_backend_error_raises_program_error():
    reached = []

    @sgl.function
    def prog(s):
        s += "1:" + sgl.gen("a")
        s["a"]
        reached.append(True)

    fake = FakeBackend(fail_on=lambda call: call.kind == "generate")
    with pytest.raises(sgl.ProgramError) as info:
        prog.run(backend=fake)
    assert isinstance(info.value.__cause__, FakeBackendError)
    assert reached == []


@within(10)
def test_select_error_becomes_program_error():
    fake = FakeBackend(fail_on=lambda call: call.kind == "select")
    with pytest.raises(sgl.ProgramError) as info:
        _select_prog().run(backend=fake)
    assert isinstance(info.value.__cause__, FakeBackendError)


@within(10)
def test_finished_state_takes_no_more_text():
    state = sgl.function(lambda s: s.__iadd__("x")).run(backend=FakeBackend())
    assert state.text() == "x"
    with pytest.raises(sgl.ProgramError, match="ended"):
        state += "more"


# --------------------------------------------------------------------------- functions


@within(10)
def test_bind_call_and_positional_arguments():
    @sgl.function
    def prog(s, topic, style="short"):
        s += f"Topic: {topic} ({style})\n" + sgl.gen("out", max_tokens=4)
        return topic.upper()

    fake = FakeBackend(default="abcdefg")
    state = prog.run("cats", backend=fake)
    assert state.text() == "Topic: cats (short)\nabcd"
    assert state.ret_value == "CATS"
    assert prog("dogs", "long", backend=fake).text() == "Topic: dogs (long)\nabcd"
    assert prog(topic="owls", backend=fake).text().startswith("Topic: owls (short)")

    bound = prog.bind(style="poem")
    assert bound is not prog and bound.bind_arguments == {"style": "poem"}
    assert bound.run(topic="fish", backend=fake).text().startswith("Topic: fish (poem)")
    assert bound(topic="fish", style="haiku", backend=fake).text().startswith("Topic: fish (haiku)")
    assert prog.bind_arguments == {}
    with pytest.raises(TypeError, match="no parameter"):
        prog.bind(colour="red")


def test_function_decorator_forms():
    def body(s):
        s += "x"

    assert isinstance(sgl.function(body), sgl.SglFunction)
    assert sgl.function(num_api_spec_tokens=8)(body).num_api_spec_tokens == 8
    with pytest.raises(TypeError, match="first parameter"):
        sgl.function(lambda: None)


# --------------------------------------------------------------------------- the default backend


@pytest.fixture
def restore_default_backend():
    with sgl.lang.api.swapped_default_backend(None):
        yield


@within(10)
def test_default_backend_is_used(restore_default_backend):
    fake = FakeBackend(default="D", server_info={"model_path": "fake-model"})
    sgl.set_default_backend(fake)
    assert sgl.get_default_backend() is fake

    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a")

    assert prog.run().text() == "xD"
    assert prog().text() == "xD"
    assert len(fake.gen_calls) == 2

    assert sgl.flush_cache() is True and fake.flushes == 1
    assert sgl.get_server_info() == {"model_path": "fake-model"}

    other = FakeBackend(default="O", server_info={"model_path": "other"})
    assert prog.run(backend=other).text() == "xO"
    assert sgl.flush_cache(other) is True and other.flushes == 1 and fake.flushes == 1
    assert sgl.get_server_info(other) == {"model_path": "other"}
    assert len(fake.gen_calls) == 2


def test_swapped_default_backend_restores_the_one_before(restore_default_backend):
    outer, inner = FakeBackend(default="O"), FakeBackend(default="I")
    sgl.set_default_backend(outer)
    with sgl.lang.api.swapped_default_backend(inner):
        assert sgl.get_default_backend() is inner
        sgl.set_default_backend(FakeBackend())  # replaced inside the block: still restored after it
    assert sgl.get_default_backend() is outer


def test_set_default_backend_rejects_non_backends(restore_default_backend):
    with pytest.raises(TypeError, match="expected an sgl backend"):
        sgl.set_default_backend("http://localhost")
    assert sgl.as_backend(FakeBackend()) is not None


def test_programs_run_without_importing_the_runtime():
    """lang is pure Python: running a program on a non-engine backend imports no torch. Of the
    runtime it reads only the sampling parameter table (torch-free, shared with the server)."""
    code = (
        "import sys, sgl\n"
        "from lang_fakes import FakeBackend\n"
        "f = sgl.function(lambda s: s.__iadd__(sgl.user('hi') + sgl.gen('a')))\n"
        "assert f.run(backend=FakeBackend()).text().endswith('fake output')\n"
        "table = {'sgl.runtime', 'sgl.runtime.errors', 'sgl.runtime.sampling', "
        "'sgl.runtime.sampling.params'}\n"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('sgl.runtime', "
        "'sgl.server')) and m not in table]\n"
        "assert not bad, bad\n"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
