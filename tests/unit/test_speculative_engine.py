"""Speculative decoding (NGRAM) end to end on tiny random models: greedy output equal token for
token to the engine without speculation (and to HF generate), every sampling parameter at
temperature 0 likewise, logprobs and streams too, constraints, seeded sampling (the same
tokens too), the exact distribution at temperature > 0 (chi-square against brute force from
HF's logits), and KV memory under pressure.

Random-weight models rarely repeat themselves, so the prompts repeat a span (the lookup then
drafts its continuation) and every test checks that drafts were really verified and accepted.
"""

from __future__ import annotations

import contextlib
import random

import pytest
import torch
from tiny_models import FAMILY_CONFIGS, save_tiny_engine_dir

import sgl

VOCAB = 320
NEW = 32


def repeating_prompts(n: int, seed: int, vocab: int = VOCAB) -> list[list[int]]:
    """A span of 5-12 random tokens three times, then its first two: drafts follow the span."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        span = [rng.randrange(1, vocab) for _ in range(rng.randint(5, 12))]
        out.append(span * 3 + span[:2])
    return out


def greedy(**extra) -> dict:
    return {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True, **extra}


def spec_counts(outs: list[dict]) -> tuple[int, int]:
    """(draft tokens verified, draft tokens accepted) summed over the results."""
    metas = [o["meta_info"] for o in outs]
    return (
        sum(m.get("spec_draft_tokens", 0) for m in metas),
        sum(m.get("spec_accepted_tokens", 0) for m in metas),
    )


def assert_speculated(outs: list[dict]) -> None:
    drafted, accepted = spec_counts(outs)
    assert drafted > 0 and accepted > 0, (drafted, accepted)


def assert_no_leak(engine) -> None:
    assert engine.flush_cache()
    info = engine.get_server_info()
    assert info["available_kv_tokens"] == info["max_total_tokens"]


def hf_greedy(hf, ids: list[int], new: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, pad_token_id=0)
    return out[0, len(ids) :].tolist()


@contextlib.contextmanager
def engine_pair(path, **options):
    """(speculative, plain) engines on the same model and options."""
    with (
        sgl.Engine(model_path=str(path), speculative_algorithm="NGRAM", **options) as spec,
        sgl.Engine(model_path=str(path), **options) as plain,
    ):
        yield spec, plain


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_engine_dir(tmp_path_factory.mktemp("tiny-llama"), VOCAB)


@pytest.fixture(scope="module")
def engines(tiny_dir):
    with engine_pair(tiny_dir[0], dtype="float32", max_total_tokens=4096) as pair:
        yield pair


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dir[0]))


# ---------------------------------------------------------------- greedy identity per family


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    made: dict[str, tuple] = {}

    def get(family: str):
        if family not in made:
            made[family] = save_tiny_engine_dir(tmp_path_factory.mktemp(family), VOCAB, arch=family)
        return made[family]

    return get


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_greedy_tokens_equal_without_speculation(family_dirs, family, dtype):
    path, hf = family_dirs(family)
    batch = repeating_prompts(8, seed=1)
    with engine_pair(path, dtype=dtype, max_total_tokens=4096) as (spec, plain):
        got = spec.generate(input_ids=batch, sampling_params=greedy())
        want = plain.generate(input_ids=batch, sampling_params=greedy())
        assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
        assert_speculated(got)
        if dtype == "float32":
            assert [o["output_ids"] for o in got] == [hf_greedy(hf, ids, NEW) for ids in batch]
        assert_no_leak(spec)


# ---------------------------------------------------------------- sampling parameters, greedy

EOS = 0  # the tiny tokenizer's <eos>


def both(engines, batch, params, **kw) -> tuple[list[dict], list[dict]]:
    spec, plain = engines
    return (
        spec.generate(input_ids=batch, sampling_params=params, **kw),
        plain.generate(input_ids=batch, sampling_params=params, **kw),
    )


def assert_same_results(got: list[dict], want: list[dict]) -> None:
    """Tokens, text and why each ended, as without speculation."""
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    assert [o["text"] for o in got] == [o["text"] for o in want]
    finish = [o["meta_info"]["finish_reason"] for o in got]
    assert finish == [o["meta_info"]["finish_reason"] for o in want]


@pytest.fixture(scope="module")
def sweep_prompts(engines) -> list[list[int]]:
    """A prompt and its own greedy output cut at every point: a request with few tokens to
    go gets a draft (and has it accepted) where the free run repeated itself. The prompt is
    the one of a batch whose speculative run accepted the most drafts."""
    candidates = repeating_prompts(8, seed=9)
    free = engines[0].generate(input_ids=candidates, sampling_params=greedy(max_new_tokens=40))
    best = max(range(len(free)), key=lambda i: free[i]["meta_info"]["spec_accepted_tokens"])
    return [candidates[best] + free[best]["output_ids"][:m] for m in range(40)]


@pytest.mark.parametrize(
    "params",
    [
        dict(repetition_penalty=1.05),
        dict(repetition_penalty=0.8),  # < 1 rewards repeating: drafts accepted more
        dict(frequency_penalty=-0.5),
        dict(presence_penalty=-1.0),
        dict(ignore_eos=True, min_new_tokens=16, logit_bias={str(EOS): 5.0}),
        dict(frequency_penalty=0.3),
        dict(presence_penalty=0.4),
        dict(frequency_penalty=-0.5, presence_penalty=0.2),
        dict(logit_bias={"7": 2.0, "11": -1.0}),
        dict(max_new_tokens=None),  # up to the context length: drafts stop short of it
        dict(ignore_eos=False, logit_bias={str(EOS): 2.0}),
        dict(ignore_eos=True, logit_bias={str(EOS): 3.0}),  # EOS in the output: and in drafts
        dict(ignore_eos=True, min_new_tokens=16, logit_bias={str(EOS): 3.0}),
        dict(ignore_eos=False, min_new_tokens=12, logit_bias={str(EOS): 3.0}),
        dict(ignore_eos=False, min_new_tokens=20, logit_bias={str(EOS): 6.0}),
    ],
    ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()).replace(" ", ""),
)
def test_sampling_params_at_temperature_0_equal_without_speculation(engines, params):
    batch = repeating_prompts(8, seed=2)
    got, want = both(engines, batch, greedy(**params))
    assert_same_results(got, want)
    assert_speculated(got)
    if params.get("ignore_eos") is False:
        stops = [o for o in want if o["meta_info"]["finish_reason"]["type"] == "stop"]
        assert stops  # EOS really ended some: the parameter was exercised
        floor = params.get("min_new_tokens", 0)
        assert all(len(o["output_ids"]) > floor for o in stops)
    assert_no_leak(engines[0])


@pytest.mark.parametrize(
    "params",
    [
        dict(),
        dict(top_k=5),
        dict(top_p=0.7),
        dict(min_p=0.2),
        dict(repetition_penalty=0.8, frequency_penalty=-0.3),
        dict(presence_penalty=0.5, logit_bias={"7": 2.0}),
        dict(ignore_eos=False, min_new_tokens=10, logit_bias={str(EOS): 2.0}),
    ],
    ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()).replace(" ", "") or "plain",
)
def test_seeded_sampling_params_equal_without_speculation(engines, params):
    """Seeded draws depend on the seed and the output position only, so at temperature > 0
    too each sampling parameter gives the tokens it gives without speculation; sent again,
    the requests draft their first run's cached continuations, which must be accepted."""
    batch = repeating_prompts(8, seed=15)
    sp = [greedy(temperature=0.9, seed=100 + i, **params) for i in range(len(batch))]
    got, want = both(engines, batch, sp)
    assert_same_results(got, want)
    again = engines[0].generate(input_ids=batch, sampling_params=sp)
    assert_same_results(again, want)
    assert_speculated(got + again)
    assert_no_leak(engines[0])


@pytest.mark.parametrize("new", [1, 2, 3, 4])
def test_few_new_tokens_equal_without_speculation(engines, sweep_prompts, new):
    """A draft leaves room for the token drawn after it: none with 2 or fewer to go."""
    got, want = both(engines, sweep_prompts, greedy(max_new_tokens=new))
    assert_same_results(got, want)
    assert all(len(o["output_ids"]) == new for o in got)
    if new <= 2:  # the first decode step draws the last token: nothing to draft
        assert spec_counts(got) == (0, 0)
    else:
        assert_speculated(got)
        assert all(o["meta_info"]["spec_draft_tokens"] <= new - 2 for o in got)
    assert_no_leak(engines[0])


def test_stop_strings_end_where_they_do_without_speculation(engines, tokenizer):
    """Each request stops at a string its own free-running output contains (text of two of
    its tokens near the middle), which lies inside an accepted draft often enough."""
    spec, plain = engines
    batch = repeating_prompts(8, seed=3)
    free = plain.generate(input_ids=batch, sampling_params=greedy())
    params = []
    for i, o in enumerate(free):
        at = 8 + i % 12
        stop = tokenizer.decode(o["output_ids"][at : at + 2])
        params.append(greedy(stop=[stop] if stop.strip() else ["\x00never"]))
    got, want = both(engines, batch, params)
    assert_same_results(got, want)
    assert sum(o["meta_info"]["finish_reason"]["type"] == "stop" for o in want) >= 4
    for o, p in zip(want, params):
        if o["meta_info"]["finish_reason"]["type"] == "stop":
            assert o["text"].find(p["stop"][0]) == -1  # the stop string is cut off
    assert_speculated(got)
    assert_no_leak(spec)


def test_stop_token_ids_end_where_they_do_without_speculation(engines):
    spec, plain = engines
    batch = repeating_prompts(8, seed=4)
    free = plain.generate(input_ids=batch, sampling_params=greedy())
    params = [greedy(stop_token_ids=[o["output_ids"][6 + i]]) for i, o in enumerate(free)]
    got, want = both(engines, batch, params)
    assert_same_results(got, want)
    for o, f, p in zip(got, free, params):
        stop_id = p["stop_token_ids"][0]
        assert o["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
        first = f["output_ids"].index(stop_id)
        assert o["output_ids"] == f["output_ids"][: first + 1]
    assert_speculated(got)
    assert_no_leak(spec)


def close_logprobs(got, want, tol: float = 1e-4) -> None:
    """Lists of (logprob, token id, text) or of lists of them (top logprobs), None allowed."""
    assert (got is None) == (want is None)
    if got is None:
        return
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if g is None or isinstance(g, list):
            close_logprobs(g, w, tol)
        else:
            assert g[1:] == w[1:], (g, w)
            assert (g[0] is None) == (w[0] is None), (g, w)  # the first prompt token has none
            assert g[0] is None or abs(g[0] - w[0]) <= tol, (g, w)


LOGPROB_FIELDS = (
    "input_token_logprobs",
    "input_top_logprobs",
    "output_token_logprobs",
    "output_top_logprobs",
)


@pytest.mark.parametrize("start", [-1, 0, 9])
def test_logprobs_equal_without_speculation(engines, start):
    batch = repeating_prompts(6, seed=5)
    kw = dict(return_logprob=True, top_logprobs_num=3, logprob_start_len=start)
    got, want = both(engines, batch, greedy(), **kw)
    assert_same_results(got, want)
    for g, w in zip(got, want):
        for name in LOGPROB_FIELDS:
            close_logprobs(g["meta_info"].get(name), w["meta_info"].get(name))
        assert len(g["meta_info"]["output_token_logprobs"]) == len(g["output_ids"])
    assert_speculated(got)
    assert_no_leak(engines[0])


@pytest.mark.parametrize("interval", [1, 3])
def test_stream_adds_up_to_the_whole_result(engines, interval):
    """Streamed chunks (a verify step may carry several tokens; stream_interval holds some
    back) add up to the non-streamed result, and each chunk carries one logprob entry per
    token it carries."""
    spec, plain = engines
    batch = repeating_prompts(6, seed=6)
    kw = dict(return_logprob=True, top_logprobs_num=3)
    want = plain.generate(input_ids=batch, sampling_params=greedy(), **kw)
    ids, texts = [[] for _ in batch], ["" for _ in batch]
    lps, tops = [[] for _ in batch], [[] for _ in batch]
    last: dict[int, dict] = {}
    params = greedy(stream_interval=interval)
    for chunk in spec.generate(input_ids=batch, sampling_params=params, stream=True, **kw):
        i, meta = chunk["index"], chunk["meta_info"]
        assert len(meta["output_token_logprobs"]) == len(chunk["output_ids"])
        assert len(meta["output_top_logprobs"]) == len(chunk["output_ids"])
        ids[i] += chunk["output_ids"]
        texts[i] += chunk["text"]
        lps[i] += meta["output_token_logprobs"]
        tops[i] += meta["output_top_logprobs"]
        last[i] = chunk
    assert ids == [o["output_ids"] for o in want]
    assert texts == [o["text"] for o in want]
    for i, o in enumerate(want):
        close_logprobs(lps[i], o["meta_info"]["output_token_logprobs"])
        close_logprobs(tops[i], o["meta_info"]["output_top_logprobs"])
    assert_speculated(list(last.values()))
    assert_no_leak(spec)


# ---------------------------------------------------------------- the distribution at T > 0

SMALL_VOCAB = 8
DRAWS = 3000
DRAW_NEW = 3  # the first decode step verifies a 1-token draft: a draw at 2 positions


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """A vocabulary of 8 (so every 3-token continuation can be enumerated) and a prompt of the
    model's own greedy text (it repeats itself: the lookup's drafts are often accepted)."""
    path, hf = save_tiny_engine_dir(tmp_path_factory.mktemp("tiny-v8"), SMALL_VOCAB)
    prompt = [1, 2, 3] + hf_greedy(hf, [1, 2, 3], 30)
    # at most 32 running: the step's draft budget (32) then covers every request's draft
    options = dict(dtype="float32", max_total_tokens=4096, max_running_requests=32)
    with engine_pair(path, **options) as pair:
        yield hf, prompt, pair, path


def processed_probs(
    logits: torch.Tensor, context: list[int], out: list[int], p: dict, allowed=None
):
    """The sampler's distribution for one position (sgl/runtime/sampling/sampler.py's
    docstring): the constraint's mask, penalties, temperature, then top_k and top_p on the
    scaled softmax."""
    x = logits.double().clone()
    if allowed is not None:
        x[~allowed] = float("-inf")
    rep = p.get("repetition_penalty", 1.0)
    for t in set(context + out):
        x[t] = x[t] / rep if x[t] > 0 else x[t] * rep
    for t in set(out):
        x[t] -= p.get("frequency_penalty", 0.0) * out.count(t) + p.get("presence_penalty", 0.0)
    probs = torch.softmax(x / p["temperature"], -1)
    order = torch.argsort(probs, descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    mass_before = torch.cumsum(probs[order], 0) - probs[order]
    top_p, top_k = p.get("top_p", 1.0), p.get("top_k", -1)
    # the oracle must not sit on a knife edge that float noise could flip
    assert top_p == 1.0 or (mass_before - top_p).abs().min() > 1e-4
    for rank, t in enumerate(order.tolist()):
        keep[t] = (top_k < 0 or rank < top_k) and mass_before[rank] < top_p
    probs = torch.where(keep, probs, torch.zeros_like(probs))
    return probs / probs.sum()


def exact_distribution(
    hf, prompt: list[int], p: dict, allowed=lambda out: None
) -> dict[tuple[int, ...], float]:
    """P(t1 t2 t3) = q(t1) q(t2 | t1) q(t3 | t1 t2), every continuation enumerated, the
    conditionals from one HF forward over all prompt + (t1, t2); `allowed(output)`: the
    constraint's mask after that output (None: unconstrained)."""
    import itertools

    heads = list(itertools.product(range(SMALL_VOCAB), repeat=DRAW_NEW - 1))
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + list(h) for h in heads])).logits[:, len(prompt) - 1 :]
    dist = {}
    for row, head in enumerate(heads):
        prob = 1.0
        for j, t in enumerate(head):
            out = list(head[:j])
            prob *= float(processed_probs(logits[row, j], prompt, out, p, allowed(out))[t])
            if prob == 0:
                break
        last = torch.zeros(SMALL_VOCAB, dtype=torch.float64)
        if prob > 0:
            out = list(head)
            last = processed_probs(logits[row, DRAW_NEW - 1], prompt, out, p, allowed(out))
        for t in range(SMALL_VOCAB):
            dist[head + (t,)] = prob * float(last[t])
    return dist


def seeded_draws(engine, prompt, params: dict, dist: dict) -> tuple[list, dict]:
    """DRAWS continuations (seeds 0 .. DRAWS - 1) and how often each came; every one must be
    in the oracle's support (top_k / top_p / a constraint leave some out)."""
    outs = []
    for start in range(0, DRAWS, 1000):  # within the engine's limit on requests in flight
        sp = [
            {**params, "max_new_tokens": DRAW_NEW, "ignore_eos": True, "seed": s}
            for s in range(start, start + 1000)
        ]
        outs += engine.generate(input_ids=[prompt] * len(sp), sampling_params=sp)
    counts: dict[tuple[int, ...], int] = {}
    for o in outs:
        seq = tuple(o["output_ids"])
        assert dist[seq] > 0, seq
        counts[seq] = counts.get(seq, 0) + 1
    return outs, counts


def chi_square_p_value(counts: dict, dist: dict, draws: int) -> float:
    """Pearson's goodness of fit, cells expecting fewer than 5 draws pooled into one."""
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for seq, prob in dist.items():
        expected = prob * draws
        if expected < 5:
            pooled_obs += counts.get(seq, 0)
            pooled_exp += expected
        else:
            stat += (counts.get(seq, 0) - expected) ** 2 / expected
            cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    df = cells - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0)))


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=1.0),
        dict(temperature=1.0, top_k=3),
        dict(temperature=0.9, top_p=0.8),
        dict(temperature=1.0, repetition_penalty=1.3, frequency_penalty=-1.0),
    ],
    ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()),
)
@pytest.mark.parametrize("speculative", [True, False], ids=["speculative", "plain-oracle-check"])
def test_sampled_continuations_have_the_exact_distribution(small_model, params, speculative):
    """3000 seeded draws of 3 tokens fit the brute-force distribution (chi-square, p > 1e-3;
    deterministic: seeds 0..2999). The engine without speculation must pass too: that checks
    the oracle, so a failure with speculation alone is speculation's. (Checked to fail when
    the accepted count is off by one now and then, and when the drafted prefix is left out
    of the penalties' output: the negative frequency penalty makes that visible.)"""
    hf, prompt, (spec, plain), _ = small_model
    engine = spec if speculative else plain
    dist = exact_distribution(hf, prompt, params)
    outs, counts = seeded_draws(engine, prompt, params, dist)
    assert chi_square_p_value(counts, dist, DRAWS) > 1e-3
    if speculative:
        drafted, accepted = spec_counts(outs)
        assert drafted > DRAWS // 2 and accepted > DRAWS // 20, (drafted, accepted)
    assert_no_leak(engine)


# ---------------------------------------------------------------- KV memory


@pytest.mark.parametrize(
    "options",
    [
        dict(max_total_tokens=250),  # 12 x (<= 38 + 48) tokens do not fit: decode retracts
        dict(max_total_tokens=4096, chunked_prefill_size=4),
        dict(max_total_tokens=4096, disable_radix_cache=True),
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_memory_options_keep_greedy_tokens(tiny_dir, engines, options):
    """Drafts' slots are reserved with the step's and freed when rejected: a pool too small
    for the batch (retraction, drafts given up first), prefill in chunks and no prefix cache
    all give the tokens of a roomy engine without speculation, and leave nothing held."""
    batch = repeating_prompts(12, seed=11)
    params = greedy(max_new_tokens=48)
    want = engines[1].generate(input_ids=batch, sampling_params=params)
    with sgl.Engine(
        model_path=str(tiny_dir[0]), dtype="float32", speculative_algorithm="NGRAM", **options
    ) as spec:
        got = spec.generate(input_ids=batch, sampling_params=params)
        assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
        assert_speculated(got)
        if options["max_total_tokens"] < 1000:
            assert spec.get_server_info()["retractions"] > 0
        assert_no_leak(spec)


# ---------------------------------------------------------------- constraints and counts

SCHEMA = {
    "type": "object",
    "properties": {
        "words": {"type": "array", "items": {"enum": ["the", "fox", "dog"]}},
        "ok": {"type": "boolean"},
    },
    "required": ["words", "ok"],
}
CONSTRAINED = [
    dict(regex=r"(the|quick|brown|fox|dog)( (the|quick|brown|fox|dog)){2,20}"),
    dict(
        regex=r'\{"name": "(ab|cd|ef)+", "n": [0-9]{1,3}, '
        r'"tags": \[("x"|"yy")(, ("x"|"yy")){0,6}\]\}'
    ),
    dict(json_schema=SCHEMA),
    dict(max_new_tokens=24, json_schema=SCHEMA),  # budget_aware: must close in time
]


@pytest.mark.parametrize(
    "constraint", CONSTRAINED, ids=["words", "jump-forward", "schema", "schema-budget"]
)
@pytest.mark.parametrize("logprobs", [False, True], ids=["jump-forward-on", "logprobs"])
def test_constrained_greedy_tokens_equal_without_speculation(engines, constraint, logprobs):
    """Drafts are cut where the grammar refuses them; forced text is appended by jump-forward
    and fed before a request drafts again, or, where jump-forward is off for the request
    (logprobs asked for), drafted and verified: the tokens (and logprobs) are those
    without speculation."""
    import json
    import re

    import jsonschema

    batch = repeating_prompts(6, seed=12)
    kw = dict(return_logprob=True, top_logprobs_num=2) if logprobs else {}
    got, want = both(engines, batch, greedy(**{"max_new_tokens": 64, **constraint}), **kw)
    assert_same_results(got, want)
    for g, w in zip(got, want):
        for name in LOGPROB_FIELDS:
            close_logprobs(g["meta_info"].get(name), w["meta_info"].get(name))
    assert_speculated(got)
    complete = [o["text"] for o in got if o["meta_info"]["finish_reason"]["type"] == "stop"]
    assert complete  # some finished their member: the whole grammar was walked
    for text in complete:
        if "regex" in constraint:
            assert re.fullmatch(constraint["regex"], text), text
        else:
            jsonschema.validate(json.loads(text), constraint["json_schema"])
    assert_no_leak(engines[0])


def test_counts_add_up_to_the_engines_totals(engines):
    """Per request: spec_accept_length = completion_tokens / spec_verify_ct (SGLang's); the
    engine's totals grow by the sums of the requests' counts."""
    spec, plain = engines
    before = spec.get_server_info()["speculative"]
    batch = repeating_prompts(8, seed=13)
    got = spec.generate(input_ids=batch, sampling_params=greedy())
    info = spec.get_server_info()
    after = info["speculative"]
    metas = [o["meta_info"] for o in got]
    for m in metas:
        assert m["spec_accept_length"] == pytest.approx(
            m["completion_tokens"] / m["spec_verify_ct"]
        )
        assert 0 <= m["spec_accepted_tokens"] <= m["spec_draft_tokens"]
        assert m["spec_verify_ct"] + m["spec_accepted_tokens"] == m["completion_tokens"] - 1
    for key, field in [
        ("verify_steps", "spec_verify_ct"),
        ("draft_tokens", "spec_draft_tokens"),
        ("accepted_tokens", "spec_accepted_tokens"),
    ]:
        assert after[key] - before[key] == sum(m[field] for m in metas), key
    assert after["algorithm"] == "NGRAM" and after["num_draft_tokens"] == 4
    assert after["acceptance_rate"] == pytest.approx(
        after["accepted_tokens"] / after["draft_tokens"]
    )
    steps = after["verify_steps"]
    assert after["avg_spec_accept_length"] == pytest.approx(
        (after["accepted_tokens"] + steps) / steps
    )
    assert info["internal_states"][0]["avg_spec_accept_length"] == after["avg_spec_accept_length"]
    assert_speculated(got)
    plain_out = plain.generate(input_ids=batch[0], sampling_params=greedy())
    assert not any(k.startswith("spec_") for k in plain_out["meta_info"])
    assert plain.get_server_info()["speculative"] == {"algorithm": None}


def test_constrained_sampling_has_the_exact_distribution(small_model):
    """Under a regex the verify position after a drafted token must be masked by the state
    after it: 3000 draws at temperature 1 fit the brute force (masks from the `regex`
    module's partial matching on the tokens' text), with and without speculation."""
    import regex
    from transformers import AutoTokenizer

    hf, prompt, engines_v8, path = small_model
    pattern = r"""([!"'][#$%&]){3,5}"""  # alternating classes: each mask differs from the last
    texts = [AutoTokenizer.from_pretrained(path).decode([t]) for t in range(SMALL_VOCAB)]

    def allowed(out: list[int]) -> torch.Tensor:
        done = "".join(texts[t] for t in out)
        ok = [
            t != EOS and regex.fullmatch(pattern, done + texts[t], partial=True) is not None
            for t in range(SMALL_VOCAB)
        ]
        return torch.tensor(ok)

    params = dict(temperature=1.0, regex=pattern)
    dist = exact_distribution(hf, prompt, {"temperature": 1.0}, allowed)
    for speculative, engine in zip([True, False], engines_v8):
        outs, counts = seeded_draws(engine, prompt, params, dist)
        assert chi_square_p_value(counts, dist, DRAWS) > 1e-3, speculative
        if speculative:
            assert_speculated(outs)
        assert_no_leak(engine)


def test_abandoned_stream_frees_the_drafts_slots(engines):
    """A stream closed while its requests draft: they are aborted and nothing stays held."""
    spec, _ = engines
    chunks = spec.generate(
        input_ids=repeating_prompts(4, seed=14),
        sampling_params=greedy(max_new_tokens=200),
        stream=True,
    )
    for chunk in chunks:  # until a verify step has accepted drafts
        if chunk["meta_info"].get("spec_accepted_tokens", 0) > 0:
            break
    else:
        pytest.fail("no draft accepted before the streams ended")
    chunks.close()
    assert spec.flush_cache()
    info = spec.get_server_info()
    assert info["available_kv_tokens"] == info["max_total_tokens"]
    assert info["num_running_reqs"] == 0


def test_seeded_sampling_equals_without_speculation(engines):
    """A seeded draw depends on the seed and the output position only (position_generator),
    so a sampled request gives the tokens it gives without speculation, whether it runs
    alone, in a batch with more drafts than a step's budget, or again (then drafting the
    first run's cached continuation)."""
    spec, plain = engines
    batch = repeating_prompts(40, seed=21)
    params = {"max_new_tokens": NEW, "temperature": 0.7, "seed": 5, "ignore_eos": True}
    want = plain.generate(input_ids=batch, sampling_params=params)
    assert spec.flush_cache()
    alone = [spec.generate(input_ids=p, sampling_params=params) for p in batch[-4:]]
    together = spec.generate(input_ids=batch, sampling_params=params)
    again = spec.generate(input_ids=batch, sampling_params=params)
    ids = [o["output_ids"] for o in want]
    assert [o["output_ids"] for o in alone] == ids[-4:]
    assert [o["output_ids"] for o in together] == ids
    assert [o["output_ids"] for o in again] == ids
    assert_speculated(together)
    drafted, accepted = spec_counts(again)
    assert accepted > drafted // 2  # the cached continuations were drafted and mostly kept
    assert_no_leak(spec)


def test_a_repeated_request_drafts_its_cached_continuation(engines):
    """NGRAM drafts first from the radix cache: a greedy request sent again has its whole
    earlier output drafted and accepted (and the tokens are still those without speculation)."""
    spec, plain = engines
    batch = repeating_prompts(8, seed=22)
    assert spec.flush_cache()
    first = spec.generate(input_ids=batch, sampling_params=greedy())
    again = spec.generate(input_ids=batch, sampling_params=greedy())
    want = plain.generate(input_ids=batch, sampling_params=greedy())
    assert_same_results(first, want)
    assert_same_results(again, want)
    drafted, accepted = spec_counts(again)
    assert drafted == accepted > 0
    for o in again:  # a draft of up to 4 tokens a step: far fewer steps than tokens
        assert o["meta_info"]["spec_verify_ct"] <= o["meta_info"]["completion_tokens"] // 3
    assert_no_leak(spec)


def test_drafts_rationed_by_measured_step_costs_keep_greedy_tokens(tiny_dir, engines, monkeypatch):
    """As served (the suite rations by the budget alone, tests/conftest.py): the engine times its
    decode steps by row count. Whichever drafts that lets through, at batch 12 and at batch 1,
    the tokens are those of decoding without speculation."""
    monkeypatch.delenv("SGL_SPEC_COST_RATIONING")
    batch = repeating_prompts(12, seed=5)
    params = greedy(max_new_tokens=48)
    want = engines[1].generate(input_ids=batch, sampling_params=params)
    with sgl.Engine(
        model_path=str(tiny_dir[0]),
        dtype="float32",
        max_total_tokens=4096,
        speculative_algorithm="NGRAM",
    ) as spec:
        got = spec.generate(input_ids=batch, sampling_params=params)
        alone = [spec.generate(input_ids=ids, sampling_params=params) for ids in batch[:2]]
        info = spec.get_server_info()["speculative"]
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    assert [o["output_ids"] for o in alone] == [o["output_ids"] for o in want[:2]]
    table = info["step_ms_by_rows"]  # measured on the engine's own decode steps
    assert len(table) >= 2 and all(ms > 0 for ms in table.values())
