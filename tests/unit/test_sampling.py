"""Tests for sgl.runtime.sampling (params, validation, batch, sampler).

The sampler is checked against a deliberately naive per-row reference written here (one
row at a time, Python loops over the few touched tokens), never against recorded outputs.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import pytest
import torch

from sgl.runtime.errors import InvalidRequestError
from sgl.runtime.sampling import SamplingParams
from sgl.runtime.sampling.batch import SamplingBatch
from sgl.runtime.sampling.sampler import SampleOutput, _inverse_cdf, make_generator, sample

NEG_INF = float("-inf")


# --------------------------------------------------------------------------- reference


def ref_processed_logits(
    logits: torch.Tensor,
    p: SamplingParams,
    output: list[int],
    prompt: list[int],
    eos_ids: list[int],
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """One row, the documented order: bias, mask, min_new_tokens, repetition, freq/presence."""
    x = logits.float().clone()
    for tid, b in (p.logit_bias or {}).items():
        x[int(tid)] += b
    if allowed is not None:
        x[~allowed] = NEG_INF
    if len(output) < p.min_new_tokens:
        for t in list(eos_ids) + list(p.stop_token_ids or []):
            x[t] = NEG_INF
    if p.repetition_penalty != 1.0:
        for t in set(prompt) | set(output):
            v = x[t].item()
            x[t] = v / p.repetition_penalty if v > 0 else v * p.repetition_penalty
    for t, c in Counter(output).items():
        x[t] = x[t] - (p.frequency_penalty * c + p.presence_penalty)
    return x


def ref_greedy(x: torch.Tensor) -> int:
    if bool((x == NEG_INF).all()):
        return -1
    return int(torch.argmax(x))


def ref_sorted_filter(probs: torch.Tensor, p: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Descending probs with top_k / top_p / min_p applied (dropped -> 0), and their ids."""
    vals, ids = torch.sort(probs, descending=True)
    plain = vals.tolist()
    kept = []
    mass_before = 0.0
    k = p.top_k if p.top_k > 0 else len(plain)
    for j, v in enumerate(plain):
        drop = j >= k or mass_before >= p.top_p or v < p.min_p * plain[0]
        mass_before += v
        kept.append(0.0 if drop else v)
    return torch.tensor(kept, dtype=vals.dtype), ids


def ref_distribution(x: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Exact sampling distribution over the vocabulary (float64), for a non-greedy row."""
    probs = torch.softmax(x.double() / p.temperature, dim=-1)
    kept, ids = ref_sorted_filter(probs, p)
    dist = torch.zeros_like(probs)
    dist[ids] = kept / kept.sum()
    return dist


def run_sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    outputs: list[list[int]] | None = None,
    prompts: list[list[int]] | None = None,
    generators: list[torch.Generator | None] | None = None,
    eos_ids: list[int] = (),
    **kw,
) -> SampleOutput:
    B, V = logits.shape
    batch = SamplingBatch.build(params, "cpu", V, list(eos_ids))
    return sample(
        logits,
        batch,
        outputs if outputs is not None else [[] for _ in range(B)],
        prompts if prompts is not None else [[] for _ in range(B)],
        generators if generators is not None else [None] * B,
        **kw,
    )


def random_params(rng: random.Random, V: int, greedy: bool) -> SamplingParams:
    """Random but valid params, each feature switched on about half the time."""
    kw: dict = {"temperature": 0.0 if greedy else rng.choice([0.5, 1.0, 1.7])}
    if rng.random() < 0.5:
        kw["logit_bias"] = {rng.randrange(V): rng.uniform(-5, 5) for _ in range(rng.randint(1, 4))}
    if rng.random() < 0.5:
        kw["min_new_tokens"] = rng.randint(1, 6)
        kw["stop_token_ids"] = [rng.randrange(V) for _ in range(rng.randint(0, 3))]
    if rng.random() < 0.5:
        kw["repetition_penalty"] = rng.choice([0.7, 1.3, 2.0])
    if rng.random() < 0.5:
        kw["frequency_penalty"] = rng.uniform(-2, 2)
    if rng.random() < 0.5:
        kw["presence_penalty"] = rng.uniform(-2, 2)
    if not greedy and rng.random() < 0.5:
        kw["top_p"] = rng.choice([0.5, 0.9])
    return SamplingParams(**kw).validate(V)


# --------------------------------------------------------------------------- params


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.1}, "min_p"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"max_new_tokens": "12"}, "max_new_tokens"),
        ({"min_new_tokens": -1}, "min_new_tokens"),
        ({"min_new_tokens": 10, "max_new_tokens": 5}, "min_new_tokens"),
        ({"n": 0}, "n"),
        ({"seed": 1.5}, "seed"),
        ({"seed": "7"}, "seed"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"stop": 3}, "stop"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop_token_ids": [1, "2"]}, "stop_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"logit_bias": {"abc": 1.0}}, "logit_bias"),
        ({"logit_bias": {"3": "big"}}, "logit_bias"),
        ({"logit_bias": [1, 2]}, "logit_bias"),
        ({"regex": "a+", "json_schema": {"type": "object"}}, "json_schema"),
        ({"regex": "a+", "ebnf": "root ::= 'a'"}, "ebnf"),
        ({"json_schema": 5}, "json_schema"),
    ],
)
def test_invalid_field_names_param(fields: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams.from_dict(fields)
    assert info.value.param == param
    assert param in str(info.value)


def test_error_message_says_the_fix() -> None:
    with pytest.raises(InvalidRequestError, match=r"temperature must be >= 0.*got -1$"):
        SamplingParams.from_dict({"temperature": -1})
    assert issubclass(InvalidRequestError, ValueError)


@pytest.mark.parametrize(
    "key, suggestion",
    [("temprature", "temperature"), ("max_tokens", "max_new_tokens"), ("topp", "top_p")],
)
def test_unknown_key_suggests_close_names(key: str, suggestion: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams.from_dict({key: 1})
    assert info.value.param == key
    assert repr(suggestion) in str(info.value)


def test_unknown_key_without_close_match_lists_names() -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams.from_dict({"zzzzzz": 1})
    assert "max_new_tokens" in str(info.value)


def test_vocab_dependent_ranges() -> None:
    p = SamplingParams.from_dict({"stop_token_ids": [9], "logit_bias": {"9": 1}})
    p.validate(vocab_size=10)
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams.from_dict({"stop_token_ids": [10]}).validate(vocab_size=10)
    assert info.value.param == "stop_token_ids"
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams.from_dict({"logit_bias": {"10": 1.0}}).validate(vocab_size=10)
    assert info.value.param == "logit_bias"


def test_normalization() -> None:
    p = SamplingParams.from_dict(
        {"stop": "\n", "top_k": 0, "logit_bias": {"5": 1, " 7": -2.5}, "temperature": 1}
    )
    assert p.stop == ["\n"]
    assert p.top_k == -1
    assert p.logit_bias == {5: 1.0, 7: -2.5}
    assert isinstance(p.temperature, float)
    assert SamplingParams.from_dict(None) == SamplingParams()
    assert SamplingParams.from_dict({"stop": ["a", "bc"]}).stop == ["a", "bc"]


def test_is_greedy() -> None:
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(temperature=0.8, top_k=1).is_greedy
    assert not SamplingParams(temperature=0.8).is_greedy
    assert not SamplingParams(temperature=1e-3, top_k=2).is_greedy


def test_to_dict_json_round_trip() -> None:
    p = SamplingParams.from_dict(
        {
            "max_new_tokens": 7,
            "stop": ["x"],
            "stop_token_ids": [3],
            "temperature": 0.3,
            "logit_bias": {"4": -1.5},
            "seed": 11,
            "json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
            "json_object": True,
        }
    )
    back = SamplingParams.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back == p
    assert SamplingParams.from_dict(SamplingParams().to_dict()) == SamplingParams()


# --------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("trial", range(12))
def test_greedy_matches_reference_processing(trial: int) -> None:
    rng = random.Random(trial)
    torch.manual_seed(trial)
    B, V = 10, 40
    eos = [0, 1]
    params = [random_params(rng, V, greedy=rng.random() < 0.7) for _ in range(B)]
    # Draw outputs from a few tokens so that counts > 1 are common.
    outputs = [rng.choices(rng.sample(range(V), 3), k=rng.randint(0, 8)) for _ in range(B)]
    prompts = [[rng.randrange(V) for _ in range(rng.randint(0, 8))] for _ in range(B)]
    logits = torch.randn(B, V) * 3
    before = logits.clone()
    out = run_sample(logits, params, outputs, prompts, eos_ids=eos)
    assert torch.equal(logits, before), "sample() must not modify its input"
    for r, p in enumerate(params):
        x = ref_processed_logits(logits[r], p, outputs[r], prompts[r], eos)
        if p.is_greedy:
            assert out.token_ids[r].item() == ref_greedy(x), (r, p)
        else:  # a sampled row still only picks from the reference support
            assert ref_distribution(x, p)[out.token_ids[r]] > 0, (r, p)


def test_greedy_with_allowed_mask_and_all_masked_rows() -> None:
    torch.manual_seed(0)
    B, V = 6, 30
    logits = torch.randn(B, V)
    allowed = torch.rand(B, V) < 0.3
    allowed[2] = False  # greedy row with nothing allowed
    allowed[5] = False  # sampled row with nothing allowed
    allowed[0, 0] = True
    params = (
        [SamplingParams(temperature=0)] * 3
        + [SamplingParams(temperature=1.0)] * 2
        + [SamplingParams(temperature=0.7, top_p=0.8)]
    )
    for _ in range(20):
        out = run_sample(logits, params, allowed_mask=allowed)
        for r in range(B):
            tok = out.token_ids[r].item()
            if r in (2, 5):
                assert tok == -1 and out.logprobs[r].item() == NEG_INF
            else:
                assert allowed[r, tok]
        for r in (0, 1):
            best = logits[r].masked_fill(~allowed[r], NEG_INF).argmax()
            assert out.token_ids[r].item() == int(best)


def test_min_new_tokens_masks_eos_and_stop_ids_even_with_ignore_eos() -> None:
    V = 8
    logits = torch.zeros(1, V)
    logits[0, 3] = 10.0  # eos
    logits[0, 5] = 9.0  # stop token
    p = SamplingParams(temperature=0, min_new_tokens=2, stop_token_ids=[5], ignore_eos=True)
    assert run_sample(logits, [p], outputs=[[1]], eos_ids=[3]).token_ids.item() not in (3, 5)
    assert run_sample(logits, [p], outputs=[[1, 2]], eos_ids=[3]).token_ids.item() == 3
    # Only eos allowed but still too early: nothing left -> -1.
    allowed = torch.zeros(1, V, dtype=torch.bool)
    allowed[0, 3] = True
    out = run_sample(logits, [p], outputs=[[]], eos_ids=[3], allowed_mask=allowed)
    assert out.token_ids.item() == -1


def test_bfloat16_and_noncontiguous_logits() -> None:
    torch.manual_seed(1)
    full = torch.randn(4, 3, 50)
    logits = full[:, -1, :]  # last position of a [B, T, V] output: non-contiguous
    p = SamplingParams(temperature=0, logit_bias={7: 5.0}, frequency_penalty=1.0)
    out = run_sample(logits, [p] * 4, outputs=[[2, 2]] * 4)
    for r in range(4):
        x = ref_processed_logits(logits[r], p, [2, 2], [], [])
        assert out.token_ids[r].item() == ref_greedy(x)
    half = logits.bfloat16()
    before = half.clone()
    out16 = run_sample(half, [SamplingParams(temperature=0)] * 4)
    assert torch.equal(out16.token_ids, half.float().argmax(-1))
    out16 = run_sample(half, [p] * 4, outputs=[[2, 2]] * 4)  # edits on a converted copy
    assert torch.equal(half, before)
    for r in range(4):
        x = ref_processed_logits(half[r].float(), p, [2, 2], [], [])
        assert out16.token_ids[r].item() == ref_greedy(x)
    raw_lp = torch.log_softmax(half.float(), dim=-1)
    assert torch.allclose(out16.logprobs, raw_lp.gather(1, out16.token_ids[:, None]).squeeze(1))


# --------------------------------------------------------------------------- distribution

DIST_CONFIGS = [
    dict(temperature=1.0),
    dict(temperature=0.5),
    dict(temperature=2.0, top_k=3),
    dict(temperature=1.0, top_p=0.7),
    dict(temperature=0.8, min_p=0.1),
    dict(temperature=1.3, top_k=5, top_p=0.8, min_p=0.05),
    dict(temperature=1.0, top_k=8, min_p=0.15),
    dict(temperature=1.0, top_p=0.95, logit_bias={2: 3.0}, presence_penalty=1.5),
    dict(temperature=1.0, frequency_penalty=0.7, repetition_penalty=1.5),
    dict(temperature=0.9, top_p=0.9, frequency_penalty=-0.8, repetition_penalty=0.6),
]


def _config_id(config: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items())


@pytest.mark.parametrize("config", DIST_CONFIGS, ids=_config_id)
def test_empirical_distribution_matches_reference(config: dict) -> None:
    """N draws in one batch of identical rows. Each frequency has std sqrt(p(1-p)/N) <= 0.0035
    at N=20k; a 5-sigma band per token keeps the false-failure rate ~1e-6 per token, while a
    wrong filter (e.g. top_p off by one token) moves some frequency by >= 0.03 = ~8 sigma."""
    torch.manual_seed(1234)
    V, N = 12, 20_000
    row = torch.linspace(-2.0, 2.5, V)[torch.randperm(V)]  # distinct logits: no sort ties
    p = SamplingParams(**config).validate(V)
    output = [4, 4, 9]  # token 4 counted twice
    prompt = [int(row.argmin()), int(row.argmax())]  # one negative and one positive logit
    expected = ref_distribution(ref_processed_logits(row, p, output, prompt, []), p)
    out = run_sample(row.expand(N, V), [p] * N, outputs=[output] * N, prompts=[prompt] * N)
    freq = torch.bincount(out.token_ids, minlength=V).double() / N
    assert bool((freq[expected == 0] == 0).all()), "token outside the reference support"
    band = 5 * torch.sqrt(expected * (1 - expected) / N) + 1e-12
    assert bool(((freq - expected).abs() <= band).all()), (freq, expected)


def test_mixed_batch_rows_are_independent() -> None:
    """Greedy rows interleaved with sampled rows: greedy stays argmax, sampled keeps its law."""
    torch.manual_seed(7)
    V, N = 10, 12_000
    row = torch.linspace(-1.0, 1.5, V)[torch.randperm(V)]
    sampled = SamplingParams(temperature=1.0, top_k=4)
    params = [SamplingParams(temperature=0) if i % 2 else sampled for i in range(2 * N)]
    out = run_sample(row.expand(2 * N, V), params)
    assert bool((out.token_ids[1::2] == row.argmax()).all())
    expected = ref_distribution(row, sampled)
    freq = torch.bincount(out.token_ids[0::2], minlength=V).double() / N
    band = 5 * torch.sqrt(expected * (1 - expected) / N) + 1e-12
    assert bool(((freq - expected).abs() <= band).all())


# --------------------------------------------------------------------------- seeds / inverse CDF


def ref_inverse_cdf_token(x: torch.Tensor, p: SamplingParams, u: float) -> tuple[int, float]:
    """The documented draw: first token whose cumulative kept mass exceeds u * total, walking
    descending-probability order when top_k/top_p is set, vocabulary order otherwise.
    Returns (token, distance from u * total to the nearest CDF step) for boundary slack."""
    probs = torch.softmax(x.float() / p.temperature, dim=-1)
    if p.top_k > 0 or p.top_p < 1.0:
        kept, ids = ref_sorted_filter(probs, p)
    else:
        kept = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
        ids = torch.arange(len(probs))
    cdf = torch.cumsum(kept.double(), 0)
    target = u * cdf[-1].item()
    j = int(torch.searchsorted(cdf, torch.tensor([target], dtype=torch.float64), right=True))
    j = min(j, len(cdf) - 1)
    return int(ids[j]), float((cdf - target).abs().min())


@pytest.mark.parametrize(
    "scale, config",
    [
        # With linspace(-s, s, 3000) logits, the top-K mass is ~1 - exp(-2 s K / 3000).
        (60.0, dict(temperature=1.0, top_p=0.9)),  # peaked: top-64 candidates suffice
        (37.5, dict(temperature=1.0, top_p=0.9)),  # top-64 holds ~0.8 < top_p: next tier
        (6.0, dict(temperature=1.0, top_p=0.9)),  # medium: the 1024 tier
        (2.4, dict(temperature=1.0, top_p=0.9)),  # top-1024 holds ~0.8 < top_p: full sort
        (1.0, dict(temperature=1.0, top_p=0.9)),  # flat: full sort
        (1.0, dict(temperature=0.9, top_k=40, min_p=0.2)),
        (1.0, dict(temperature=1.1, top_k=700)),
        (4.0, dict(temperature=0.7)),
        (4.0, dict(temperature=0.7, min_p=0.05)),
    ],
)
def test_seeded_draw_equals_reference_inverse_cdf(scale: float, config: dict) -> None:
    """u is reproduced from the same seed, so the exact token is known in advance."""
    torch.manual_seed(99)
    B, V = 64, 3000
    base = torch.linspace(-scale, scale, V)  # distinct values: no sort ties
    logits = torch.stack([base[torch.randperm(V)] for _ in range(B)])
    p = SamplingParams(**config).validate(V)
    seeds = list(range(100, 100 + B))
    out = run_sample(logits, [p] * B, generators=[make_generator(s) for s in seeds])
    for r, s in enumerate(seeds):
        u = torch.rand(1, generator=make_generator(s)).item()
        tok, slack = ref_inverse_cdf_token(logits[r], p, u)
        assert out.token_ids[r].item() == tok or slack < 1e-5, (r, tok, out.token_ids[r])


def test_inverse_cdf_never_picks_zero_weight() -> None:
    """Edge draws: u = 0 must skip leading zero weights, u -> 1 must not run past the last
    non-zero weight (rounding can make u * total reach total)."""
    weights = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.2, 0.8, 0.0, 0.0]])
    assert _inverse_cdf(weights, torch.tensor([0.0, 0.0])).tolist() == [1, 0]
    assert _inverse_cdf(weights, torch.tensor([1.0, 1.0])).tolist() == [2, 1]


@pytest.mark.parametrize("V", [1000, 1024, 5000])
def test_blocked_inverse_cdf_matches_plain_walk(V: int) -> None:
    """Wide rows take the two-level (block sums, then one block) walk; it must agree with a
    plain cumsum walk and skip zero weights at block edges, including the padded tail."""
    torch.manual_seed(V)
    n = 200
    weights = torch.rand(n, V) * (torch.rand(n, V) < 0.05)
    weights[:, :300] = 0.0  # leading empty blocks
    weights[:, -1] = 0.0
    weights[0] = 0.0
    weights[0, 511] = weights[0, 512] = 1.0  # only entries either side of a block edge
    u = torch.rand(n)
    u[0], u[1], u[2] = 0.0, 1.0, 0.5
    got = _inverse_cdf(weights, u)
    assert bool((weights.gather(1, got[:, None]) > 0).all())
    cdf = weights.double().cumsum(-1)
    target = u.double()[:, None] * cdf[:, -1:]
    want = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=V - 1)
    slack = (cdf - target).abs().min(dim=1).values
    assert bool(((got == want) | (slack < 1e-4)).all())
    assert got[0].item() == 511 and got[1].item() == int(weights[1].nonzero().max())


def _seeded_run(
    target_logits: torch.Tensor,
    target: SamplingParams,
    seed: int,
    neighbours: list[SamplingParams],
    position: int,
    steps: int = 15,
) -> list[int]:
    """Sample `steps` tokens for one seeded row placed among `neighbours`."""
    V = target_logits.shape[0]
    params = list(neighbours)
    params.insert(position, target)
    gens: list[torch.Generator | None] = [
        make_generator(1000 + i) if i % 3 == 0 else None for i in range(len(params))
    ]
    gens[position] = make_generator(seed)
    batch = SamplingBatch.build(params, "cpu", V, [0])
    tokens = []
    for step in range(steps):
        logits = torch.randn(len(params), V) * 2
        logits[position] = target_logits + 0.1 * step
        out = sample(logits, batch, [[] for _ in params], [[] for _ in params], gens)
        tokens.append(out.token_ids[position].item())
    return tokens


@pytest.mark.parametrize(
    "target",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.8, top_p=0.9),
        SamplingParams(temperature=1.2, top_k=50, min_p=0.01),
    ],
)
def test_same_seed_same_tokens_across_batch_compositions(target: SamplingParams) -> None:
    torch.manual_seed(5)
    V = 500
    row = torch.randn(V) * 2
    alone = _seeded_run(row, target, 42, [], 0)
    crowds = [
        ([SamplingParams(temperature=0)] * 3, 1),
        ([SamplingParams(temperature=1.0), SamplingParams(top_p=0.5), SamplingParams(top_k=5)], 2),
        ([SamplingParams(temperature=0.3, repetition_penalty=1.2, min_p=0.2)] * 7, 7),
    ]
    for neighbours, position in crowds:
        torch.manual_seed(position)  # the default RNG state differs too
        assert _seeded_run(row, target, 42, neighbours, position) == alone
    assert _seeded_run(row, target, 43, [], 0) != alone


def test_make_generator_accepts_any_int() -> None:
    for seed in (0, -1, 2**64 + 5, 2**70):
        torch.rand(1, generator=make_generator(seed))
    a = torch.rand(3, generator=make_generator(7))
    assert torch.equal(a, torch.rand(3, generator=make_generator(7)))


# --------------------------------------------------------------------------- logprobs


def test_logprobs_are_raw_log_softmax() -> None:
    torch.manual_seed(3)
    B, V = 8, 64
    logits = torch.randn(B, V) * 2
    params = [
        SamplingParams(temperature=0, logit_bias={5: 10.0}),
        SamplingParams(temperature=0.5, frequency_penalty=1.0),
        SamplingParams(temperature=1.5, top_p=0.8),
        SamplingParams(temperature=1.0, top_k=3, repetition_penalty=1.5),
    ] * 2
    nums = [0, 1, 5, 3, 0, 0, V + 10, 2]
    out = run_sample(
        logits, params, outputs=[[1, 2, 2]] * B, prompts=[[3]] * B, top_logprobs_num=nums
    )
    ref = torch.log_softmax(logits, dim=-1)
    assert out.token_ids.dtype == torch.int64 and out.logprobs.dtype == torch.float32
    assert torch.allclose(out.logprobs, ref.gather(1, out.token_ids[:, None]).squeeze(1), atol=1e-5)
    for r in range(B):
        if nums[r] == 0:
            assert out.top_logprobs[r] is None
            continue
        k = min(nums[r], V)
        vals, ids = torch.topk(ref[r], k)
        got = out.top_logprobs[r]
        assert [t for t, _ in got] == ids.tolist()
        assert all(math.isclose(a, b, abs_tol=1e-5) for (_, a), b in zip(got, vals.tolist()))
        assert all(got[i][1] >= got[i + 1][1] for i in range(len(got) - 1))


def test_without_logprobs_the_same_tokens_are_picked() -> None:
    """with_logprobs=False (no request asked) skips the logsumexp: same tokens, seeded draws
    included, and no logprobs; asking for top logprobs then is an error."""
    torch.manual_seed(4)
    B, V = 6, 80
    logits = torch.randn(B, V) * 2
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.7, top_p=0.9),
        SamplingParams(temperature=1.2, top_k=5, repetition_penalty=1.3),
    ] * 2
    runs = []
    for with_logprobs in (True, False):
        gens = [make_generator(11 + r) for r in range(B)]
        runs.append(
            run_sample(
                logits,
                params,
                outputs=[[1, 2]] * B,
                prompts=[[3]] * B,
                generators=gens,
                with_logprobs=with_logprobs,
            )
        )
    assert torch.equal(runs[0].token_ids, runs[1].token_ids)
    assert runs[1].logprobs is None and runs[1].top_logprobs == [None] * B
    with pytest.raises(ValueError, match="with_logprobs"):
        run_sample(logits, params, top_logprobs_num=[1] * B, with_logprobs=False)


def test_empty_batch() -> None:
    out = run_sample(torch.empty(0, 10), [])
    assert out.token_ids.shape == (0,) and out.logprobs.shape == (0,) and out.top_logprobs == []


def test_a_rows_logsumexp_is_the_same_alone_and_beside_others():
    """A row's logsumexp (its logprobs) bit for bit whether it is alone or one of several: a
    lone row's sum is not split among threads differently (torch's own did, ~1e-6 apart)."""
    from sgl.runtime.sampling.sampler import row_logsumexp

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(0)
        for _ in range(100):
            x = torch.randn(5, 49152, generator=g) * 5
            together = row_logsumexp(x)
            assert torch.equal(together, torch.logsumexp(x, dim=-1))  # 2+ rows: torch's
            for m in (1, 2, 3):
                assert torch.equal(row_logsumexp(x[:m]), together[:m])
    finally:
        torch.set_num_threads(threads)
