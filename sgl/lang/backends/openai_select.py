"""`select` over an OpenAI-compatible API.

Scoring ("logprobs"): one `/v1/completions` call with the prompt alone and the prompt plus
each choice, `echo: true, logprobs: 1`, returns every prompt token's logprob with its text
and offset. As in process (`scoring.py`), a choice's tokens are those after the longest
token prefix all candidates share with the prompt alone, so a merge of the prompt's last
token with the choice is scored, not split. Servers that do not echo prompt logprobs
(OpenAI's chat models, llama.cpp) answer without them or refuse: the caller moves on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sgl.lang.backends.runtime_endpoint import RemoteError
from sgl.lang.choices import ChoiceScores

if TYPE_CHECKING:
    from sgl.lang.backends.openai_compat import OpenAI

Token = tuple[int, str]  # (character offset, token text)


def choice_token_bound(choices: list[str]) -> int:
    """Tokens enough for any choice: a token is at least one byte of it (plus one spare)."""
    return max(len(c.encode("utf-8")) for c in choices) + 1


def match_choice(produced: str, choices: list[str]) -> str | None:
    """The choice the generated text is (exactly, else the longest it starts with, else ignoring
    surrounding whitespace); None if it is none of them."""
    if produced in choices:
        return produced
    starts = [c for c in choices if produced.startswith(c)]
    if starts:
        return max(starts, key=len)
    stripped = [c for c in choices if c.strip() == produced.strip()]
    return stripped[0] if stripped else None


def _prompt_tokens(
    choice: dict[str, Any], prompt: str
) -> tuple[list[Token], list[float | None]] | None:
    """The echoed prompt's tokens and logprobs (generated tokens, at or past its end, dropped)."""
    lp = choice.get("logprobs") or {}
    tokens, lps, offsets = lp.get("tokens"), lp.get("token_logprobs"), lp.get("text_offset")
    if (
        not tokens
        or lps is None
        or offsets is None
        or len(tokens) != len(lps)
        or len(tokens) != len(offsets)
    ):
        return None
    keep = [i for i, off in enumerate(offsets) if off < len(prompt)]
    if "".join(tokens[i] for i in keep) != prompt:
        return None  # not an echo of this prompt
    return [(offsets[i], tokens[i]) for i in keep], [lps[i] for i in keep]


def _echo(
    backend: OpenAI, prompts: list[str]
) -> list[tuple[list[Token], list[float | None]]] | None:
    """Prompt tokens and logprobs of each prompt (one call); None if the endpoint has none."""
    for max_tokens in (0, 1):  # vLLM and sgl echo with 0 new tokens; others may need 1
        body = {
            "model": backend.model,
            "prompt": prompts,
            "max_tokens": max_tokens,
            "echo": True,
            "logprobs": 1,
            "temperature": 0,
        }
        try:
            out = backend.http.post("/completions", body)
        except RemoteError as e:
            if 400 <= e.status < 500 and e.status not in (401, 403, 429):
                continue
            raise
        choices = sorted(out.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != len(prompts):
            return None
        parsed = [_prompt_tokens(c, p) for c, p in zip(choices, prompts)]
        return None if any(p is None for p in parsed) else parsed  # type: ignore[return-value]
    return None


def _common(a: list[Token], b: list[Token]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def score_by_echo(
    backend: OpenAI, text: str, choices: list[str], unconditional: bool
) -> ChoiceScores | None:
    """Each choice's token logprobs after `text` (and alone, if asked), or None if unavailable."""
    got = _echo(backend, [text, *(text + c for c in choices)])
    if got is None:
        return None
    (prompt_toks, _), *rest = got
    start = max(min(_common(prompt_toks, toks) for toks, _ in rest), 1)
    cond = [lps[start:] for _, lps in rest]
    if any(lp is None for lps in cond for lp in lps) or any(not lps for lps in cond):
        return None
    uncond = None
    if unconditional:
        # The choice's own text as a whole prompt: its first token has no logprob there, so it
        # keeps the conditional one (as in process for a model without a BOS token).
        tails = ["".join(t for _, t in toks[start:]) for toks, _ in rest]
        alone = _echo(backend, tails)
        if alone is None:
            return None
        uncond = [
            c[:1] + [lp if lp is not None else 0.0 for lp in a[1:]]
            for c, (_, a) in zip(cond, alone)
        ]
    return ChoiceScores(list(choices), cond, uncond)  # type: ignore[arg-type]
