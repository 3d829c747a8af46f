"""API speculative execution (`@sgl.function(num_api_spec_tokens=N)`), for completion APIs.

An API call has a price per call and per prompt token, and a program with k gens sends
its growing prompt k times. With speculation, a gen makes one call for up to
max(its max_tokens, N) tokens with no stop, and keeps the rest of that continuation: the
text the program appends next (template text, a select's choice) is checked against it,
and a later gen is filled from it, with no call, when the program's text so far is
exactly what the model wrote.

A gen is filled only when the result provably equals what its own call would return
(greedy, same sampling parameters), else a call is made. That needs the token boundaries
of the continuation (so `max_tokens` can be counted and the gen starts where a token
starts, as a re-tokenized prompt would), and stop strings resolved as the engine does:
the occurrence with the smallest start, the text before it, counted in tokens up to the
end of the longest stop so no earlier-starting stop could still complete.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

# Gens whose result also depends on something speculation cannot replay are never filled.
_NOT_SPECULABLE = ("regex", "json_schema", "ebnf", "structural_tag", "stop_token_ids", "n")
_ZERO_DEFAULT = ("frequency_penalty", "presence_penalty", "min_new_tokens")
_IGNORED_IN_KEY = ("max_new_tokens", "stop")


def speculable(sampling: dict[str, Any]) -> bool:
    """No constraint, stop token ids or history-dependent penalty (those see the other gens'
    tokens)."""
    if any(sampling.get(k) not in (None, [], ()) for k in _NOT_SPECULABLE):
        return False
    if sampling.get("repetition_penalty") not in (None, 1.0):
        return False
    return not any(sampling.get(k) for k in _ZERO_DEFAULT)


def sampling_key(sampling: dict[str, Any]) -> tuple:
    """What must be equal between the speculating gen and a gen filled from it."""
    return tuple(sorted((k, repr(v)) for k, v in sampling.items() if k not in _IGNORED_IN_KEY))


def stops_of(sampling: dict[str, Any]) -> list[str]:
    stop = sampling.get("stop")
    if stop is None:
        return []
    return [s for s in ([stop] if isinstance(stop, str) else stop) if s]


def earliest_stop(text: str, stops: list[str]) -> tuple[int, str] | None:
    """The occurrence with the smallest start (the shortest stop on a tie), as the engine trims."""
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or (i, len(s)) < (best[0], len(best[1]))):
            best = (i, s)
    return best


@dataclass(frozen=True)
class Speculation:
    """A continuation of the state's text as generated, and how much of it the state has used."""

    text: str
    token_ends: tuple[int, ...]  # where each generated token ends, in characters of `text`
    ended_by_eos: bool  # the model stopped by itself (not at the token limit)
    key: tuple  # sampling_key of the call that made it
    pos: int = 0  # text[:pos] is already in the program state

    @classmethod
    def from_result(
        cls, text: str, meta: dict[str, Any], sampling: dict[str, Any]
    ) -> Speculation | None:
        """From a call made with return_logprob (for the tokens); None without usable tokens."""
        pieces = [entry[2] for entry in meta.get("output_token_logprobs") or []]
        if not pieces or any(p is None for p in pieces) or "".join(pieces) != text:
            return None
        ends, n = [], 0
        for p in pieces:
            n += len(p)
            ends.append(n)
        finish = meta.get("finish_reason") or {}
        eos = finish.get("type") == "stop" and finish.get("matched") is None
        return cls(text, tuple(ends), eos, sampling_key(sampling))

    def after(self, appended: str) -> Speculation | None:
        """The speculation once the program appends `appended`; None if the model wrote
        otherwise."""
        if self.text.startswith(appended, self.pos):
            return replace(self, pos=self.pos + len(appended))
        return None

    def take(self, sampling: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        """The gen's text and meta_info from the continuation, or None if it cannot be proven
        equal."""
        if sampling_key(sampling) != self.key or not speculable(sampling):
            return None
        if self.pos == 0:
            first = 0
        elif self.pos in self.token_ends:
            first = self.token_ends.index(self.pos) + 1  # index of the gen's first token
        else:
            return None  # the gen would start mid-token: the prompt would tokenize differently
        ends = self.token_ends[first:]
        rest = self.text[self.pos :]
        budget = sampling.get("max_new_tokens")
        if budget is None:
            return None
        stops = stops_of(sampling)
        hit = earliest_stop(rest, stops)
        budget_end = ends[budget - 1] - self.pos if budget <= len(ends) else None
        if hit is not None and (budget_end is None or hit[0] < budget_end):
            return self._take_stop(rest, ends, hit, max(map(len, stops)), budget)
        if budget_end is not None:  # the limit comes first
            meta = {
                "finish_reason": {"type": "length", "length": budget},
                "completion_tokens": budget,
            }
            return rest[:budget_end], meta
        if self.ended_by_eos:  # the model ended within the budget
            return rest, {
                "finish_reason": {"type": "stop", "matched": None},
                "completion_tokens": len(ends),
            }
        return None

    def _take_stop(
        self, rest: str, ends: tuple[int, ...], hit: tuple[int, str], longest: int, budget: int
    ) -> tuple[str, dict[str, Any]] | None:
        start, stop = hit
        settled = start + longest  # by then no stop starting earlier can still complete
        if settled > len(rest) and not self.ended_by_eos:
            return None
        needed = _tokens_to_reach(ends, self.pos + min(settled, len(rest)))
        if needed > budget:
            return None  # the engine might hit the limit while the stop is undecided
        used = _tokens_to_reach(ends, self.pos + start + len(stop))
        return rest[:start], {
            "finish_reason": {"type": "stop", "matched": stop},
            "completion_tokens": used,
        }


def _tokens_to_reach(ends: tuple[int, ...], offset: int) -> int:
    for i, end in enumerate(ends):
        if end >= offset:
            return i + 1
    return len(ends)


def speculative_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """meta_info of a gen filled from a speculation: no prompt was sent for it."""
    return {"prompt_tokens": 0, "cached_tokens": 0, **meta, "speculative": True}
