"""Constrained decoding on the embedded model: every output is in the requested language
(re.fullmatch, jsonschema, an independent parser), with jump-forward on and off."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

import sgl

pytestmark = pytest.mark.integration

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "active"],
    "additionalProperties": False,
}
ARITH = """
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]{1,3} | "(" expr ")"
"""


def chat(engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )


@pytest.fixture(scope="module")
def engines():
    on = sgl.Engine(model_path="default", max_total_tokens=20000)
    off = sgl.Engine(model_path="default", max_total_tokens=20000, disable_jump_forward=True)
    yield {"on": on, "off": off}
    on.shutdown()
    off.shutdown()


def arith_value_ok(text: str) -> bool:
    """Independent check of the arithmetic grammar: a recursive-descent parser."""
    pos = 0

    def number() -> bool:
        nonlocal pos
        m = re.match(r"[0-9]{1,3}(?![0-9])", text[pos:])
        if not m:
            return False
        pos += m.end()
        return True

    def factor() -> bool:
        nonlocal pos
        if text.startswith("(", pos):
            pos += 1
            if not expr() or not text.startswith(")", pos):
                return False
            pos += 1
            return True
        return number()

    def chain(item, ops) -> bool:
        nonlocal pos
        if not item():
            return False
        while pos < len(text) and text[pos] in ops:
            pos += 1
            if not item():
                return False
        return True

    def term() -> bool:
        return chain(factor, "*/")

    def expr() -> bool:
        return chain(term, "+-")

    return expr() and pos == len(text)


@pytest.mark.parametrize("mode", ["on", "off"])
def test_regex_outputs_fullmatch(engines, mode):
    engine = engines[mode]
    pattern = r"(Mon|Tues|Wednes)day, [0-9]{1,2} (May|June) 20[0-9]{2}"
    outs = engine.generate(
        [chat(engine, f"Write a date. Variant {i}.") for i in range(8)],
        {"regex": pattern, "temperature": 1.0, "max_new_tokens": 40, "seed": 7},
    )
    for o in outs:
        assert re.fullmatch(pattern, o["text"]), o["text"]
        assert o["meta_info"]["finish_reason"]["type"] == "stop"


@pytest.mark.parametrize("mode", ["on", "off"])
def test_json_schema_outputs_validate(engines, mode):
    engine = engines[mode]
    outs = engine.generate(
        [chat(engine, f"Describe user number {i} as JSON.") for i in range(8)],
        {"json_schema": json.dumps(PERSON), "temperature": 1.0, "max_new_tokens": 96, "seed": 3},
    )
    for o in outs:
        assert o["meta_info"]["finish_reason"]["type"] == "stop", o
        jsonschema.validate(json.loads(o["text"]), PERSON)


@pytest.mark.parametrize("mode", ["on", "off"])
def test_ebnf_outputs_parse(engines, mode):
    engine = engines[mode]
    outs = engine.generate(
        [chat(engine, f"Write an arithmetic expression, example {i}.") for i in range(6)],
        {"ebnf": ARITH, "temperature": 1.0, "max_new_tokens": 48, "seed": 11},
    )
    for o in outs:
        if o["meta_info"]["finish_reason"]["type"] == "length":
            continue  # cut by the limit: a prefix, checked elsewhere
        assert arith_value_ok(o["text"]), o["text"]


def test_json_object_mode_gives_a_json_object(engines):
    engine = engines["on"]
    out = engine.generate(
        chat(engine, "Give me a JSON object about a cat."),
        {"json_object": True, "temperature": 0.7, "max_new_tokens": 160, "seed": 1},
    )
    if out["meta_info"]["finish_reason"]["type"] != "length":
        assert isinstance(json.loads(out["text"]), dict)


def test_jump_forward_takes_fewer_steps_and_same_greedy_output(engines):
    results = {}
    for mode, engine in engines.items():
        engine.flush_cache()
        before = engine.get_server_info()["forward_steps"]
        out = engine.generate(
            chat(engine, "Describe an admin user as JSON."),
            {"json_schema": PERSON, "temperature": 0, "max_new_tokens": 96},
        )
        results[mode] = (engine.get_server_info()["forward_steps"] - before, out)
    (steps_on, out_on), (steps_off, out_off) = results["on"], results["off"]
    jsonschema.validate(json.loads(out_on["text"]), PERSON)
    assert steps_on < steps_off
    assert json.loads(out_on["text"]).keys() == json.loads(out_off["text"]).keys()


def test_cut_by_max_new_tokens_reports_length(engines):
    engine = engines["on"]
    out = engine.generate(chat(engine, "JSON please"), {"json_schema": PERSON, "max_new_tokens": 5})
    # No member of PERSON fits in 5 tokens: the output is cut, and says so.
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 5, "incomplete": True}
    assert out["meta_info"]["completion_tokens"] <= 5
    free = engine.generate(chat(engine, "Hi"), {"max_new_tokens": 3, "ignore_eos": True})
    assert free["meta_info"]["finish_reason"] == {
        "type": "length",
        "length": 3,
    }  # no constraint: nothing to be cut


def test_n_samples_and_stop_strings_with_constraints(engines):
    engine = engines["on"]
    outs = engine.generate(
        chat(engine, "A number:"),
        {"regex": "[0-9]{3}-[0-9]{3}", "n": 3, "temperature": 1.0, "max_new_tokens": 20},
    )
    assert len(outs) == 3 and all(re.fullmatch("[0-9]{3}-[0-9]{3}", o["text"]) for o in outs)
    out = engine.generate(
        chat(engine, "A number:"),
        {"regex": "[0-9]{3}-[0-9]{3}", "stop": ["-"], "temperature": 0, "max_new_tokens": 20},
    )
    assert (
        re.fullmatch("[0-9]{3}", out["text"])
        and out["meta_info"]["finish_reason"]["matched"] == "-"
    )


@pytest.mark.parametrize(
    "params,param",
    [
        ({"regex": "(unclosed"}, "regex"),
        ({"json_schema": "{not json"}, "json_schema"),
        ({"json_schema": {"type": "array", "contains": {"type": "integer"}}}, "json_schema"),
        ({"ebnf": "root ::= missing_rule"}, "ebnf"),
        ({"regex": "a", "json_schema": {"type": "string"}}, None),
    ],
)
def test_bad_constraints_rejected_at_submit(engines, params, param):
    engine = engines["on"]
    with pytest.raises(sgl.InvalidRequestError) as e:
        engine.generate("x", {**params, "max_new_tokens": 4})
    if param:
        assert e.value.param == param
    assert engine.generate("Hi", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2


def test_constraint_over_the_compile_limit_is_a_bad_request_and_the_engine_serves_on():
    with sgl.Engine(
        model_path="default", max_total_tokens=2000, constraint_compile_timeout=1.0
    ) as engine:
        with pytest.raises(sgl.InvalidRequestError, match="compile time limit") as e:
            engine.generate("x", {"regex": "(a|b)*a(a|b){24}", "max_new_tokens": 4})
        assert e.value.param == "regex"
        out = engine.generate("Pick:", {"regex": "(yes|no)", "max_new_tokens": 4, "temperature": 0})
        assert out["text"] in ("yes", "no")
        assert engine.flush_cache()
        info = engine.get_server_info()
        assert info["available_kv_tokens"] == info["max_total_tokens"]


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_external_grammar_backends_constrain_and_jump_forward(backend):
    pytest.importorskip(backend)
    with sgl.Engine(model_path="default", max_total_tokens=4000, grammar_backend=backend) as engine:
        assert engine.get_server_info()["grammar_backend"] == backend
        # greedy: xgrammar's bounded strings admit control characters (see the unit tests)
        outs = engine.generate(
            [chat(engine, f"Describe user number {i} as JSON.") for i in range(3)],
            {"json_schema": PERSON, "temperature": 0, "max_new_tokens": 96},
        )
        for o in outs:
            assert o["meta_info"]["finish_reason"]["type"] == "stop", o
            jsonschema.validate(json.loads(o["text"]), PERSON)
        before = engine.get_server_info()["forward_steps"]
        one = engine.generate(
            chat(engine, "Describe an admin user as JSON."),
            {"json_schema": PERSON, "temperature": 0, "max_new_tokens": 96},
        )
        steps = engine.get_server_info()["forward_steps"] - before
        # One request alone takes a step per sampled token (plus prefill): forced keys take none.
        assert steps < one["meta_info"]["completion_tokens"], (steps, one)
        out = engine.generate(
            chat(engine, "Pick a colour."), {"regex": "(red|green|blue)!", "max_new_tokens": 8}
        )
        assert re.fullmatch("(red|green|blue)!", out["text"]), out["text"]
        with pytest.raises(sgl.InvalidRequestError) as e:
            engine.generate("x", {"regex": "(unclosed", "max_new_tokens": 4})
        assert e.value.param == "regex"
        assert engine.flush_cache()
        info = engine.get_server_info()
        assert info["available_kv_tokens"] == info["max_total_tokens"]


def test_no_kv_leak_after_constrained_requests(engines):
    for engine in engines.values():
        assert engine.flush_cache()
        info = engine.get_server_info()
        assert info["available_kv_tokens"] == info["max_total_tokens"]


def test_text_forced_from_the_start_is_prefilled_with_the_prompt(engines):
    """The schema forces '{"name":' before any choice: with jump-forward it is prefilled with
    the prompt, so the first sampled token comes out of the prefill step itself."""
    engine = engines["on"]
    forced = '{"name":'
    n_forced = len(engine.tokenizer(forced, add_special_tokens=False).input_ids)
    params = {"json_schema": PERSON, "temperature": 0, "max_new_tokens": n_forced + 1}
    prompt = chat(engine, "Describe a user as JSON.")
    engine.flush_cache()
    before = engine.get_server_info()["forward_steps"]
    out = engine.generate(prompt, params)
    assert engine.get_server_info()["forward_steps"] - before == 1  # the prefill, and nothing else
    assert out["text"].startswith(forced) and len(out["output_ids"]) == n_forced + 1
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    # Streamed, the forced text arrives with the first token; the pieces add up to the same.
    chunks = list(engine.generate(prompt, params, stream=True))
    assert chunks[0]["text"].startswith(forced)
    assert "".join(c["text"] for c in chunks) == out["text"]
    assert [t for c in chunks for t in c["output_ids"]] == out["output_ids"]
    off = engines["off"].generate(prompt, params)
    assert off["text"].startswith(forced)


BUDGET_LANGUAGES = [  # (constraint, the shortest member, a check of a complete output)
    ({"regex": "[a-z]+@[a-z]+\\.(com|org)"}, "a@a.com",
     lambda t: re.fullmatch("[a-z]+@[a-z]+\\.(com|org)", t)),
    ({"regex": "(0|[1-9][0-9]*)(\\+(0|[1-9][0-9]*))*="}, "0=",
     lambda t: re.fullmatch("(0|[1-9][0-9]*)(\\+(0|[1-9][0-9]*))*=", t)),
    ({"json_schema": {"type": "object",
                      "properties": {"name": {"type": "string"},
                                     "tags": {"type": "array", "items": {"type": "string"}}},
                      "required": ["name", "tags"], "additionalProperties": False}},
     '{"name":"","tags":[]}', lambda t: isinstance(json.loads(t)["tags"], list)),
    ({"ebnf": 'root ::= item ("," item)* "."\nitem ::= [a-z]+'}, "a.",
     lambda t: re.fullmatch("[a-z]+(,[a-z]+)*\\.", t)),
    ({"ebnf": 'root ::= list\nlist ::= "[" (list ("," list)*)? "]"'}, "[]",
     lambda t: _nested_lists(json.loads(t))),
]  # fmt: skip


def _nested_lists(value) -> bool:
    return isinstance(value, list) and all(_nested_lists(v) for v in value)


def _complete(check, text: str) -> bool:
    try:
        return bool(check(text))
    except (ValueError, KeyError, TypeError):
        return False


@pytest.mark.parametrize("constraint,shortest,check", BUDGET_LANGUAGES)
def test_budget_aware_outputs_are_complete_at_1_2x_the_shortest(
    engines, constraint, shortest, check
):
    engine = engines["on"]
    n_short = len(engine.tokenizer(shortest, add_special_tokens=False).input_ids) + 1  # + EOS
    budget = max(n_short + 1, round(1.2 * n_short))
    prompt = chat(engine, "Write one long example. Be verbose.")
    params = {**constraint, "temperature": 1.0, "max_new_tokens": budget, "n": 16, "seed": 7}
    # 32 samples (seeds 7..22 and 21..36 per row): jump-forward's canonical tokens must not
    # overrun what the budget masks planned (a sample of seed 29 once did, before the check).
    aware = engine.generate(prompt, params) + engine.generate(prompt, {**params, "seed": 21})
    incomplete = [o["text"] for o in aware if not _complete(check, o["text"])]
    assert not incomplete, incomplete
    assert all(o["meta_info"]["finish_reason"]["type"] == "stop" for o in aware)
    plain = engine.generate(prompt, {**params, "budget_aware": False})
    assert any(not _complete(check, o["text"]) for o in plain)  # without it, outputs get cut


# The grammar route (EBNF, a JSON schema too large for the regex route, structural tags) at the
# tightest budgets: (constraint, a shortest member written here, a check of a complete output).
WIDE_SCHEMA = {"type": "object",
               "properties": {f"f{i:02d}": {"type": "integer" if i % 3 == 0 else "string"}
                              for i in range(80)},
               "required": ["f00", "f01", "f02", "f03"], "additionalProperties": False}  # fmt: skip
ADD = {"type": "object",
       "properties": {"description": {"type": "string"}, "first_operand": {"type": "integer"},
                      "second_operand": {"type": "integer"}},
       "required": ["description", "first_operand", "second_operand"],
       "additionalProperties": False}  # fmt: skip
ADD_CALLS = {
    "type": "structural_tag",
    "free_text": False,
    "separator": " ",
    "triggers": ["<function="],
    "structures": [{"begin": "<function=add_numbers>", "end": "</function>", "schema": ADD}],
}
CALL = r"<function=add_numbers>(\{.*?\})</function>"
ITEM = r'\{"id": [0-9]+, "tags": \[("[a-z]+"(,"[a-z]+")*)?\]\}'
TIGHT_GRAMMAR_LANGUAGES = {
    "ebnf": ({"ebnf": 'root ::= "[" item ("," item)* "]"\n'
                      'item ::= "{\\"id\\": " [0-9]+ ", \\"tags\\": [" '
                      '("\\"" [a-z]+ "\\"" ("," "\\"" [a-z]+ "\\"")*)? "]}"'},
             '[{"id": 0, "tags": []}]', lambda t: re.fullmatch(rf"\[{ITEM}(,{ITEM})*\]", t)),
    "wide_schema": ({"json_schema": WIDE_SCHEMA}, '{"f00":0,"f01":"","f02":"","f03":0}',
                    lambda t: jsonschema.validate(json.loads(t), WIDE_SCHEMA) is None),
    "structural_tag": ({"structural_tag": ADD_CALLS},
                       '<function=add_numbers>'
                       '{"description":"","first_operand":0,"second_operand":0}</function>',
                       lambda t: re.fullmatch(rf"{CALL}( {CALL})*", t, re.S) and all(
                           jsonschema.validate(json.loads(x), ADD) is None
                           for x in re.findall(CALL, t, re.S))),
}  # fmt: skip


@pytest.mark.parametrize("name", TIGHT_GRAMMAR_LANGUAGES)
def test_grammar_route_outputs_are_complete_whenever_a_member_fits(engines, name):
    """Temperature 1.0 at a budget of a shortest member's tokens (the tokenizer's, + EOS) and
    a little more, jump-forward on and off: every output is complete. Before the grammar
    route planned its completions (a bound counted beyond 64 bytes at a token a byte, tokens
    split at rule boundaries), the tightest budget cut nearly every sample."""
    from sgl.constrained.compiler import REGEX_ROUTE_MAX_TEXT
    from sgl.constrained.json_schema import json_schema_to_rx

    assert (
        len(json_schema_to_rx(WIDE_SCHEMA).text) > REGEX_ROUTE_MAX_TEXT
    )  # it takes the grammar route
    constraint, member, check = TIGHT_GRAMMAR_LANGUAGES[name]
    for mode, engine in engines.items():
        fits = len(engine.tokenizer(member, add_special_tokens=False).input_ids) + 1
        prompt = chat(engine, "Write one long example with many items. Be verbose.")
        for budget in (fits, fits + 3):
            outs = engine.generate(
                prompt,
                {
                    **constraint,
                    "temperature": 1.0,
                    "max_new_tokens": budget,
                    "n": 8,
                    "seed": budget,
                },
            )
            incomplete = [o["text"] for o in outs if not _complete(check, o["text"])]
            assert not incomplete, (mode, budget, incomplete)
