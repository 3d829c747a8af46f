"""Tensor parallelism through the engine and the server: `Engine(tp_size=2)` (two scheduler
processes over gloo, one thread each) against the same model at tp 1, the oracle. Greedy
tokens must be equal in float32 (the logits differ only in the order of the row-parallel
sums: <= 3e-7 measured in test_tensor_parallel.py), sampled tokens equal for the same seed,
and every feature that lives in the scheduler works: constraints and jump-forward, forks,
sessions, logprobs, streaming, abort, retraction and shipped programs (`/run_program`). A
killed rank fails every caller and leaves no process behind."""

from __future__ import annotations

import json
import os
import signal

import jsonschema
import pytest
import requests
from process_helpers import call_in_background, gone
from server_helpers import ServerThread, wait_until

import sgl
from sgl.runtime.errors import EngineDeadError, EngineUnavailableError
from sgl.server.app import create_app

pytestmark = pytest.mark.integration

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
PROMPTS = ["the quick brown", "hello world, structured", "0123456789 the lazy dog"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "unit"))
    from tiny_models import save_tiny_engine_dir

    path, _ = save_tiny_engine_dir(
        tmp_path_factory.mktemp("tiny-tp"), 320, max_position_embeddings=512
    )
    return str(path)


@pytest.fixture(scope="module")
def engines(model_dir):
    """(tp 1, tp 2) on the same weights, float32, a small pool (retractions happen)."""
    opts = dict(model_path=model_dir, dtype="float32", max_total_tokens=600, random_seed=3)
    with sgl.Engine(**opts) as one, sgl.Engine(**opts, tp_size=2) as two:
        yield one, two


def both(engines, *args, **kwargs):
    one, two = engines
    return one.generate(*args, **kwargs), two.generate(*args, **kwargs)


def ids(out):
    return [x["output_ids"] for x in (out if isinstance(out, list) else [out])]


def test_tp2_generates_what_tp1_generates(engines):
    a, b = both(engines, PROMPTS, GREEDY, return_logprob=True, top_logprobs_num=3)
    assert ids(a) == ids(b)
    for x, y in zip(a, b):
        assert [e[0] for e in x["meta_info"]["output_token_logprobs"]] == pytest.approx(
            [e[0] for e in y["meta_info"]["output_token_logprobs"]], abs=1e-4
        )
    a, b = both(engines, "sampled", {"max_new_tokens": 12, "temperature": 0.9, "seed": 5, "n": 3})
    assert ids(a) == ids(b)  # seeded: the same tokens (rank 0 samples, the other takes them)
    stream = list(engines[1].generate(PROMPTS[0], GREEDY, stream=True))
    assert "".join(c["text"] for c in stream) == a_text(engines[0], PROMPTS[0])


def a_text(engine, prompt):
    return engine.generate(prompt, GREEDY)["text"]


def test_constraints_and_jump_forward_at_tp2(engines):
    for params in (
        {"max_new_tokens": 40, "json_schema": json.dumps(SCHEMA), "temperature": 0},
        {"max_new_tokens": 8, "regex": "(fox|dog) [0-9]{2}", "temperature": 0},
        {"max_new_tokens": 8, "ebnf": 'root ::= "yes" | "no" " " [a-z]+', "temperature": 0},
    ):
        a, b = both(engines, "answer:", params)
        assert ids(a) == ids(b), params
    a, b = both(
        engines,
        "json:",
        {"max_new_tokens": 120, "json_schema": json.dumps(SCHEMA), "temperature": 0},
    )
    assert ids(a) == ids(b) and b["meta_info"]["finish_reason"]["type"] == "stop"
    jsonschema.validate(json.loads(b["text"]), SCHEMA)
    info = engines[1].get_server_info()
    assert info["jump_forward_tokens"] > 0 and info["tp_size"] == 2


@sgl.function
def forked(s, topic):
    s += "Facts about " + topic + ":\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"{i + 1}. " + sgl.gen("fact", max_tokens=8, temperature=0)
    forks.join()
    s += "Pick: " + sgl.select("pick", choices=["first", "second"])


def test_programs_sessions_and_aborts_at_tp2(engines):
    one, two = engines
    a = forked.run(topic="the fox", backend=sgl.as_backend(one))
    b = forked.run(topic="the fox", backend=sgl.as_backend(two))
    assert a["fact"] == b["fact"] and a["pick"] == b["pick"]
    sid = two.open_session(capacity_tokens=300)
    first = two.generate(
        "hello", {"max_new_tokens": 4, "temperature": 0}, session_params={"id": sid}
    )
    turn = two.generate(
        " again",
        {"max_new_tokens": 4, "temperature": 0},
        session_params={"id": sid, "rid": first["meta_info"]["id"]},
    )
    assert turn["meta_info"]["cached_tokens"] > 0
    assert two.close_session(sid)
    stream = two.generate(
        "count", {"max_new_tokens": 300, "ignore_eos": True}, stream=True, rid="tp-long"
    )
    next(stream)
    two.abort("tp-long")
    last = list(stream)[-1]["meta_info"]
    assert last["finish_reason"]["type"] == "abort" and last["completion_tokens"] < 300


def test_retraction_at_tp2_gives_tp1s_tokens(engines):
    """Eight 120-token generations on a 600-token pool: decoding runs out of KV and retracts,
    on both ranks alike (every rank builds the same batches)."""
    before = engines[1].get_server_info()["retractions"]
    params = {"max_new_tokens": 120, "temperature": 0, "ignore_eos": True}
    prompts = [f"{p} {i}" for i, p in enumerate(PROMPTS * 3)][:8]
    a, b = both(engines, prompts, params)
    assert ids(a) == ids(b)
    assert engines[1].get_server_info()["retractions"] > before


def test_the_server_and_shipped_programs_at_tp2(engines):
    one, two = engines
    with ServerThread(create_app(two, "tiny")) as url:
        r = requests.post(
            url + "/generate", json={"text": PROMPTS[1], "sampling_params": GREEDY}, timeout=120
        )
        assert (
            r.status_code == 200
            and r.json()["output_ids"] == one.generate(PROMPTS[1], GREEDY)["output_ids"]
        )
        shipped = forked.run(topic="the dog", backend=sgl.RuntimeEndpoint(url))
        local = forked.run(topic="the dog", backend=sgl.as_backend(one))
        assert shipped["fact"] == local["fact"] and shipped["pick"] == local["pick"]
        assert requests.get(url + "/health", timeout=10).status_code == 200


def test_a_killed_rank_fails_every_caller_and_stops_the_other(model_dir):
    engine = sgl.Engine(model_path=model_dir, dtype="float32", max_total_tokens=600, tp_size=2)
    pids = engine.scheduler_pids
    caller, outcome = call_in_background(
        lambda: engine.generate("count", {"max_new_tokens": 400, "ignore_eos": True})
    )
    assert wait_until(
        lambda: engine.get_server_info()["num_running_reqs"] == 1, timeout=120, interval=0.05
    )
    with ServerThread(create_app(engine, "tiny")) as url:
        assert requests.get(url + "/health", timeout=10).status_code == 200
        os.kill(pids[1], signal.SIGKILL)  # not the rank that talks to the engine
        caller.join(120)
        health = requests.get(url + "/health", timeout=10)
        assert health.status_code == 503 and "incident" in health.text
    assert not caller.is_alive() and isinstance(outcome.get("error"), RuntimeError), outcome
    assert isinstance(engine.fault, EngineDeadError) and "rank 1" in str(engine.fault)
    with pytest.raises(EngineUnavailableError):
        engine.generate("x", {"max_new_tokens": 2})
    engine.shutdown()
    assert wait_until(lambda: all(gone(p) for p in pids), timeout=30, interval=0.05)


def test_a_config_that_cannot_split_is_refused_naming_the_field(model_dir):
    with pytest.raises(ValueError, match="num_attention_heads=4 is not divisible by tp_size=3"):
        sgl.Engine(model_path=model_dir, dtype="float32", max_total_tokens=600, tp_size=3)


def test_the_embedded_model_unquantized_at_tp2_gives_tp1s_greedy_tokens(engine):
    """SmolLM2-135M has 9 query and 3 KV heads: at tp 2 rank 0 holds 2 KV heads and their 6
    query heads, rank 1 the third and its 3. Its greedy tokens are tp 1's (the session engine,
    float32 dense: itself held to HF transformers by test_engine_oracle.py)."""
    from oracle_helpers import ORACLE_EXACT

    params = {"max_new_tokens": 24, "temperature": 0}
    prompts = ["The capital of France is", "def fibonacci(n):", "Three facts about honeybees:\n1."]
    with sgl.Engine(**ORACLE_EXACT, max_total_tokens=2048, tp_size=2) as two:
        assert len(two.scheduler_pids) == 2
        got = two.generate(prompts, params)
    want = engine.generate(prompts, params)
    assert ids(got) == ids(want)
