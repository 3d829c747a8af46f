"""The in-process backend: programs call an `sgl.Engine` directly."""

from __future__ import annotations

import threading
from typing import Any, Iterator

from sgl.lang.backends.base import Backend
from sgl.lang.chat_template import ChatTemplate
from sgl.lang.choices import ChoicesDecision, ChoicesMethod, ChoiceScores, decide


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class EngineBackend(Backend):
    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._template: ChatTemplate | None = None
        self._lock = threading.Lock()

    def generate(self, text: str, sampling: dict[str, Any], logprobs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        out = self.engine.generate(text, sampling, **logprobs)
        return out["text"], out["meta_info"]

    def generate_stream(
        self, text: str, sampling: dict[str, Any], logprobs: dict[str, Any]
    ) -> Iterator[tuple[str, dict[str, Any] | None]]:
        for chunk in self.engine.generate(text, sampling, stream=True, **logprobs):
            meta = chunk["meta_info"]
            yield chunk["text"], meta if meta.get("finish_reason") is not None else None

    def select(self, text: str, choices: list[str], temperature: float, method: ChoicesMethod) -> ChoicesDecision:
        scores = self.score_choices(text, choices, method.requires_unconditional)
        return decide(method, scores, temperature)

    def score_choices(self, text: str, choices: list[str], unconditional: bool) -> ChoiceScores:
        """Per-token logprobs of each choice after `text`, from one batched scoring request.

        Tokenizing `text + choice` can merge the last prompt token with the choice, so the
        choice tokens are those after the longest token prefix shared by all candidates
        and the prompt; that prefix is scored once, from the radix cache.
        """
        prompt_ids = self.engine.encode(text)
        ids = [self.engine.encode(text + c) for c in choices]
        start = min(_common_prefix_len(prompt_ids, x) for x in ids)
        start = max(start, 1)  # the first token of a sequence has no logprob
        cond = self._score(ids, start)
        uncond = None
        if unconditional:
            # The same choice tokens after only a BOS token (when the model has none, the
            # first choice token keeps its conditional logprob: it cannot be scored alone).
            lead = self._lead_ids()
            tails = [x[start:] for x in ids]
            if lead:
                uncond = self._score([lead + t for t in tails], len(lead))
            else:
                long = [t for t in tails if len(t) > 1]
                scored = iter(self._score(long, 1) if long else [])
                uncond = [c[:1] + (next(scored) if len(t) > 1 else []) for t, c in zip(tails, cond)]
        return ChoiceScores(list(choices), cond, uncond)

    def _score(self, id_lists: list[list[int]], start: int) -> list[list[float]]:
        outs = self.engine.generate(
            input_ids=id_lists, sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=start
        )
        return [[lp for lp, _, _ in o["meta_info"]["input_token_logprobs"] if lp is not None] for o in outs]

    def _lead_ids(self) -> list[int]:
        bos = getattr(self.engine.tokenizer, "bos_token_id", None)
        return [bos] if bos is not None else []

    def cache_prefix(self, text: str) -> None:
        if text:
            self.engine.generate(text, {"max_new_tokens": 0})

    def chat_template(self) -> ChatTemplate:
        with self._lock:
            if self._template is None:
                self._template = ChatTemplate.from_hf_tokenizer(self.engine.tokenizer)
            return self._template

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def get_server_info(self) -> dict[str, Any]:
        return self.engine.get_server_info()

    def shutdown(self) -> None:
        self.engine.shutdown()
