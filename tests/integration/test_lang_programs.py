"""Real programs on the embedded model, through the in-process backend.

Oracles: HF transformers on the same weights (greedy text, select scores), `re.fullmatch`
for regex/dtype output, `jsonschema` for JSON, the tokenizer's own chat template for roles.
"""

from __future__ import annotations

import ast
import json
import re
import threading

import jsonschema
import pytest
import regex
import torch
from oracle_helpers import hf_greedy, kv_all_returned, wait_until

import sgl
from sgl.lang.generation import DTYPE_REGEX

FEW_SHOT = (
    "Q: What is the capital of Italy?\nA: Rome\n\n"
    "Q: What is the capital of Japan?\nA: Tokyo\n\n"
    "Q: What is the capital of Egypt?\nA: Cairo\n\n"
)


@pytest.fixture(scope="module")
def backend(engine):
    return sgl.as_backend(engine)


@sgl.function
def few_shot_qa(s, question):
    s += FEW_SHOT + "Q: " + question + "\nA:"
    s += sgl.gen("answer", max_tokens=16, stop="\n")


def test_few_shot_qa_with_stop_equals_hf_greedy(backend, engine, hf_model):
    state = few_shot_qa.run(
        question="What is the capital of France?", temperature=0, backend=backend
    )
    answer = state["answer"]
    assert "\n" not in answer
    meta = state.get_meta_info("answer")
    assert meta["finish_reason"]["type"] in ("stop", "length")
    # Oracle: HF greedy continuation of the same prompt, cut at the first newline.
    prompt = state.text()[: -len(answer)] if answer else state.text()
    ids = engine.encode(prompt)
    ref = engine.tokenizer.decode(hf_greedy(hf_model, ids, 16), skip_special_tokens=True)
    assert answer == ref.split("\n")[0]
    assert state.text() == prompt + answer


def _hf_choice_logprobs(hf_model, engine, prompt: str, choice: str) -> list[float]:
    prompt_ids = engine.encode(prompt)
    ids = engine.encode(prompt + choice)
    start = 0
    while start < min(len(ids), len(prompt_ids)) and ids[start] == prompt_ids[start]:
        start += 1
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[p - 1, ids[p]].item() for p in range(start, len(ids))]


def test_select_matches_hf_scores(backend, engine, hf_model):
    @sgl.function
    def classify(s, text):
        s += f"Text: {text}\nSentiment (positive or negative):"
        s += sgl.select("label", [" positive", " negative", " neutral"])

    state = classify.run(text="I loved this film, it was wonderful!", backend=backend)
    prompt = "Text: I loved this film, it was wonderful!\nSentiment (positive or negative):"
    scores = {
        c: _hf_choice_logprobs(hf_model, engine, prompt, c)
        for c in (" positive", " negative", " neutral")
    }
    expected = max(scores, key=lambda c: sum(scores[c]) / len(scores[c]))
    assert state["label"] == expected
    meta = state.get_meta_info("label")
    for c, got in zip((" positive", " negative", " neutral"), meta["normalized_prompt_logprobs"]):
        assert got == pytest.approx(sum(scores[c]) / len(scores[c]), abs=2e-3)
    assert state.text() == prompt + expected


def test_select_methods_and_gen_choices(backend):
    @sgl.function
    def pick(s, method):
        s += "The opposite of hot is"
        s += sgl.gen("word", choices=[" cold", " warm", " blue"], choices_method=method)

    for method in (
        sgl.token_length_normalized,
        sgl.greedy_token_selection,
        sgl.unconditional_likelihood_normalized,
    ):
        state = pick.run(method=method, backend=backend)
        assert state["word"] in (" cold", " warm", " blue")
    meta = pick.run(method=sgl.unconditional_likelihood_normalized, backend=backend).get_meta_info(
        "word"
    )
    assert len(meta["unconditional_token_logprobs"]) == 3


@pytest.mark.parametrize("dtype", [int, float, bool, str])
def test_gen_dtypes_match_their_regex(backend, dtype):
    @sgl.function
    def typed(s):
        s += "Write a value: "
        s += sgl.gen("v", dtype=dtype, max_tokens=24, temperature=1.0)

    pattern = DTYPE_REGEX[dtype.__name__]
    for _ in range(3):
        state = typed.run(backend=backend)
        value = state["v"]
        if (
            state.get_meta_info("v")["finish_reason"]["type"] == "length"
        ):  # cut: a prefix of the language
            assert regex.fullmatch(pattern, value, partial=True), value
            continue
        assert re.fullmatch(pattern, value) and value.strip() == value, (
            value
        )  # an ending blank is a stop, cut
        # the oracle: Python reads it back as that type, and numbers and strings are JSON literals
        assert type(ast.literal_eval(value)) is dtype or (dtype is float and "." not in value), (
            value
        )
        if dtype is not bool:
            assert type(json.loads(value)) in ((int, float) if dtype is float else (dtype,)), value


def test_gen_int_and_regex(backend):
    @sgl.function
    def facts(s):
        s += "The year the first moon landing happened: "
        s += sgl.gen_int("year", temperature=1.0)
        s += "\nA US phone number: "
        s += sgl.gen("phone", regex=r"\(\d{3}\) \d{3}-\d{4}", temperature=1.0)

    state = facts.run(backend=backend)
    assert re.fullmatch(DTYPE_REGEX["int"], state["year"])
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", state["phone"])


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def test_json_schema_and_json_in_var_scope(backend):
    @sgl.function
    def extract(s, text):
        s += sgl.user(f"Extract name, age and city as JSON from: {text}")
        with s.assistant():
            with s.var_scope("json_text"):
                s += sgl.gen("person", json_schema=SCHEMA, max_tokens=64, temperature=1.0)

    for _ in range(2):
        state = extract.run(text="Maria, 34, lives in Porto.", backend=backend)
        assert state["json_text"] == state["person"]
        jsonschema.validate(json.loads(state["person"]), SCHEMA)


def test_roles_render_with_the_models_chat_template(backend, engine):
    @sgl.function
    def chat(s):
        s += sgl.system("You are brief.")
        s += sgl.user("Say hi.")
        s += sgl.assistant(sgl.gen("a1", max_tokens=12, temperature=0))
        with s.user():
            s += "Now say bye."
        s += sgl.assistant(sgl.gen("a2", max_tokens=12, temperature=0))

    state = chat.run(backend=backend)
    msgs = state.messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert msgs[2]["content"] == state["a1"] and msgs[4]["content"] == state["a2"]
    assert state.text() == engine.tokenizer.apply_chat_template(msgs, tokenize=False)

    @sgl.function
    def no_system(s):
        s += sgl.user("Hello")
        s += sgl.assistant("Hi!")

    state = no_system.run(backend=backend)  # the template's default system message is inserted
    assert state.text() == engine.tokenizer.apply_chat_template(state.messages(), tokenize=False)


def test_fork_join_both_modes_share_the_prefix(backend, engine):
    @sgl.function
    def tips(s, mode):
        s += "Here are two tips for staying healthy, each in one sentence.\n" * 3
        forks = s.fork(2)
        forks += lambda i: f"Tip {i + 1}:" + sgl.gen("tip", max_tokens=12, stop="\n", temperature=0)
        texts = [forks[i]["tip"] for i in range(2)]
        forks.join(mode=mode)
        return texts

    before = engine.get_server_info()["cached_tokens"]
    state = tips.run(mode="gather_variable", backend=backend)
    assert state["tip"] == state.ret_value
    assert engine.get_server_info()["cached_tokens"] > before  # the branches shared the prefix
    state = tips.run(mode="concate_and_append", backend=backend)
    head = "Here are two tips for staying healthy, each in one sentence.\n" * 3
    expected = head + "".join(f"Tip {i + 1}:{t}" for i, t in enumerate(state.ret_value))
    assert state.text() == expected
    assert "tip" not in state  # concate_and_append moves text, not variables


def test_fork_branches_run_concurrently(backend, engine):
    """Four branches of 24 tokens take far fewer forward steps than 4 x 24 when batched."""

    @sgl.function
    def four(s):
        s += "Write something:"
        forks = s.fork(4)
        forks += sgl.gen("x", max_tokens=24, ignore_eos=True, temperature=1.0)
        forks.join()

    steps = engine.get_server_info()["forward_steps"]
    state = four.run(backend=backend)
    assert len(state["x"]) == 4
    assert engine.get_server_info()["forward_steps"] - steps < 2 * 24


def test_streaming_pieces_join_to_the_final_text(backend):
    @sgl.function
    def story(s):
        s += sgl.user("Tell me a very short story.")
        s += sgl.assistant(sgl.gen("story", max_tokens=32, temperature=0))

    state = story.run(stream=True, backend=backend)
    pieces = list(state.text_iter())
    assert len(pieces) > 3
    assert "".join(pieces) == state.text()
    state = story.run(stream=True, backend=backend)
    assert "".join(state.text_iter("story")) == state["story"]


def test_tool_use_reads_a_variable_mid_program(backend):
    calls = []

    def calculator(expr: str) -> str:
        calls.append(expr)
        a, b = (int(x) for x in re.findall(r"\d+", expr)[:2])
        return str(a + b)

    @sgl.function
    def tool(s):
        s += "Write an addition of two numbers: "
        s += sgl.gen("expr", regex=r"\d{1,3} \+ \d{1,3}", temperature=1.0)
        result = calculator(s["expr"])  # the program reads the generated text and calls a tool
        s += " = " + result + "\nThe result is " + sgl.gen("say", max_tokens=4, temperature=0)

    state = tool.run(backend=backend)
    assert calls == [state["expr"]]
    a, b = (int(x) for x in state["expr"].split(" + "))
    assert f"{state['expr']} = {a + b}\n" in state.text()


def test_bind_and_call(backend):
    @sgl.function
    def greet(s, greeting, name):
        s += f"{greeting}, {name}!"

    hello = greet.bind(greeting="Hello")
    assert hello.run(name="Ada", backend=backend).text() == "Hello, Ada!"
    assert greet("Hi", "Bob", backend=backend).text() == "Hi, Bob!"


def test_errors_reach_the_caller_and_leak_nothing(backend, engine):
    @sgl.function
    def bad_regex(s):
        s += "x"
        s += sgl.gen("v", regex="(unclosed")

    with pytest.raises(sgl.ProgramError) as err:
        bad_regex.run(backend=backend)
    assert isinstance(err.value.__cause__, sgl.InvalidRequestError)

    @sgl.function
    def raises(s):
        s += "x"
        raise RuntimeError("boom in the program")

    with pytest.raises(RuntimeError, match="boom"):
        raises.run(backend=backend)

    state = bad_regex.run(stream=True, backend=backend)
    with pytest.raises(sgl.ProgramError):
        list(state.text_iter())
    assert wait_until(lambda: kv_all_returned(engine))


def test_run_batch_of_32_with_threads_and_progress_bar(backend, engine, capsys):
    questions = [f"What is {i} plus {i}?" for i in range(32)]
    before = engine.get_server_info()
    states = few_shot_qa.run_batch(
        [{"question": q} for q in questions],
        temperature=0,
        num_threads=8,
        progress_bar=True,
        backend=backend,
    )
    assert len(states) == 32
    for q, st in zip(questions, states):
        assert st.error is None
        assert st.text().startswith(FEW_SHOT + "Q: " + q + "\nA:")  # input order kept
        assert "\n" not in st["answer"]
    assert "32/32" in capsys.readouterr().err  # the progress bar ran to the end
    after = engine.get_server_info()
    # The constant few-shot prefix was computed once up front: most prompt tokens were cached.
    assert (
        after["cached_tokens"] - before["cached_tokens"] >= 32 * len(engine.encode(FEW_SHOT)) * 0.8
    )

    # One failing item does not sink the others.
    items = [{"question": "ok?"}, {"question": None}, {"question": "fine?"}]
    states = few_shot_qa.run_batch(items, temperature=0, max_new_tokens=4, backend=backend)
    assert states[0].error is None and states[2].error is None
    assert isinstance(states[1].error, TypeError)  # "Q: " + None in the program body
    with pytest.raises(sgl.ProgramError) as err:
        states[1].text()
    assert isinstance(err.value.__cause__, TypeError)


def test_default_backend_is_the_embedded_engine():
    from sgl.lang import api

    done = threading.Event()
    result = {}

    def run():
        result["state"] = few_shot_qa.run(
            question="What is the capital of Spain?", temperature=0, max_new_tokens=4
        )
        done.set()

    with api.swapped_default_backend(None):  # none set: the program builds the embedded model
        t = threading.Thread(target=run, daemon=True)
        t.start()
        assert done.wait(300)
        backend = sgl.get_default_backend()
        assert isinstance(backend, sgl.EngineBackend)
        assert result["state"]["answer"]
        assert (
            sgl.get_server_info()["finished_requests"] >= 1
        )  # the engine the program built, not a fresh one
        backend.shutdown()
