"""Greedy decoding with top-2 logprobs, and a comparison of two such runs that tells a real
difference from a near-tie that rounding may legitimately break either way."""

from __future__ import annotations

import gc
import random

import torch


def random_prompts(n: int, vocab: int, lo: int = 3, hi: int = 60, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def greedy_top2(engine, prompts: list[list[int]], new_tokens: int | list[int]) -> list[dict]:
    counts = new_tokens if isinstance(new_tokens, list) else [new_tokens] * len(prompts)
    sp = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in counts]
    outs = engine.generate(
        input_ids=prompts, sampling_params=sp, return_logprob=True, top_logprobs_num=2
    )
    return [
        {
            "ids": o["output_ids"],
            "top2": [
                [(lp, tid) for lp, tid, _ in step] for step in o["meta_info"]["output_top_logprobs"]
            ],
        }
        for o in outs
    ]


def assert_same_greedy(ref: list[dict], got: list[dict], lp_tol: float, tie_margin: float) -> None:
    """Token ids must match. They may part where the reference's top-2 logprobs are within
    `tie_margin` (a near-tie: either token is a correct greedy choice); until then the chosen
    tokens' logprobs must agree within `lp_tol`."""
    for i, (a, b) in enumerate(zip(ref, got)):
        assert len(a["ids"]) == len(b["ids"]), (
            f"prompt {i}: {len(a['ids'])} vs {len(b['ids'])} tokens"
        )
        for step, (ta, tb) in enumerate(zip(a["ids"], b["ids"])):
            (lp1, _), (lp2, _) = a["top2"][step][:2]
            if ta != tb:
                assert lp1 - lp2 < tie_margin, (
                    f"prompt {i} step {step}: token {tb} instead of {ta}, but the reference's "
                    f"margin is {lp1 - lp2:.3g}"
                )
                break  # after a legitimate tie-break the continuations differ
            lp_b = b["top2"][step][0][0]
            assert abs(lp1 - lp_b) < lp_tol, f"prompt {i} step {step}: logprob {lp_b} vs {lp1}"


def free_cuda() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def sharpen(engine, factor: float = 50.0) -> None:
    """Scale the final norm of a random-weight model: its near-uniform logits (margins of a few
    hundredths) become decisive, so a wrong kernel changes tokens instead of hiding in ties.
    In place, so captured CUDA graphs see it."""
    with torch.no_grad():
        engine.model.norm.weight.mul_(factor)
