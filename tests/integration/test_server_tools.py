"""Tool calling and reasoning through the official `openai` client, on the embedded model
(its chat template takes no tools: the server describes them in a system message, Hermes
syntax), and on a tiny model whose template takes tools.

The oracle for every call is `jsonschema` against the declared parameters, over many
samples at temperature 1.0: no response may carry a call to an undeclared function or with
arguments that fail validation. Streams are reassembled and compared with the non-streamed
answer to the same request (seeded), both run on an empty prefix cache. The sampling tests run
on the default configuration (int4 codes); the conversation, extraction, pythonic and
bad-request tests on the session's float32 engine."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import requests
from server_helpers import ServerThread, assert_error, kv_whole, wait_until

from sgl.server import create_app

pytestmark = pytest.mark.integration

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
EMAIL = {
    "type": "object",
    "properties": {
        "to": {
            "type": "array",
            "items": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"},
            "minItems": 1,
            "maxItems": 3,
        },
        "subject": {"type": "string", "maxLength": 30},
        "urgent": {"type": "boolean"},
        "meta": {
            "type": "object",
            "properties": {"tag": {"enum": ["work", "home"]}},
            "required": ["tag"],
            "additionalProperties": False,
        },
    },
    "required": ["to", "subject", "meta"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather forecast for a city.",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {"name": "send_email", "description": "Send an email.", "parameters": EMAIL},
    },
    {"type": "function", "function": {"name": "get_time", "description": "The current time."}},
]
SCHEMAS = {"get_weather": WEATHER, "send_email": EMAIL, "get_time": {"type": "object"}}
ASK = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]


@pytest.fixture(scope="module")
def url(engine):
    with ServerThread(create_app(engine, "tools-model")) as u:
        yield u


def openai_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)


def served_client(engine, name: str, **app_options):
    """An OpenAI client of a server on `engine` built with `app_options` (a fixture body)."""
    with ServerThread(create_app(engine, name, **app_options)) as u, openai_client(u) as c:
        yield c


def cold(client: openai.OpenAI) -> None:
    """Empty the server's prefix cache: the next request computes its whole prompt. A stream
    compared with the same seeded request whole must run the same shapes: a prefix-cache hit
    shortens the prefill, which changes the logits in their last bits and so the samples."""
    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    assert wait_until(
        lambda: requests.post(base + "/flush_cache", timeout=30).json()["success"], timeout=60
    )


@pytest.fixture(scope="module")
def client(url):
    with openai_client(url) as c:
        yield c


@pytest.fixture(scope="module")
def default_engine():
    """The default configuration (int4 codes on the CPU) for the tests whose oracle is
    jsonschema alone: they sample ~10k tokens at batch 6, where it decodes ~4x faster than the
    float32 oracle engine (380 vs 89 tok/s measured). A stream compared with the same seeded
    request whole runs both on an empty prefix cache (`cold`)."""
    import sgl

    with sgl.Engine(model_path="default") as e:
        yield e


@pytest.fixture(scope="module")
def fast_url(default_engine):
    with ServerThread(create_app(default_engine, "tools-model")) as u:
        yield u


@pytest.fixture(scope="module")
def fast_client(fast_url):
    with openai_client(fast_url) as c:
        yield c


def check_calls(calls) -> list[tuple[str, dict]]:
    """Each call names a declared function and its arguments validate: (name, arguments)."""
    out = []
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert c.function.name in SCHEMAS, c.function.name
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
        out.append((c.function.name, args))
    return out


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "send_email"}}],
    ids=["required", "named"],
)
def test_forced_calls_are_always_valid_at_temperature_one(fast_client, choice):
    calls = 0
    for seed in range(3):
        r = fast_client.chat.completions.create(
            model="tools-model",
            messages=ASK,
            tools=TOOLS,
            tool_choice=choice,
            temperature=1.0,
            n=6,
            seed=seed * 6,
            max_tokens=160,
        )
        for ch in r.choices:
            assert ch.finish_reason == "tool_calls", (
                ch.message.content
            )  # a call fits in 160 tokens: never cut
            found = check_calls(ch.message.tool_calls)
            assert found and (not ch.message.content)
            if isinstance(choice, dict):
                assert [name for name, _ in found] == ["send_email"]
            calls += len(found)
    assert calls >= 12


def test_auto_calls_are_valid_and_text_stays_text(fast_client, default_engine):
    """The 135M model seldom starts a call by itself: a bias on "<" makes it start many
    (and write much other text with "<"), so the calls it begins under "auto" are tested."""
    with_calls, lt = 0, default_engine.tokenizer("<").input_ids[-1]
    for seed in range(3):
        r = fast_client.chat.completions.create(
            model="tools-model",
            messages=ASK,
            tools=TOOLS,
            temperature=1.0,
            n=6,
            seed=seed * 6,
            max_tokens=120,
            logit_bias={str(lt): 8},
        )
        for ch in r.choices:
            if ch.message.tool_calls:
                with_calls += 1
                check_calls(ch.message.tool_calls)
                assert ch.finish_reason == "tool_calls"
            assert "<tool_call>" not in (
                ch.message.content or ""
            )  # every call the model began was completed
    assert with_calls >= 3


def test_parallel_tool_calls_false_gives_at_most_one(fast_client):
    r = fast_client.chat.completions.create(
        model="tools-model",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        n=6,
        seed=5,
        max_tokens=160,
    )
    for ch in r.choices:
        assert ch.finish_reason == "tool_calls"
        assert len(check_calls(ch.message.tool_calls)) == 1


# The shortest call of TOOLS[:2], written here: as the tokenizer spells it, + EOS, it is an
# upper bound of the fewest tokens a complete answer takes.
SHORTEST_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city":"","unit":"celsius"}}\n</tool_call>'
)


@pytest.mark.parametrize(
    "choice,parallel",
    [
        ("required", True),
        ("required", False),
        ({"type": "function", "function": {"name": "get_weather"}}, True),
    ],
    ids=["required-parallel", "required-one", "named"],
)
def test_forced_calls_complete_whenever_one_fits(fast_client, default_engine, choice, parallel):
    """Budget-aware completion on tool calls (a structural tag on the grammar route): at
    temperature 1.0, with max_tokens from what the shortest call takes up, every sample ends
    with finish_reason tool_calls and arguments that validate; parallel calls stop at as many
    as fit. Before, every sample at the tightest budget was cut (the bound counted 50 tokens)."""
    fits = len(default_engine.tokenizer(SHORTEST_CALL, add_special_tokens=False).input_ids) + 1
    for max_tokens in (fits, fits + 2, fits + 40):
        r = fast_client.chat.completions.create(
            model="tools-model",
            messages=ASK,
            tools=TOOLS[:2],
            tool_choice=choice,
            parallel_tool_calls=parallel,
            temperature=1.0,
            n=8,
            seed=max_tokens,
            max_tokens=max_tokens,
        )
        for ch in r.choices:
            assert ch.finish_reason == "tool_calls", (max_tokens, ch.message.content)
            found = check_calls(ch.message.tool_calls)
            assert found and (parallel and choice == "required" or len(found) == 1)


def _reassemble(stream) -> dict[int, dict]:
    """Streamed choices: content, calls (name, arguments) from the deltas, finish reason."""
    out: dict[int, dict] = {}
    for chunk in stream:
        for ch in chunk.choices:
            o = out.setdefault(ch.index, {"content": "", "calls": {}, "finish": None})
            o["content"] += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                call = o["calls"].setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id is not None:
                    assert call["id"] is None, "a call's id comes once"
                    call["id"], call["name"] = d.id, d.function.name
                assert call["name"] is not None, "the name comes with the call's first delta"
                call["arguments"] += d.function.arguments or ""
            if ch.finish_reason is not None:
                o["finish"] = ch.finish_reason
    return out


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_streamed_calls_reassemble_to_the_whole_answer(fast_client, default_engine, choice):
    lt = default_engine.tokenizer("<").input_ids[
        -1
    ]  # under auto: text with "<", calls begun and not (see above)
    kwargs = dict(
        model="tools-model",
        messages=ASK,
        tools=TOOLS,
        tool_choice=choice,
        temperature=1.0,
        n=6,
        seed=11,
        max_tokens=160,
        logit_bias={str(lt): 8} if choice == "auto" else None,
    )
    cold(fast_client)
    whole = fast_client.chat.completions.create(**kwargs)
    cold(fast_client)
    streamed = _reassemble(fast_client.chat.completions.create(stream=True, **kwargs))
    for ch in whole.choices:
        s = streamed[ch.index]
        assert s["finish"] == ch.finish_reason
        assert s["content"] == (ch.message.content or "")
        expected = [(c.function.name, c.function.arguments) for c in ch.message.tool_calls or []]
        assert [(c["name"], c["arguments"]) for _, c in sorted(s["calls"].items())] == expected


def test_a_conversation_feeds_tool_results_back(client):
    first = client.chat.completions.create(
        model="tools-model",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=160,
    )
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [
        first.choices[0].message.model_dump(exclude_none=True),
        {
            "role": "tool",
            "tool_call_id": call.id,
            "content": json.dumps({"forecast": "sunny, 21 C"}),
        },
    ]
    second = client.chat.completions.create(
        model="tools-model", messages=history, tools=TOOLS, temperature=0, max_tokens=40
    )
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    check_calls(second.choices[0].message.tool_calls or [])
    usage_first, usage_second = first.usage.prompt_tokens, second.usage.prompt_tokens
    assert usage_second > usage_first + 10  # the call and its result are in the prompt


@pytest.mark.parametrize(
    "body,field",
    [
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        ({"tools": TOOLS + [TOOLS[0]]}, "tools[3].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
            "tools[0].function.name",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "nonsense"}},
                    }
                ],
                "tool_choice": "required",
            },
            "tools[0].function.parameters",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
                ]
            },
            "tools[0].function.parameters",
        ),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize"),
    ],
)
def test_bad_tool_requests_are_400_naming_the_field(url, body, field):
    request = {"model": "tools-model", "messages": ASK, "tools": TOOLS, "max_tokens": 8, **body}
    request = {k: v for k, v in request.items() if v is not None}
    assert_error(requests.post(url + "/v1/chat/completions", json=request, timeout=60), 400, field)


def test_kv_is_whole_after_the_tool_requests(url, fast_url):
    assert wait_until(lambda: kv_whole(url), timeout=60)
    assert wait_until(lambda: kv_whole(fast_url), timeout=60)


# A ChatML template that takes tools (in the manner of Qwen's): the tools as JSON lines in the
# system turn, calls as <tool_call> blocks, results in <tool_response> user turns, and a
# thinking switch read from chat_template_kwargs.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t['function'] | tojson "
    "}}\n{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ "
    "m['content'] }}\n"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] or '' }}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>\n{\"name\": \"{{ c['function']['name'] "
    '}}", '
    "\"arguments\": {{ c['function']['arguments'] | tojson }}}\n</tool_call>{% endfor "
    "%}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif "
    "%}{% endif %}"
)


def test_a_template_that_takes_tools_renders_them_and_the_history(tmp_path):
    import sys
    from pathlib import Path

    import sgl

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "unit"))
    from tiny_models import save_tiny_engine_dir

    path, _hf = save_tiny_engine_dir(
        tmp_path, 320, arch="qwen2", chat_template=TOOL_TEMPLATE, max_position_embeddings=4096
    )
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Rome", "unit": "celsius"}'},
    }
    history = ASK + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
    ]
    with sgl.Engine(model_path=str(path), dtype="float32", max_total_tokens=4096) as engine:
        with ServerThread(create_app(engine, "tiny")) as url:
            body = {
                "model": "tiny",
                "messages": history,
                "tools": TOOLS,
                "tool_choice": "none",
                "max_tokens": 12,
                "temperature": 0,
                "chat_template_kwargs": {"enable_thinking": False},
            }
            resp = requests.post(url + "/v1/chat/completions", json=body, timeout=120)
            assert resp.status_code == 200, resp.text
            answer = resp.json()["choices"][0]["message"]["content"]
            required = requests.post(
                url + "/v1/chat/completions",
                json={**body, "tool_choice": "required", "max_tokens": 200},
                timeout=120,
            ).json()
        as_template_reads_it = [
            *ASK,
            {
                **history[1],
                "tool_calls": [
                    {
                        **call,
                        "function": {
                            **call["function"],
                            "arguments": {"city": "Rome", "unit": "celsius"},
                        },
                    }
                ],
            },
            history[2],
        ]
        prompt = engine.tokenizer.apply_chat_template(
            as_template_reads_it,
            tools=TOOLS,
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=False,
        )
        assert (
            '"name": "send_email"' in prompt
            and '"arguments": {"city": "Rome"' in prompt
            and "<think>" in prompt
        )
        want = engine.generate(prompt, {"max_new_tokens": 12, "temperature": 0})
    assert answer == want["text"]
    choice = required["choices"][0]  # random weights, but the call is well-formed all the same
    assert choice["finish_reason"] in ("tool_calls", "length")
    for c in choice["message"].get("tool_calls") or []:
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])


@pytest.fixture(scope="module")
def fast_reasoning_client(default_engine):
    yield from served_client(default_engine, "r1", reasoning_parser="deepseek-r1")


def test_reasoning_is_split_from_the_answer_whole_and_streamed(
    fast_reasoning_client, default_engine
):
    """reasoning_content and content are the parts before and after </think>, streamed or
    not; separate_reasoning=false gives the raw text (the oracle). The answer is a JSON
    schema's (it starts after the reasoning), and a bias on the marker's tokens makes the
    135M model end its reasoning."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    kwargs = dict(
        model="r1",
        messages=ASK,
        temperature=1.0,
        n=4,
        seed=2,
        max_tokens=120,
        logit_bias={str(t): 5 for t in default_engine.tokenizer("</think>").input_ids},
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    )
    cold(fast_reasoning_client)
    whole = fast_reasoning_client.chat.completions.create(**kwargs)
    cold(fast_reasoning_client)
    raw = fast_reasoning_client.chat.completions.create(
        **kwargs, extra_body={"separate_reasoning": False}
    )
    cold(fast_reasoning_client)
    streamed: dict[int, list[str]] = {}
    for chunk in fast_reasoning_client.chat.completions.create(stream=True, **kwargs):
        for ch in chunk.choices:
            parts = streamed.setdefault(ch.index, ["", ""])
            parts[0] += getattr(ch.delta, "reasoning_content", None) or ""
            parts[1] += ch.delta.content or ""
    split = 0
    for ch, raw_ch in zip(whole.choices, raw.choices):
        text = raw_ch.message.content
        assert streamed[ch.index] == [ch.message.reasoning_content or "", ch.message.content]
        if "</think>" not in text:  # cut by max_tokens while reasoning: all of it is reasoning
            assert ch.message.reasoning_content == text.strip() and ch.message.content == ""
            continue
        split += 1
        thought, answer = text.split("</think>", 1)
        assert ch.message.reasoning_content == (thought.removeprefix("<think>").strip() or None)
        assert ch.message.content == answer.lstrip("\n")
        if ch.finish_reason == "stop":
            jsonschema.validate(json.loads(answer), schema)
    assert split >= 2


def test_with_a_reasoning_model_the_constraint_starts_after_the_reasoning(
    fast_reasoning_client, default_engine
):
    """The reasoning is free text; the answer after </think> is constrained (a bias on the
    marker's tokens makes the 135M model end its 'reasoning' within the budget)."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    }
    bias = {str(t): 5 for t in default_engine.tokenizer("</think>").input_ids}
    r = fast_reasoning_client.chat.completions.create(
        model="r1",
        messages=[{"role": "user", "content": "Name a city as JSON."}],
        temperature=1.0,
        n=6,
        seed=1,
        max_tokens=120,
        logit_bias=bias,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    done = [ch for ch in r.choices if ch.finish_reason == "stop"]
    assert done
    for ch in done:
        assert ch.message.reasoning_content  # free text, not JSON
        jsonschema.validate(json.loads(ch.message.content), schema)
    calls = fast_reasoning_client.chat.completions.create(
        model="r1",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        temperature=1.0,
        n=6,
        seed=3,
        max_tokens=200,
        logit_bias=bias,
    )
    for ch in calls.choices:
        if ch.finish_reason == "tool_calls":
            check_calls(ch.message.tool_calls)
    assert any(ch.finish_reason == "tool_calls" for ch in calls.choices)
    with pytest.raises(openai.BadRequestError) as e:
        fast_reasoning_client.chat.completions.create(
            model="r1", messages=ASK, max_tokens=4, extra_body={"regex": "a+"}
        )
    assert e.value.body["param"] == "regex"


def test_extract_reads_tool_calls_and_results_in_a_conversation(url):
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'},
    }
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "snow", "temperature": -4}'},
    ]
    schema = {
        "type": "object",
        "properties": {"sky": {"enum": ["snow", "rain", "sun"]}},
        "required": ["sky"],
    }
    r = requests.post(
        url + "/v1/extract",
        json={"messages": messages, "schema": schema, "max_tokens": 40},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    jsonschema.validate(r.json()["data"], schema)
    bare = requests.post(
        url + "/v1/extract", json={"messages": ASK, "schema": schema, "max_tokens": 40}, timeout=120
    )
    assert (
        r.json()["usage"]["prompt_tokens"] > bare.json()["usage"]["prompt_tokens"] + 20
    )  # the call and result


@pytest.fixture(scope="module")
def pythonic_client(engine):
    yield from served_client(engine, "py", tool_call_parser="pythonic")


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_pythonic_calls_are_constrained_too(pythonic_client, choice):
    kwargs = dict(
        model="py",
        messages=ASK,
        tools=TOOLS,
        tool_choice=choice,
        temperature=1.0,
        n=6,
        seed=4,
        max_tokens=160,
    )
    cold(pythonic_client)
    r = pythonic_client.chat.completions.create(**kwargs)
    cold(pythonic_client)
    streamed = _reassemble(pythonic_client.chat.completions.create(stream=True, **kwargs))
    made = 0
    for ch in r.choices:
        assert ch.finish_reason in ("tool_calls", "length")
        if ch.finish_reason == "tool_calls":
            made += len(check_calls(ch.message.tool_calls))
        s = streamed[ch.index]
        expected = [(c.function.name, c.function.arguments) for c in ch.message.tool_calls or []]
        assert [(c["name"], c["arguments"]) for _, c in sorted(s["calls"].items())] == expected
    assert made >= 3
