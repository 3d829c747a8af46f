"""How `select` turns per-token logprobs of each choice into a decision.

A backend scores every choice as a continuation of the prompt (one batched request) and
hands the per-token logprobs to one of these methods. Names and behaviour follow SGLang.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ChoiceScores:
    """Logprobs of each choice's tokens given the prompt (and, if asked for, without it)."""

    choices: list[str]
    token_logprobs: list[list[float]]  # per choice, per choice token
    unconditional_token_logprobs: list[list[float]] | None = None


@dataclass
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("-inf")


class ChoicesMethod(ABC):
    """Base: `requires_unconditional` asks the backend for context-free logprobs too."""

    requires_unconditional = False

    @abstractmethod
    def __call__(self, scores: ChoiceScores) -> ChoicesDecision:
        """Pick one of `scores.choices`."""


class TokenLengthNormalized(ChoicesMethod):
    """The choice with the highest mean logprob per token (SGLang's default)."""

    def __call__(self, scores: ChoiceScores) -> ChoicesDecision:
        norm = [_mean(lp) for lp in scores.token_logprobs]
        best = max(range(len(norm)), key=lambda i: norm[i])
        return ChoicesDecision(scores.choices[best], {"normalized_prompt_logprobs": norm})


class GreedyTokenSelection(ChoicesMethod):
    """Walk the choices token by token, keeping those whose token is most likely at each step.

    A choice that runs out of tokens is padded with its own mean logprob, so it competes
    on a like-for-like basis with longer ones.
    """

    def __call__(self, scores: ChoiceScores) -> ChoicesDecision:
        lps = scores.token_logprobs
        width = max(len(x) for x in lps)
        padded = [x + [_mean(x)] * (width - len(x)) for x in lps]
        alive = list(range(len(lps)))
        for pos in range(width):
            top = max(padded[i][pos] for i in alive)
            alive = [i for i in alive if padded[i][pos] == top]
            if len(alive) == 1:
                break
        return ChoicesDecision(
            scores.choices[alive[0]], {"normalized_prompt_logprobs": [_mean(x) for x in lps]}
        )


class UnconditionalLikelihoodNormalized(ChoicesMethod):
    """Mean over tokens of log p(token | prompt) - log p(token | no prompt): corrects for
    choices that are likely whatever the question (e.g. short, common words)."""

    requires_unconditional = True

    def __call__(self, scores: ChoiceScores) -> ChoicesDecision:
        uncond = scores.unconditional_token_logprobs
        if uncond is None:
            raise ValueError(
                "unconditional_likelihood_normalized needs unconditional logprobs from the backend"
            )
        norm = [
            _mean([c - u for c, u in zip(cond, unc)])
            for cond, unc in zip(scores.token_logprobs, uncond)
        ]
        best = max(range(len(norm)), key=lambda i: norm[i])
        return ChoicesDecision(
            scores.choices[best],
            {
                "normalized_prompt_logprobs": [_mean(x) for x in scores.token_logprobs],
                "normalized_unconditional": norm,
            },
        )


def decide(
    method: ChoicesMethod,
    scores: ChoiceScores,
    temperature: float,
    rng: random.Random | None = None,
) -> ChoicesDecision:
    """Apply `method`; with temperature > 0, sample a choice from softmax(mean logprob / T)
    instead."""
    result = method(scores)
    if temperature and temperature > 0:
        norm = (
            result.meta_info.get("normalized_unconditional")
            or result.meta_info["normalized_prompt_logprobs"]
        )
        top = max(norm)
        weights = [math.exp((x - top) / temperature) for x in norm]
        pick = (rng or random).choices(range(len(norm)), weights=weights)[0]
        result = ChoicesDecision(scores.choices[pick], result.meta_info)
    result.meta_info.setdefault("input_token_logprobs", scores.token_logprobs)
    if scores.unconditional_token_logprobs is not None:
        result.meta_info.setdefault(
            "unconditional_token_logprobs", scores.unconditional_token_logprobs
        )
    return result


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
