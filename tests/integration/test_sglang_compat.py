"""What SGLang's clients send and expect, against the server on the embedded model.

Oracles: the same request without the field under test (so the field's effect is the only
difference), `re.search` over each token prefix of the output (stop_regex), the non-streamed
answer for a stream, and the files the profiler writes."""

from __future__ import annotations

import json
import os
import re

import jsonschema
import pytest
import requests
from server_helpers import ServerThread, assert_error, sse_events

import sgl
from sgl.server import create_app

pytestmark = pytest.mark.integration

# Every sampling parameter SGLang 0.5's /generate takes, as its frontend sends them
# (`SglSamplingParams.to_srt_kwargs`: empty lists, nulls) plus the rest of the API's fields.
SGLANG_SAMPLING = {
    "max_new_tokens": 6,
    "min_new_tokens": 0,
    "n": 1,
    "stop": [],
    "stop_token_ids": [],
    "stop_regex": [],
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "regex": None,
    "json_schema": None,
    "ebnf": None,
    "structural_tag": None,
    "custom_params": {"note": 1},
    "stream_interval": None,
    "logit_bias": {},
    "sampling_seed": None,
}
# SGLang's other /generate fields, at their "off" values
SGLANG_OFF_FIELDS = {
    "log_metrics": True,
    "return_hidden_states": False,
    "token_ids_logprob": None,
    "lora_path": None,
    "custom_logit_processor": None,
    "image_data": None,
    "modalities": None,
}
PROMPT = "The history of the printing press"


@pytest.fixture(scope="module")
def url(engine, tmp_path_factory):
    profile_dir = tmp_path_factory.mktemp("profiles")
    with ServerThread(create_app(engine, "sgl-test", profile_dir=str(profile_dir))) as u:
        yield u


def generate(url: str, body: dict) -> dict:
    r = requests.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def greedy(url: str, n: int, **extra) -> dict:
    return generate(
        url,
        {
            "text": PROMPT,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **extra},
        },
    )


def test_every_sglang_sampling_parameter_is_accepted(url):
    got = generate(url, {"text": PROMPT, "sampling_params": SGLANG_SAMPLING, **SGLANG_OFF_FIELDS})
    plain = generate(
        url, {"text": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    )
    assert got["text"] == plain["text"]  # [] / null / custom_params change nothing
    assert_error(
        requests.post(
            url + "/generate",
            json={"text": PROMPT, "sampling_params": {"structural_tag": "{}"}},
            timeout=30,
        ),
        400,
        "structural_tag.structures",
    )
    err = assert_error(
        requests.post(
            url + "/generate",
            json={"text": PROMPT, "sampling_params": {"stop_regexp": "x"}},
            timeout=30,
        ),
        400,
        "stop_regexp",
    )
    assert "did you mean 'stop_regex'" in err["message"]
    assert_error(
        requests.post(
            url + "/generate",
            json={"text": PROMPT, "sampling_params": {"stop_regex": "(?<=a)b"}},
            timeout=30,
        ),
        400,
        "stop_regex",
    )
    for field, value in (
        ("lora_path", "adapter-1"),
        ("return_hidden_states", True),
        ("image_data", "x.png"),
    ):
        err = assert_error(
            requests.post(url + "/generate", json={"text": PROMPT, field: value}, timeout=30),
            400,
            field,
        )
        assert "not supported" in err["message"]


def test_structural_tag_in_sglangs_form(url, engine):
    """SGLang's structural_tag (a JSON string): free text until the trigger, then the
    structure; a bias on "<" makes the model begin segments, which must then be valid."""
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["n"],
        "additionalProperties": False,
    }
    tag = json.dumps(
        {
            "type": "structural_tag",
            "triggers": ["<n>"],
            "structures": [{"begin": "<n>", "schema": schema, "end": "</n>"}],
        }
    )
    lt = engine.tokenizer("<").input_ids[-1]
    outs = generate(
        url,
        {
            "text": ["Numbers: ", 'Write <n>{"n": 5}</n>: '],
            "sampling_params": {
                "structural_tag": tag,
                "max_new_tokens": 48,
                "temperature": 1.0,
                "n": 4,
                "seed": 3,
                "logit_bias": {str(lt): 6},
            },
        },
    )
    segments = 0
    for out in outs:
        text = out["text"]
        for piece in text.split("<n>")[1:]:
            if "</n>" not in piece and out["meta_info"]["finish_reason"]["type"] == "length":
                continue  # cut off by max_new_tokens inside a segment
            segments += 1
            jsonschema.validate(json.loads(piece.split("</n>")[0]), schema)
    assert segments >= 2


def token_prefixes(engine, ids: list[int]) -> list[str]:
    return [engine.decode(ids[:k]) for k in range(1, len(ids) + 1)]


def expected_stop(prefixes: list[str], pattern: str) -> tuple[int, re.Match] | None:
    """The first token count whose text has a match (SGLang checks after every token)."""
    for k, text in enumerate(prefixes, start=1):
        m = re.search(pattern, text, re.ASCII)
        if m:
            return k, m
    return None


def test_stop_regex_stops_at_the_first_match_across_tokens_and_trims(url, engine):
    full = greedy(url, 24)
    ids, prefixes = full["output_ids"], token_prefixes(engine, full["output_ids"])
    # A piece of the output that spans a token boundary, then a class: a regex that must be
    # matched over several tokens' text.
    cut = len(prefixes[4])
    piece = full["text"][cut - 3 : cut + 2]
    pattern = re.escape(piece[:-1]) + r"[^\n]"
    k, m = expected_stop(prefixes, pattern)
    got = greedy(url, 24, stop_regex=pattern)
    assert got["text"] == prefixes[k - 1][: m.start()]
    assert got["output_ids"] == ids[:k]
    assert got["meta_info"]["finish_reason"] == {"type": "stop", "matched": m.group(0)}
    kept = greedy(url, 24, stop_regex=[r"never-in-text[0-9]+", pattern], no_stop_trim=True)
    assert kept["text"] == prefixes[k - 1] and kept["meta_info"]["finish_reason"][
        "matched"
    ] == m.group(0)
    # streamed: the pieces add up to the same trimmed text (text that might still match is held
    # back)
    events = [
        e
        for e in sse_events(
            requests.post(
                url + "/generate",
                json={
                    "text": PROMPT,
                    "stream": True,
                    "sampling_params": {
                        "max_new_tokens": 24,
                        "temperature": 0,
                        "ignore_eos": True,
                        "stop_regex": pattern,
                    },
                },
                stream=True,
                timeout=120,
            )
        )
        if e != "[DONE]"
    ]
    assert events[-1]["text"] == got["text"] and all(
        got["text"].startswith(e["text"]) for e in events
    )
    none = greedy(url, 24, stop_regex="QQQ[0-9]+")
    assert none["text"] == full["text"] and none["meta_info"]["finish_reason"]["type"] == "length"


def test_stream_interval_sends_a_chunk_every_n_tokens(engine):
    chunks = list(
        engine.generate(
            PROMPT,
            {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True, "stream_interval": 4},
            stream=True,
        )
    )
    whole = engine.generate(PROMPT, {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True})
    assert [len(c["output_ids"]) for c in chunks] == [4, 4, 4]
    assert "".join(c["text"] for c in chunks) == whole["text"]


def test_sampling_seed_is_seed_and_logit_bias_applies(url, engine):
    sampled = {"max_new_tokens": 8, "temperature": 1.0, "ignore_eos": True}
    a = greedy(url, 8, **{**sampled, "sampling_seed": 7})
    b = greedy(url, 8, **{**sampled, "seed": 7})
    assert a["output_ids"] == b["output_ids"]
    token = engine.encode(" banana")[0]
    biased = greedy(url, 4, logit_bias={str(token): 100.0})
    assert biased["output_ids"] == [token] * 4


def test_streamed_logprobs_come_with_each_chunk_and_add_up(url, engine):
    sp = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
    lp = dict(return_logprob=True, top_logprobs_num=2, logprob_start_len=0)
    whole = engine.generate(PROMPT, sp, **lp)["meta_info"]
    chunks = list(engine.generate(PROMPT, sp, stream=True, **lp))
    assert [len(c["meta_info"]["output_token_logprobs"]) for c in chunks] == [
        len(c["output_ids"]) for c in chunks
    ]
    assert [e for c in chunks for e in c["meta_info"]["output_token_logprobs"]] == whole[
        "output_token_logprobs"
    ]
    assert [e for c in chunks for e in c["meta_info"]["output_top_logprobs"]] == whole[
        "output_top_logprobs"
    ]
    assert chunks[0]["meta_info"]["input_token_logprobs"] == whole["input_token_logprobs"]
    assert all("input_token_logprobs" not in c["meta_info"] for c in chunks[1:])
    # the native server: text, ids and logprob entries so far in every event (as SGLang)
    events = [
        e
        for e in sse_events(
            requests.post(
                url + "/generate",
                json={
                    "text": PROMPT,
                    "sampling_params": sp,
                    "stream": True,
                    "return_logprob": True,
                    "top_logprobs_num": 2,
                    "logprob_start_len": 0,
                },
                stream=True,
                timeout=120,
            )
        )
        if e != "[DONE]"
    ]
    assert all(len(e["meta_info"]["output_token_logprobs"]) == len(e["output_ids"]) for e in events)
    last = events[-1]["meta_info"]
    assert [list(x) for x in whole["output_token_logprobs"]] == last["output_token_logprobs"]
    assert [list(x) for x in whole["input_token_logprobs"]] == last["input_token_logprobs"]


def test_openai_stream_carries_each_chunks_logprobs(url):
    body = {
        "model": "sgl-test",
        "messages": [{"role": "user", "content": "Name three fruits."}],
        "max_tokens": 10,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    whole = requests.post(url + "/v1/chat/completions", json=body, timeout=120).json()["choices"][0]
    events = [
        e
        for e in sse_events(
            requests.post(
                url + "/v1/chat/completions",
                json={**body, "stream": True},
                stream=True,
                timeout=120,
            )
        )
        if e != "[DONE]"
    ]
    entries = [
        t for e in events for c in e["choices"] if c["logprobs"] for t in c["logprobs"]["content"]
    ]
    # the same entries (the second run reuses the cached prompt, so logprobs agree to rounding)
    assert [(t["token"], [x["token"] for x in t["top_logprobs"]]) for t in entries] == [
        (t["token"], [x["token"] for x in t["top_logprobs"]]) for t in whole["logprobs"]["content"]
    ]
    assert [t["logprob"] for t in entries] == pytest.approx(
        [t["logprob"] for t in whole["logprobs"]["content"]], abs=1e-4
    )
    with_text = [c for e in events for c in e["choices"] if c.get("delta", {}).get("content")]
    assert all(c["logprobs"] and c["logprobs"]["content"] for c in with_text)
    assert "".join(c["delta"]["content"] for c in with_text) == whole["message"]["content"]


def test_server_info_alias_and_a_loadable_model_path(url):
    """`model_path` is a local directory a router loads the tokenizer from (for the embedded
    GGUF: its converted tokenizer's files, the same tokenizer the engine encodes with)."""
    from transformers import AutoTokenizer

    old = requests.get(url + "/get_server_info", timeout=30).json()
    new = requests.get(url + "/server_info", timeout=30).json()
    assert set(new) == set(old) and new["resolved_model_path"].endswith(".gguf")
    info = requests.get(url + "/get_model_info", timeout=30).json()
    assert new["model_path"] == info["model_path"] == info["tokenizer_path"]
    text = "Hello, router: tokenize me the same way."
    ids = requests.post(url + "/tokenize", json={"text": text}, timeout=30).json()["input_ids"]
    assert AutoTokenizer.from_pretrained(info["model_path"])(text).input_ids == ids


def test_profiler_writes_a_chrome_trace_under_the_profile_dir(url, engine):
    assert_error(requests.post(url + "/stop_profile", timeout=30), 400)
    assert_error(
        requests.post(url + "/start_profile", json={"output_dir": "../../elsewhere"}, timeout=30),
        400,
        "output_dir",
    )
    r = requests.post(
        url + "/start_profile", json={"output_dir": "run1", "activities": ["CPU"]}, timeout=60
    )
    assert r.status_code == 200, r.text
    assert_error(requests.post(url + "/start_profile", json={}, timeout=30), 400)  # already running
    greedy(url, 4)
    r = requests.post(url + "/stop_profile", timeout=120)
    assert r.status_code == 200, r.text
    path = r.json()["message"].split("trace written to ", 1)[1]
    assert "/run1/" in path
    with open(path) as f:
        trace = json.load(f)
    names = {ev.get("name", "") for ev in trace["traceEvents"]}
    assert any(
        n.startswith("aten::") for n in names
    )  # the model's ops, recorded on the scheduler thread


def test_profiling_off_without_a_profile_dir(engine):
    with ServerThread(create_app(engine, "no-profiling")) as u:
        err = assert_error(requests.post(u + "/start_profile", timeout=30), 400)
        assert "--profile-dir" in err["message"]


def test_profile_of_num_steps_ends_by_itself(engine, tmp_path):
    engine.start_profile(str(tmp_path), num_steps=2, activities=["CPU"])
    engine.generate(PROMPT, {"max_new_tokens": 6, "temperature": 0})  # more than 2 steps
    path = engine.stop_profile()  # the trace the profile wrote when it ended after 2 steps
    assert path.startswith(str(tmp_path)) and json.load(open(path))["traceEvents"]
    with pytest.raises(ValueError, match="no profile is running"):
        engine.stop_profile()


def test_profiles_ended_in_the_same_second_write_distinct_traces(tmp_path):
    from sgl.runtime.profiler import StepProfiler

    profiler, paths = StepProfiler(), []
    for _ in range(3):  # a profile of nothing ends in well under a second
        profiler.start(str(tmp_path), activities=["CPU"])
        paths.append(profiler.stop())
    assert len(set(paths)) == 3 and all(os.path.exists(p) for p in paths)


def test_output_token_logprobs_length_counts_the_entries_so_far(url):
    """SGLang's meta carries `output_token_logprobs_length` (its frontend's stream consumers read
    it)."""
    body = {
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
        "return_logprob": True,
    }
    events = [
        e
        for e in sse_events(
            requests.post(
                url + "/generate", json={**body, "stream": True}, stream=True, timeout=120
            )
        )
        if e != "[DONE]"
    ]
    for e in events:
        meta = e["meta_info"]
        assert (
            meta["output_token_logprobs_length"]
            == len(meta["output_token_logprobs"])
            == meta["completion_tokens"]
        )
    meta = generate(url, body)["meta_info"]
    assert meta["output_token_logprobs_length"] == len(meta["output_token_logprobs"]) == 6
    assert (
        "output_token_logprobs_length"
        not in generate(url, {**body, "return_logprob": False})["meta_info"]
    )


def test_concate_and_append_request_answers_as_sglang_and_checks_its_body(url):
    """SGLang's RuntimeEndpoint calls it when forks join with mode="concate_and_append" (it
    404'd and the program hung until the client's timeout)."""
    r = requests.post(
        url + "/concate_and_append_request",
        json={"src_rids": ["a", "b"], "dst_rid": "p"},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    assert_error(
        requests.post(
            url + "/concate_and_append_request", json={"src_rids": [], "dst_rid": "p"}, timeout=30
        ),
        400,
        "src_rids",
    )
    assert_error(
        requests.post(url + "/concate_and_append_request", json={"src_rids": ["a"]}, timeout=30),
        400,
        "dst_rid",
    )


def test_runtime_endpoint_endpoint_is_itself(url):
    """SGLang code reads `global_config.default_backend.endpoint` (a Runtime's endpoint)."""
    backend = sgl.RuntimeEndpoint(url)
    assert backend.endpoint is backend and backend.endpoint.get_model_name() == "sgl-test"
