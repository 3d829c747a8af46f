"""The engine's caller-facing API on a tiny model: chat messages, streams of several requests,
finish listeners, typed picklable messages, and the prefix-cache implementations."""

from __future__ import annotations

import asyncio
import pickle
import threading

import pytest
from tiny_models import save_tiny_engine_dir

import sgl
from sgl.lang.chat_template import ChatTemplate
from sgl.runtime.errors import InvalidRequestError
from sgl.runtime.messages import (
    AbortRequest,
    CloseSession,
    FinishReason,
    FlushCache,
    GenerateRequest,
    GetInfo,
    LogprobOptions,
    OpenSession,
    Reply,
    ReqEvent,
    RequestStats,
    Shutdown,
    SubmitRequest,
)
from sgl.runtime.sampling import SamplingParams
from sgl.runtime.session import SessionParams

VOCAB = 320
TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path, _ = save_tiny_engine_dir(tmp_path_factory.mktemp("tiny-api"), VOCAB)
    with sgl.Engine(model_path=str(path), max_total_tokens=4096) as e:
        yield e


def test_messages_use_the_models_chat_template(engine):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    sp = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    engine.tokenizer.chat_template = TEMPLATE
    try:
        text = engine.tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=True
        )  # HF renders
        assert engine.render_messages(msgs) == text
        by_messages = engine.generate(messages=msgs, sampling_params=sp)
        assert by_messages["output_ids"] == engine.generate(text, sp)["output_ids"]
        both = engine.generate(messages=[msgs, msgs[1:]], sampling_params=sp)
        assert [o["output_ids"] for o in both] == [
            by_messages["output_ids"],
            engine.generate(engine.render_messages(msgs[1:]), sp)["output_ids"],
        ]
    finally:
        engine.tokenizer.chat_template = None


def test_messages_without_a_template_get_the_plain_roles(engine):
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "ok"},
    ]
    plain = ChatTemplate.plain()
    expected = "".join(
        plain.role_prefix(m["role"], i == 0) + m["content"] + plain.role_suffix(m["role"])
        for i, m in enumerate(msgs)
    ) + plain.role_prefix("assistant", False)
    assert engine.render_messages(msgs) == expected


@pytest.mark.parametrize(
    "bad, field",
    [
        ([], "messages"),
        ([{"content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": 3}], "messages[0].content"),
    ],
)
def test_bad_messages_name_the_field(engine, bad, field):
    with pytest.raises(InvalidRequestError) as e:
        engine.generate(messages=bad, sampling_params={"max_new_tokens": 1})
    assert e.value.param == field
    with pytest.raises(InvalidRequestError, match="not both"):
        engine.generate("x", messages=[{"role": "user", "content": "x"}])


def test_streams_of_several_requests_equal_their_whole_results(engine):
    """A batch with n = 2 streams interleaved chunks; per index they add up to the non-streamed
    results of the same seeded samples (sample i of a prompt is seeded seed + i)."""
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    sp = {"max_new_tokens": 10, "temperature": 1.0, "seed": 7, "n": 2, "ignore_eos": True}
    whole = engine.generate(input_ids=prompts, sampling_params=sp)
    texts, ids, finished = ["", "", "", ""], [[], [], [], []], set()
    for chunk in engine.generate(input_ids=prompts, sampling_params=sp, stream=True):
        i = chunk["index"]
        assert i not in finished  # nothing after a request's last chunk
        texts[i] += chunk["text"]
        ids[i] += chunk["output_ids"]
        if chunk["meta_info"]["finish_reason"] is not None:
            finished.add(i)
    assert finished == {0, 1, 2, 3}
    assert ids == [o["output_ids"] for o in whole] and texts == [o["text"] for o in whole]
    assert whole[0]["output_ids"] != whole[1]["output_ids"]  # two samples, two seeds


def test_async_stream_of_a_batch(engine):
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    sp = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}

    async def run():
        ids = [[], []]
        async for chunk in await engine.async_generate(
            input_ids=prompts, sampling_params=sp, stream=True
        ):
            ids[chunk["index"]] += chunk["output_ids"]
        return ids

    assert asyncio.run(run()) == [
        o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=sp)
    ]


def test_abandoned_multi_stream_frees_everything(engine):
    chunks = engine.generate(
        input_ids=[[5, 6], [7, 8]],
        sampling_params={"max_new_tokens": 200, "ignore_eos": True},
        stream=True,
    )
    next(chunks)
    chunks.close()  # the consumer stops: both requests are aborted
    assert engine.flush_cache()
    info = engine.get_server_info()
    assert info["available_kv_tokens"] == info["max_total_tokens"] and info["num_running_reqs"] == 0


def test_debug_wrap_sees_each_message_and_restores_the_engine(engine):
    """The test hook wraps the chosen point only while its block runs."""
    sent: list = []

    def record(send):
        def recording_send(msg):
            sent.append(msg)
            send(msg)

        return recording_send

    with engine.debug_wrap("send", record):
        out = engine.generate(
            input_ids=[5, 6], sampling_params={"max_new_tokens": 2}, rid="wrapped"
        )
    engine.generate(input_ids=[5, 6], sampling_params={"max_new_tokens": 2}, rid="after")
    # only the call inside the block was seen: the wrap is gone after it
    assert [type(m).__name__ for m in sent] == ["SubmitRequest"] and sent[
        0
    ].request.rid == "wrapped"
    assert out["meta_info"]["completion_tokens"] == 2
    with pytest.raises(
        ValueError, match=r"unknown debug_wrap point 'nowhere'; the points are \[.*'send'"
    ):
        with engine.debug_wrap("nowhere", record):
            pass


def test_debug_state_counts_a_held_request_until_it_finishes(engine):
    gate, entered = threading.Event(), threading.Event()

    def held(step):
        def held_step():
            if engine.debug_state()["waiting"]:
                entered.set()
                assert gate.wait(60)
            return step()

        return held_step

    with engine.debug_wrap("step", held):
        chunks = engine.generate(
            input_ids=[5, 6], sampling_params={"max_new_tokens": 2}, stream=True
        )
        assert entered.wait(60)
        state = engine.debug_state()
        assert state["in_flight"] == 1 and state["waiting"] == 1 and state["running"] == 0
        gate.set()
        assert list(chunks)[-1]["meta_info"]["finish_reason"]["type"] == "length"
    state = engine.debug_state()
    assert state["in_flight"] == 0 and state["waiting"] == 0 and state["running"] == 0


def test_finish_listeners_see_every_request_aborts_included(engine):
    seen: list[ReqEvent] = []
    engine.add_finish_listener(seen.append)
    engine.generate(
        input_ids=[[5, 6, 7]],
        sampling_params={"max_new_tokens": 3, "n": 2, "ignore_eos": True},
        rid="lst",
    )
    chunks = engine.generate(
        input_ids=[5, 6],
        sampling_params={"max_new_tokens": 200, "ignore_eos": True},
        stream=True,
        rid="lst-gone",
    )
    next(chunks)
    chunks.close()
    # the abort was handled before this answer: its final event was emitted
    engine.get_server_info()
    mine = {e.rid: e for e in seen if e.rid.startswith("lst")}
    assert set(mine) == {"lst-0", "lst-1", "lst-gone"}
    assert (
        mine["lst-0"].finish == FinishReason.of_length(3)
        and mine["lst-0"].stats.completion_tokens == 3
    )
    assert mine["lst-gone"].finish.is_abort


def test_messages_and_results_are_plain_picklable_data():
    req = GenerateRequest(
        "r",
        [1, 2],
        SamplingParams(max_new_tokens=3),
        LogprobOptions(True, 0, 2, True),
        session=SessionParams("s", "r0"),
    )
    msgs = [
        SubmitRequest(req),
        AbortRequest("r"),
        OpenSession("q", 10, "s", 5.0),
        CloseSession(None, "s"),
        FlushCache("q"),
        GetInfo("q"),
        Shutdown(),
        ReqEvent("r", "t", [3], RequestStats(2, 1, 0, 0.5, 0.1), FinishReason.stop(3)),
        Reply("q", {"a": 1}),
    ]
    for m in msgs:
        assert pickle.loads(pickle.dumps(m)) == m
    assert FinishReason.of_length(4).to_dict() == {"type": "length", "length": 4}
    assert FinishReason.abort("x").to_dict() == {"type": "abort", "message": "x"}


def test_messages_and_errors_cross_a_process_boundary_as_plain_data():
    """A request travels with its constraint as a spec (the JSON schema and EBNF grammars
    that did not pickle compiled); errors come back whole: same type, message and fields."""
    from sgl.runtime.errors import (
        EngineDeadError,
        EngineFault,
        EngineOverloadedError,
        NotFoundError,
    )

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for params in (
        SamplingParams(json_schema=schema),
        SamplingParams(ebnf='root ::= "a"+'),
        SamplingParams(json_object=True),
    ):
        back = pickle.loads(pickle.dumps(GenerateRequest("r", [1], params)))
        assert back.sampling_params == params
    for error in (
        InvalidRequestError("bad regex", "regex"),
        NotFoundError("no session", "session_params"),
        EngineOverloadedError("full", retry_after=7),
        EngineFault("abc123"),
        EngineDeadError("the scheduler process exited", "def456"),
    ):
        back = pickle.loads(pickle.dumps(error))
        assert (
            type(back) is type(error)
            and str(back) == str(error)
            and back.__dict__ == error.__dict__
        )
    assert str(pickle.loads(pickle.dumps(EngineFault("x")))) == "engine step failed (incident x)"


def test_prefix_cache_off_is_a_cache_that_keeps_nothing(tmp_path):
    path, _ = save_tiny_engine_dir(tmp_path, VOCAB)
    prompt = list(range(10, 60))
    sp = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    with sgl.Engine(model_path=str(path), max_total_tokens=2048, disable_radix_cache=True) as off:
        a, b = (
            off.generate(input_ids=prompt, sampling_params=sp),
            off.generate(input_ids=prompt, sampling_params=sp),
        )
        info = off.get_server_info()
    with sgl.Engine(model_path=str(path), max_total_tokens=2048) as on:
        c, d = (
            on.generate(input_ids=prompt, sampling_params=sp),
            on.generate(input_ids=prompt, sampling_params=sp),
        )
    assert a["output_ids"] == b["output_ids"] == c["output_ids"] == d["output_ids"]
    assert (
        b["meta_info"]["cached_tokens"] == 0 and d["meta_info"]["cached_tokens"] == len(prompt) - 1
    )
    assert (
        info["radix_cache_tokens"] == 0 and info["available_kv_tokens"] == info["max_total_tokens"]
    )


def test_max_new_tokens_none_fills_the_room(engine):
    out = engine.generate(
        input_ids=[5, 6, 7],
        sampling_params={"max_new_tokens": None, "temperature": 0, "ignore_eos": True},
    )
    assert (
        out["meta_info"]["completion_tokens"] == engine.context_len - 3
    )  # the context (256) binds before the pool


def test_shutdown_answers_requests_still_waiting(tmp_path):
    path, _ = save_tiny_engine_dir(tmp_path, VOCAB)
    engine = sgl.Engine(model_path=str(path), max_total_tokens=1024)
    chunks = engine.generate(
        input_ids=[5, 6], sampling_params={"max_new_tokens": 200, "ignore_eos": True}, stream=True
    )
    next(chunks)
    engine.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        for _ in chunks:
            pass
