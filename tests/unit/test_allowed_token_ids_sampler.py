"""allowed_token_ids (vLLM's): only the listed ids may be sampled. Oracles: the argmax over the
allowed ids of the raw logits (brute force), membership of every draw, and the grammar mask
intersected by hand."""

from __future__ import annotations

import random

import pytest
import torch

from sgl.runtime.errors import InvalidRequestError
from sgl.runtime.sampling import SamplingParams
from sgl.runtime.sampling.batch import SamplingBatch
from sgl.runtime.sampling.sampler import sample

V = 50


def _sample(logits, params, allowed_mask=None):
    batch = SamplingBatch.build(params, "cpu", V, eos_token_ids=[0])
    B = len(params)
    return sample(
        logits,
        batch,
        [[] for _ in range(B)],
        [[] for _ in range(B)],
        [None] * B,
        allowed_mask=allowed_mask,
    ).token_ids.tolist()


@pytest.mark.parametrize("trial", range(8))
def test_greedy_is_the_argmax_over_the_allowed_ids(trial: int) -> None:
    rng = random.Random(trial)
    torch.manual_seed(trial)
    logits = torch.randn(4, V) * 3
    allowed = [rng.sample(range(V), rng.randint(1, 10)) for _ in range(4)]
    bias = {rng.randrange(V): 5.0}
    params = [SamplingParams(temperature=0, allowed_token_ids=a).validate(V) for a in allowed[:3]]
    params.append(
        SamplingParams(temperature=0, allowed_token_ids=allowed[3], logit_bias=bias).validate(V)
    )
    got = _sample(logits, params)
    for r, ids in enumerate(allowed):
        row = logits[r].clone()
        if r == 3:
            for tid, b in bias.items():
                row[tid] += b
        assert got[r] == max(ids, key=lambda t: float(row[t]))


@pytest.mark.parametrize(
    "extra", [{}, {"top_k": 3}, {"top_p": 0.5}, {"min_p": 0.2}, {"temperature": 5.0}]
)
def test_every_draw_is_an_allowed_id(extra: dict) -> None:
    torch.manual_seed(1)
    logits = torch.randn(3, V) * 4
    ids = [[7], [3, 9, 40], list(range(0, V, 2))]
    params = [
        SamplingParams(**{"temperature": 1.0, **extra}, allowed_token_ids=a).validate(V)
        for a in ids
    ]
    seen = [set() for _ in ids]
    for _ in range(200):
        for r, tok in enumerate(_sample(logits, params)):
            assert tok in ids[r]
            seen[r].add(tok)
    assert seen[0] == {7}
    if set(extra) <= {
        "temperature"
    }:  # no filter: not stuck on one id where several are likely enough
        assert len(seen[1]) >= 2


def test_with_a_grammar_mask_only_ids_both_allow_and_none_left_is_minus_one() -> None:
    torch.manual_seed(2)
    logits = torch.randn(3, V)
    mask = torch.zeros(3, V, dtype=torch.bool)
    mask[:, 10:20] = True
    ids = [[5, 12, 15, 30], [1, 2, 3], [12]]
    params = [
        SamplingParams(temperature=0, allowed_token_ids=ids[0]),
        SamplingParams(allowed_token_ids=ids[1]),
        SamplingParams(temperature=0.8, allowed_token_ids=ids[2]),
    ]
    for _ in range(20):
        got = _sample(logits, [p.validate(V) for p in params], allowed_mask=mask)
        assert got[0] == max((12, 15), key=lambda t: float(logits[0, t]))
        assert got[1] == -1  # disjoint: nothing left, the scheduler finishes the request
        assert got[2] == 12


def test_an_empty_list_allows_nothing() -> None:
    assert _sample(
        torch.randn(1, V), [SamplingParams(temperature=0, allowed_token_ids=[]).validate(V)]
    ) == [-1]


def test_the_other_rows_of_the_batch_are_untouched() -> None:
    torch.manual_seed(3)
    logits = torch.randn(2, V)
    got = _sample(
        logits,
        [SamplingParams(temperature=0, allowed_token_ids=[4]), SamplingParams(temperature=0)],
    )
    assert got == [4, int(logits[1].argmax())]


@pytest.mark.parametrize("value", [[-1], [V], [1, "2"], "3", [1.0], {"1": 1}])
def test_bad_ids_name_the_field(value) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams.from_dict({"allowed_token_ids": value}).validate(vocab_size=V)
    assert info.value.param == "allowed_token_ids" and "allowed_token_ids" in str(info.value)
