"""Speculative decoding (NGRAM prompt lookup) on the embedded model, the server and tensor
parallelism. The oracle is the same model without speculation (the session's `engine`):
greedy decoding must give its tokens one for one, whatever was drafted. Every test also
checks that drafts were really proposed and accepted, or it would prove nothing: copying and
quoting prompts make the model repeat its input, which prompt lookup drafts well."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import jsonschema
import pytest
import requests
import torch
from oracle_helpers import _LONG_TEXT, ORACLE_EXACT, chat
from process_helpers import gone
from server_helpers import ServerThread, kv_whole, metric, parse_metrics, sse_events, wait_until

import sgl
from sgl.runtime.cpu_share import omp_set_num_threads
from sgl.server.app import create_app
from sgl.server.launch import build_parser, engine_kwargs, main, parse_args

pytestmark = pytest.mark.integration

GREEDY = {"temperature": 0, "max_new_tokens": 64}
MODEL = "smollm2-spec"
CARD = (
    "Customer record. Name: Margaret Holloway. City: Portsmouth. Account number: 48213. "
    "Favourite colour: teal. Member since: 2011."
)


def copy_prompts(tok) -> list[str]:
    """Prompts whose answers repeat their input (drafts are accepted)."""
    return [
        chat(tok, "Repeat the following paragraph exactly, word for word.\n\n" + _LONG_TEXT),
        chat(tok, "Quote the first two sentences of this text.\n\n" + _LONG_TEXT),
        _LONG_TEXT + "\n\nThe same text again, copied:\n\n" + _LONG_TEXT[:120],
    ]


# Repeated phrases, cut mid-repeat: what comes next is in the prompt.
REPEATS = [
    "Copy the line four times. Line: the red fox jumps over the old stone wall at dawn. "
    "Copies: the red fox jumps over the old stone wall at dawn. The red fox",
    "Repeat after me: one two three four five six seven, one two three four five six seven, "
    "one two three four five six seven, one two",
    "The printing press spread pamphlets, newspapers and journals across Europe. The printing "
    "press spread pamphlets, newspapers and journals across Europe. The printing",
    "Say it again and again: sail the ship home before the storm, sail the ship home before "
    "the storm, sail the ship home",
    "Shopping list: apples, pears, plums, cherries, apples, pears, plums, cherries, apples, "
    "pears, plums, cherries, apples, pears,",
    "Echo: the quick brown fox jumps over the lazy dog; the quick brown fox jumps over the lazy "
    "dog; the quick brown",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday, "
    "Wednesday, Thursday, Friday, Saturday, Sunday, Monday,",
    "A rose is a rose is a rose is a rose. A rose is a rose is a rose is a rose. A rose is a "
    "rose is",
]


def free_prompts(tok) -> list[str]:
    return [
        chat(tok, "What is the capital of France?"),
        chat(tok, "Write a haiku about autumn leaves."),
        chat(tok, "List three primary colors."),
        chat(tok, "Explain in two sentences what a CPU does."),
    ]


@pytest.fixture(scope="module")
def spec():
    e = sgl.Engine(**ORACLE_EXACT, speculative_algorithm="NGRAM")
    yield e
    e.shutdown()


def as_list(out) -> list[dict]:
    return out if isinstance(out, list) else [out]


def assert_same(got, want) -> None:
    """Token for token what the engine without speculation produced, and finished alike."""
    got, want = as_list(got), as_list(want)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    assert [o["text"] for o in got] == [o["text"] for o in want]
    assert [o["meta_info"]["finish_reason"] for o in got] == [
        o["meta_info"]["finish_reason"] for o in want
    ]


def spec_counts(outs) -> tuple[int, int]:
    """(drafted, accepted) over the outputs; each output's counts checked for consistency."""
    drafted = accepted = 0
    for o in as_list(outs):
        m = o["meta_info"]
        assert m["spec_verify_ct"] >= 1 and 0 <= m["spec_accepted_tokens"] <= m["spec_draft_tokens"]
        drafted += m["spec_draft_tokens"]
        accepted += m["spec_accepted_tokens"]
    return drafted, accepted


def assert_speculated(outs) -> None:
    drafted, accepted = spec_counts(outs)
    assert drafted > 0 and accepted > 0, (drafted, accepted)


# ------------------------------------------------------------------ greedy identity


def test_copying_prompts_accept_drafts_and_keep_the_tokens(spec, engine):
    prompts = copy_prompts(engine.tokenizer)
    want = engine.generate(prompts, GREEDY, return_logprob=True, top_logprobs_num=2)
    assert any(w["meta_info"]["finish_reason"]["type"] == "length" for w in want)
    for p, w in zip(prompts, want):  # one at a time: each request's verify steps alone
        got = spec.generate(p, GREEDY, return_logprob=True, top_logprobs_num=2)
        assert_same(got, w)
        m = got["meta_info"]
        assert m["spec_accepted_tokens"] > 0, m
        # each verify step adds its accepted drafts and one drawn token (the first token came
        # from the prefill); a stop may cut a step's accepted tokens short
        if m["finish_reason"]["type"] == "length":
            assert m["completion_tokens"] == 1 + m["spec_verify_ct"] + m["spec_accepted_tokens"]
        assert m["spec_verify_ct"] < m["completion_tokens"] - 1  # fewer steps than tokens
        assert m["spec_accept_length"] == pytest.approx(
            m["completion_tokens"] / m["spec_verify_ct"]
        )
        # the logprob of each token is the one the model gives it without speculation
        lp = [e[0] for e in m["output_token_logprobs"]]
        assert lp == pytest.approx(
            [e[0] for e in w["meta_info"]["output_token_logprobs"]], abs=1e-4
        )
        tops = [[t[1] for t in e] for e in m["output_top_logprobs"]]
        assert tops == [[t[1] for t in e] for e in w["meta_info"]["output_top_logprobs"]]


def test_free_chat_prompts_keep_the_tokens(spec, engine):
    prompts, params = free_prompts(engine.tokenizer), dict(GREEDY, max_new_tokens=40)
    got = spec.generate(prompts, params)
    assert_same(got, engine.generate(prompts, params))
    assert_speculated(got)


def test_a_mixed_batch_of_8_keeps_every_requests_tokens(spec, engine):
    """Copying and free prompts in one batch, with the parameters a verify step must apply at
    every drafted position: penalties, a stop string, min_new_tokens, ignore_eos."""
    tok = engine.tokenizer
    prompts = copy_prompts(tok) + free_prompts(tok) + [REPEATS[1]]
    params = [
        dict(GREEDY, max_new_tokens=72),
        dict(GREEDY, repetition_penalty=1.6),
        dict(GREEDY, stop=["printing"], max_new_tokens=48),
        dict(GREEDY, max_new_tokens=24, ignore_eos=True),
        dict(GREEDY, frequency_penalty=1.0, presence_penalty=0.5),
        dict(GREEDY, min_new_tokens=30, max_new_tokens=40),
        dict(GREEDY, max_new_tokens=16, logit_bias={"28": 2.5}),  # "," favoured
        dict(GREEDY, max_new_tokens=48, ignore_eos=True),
    ]
    got = spec.generate(prompts, params)
    assert_same(got, engine.generate(prompts, params))
    assert_speculated(got)
    assert (
        "printing" not in got[2]["text"] and got[2]["meta_info"]["finish_reason"]["type"] == "stop"
    )
    assert len(got[5]["output_ids"]) >= 30


def test_penalties_count_the_drafted_tokens_before_each_position(spec, engine):
    """Copying repeated phrases under presence and frequency penalties (which, unlike the
    repetition penalty, spare the prompt's tokens, so drafts from it are accepted): the
    tokens a draft puts before a position are penalised there as if already output."""
    prompts = copy_prompts(engine.tokenizer)[:1] + REPEATS
    params = dict(GREEDY, max_new_tokens=40, ignore_eos=True)
    params = [dict(params, presence_penalty=1.5)] * 5 + [dict(params, frequency_penalty=1.0)] * 4
    got = spec.generate(prompts, params)
    assert_same(got, engine.generate(prompts, params))
    assert_speculated(got)


# ------------------------------------------------------------------ constraints

EXTRACT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "city": {"type": "string", "maxLength": 40},
        "account": {"type": "integer"},
    },
    "required": ["name", "city", "account"],
    "additionalProperties": False,
}
RECORD = (
    r"Customer record\. Name: [A-Z][a-z]+ [A-Z][a-z]+\. City: [A-Z][a-z]+\. "
    r"Account number: [0-9]{5}\."
)
BOUNDED = r"Customer record\. [A-Za-z0-9 .:]{10,60}\."
EBNF = 'root ::= "Name: " name ". City: " name "."\nname ::= [A-Z] [a-z]+ (" " [A-Z] [a-z]+)?'
EBNF_RE = r"Name: [A-Z][a-z]+( [A-Z][a-z]+)?\. City: [A-Z][a-z]+( [A-Z][a-z]+)?\."


def constrained_requests(tok) -> tuple[list[str], list[dict], list]:
    """(prompts, params, a check of each output): regexes, a JSON schema and EBNF whose
    answers copy the input, and a budget-aware schema at a tight budget."""
    repeat = chat(tok, f"{CARD}\n\nRepeat the record.")
    ask = chat(tok, f"{CARD}\n\nGive the customer's name, city and account number as JSON.")
    prompts = [
        repeat,
        repeat,
        ask,
        chat(tok, f"{CARD}\n\nWrite 'Name: ' and the name, then '. City: ' and the city."),
        ask,
    ]
    params = [
        dict(GREEDY, regex=RECORD),
        dict(GREEDY, regex=BOUNDED),
        dict(GREEDY, max_new_tokens=96, json_schema=json.dumps(EXTRACT)),
        dict(GREEDY, ebnf=EBNF),
        dict(GREEDY, max_new_tokens=24, json_schema=json.dumps(EXTRACT), budget_aware=True),
    ]
    checks = [
        lambda t: re.fullmatch(RECORD, t),
        lambda t: re.fullmatch(BOUNDED, t),
        lambda t: jsonschema.validate(json.loads(t), EXTRACT) is None,
        lambda t: re.fullmatch(EBNF_RE, t),
        lambda t: jsonschema.validate(json.loads(t), EXTRACT) is None,
    ]
    return prompts, params, checks


def test_json_extraction_whose_forced_keys_were_drafted_keeps_the_tokens(spec, engine):
    """A schema shown in the prompt makes prompt lookup draft the keys that jump-forward then
    forces: a verify step's accepted draft and the forced text after it can overlap. (This
    once left a request with K/V for every token and nothing to feed: the engine faulted.)"""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from spec_workloads import build

    w = build("json_extraction", 2, "forced-keys", 12, 160)
    params = {
        **GREEDY,
        "max_new_tokens": w.max_new_tokens,
        "json_schema": json.dumps(w.json_schema),
    }
    want = engine.generate(w.prompts, params)
    jumped = spec.get_server_info()["jump_forward_tokens"]
    got = spec.generate(w.prompts, params)
    assert_same(got, want)
    assert_speculated(got)
    assert spec.get_server_info()["jump_forward_tokens"] > jumped  # forced text was appended
    for o in got:
        if o["meta_info"]["finish_reason"]["type"] != "length":
            jsonschema.validate(json.loads(o["text"]), w.json_schema)


@pytest.fixture
def jump_forward(spec, engine):
    """Set `disable_jump_forward` on both engines (a live option); restored afterwards."""
    before = {e: e.config.disable_jump_forward for e in (spec, engine)}

    def set_(on: bool) -> None:
        for e in (spec, engine):
            assert e.update_options(disable_jump_forward=not on) == {"disable_jump_forward": not on}

    yield set_
    for e, value in before.items():
        e.update_options(disable_jump_forward=value)


@pytest.mark.parametrize("mode", ["jump_forward", "no_jump_forward", "logprobs"])
def test_constrained_outputs_keep_the_tokens_and_are_valid(spec, engine, jump_forward, mode):
    """With jump-forward, forced text is appended; without it, or with logprobs asked for
    (which jump-forward does not give), forced text is drafted and verified."""
    jump_forward(mode != "no_jump_forward")
    logprobs = dict(return_logprob=True, top_logprobs_num=2) if mode == "logprobs" else {}
    prompts, params, checks = constrained_requests(engine.tokenizer)
    got = spec.generate(prompts, params, **logprobs)
    want = engine.generate(prompts, params, **logprobs)
    assert_same(got, want)
    for o, check in zip(got, checks):
        assert o["meta_info"]["finish_reason"]["type"] == "stop", o
        assert check(o["text"]), o["text"]
    assert got[0]["text"] == CARD[:82]  # copied: the record's own words, drafted from it
    extracted = json.loads(got[2]["text"])
    assert extracted["name"] == "Margaret Holloway" and extracted["account"] == 48213
    assert all(spec_counts(o)[1] > 0 for o in got[:4]), [o["meta_info"] for o in got]
    for g, w in zip(got, want if logprobs else []):
        lp = [e[0] for e in g["meta_info"]["output_token_logprobs"]]
        assert lp == pytest.approx(
            [e[0] for e in w["meta_info"]["output_token_logprobs"]], abs=1e-4
        )


# ------------------------------------------------------------------ sessions and forks


def test_session_turns_keep_the_tokens(spec, engine):
    tok = engine.tokenizer
    turns = [
        chat(tok, "Repeat this sentence exactly: " + _LONG_TEXT[:160]),
        "\nNow repeat it once more:",
        "\nAnd the sentence after it in the text was:",
    ]
    outs = {}
    for e in (spec, engine):
        sid, rid, outs[e] = e.open_session(), None, []
        try:
            for text in turns:
                session = {"id": sid, "rid": rid} if rid else {"id": sid}
                o = e.generate(text, dict(GREEDY, max_new_tokens=40), session_params=session)
                outs[e].append(o)
                rid = o["meta_info"]["id"]
        finally:
            assert e.close_session(sid)
    assert_same(outs[spec], outs[engine])
    assert_speculated(outs[spec])
    # a later turn's prompt holds the history: it was cached, not recomputed
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in outs[spec][1:])


def test_n_samples_and_a_shared_prefix_batch_keep_the_tokens(spec, engine):
    tok = engine.tokenizer
    quote = copy_prompts(tok)[0]
    params = dict(GREEDY, max_new_tokens=32, n=2)
    got = spec.generate(quote, params)
    assert_same(got, engine.generate(quote, params))
    assert_speculated(got)
    # fork-style: one long shared prefix, then different questions (one radix-cached prefix)
    head = f"{_LONG_TEXT}\n\n"
    forks = [
        head + "Question: who combined the screw press with movable type?\nAnswer:",
        head + "Question: who copied books before printing?\nAnswer:",
        head + "Quote the sentence about pamphlets:\n",
        head + "Repeat the last sentence:\n",
    ]
    got = spec.generate(forks, dict(GREEDY, max_new_tokens=32))
    assert_same(got, engine.generate(forks, dict(GREEDY, max_new_tokens=32)))
    assert_speculated(got)
    assert sum(o["meta_info"]["cached_tokens"] for o in got) > 0  # the prefix was shared


# ------------------------------------------------------------------ short memory

SHORT_POOL = 160  # KV slots: a fifth of what the batch below needs at its end


def test_short_kv_memory_drops_drafts_and_retracts_keeping_the_tokens(engine):
    """A pool far too small for the batch: drafts are given up first, then requests are
    retracted and recomputed; the tokens are the large pool's without speculation."""
    ids = [engine.encode(p) for p in REPEATS]
    params = {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}
    assert sum(len(x) + 64 for x in ids) > 4 * SHORT_POOL  # cannot all fit at once
    with sgl.Engine(
        **ORACLE_EXACT, max_total_tokens=SHORT_POOL, speculative_algorithm="NGRAM"
    ) as small:
        got = small.generate(input_ids=ids, sampling_params=params)
        info = small.get_server_info()
        assert info["retractions"] > 0
        assert small.flush_cache()
        assert small.get_server_info()["available_kv_tokens"] == info["max_total_tokens"]
    assert_same(got, engine.generate(input_ids=ids, sampling_params=params))
    assert_speculated(got)


# ------------------------------------------------------------------ the server

SERVER_ARGV = [
    "--speculative-algorithm",
    "ngram",  # SGLang's spelling is upper case; either is taken
    "--speculative-num-draft-tokens",
    "6",
    "--dtype",
    "float32",
    "--quantization",
    "none",
    "--max-total-tokens",
    "4096",
]


@pytest.fixture(scope="module")
def server():
    """A server whose engine is built from the launcher's flags (a scheduler process, the
    server's default), and that engine."""
    args = parse_args(build_parser(), SERVER_ARGV)
    e = sgl.Engine(**engine_kwargs(args))
    pids = list(e.scheduler_pids)
    try:
        with ServerThread(create_app(e, MODEL)) as url:
            yield url, e
    finally:
        e.shutdown()
    assert wait_until(lambda: all(gone(p) for p in pids), timeout=30, interval=0.05)


def server_info(url: str) -> dict:
    return requests.get(url + "/get_server_info", timeout=30).json()


def test_server_generate_reports_verify_steps_and_keeps_the_tokens(server, engine):
    url, _ = server
    tok = engine.tokenizer
    prompts = copy_prompts(tok)[:2] + free_prompts(tok)[:1]
    before = server_info(url)["speculative"]
    r = requests.post(
        url + "/generate", json={"text": prompts, "sampling_params": GREEDY}, timeout=300
    )
    assert r.status_code == 200, r.text
    got = r.json()
    assert_same(got, engine.generate(prompts, GREEDY))
    assert_speculated(got)
    for o in got:
        m = o["meta_info"]
        assert m["spec_verify_ct"] > 0
        assert m["spec_accept_length"] == pytest.approx(
            m["completion_tokens"] / m["spec_verify_ct"]
        )
    info = server_info(url)
    s = info["speculative"]
    assert s["algorithm"] == "NGRAM" and s["num_draft_tokens"] == 6  # from the flags
    # the engine's totals moved by exactly what the requests report
    verify = sum(o["meta_info"]["spec_verify_ct"] for o in got)
    drafted, accepted = spec_counts(got)
    assert s["verify_steps"] - before["verify_steps"] == verify
    assert s["draft_tokens"] - before["draft_tokens"] == drafted
    assert s["accepted_tokens"] - before["accepted_tokens"] == accepted
    assert 0 <= s["acceptance_rate"] <= 1
    assert s["acceptance_rate"] == pytest.approx(s["accepted_tokens"] / s["draft_tokens"])
    avg = info["internal_states"][0]["avg_spec_accept_length"]
    assert avg >= 1 and avg == pytest.approx(s["avg_spec_accept_length"])
    assert avg == pytest.approx((s["accepted_tokens"] + s["verify_steps"]) / s["verify_steps"])


def test_server_stream_grows_to_the_whole_output(server, engine):
    """Streamed chunks hold the cumulative text and ids (SGLang's /generate), each extending
    the one before, though a verify step commits several tokens at once."""
    url, _ = server
    prompt = copy_prompts(engine.tokenizer)[0]
    body = {"text": prompt, "sampling_params": GREEDY, "stream": True}
    with requests.post(url + "/generate", json=body, stream=True, timeout=300) as r:
        assert r.status_code == 200
        chunks = [e for e in sse_events(r) if e != "[DONE]"]
    want = engine.generate(prompt, GREEDY)
    for before, after in zip(chunks, chunks[1:]):
        assert after["text"].startswith(before["text"])
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
    assert chunks[-1]["text"] == want["text"] and chunks[-1]["output_ids"] == want["output_ids"]
    last = chunks[-1]["meta_info"]
    assert last["spec_accepted_tokens"] > 0 and last["spec_verify_ct"] < len(chunks)


def test_server_metrics_export_speculation(server, engine):
    url, _ = server
    prompt = copy_prompts(engine.tokenizer)[2]
    before = parse_metrics(requests.get(url + "/metrics", timeout=30).text)
    o = requests.post(
        url + "/generate", json={"text": prompt, "sampling_params": GREEDY}, timeout=300
    ).json()
    after = parse_metrics(requests.get(url + "/metrics", timeout=30).text)
    s = server_info(url)["speculative"]
    assert (
        metric(after, "sgl:spec_verify_calls_total") - metric(before, "sgl:spec_verify_calls_total")
        == o["meta_info"]["spec_verify_ct"]
    )
    assert metric(after, "sgl:spec_accept_length") == pytest.approx(s["avg_spec_accept_length"])
    assert metric(after, "sgl:spec_accept_rate") == pytest.approx(s["acceptance_rate"])
    assert metric(after, "sgl:spec_num_draft_tokens") == 6


def test_server_has_no_kv_left_behind(server):
    url, _ = server
    assert kv_whole(url)


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["--speculative-algorithm", "FOO"], "--speculative-algorithm"),
        (["--speculative-algorithm", "EAGLE"], "--speculative-algorithm"),
        (["--speculative-num-draft-tokens", "0"], "--speculative-num-draft-tokens"),
        (["--speculative-num-draft-tokens", "33"], "--speculative-num-draft-tokens"),
        (["--speculative-num-draft-tokens", "four"], "--speculative-num-draft-tokens"),
        (["--speculative-num-steps", "0"], "--speculative-num-steps"),
    ],
)
def test_the_launcher_refuses_a_bad_value_naming_the_flag(argv, flag, capsys):
    """Refused while parsing the command line, before any model is loaded."""
    with pytest.raises(SystemExit) as e:
        main(["--speculative-algorithm", "NGRAM", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and argv[1] in err, err


# ------------------------------------------------------------------ as served: compiled, int4


def one_thread(forward):
    """`forward` run with the scheduler thread's OpenMP team cut to one thread, as
    `cpu_share` cuts it when another process takes a CPU."""
    set_threads = omp_set_num_threads()
    assert set_threads is not None, "the OpenMP runtime torch loaded was not found"

    def run(*args, **kwargs):
        team = torch.get_num_threads()
        set_threads(1)
        try:
            return forward(*args, **kwargs)
        finally:
            set_threads(team)

    return run


def assert_same_tokens_and_logprobs(got, want) -> None:
    assert got["output_ids"] == want["output_ids"]
    lp = [e[0] for e in got["meta_info"]["output_token_logprobs"]]
    assert lp == [e[0] for e in want["meta_info"]["output_token_logprobs"]]


def test_compiled_as_served_every_logprob_is_plain_decodings_bit_for_bit(engine):
    """The embedded model as `make serve` runs it (int4 weights, the activation dtype this CPU
    gets, compiled decode graphs). A verify row runs the batched graph and the plain decode step
    the static batch-1 graph: they must compute a row alike, so every token's logprob equals
    non-speculative decoding's exactly (a logit ~0.3 apart flipped greedy tokens before).
    And the same requests computed again with one compute thread instead of the full team
    (the load of the machine must not change an output: oneDNN split some prefill matmuls'
    sums between two threads, which gave first-token logprobs ~0.05 apart)."""
    prompts = copy_prompts(engine.tokenizer)
    params = dict(GREEDY, max_new_tokens=96)
    with (
        sgl.Engine(torch_compile=True) as plain,
        sgl.Engine(torch_compile=True, speculative_algorithm="NGRAM") as spec,
    ):
        assert spec.get_server_info()["torch_compile"]["enabled"]
        accepted, wants = 0, []
        for p in prompts:  # one at a time: batch 1, where the two graphs meet
            wants.append(plain.generate(p, params, return_logprob=True))
            got = spec.generate(p, params, return_logprob=True)
            assert_same_tokens_and_logprobs(got, wants[-1])
            accepted += got["meta_info"]["spec_accepted_tokens"]
        assert accepted > 0
        steps = spec.get_server_info()["torch_compile"]["steps"]
        assert steps["batch 1"] > 0 and steps["batch 2+"] > 0, steps  # both graphs ran
        # ~600 prompt tokens: prefill matmuls of the row counts oneDNN split by threads
        prompts.append(chat(engine.tokenizer, "Summarize:\n\n" + " ".join([_LONG_TEXT] * 5)))
        wants.append(plain.generate(prompts[-1], params, return_logprob=True))
        assert plain.flush_cache()  # computed again from the first token
        with plain.debug_wrap("forward", one_thread):
            for p, want in zip(prompts, wants):
                assert_same_tokens_and_logprobs(
                    plain.generate(p, params, return_logprob=True), want
                )


# ------------------------------------------------------------------ tensor parallel


def test_tp2_speculative_greedy_is_tp1s(engine):
    tok = engine.tokenizer
    prompts = copy_prompts(tok)[:1] + free_prompts(tok)[:2]
    params = dict(GREEDY, max_new_tokens=40)
    with sgl.Engine(
        **ORACLE_EXACT, max_total_tokens=2048, tp_size=2, speculative_algorithm="NGRAM"
    ) as two:
        pids = list(two.scheduler_pids)
        assert len(pids) == 2
        got = two.generate(prompts, params)
        assert two.get_server_info()["speculative"]["accepted_tokens"] > 0
        assert two.flush_cache()
        info = two.get_server_info()
        assert info["available_kv_tokens"] == info["max_total_tokens"]
    assert wait_until(lambda: all(gone(p) for p in pids), timeout=30, interval=0.05)
    assert_same(got, engine.generate(prompts, params))
    assert_speculated(got)


# ------------------------------------------------------------------ last: nothing leaked


def test_the_speculative_engine_has_no_kv_left_behind(spec):
    assert spec.flush_cache()
    info = spec.get_server_info()
    assert info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0
    assert info["available_kv_tokens"] == info["max_total_tokens"]
