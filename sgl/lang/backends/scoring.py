"""`select` for backends that can tokenize and score token sequences (in process or remote).

A choice is scored as a continuation of the prompt from one batched request. Tokenizing
`text + choice` can merge the prompt's last token with the choice, so the choice tokens
are those after the longest token prefix that all candidates share with the prompt; that
prefix comes from the radix cache.
"""

from __future__ import annotations

from abc import abstractmethod

from sgl.lang.backends.base import Backend
from sgl.lang.choices import ChoiceScores, ChoicesDecision, ChoicesMethod, decide


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class TokenScoringBackend(Backend):
    """Implements `select` on top of `encode_batch` and `score_tokens`."""

    @abstractmethod
    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, as the model's tokenizer gives them for a prompt."""

    @abstractmethod
    def score_tokens(self, id_lists: list[list[int]], start: int) -> list[list[float]]:
        """Logprob of every token from position `start` on, for each sequence (one request)."""

    @abstractmethod
    def bos_token_id(self) -> int | None:
        """The token an unconditional score starts from (None: the model has none)."""

    def select(
        self, text: str, choices: list[str], temperature: float, method: ChoicesMethod
    ) -> ChoicesDecision:
        return decide(
            method, self.score_choices(text, choices, method.requires_unconditional), temperature
        )

    def score_choices(self, text: str, choices: list[str], unconditional: bool) -> ChoiceScores:
        prompt_ids, *ids = self.encode_batch([text, *(text + c for c in choices)])
        start = max(min(common_prefix_len(prompt_ids, x) for x in ids), 1)  # token 0 has no logprob
        cond = self.score_tokens(ids, start)
        uncond = None
        if unconditional:
            # The same choice tokens after only a BOS token (without one, the first choice
            # token keeps its conditional logprob: it cannot be scored alone).
            bos = self.bos_token_id()
            tails = [x[start:] for x in ids]
            if bos is not None:
                uncond = self.score_tokens([[bos, *t] for t in tails], 1)
            else:
                long = [t for t in tails if len(t) > 1]
                scored = iter(self.score_tokens(long, 1) if long else [])
                uncond = [c[:1] + (next(scored) if len(t) > 1 else []) for t, c in zip(tails, cond)]
        return ChoiceScores(list(choices), cond, uncond)


def logprobs_of(meta_info: dict) -> list[float]:
    """The scored prompt tokens' logprobs from a result's input_token_logprobs."""
    return [entry[0] for entry in meta_info["input_token_logprobs"] if entry[0] is not None]
