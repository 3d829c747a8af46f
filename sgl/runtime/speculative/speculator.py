"""The scheduler's speculation policy: which decoding requests get draft tokens this step, how
many, and what a verify step accepted.

Drafts come from prompt lookup (`ngram.py`) or, for a constrained request whose forced text
jump-forward does not append, from that text. A request's draft rides along in its decode
step: the step computes its newest token and the k drafted after it (k + 1 positions), and
the sampler draws a token at each position exactly as it would without speculation, the
drafted prefix counting as output
(`ModelRunner.sample(drafts=...)`). The draft is accepted up to the first position whose
draw differs from it, and that draw is the next token (a free one when all k matched). For a
draft that is one fixed sequence (prompt lookup; a greedy draft model) this is exact at any
temperature: position j's draw has the target's distribution given the accepted prefix, and
"accept while the draw equals the draft" is rejection sampling with a point-mass proposal
(accept with probability p(d); on rejection the draw is distributed as p without d).

Drafts cost compute, so they are rationed: a request whose last drafts were all rejected
waits a growing number of steps before drafting again, its draft length follows what was
accepted, and a step verifies the number of drafted tokens that gives it the most expected
tokens per second at the costs measured on this engine's own steps (`step_cost.py`), the most
valuable first: the j-th drafted token of a request that keeps a drafted token with
probability p is worth p^j. A step's drafts also stay under a token budget (`step_budget`).
Under tensor parallelism the ranks must draft alike, so there the budget alone rations (a
rank's timings are its own), as it does with SGL_SPEC_COST_RATIONING=0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from sgl.runtime.request import Req
from sgl.runtime.speculative.ngram import NgramIndex
from sgl.runtime.speculative.step_cost import StepCost, worth_drafting

SPECULATIVE_ALGORITHMS = ("NGRAM", "STANDALONE")
# The largest speculative_num_draft_tokens taken (one request's draft in one step).
MAX_DRAFT_TOKENS = 32
# Draft tokens one step may verify in all, beyond its one token per decoding request.
STEP_TOKEN_BUDGET = 32
# Steps a request waits before drafting again after a wholly rejected draft: 1, 3, 7, ... capped.
MAX_BACKOFF_STEPS = 16
# After this many steps in a row where the measured costs held offered drafts back, a step
# verifies all the budget allows: the row counts above stay measured as conditions change
# (what a count cost under other conditions would otherwise stand for good once unvisited).
EXPLORE_EVERY = 16
# A request's chance of keeping a drafted token (given the ones before it were kept) is its own
# record, forgetting by this factor per verify, blended with the engine's record as
# PRIOR_WEIGHT verifies' worth.
ACCEPT_FORGET, PRIOR_WEIGHT = 0.9, 2.0
# A draft model drafts only while at most this many requests decode: each drafted token is a
# forward of the draft over the batch, which pays while the target's step is bound by reading
# its weights (measured, SmolLM2 bf16 with its int4 self-draft on 2 EPYC cores: 1.22x at batch
# 1, 0.59x at batch 16).
DRAFT_MODEL_MAX_BATCH = 4


@dataclass
class SpecState:
    """One request's drafting state."""

    index: NgramIndex
    length: int  # the next draft's length (adaptive)
    misses: int = 0  # wholly rejected drafts in a row
    wait: int = 0  # steps to skip before drafting again
    kept: float = 0.0  # drafted tokens kept (fading), each after the ones before it were kept
    tried: float = 0.0  # and those decided: kept ones plus the first refused of each draft


@dataclass
class SpecStats:
    """Engine-wide counts since start."""

    verify_steps: int = 0  # decode steps of a request while speculation is on
    drafted: int = 0
    accepted: int = 0
    by_length: dict[int, int] = field(default_factory=dict)  # accepted per verify: how often
    decided: int = 0  # accepted tokens plus the first rejected of each draft

    def keep_rate(self) -> float:
        """The engine's chance of keeping a drafted token whose predecessors were kept."""
        return self.accepted / self.decided if self.decided else 0.5

    def as_dict(self) -> dict:
        rate = self.accepted / self.drafted if self.drafted else None
        # SGLang's avg_spec_accept_length: tokens per verify step (accepted drafts + the draw)
        steps = self.verify_steps
        length = (self.accepted + steps) / steps if steps else None
        return {
            "verify_steps": self.verify_steps,
            "draft_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            "acceptance_rate": rate,
            "avg_spec_accept_length": length,
            # verify steps that drafted, by how many of their tokens were accepted
            "accept_histogram": {str(k): v for k, v in sorted(self.by_length.items())},
        }


class Speculator:
    """Drafting by prompt lookup (`NGRAM`) or a draft model (`STANDALONE`, given `draft_model`),
    with adaptive length and per-step rationing."""

    def __init__(
        self,
        num_draft_tokens: int,
        tokenizer: Any = None,
        draft_model: Any = None,
        prefix_cache: Any = None,
        min_ngram: int = 1,
        max_ngram: int = 4,
        step_budget: int = STEP_TOKEN_BUDGET,
        measure_cost: bool = True,
    ) -> None:
        self.num_draft_tokens = num_draft_tokens
        self.tokenizer = tokenizer  # the scheduler's: forced text -> draft tokens
        self.draft_model = draft_model  # draft_model.DraftModel, or None (prompt lookup)
        self.algorithm = "NGRAM" if draft_model is None else "STANDALONE"
        self.prefix_cache = prefix_cache  # NGRAM also drafts from other cached sequences
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.step_budget = step_budget
        self.stats = SpecStats()
        # decode steps' seconds by rows (the scheduler reports them), None: the budget alone
        self.step_cost = StepCost() if measure_cost else None
        self._held_back = 0  # steps in a row whose offers the costs cut

    def _state(self, r: Req) -> SpecState:
        if r.spec is None:
            r.spec = SpecState(NgramIndex(self.min_ngram, self.max_ngram), self.num_draft_tokens)
        return r.spec

    def propose(self, decoding: list[Req]) -> None:
        """Set `draft_ids` on the requests that draft this step (and clear the others')."""
        budget = self.step_budget
        # too many requests for a draft model to pay (forced text still drafts: it costs none)
        model_idle = self.draft_model is not None and len(decoding) > DRAFT_MODEL_MAX_BATCH
        wanted: list[tuple[Req, int]] = []
        forced_rows = 0
        for r in decoding:
            r.draft_ids = []
            k = min(self._length(r), budget)
            if k <= 0:
                continue
            forced = self._forced_draft(r, k) if r.matcher is not None else []
            if forced:  # the constraint allows nothing else: kept for sure, always worth it
                r.draft_ids = _grammar_prefix(r.matcher, forced)
                budget -= len(r.draft_ids)
                forced_rows += len(r.draft_ids)
                continue
            if not model_idle:
                wanted.append((r, k))
        step = (sum(r.pending_tokens for r in decoding) + forced_rows, len(decoding) + forced_rows)
        if self.draft_model is not None:  # rationed before drafting: each drafted token costs
            self.draft_model.release_others(set(decoding))
            wanted = [(r, n) for (r, _), n in zip(wanted, self._ration(wanted, *step, budget)) if n]
            drafts = self.draft_model.draft([r for r, _ in wanted], [k for _, k in wanted])
        else:  # looked up first (cheap): only what the lookup found competes
            drafts = [self._lookup(r, k) for r, k in wanted]
            offers = [(r, len(d)) for (r, _), d in zip(wanted, drafts)]
            drafts = [d[:n] for d, n in zip(drafts, self._ration(offers, *step, budget))]
        for (r, _), draft in zip(wanted, drafts):
            r.draft_ids = _grammar_prefix(r.matcher, draft) if r.matcher is not None else draft

    def _ration(
        self, offers: list[tuple[Req, int]], rows: int, expected: int, budget: int
    ) -> list[int]:
        """How many of the tokens each (request, tokens it could draft) offers this step
        verifies: the most valuable first (a request's j-th token is worth p^j), as many as give
        the step the most expected tokens per second (`worth_drafting`) within the budget."""
        ranked = sorted(
            (
                (self.keep_chance(r) ** j, i)
                for i, (r, n) in enumerate(offers)
                for j in range(1, n + 1)
            ),
            key=lambda vi: -vi[0],
        )  # stable: a request's tokens stay in order among equal values
        most = min(len(ranked), budget)
        take = worth_drafting([v for v, _ in ranked], rows, expected, self.step_cost, budget)
        self._held_back = self._held_back + 1 if take < most else 0
        if self._held_back >= EXPLORE_EVERY:
            self._held_back = 0
            take = most
        counts = [0] * len(offers)
        for _, i in ranked[:take]:
            counts[i] += 1
        return counts

    def keep_chance(self, r: Req) -> float:
        """The chance that `r` keeps a drafted token whose predecessors it kept: its own
        record, blended with the engine's."""
        state = self._state(r)
        prior = self.stats.keep_rate()
        return (state.kept + PRIOR_WEIGHT * prior) / (state.tried + PRIOR_WEIGHT)

    def observe_step(self, rows: int, seconds: float) -> None:
        """A decode step of `rows` rows took `seconds` (forward and sampling)."""
        if self.step_cost is not None:
            self.step_cost.observe(rows, seconds)

    def _lookup(self, r: Req, k: int) -> list[int]:
        """Prompt lookup: what a cached sequence holding all of this one's tokens went on
        with (a request that ran before with the same context, a sibling sample, a program's
        earlier call), else what followed the suffix earlier in this sequence."""
        tokens = r.fill_ids  # a new list each read: built once here
        if self.prefix_cache is not None:
            cached = self.prefix_cache.continuation(tokens, k)
            if cached:
                return cached
        return self._state(r).index.propose(tokens, k)

    def _length(self, r: Req) -> int:
        """How many tokens the request may draft now (0: none this step)."""
        if r.pending_tokens != 1:  # forced tokens to feed first (jump-forward)
            return 0
        state = self._state(r)
        if state.wait > 0:
            state.wait -= 1
            return 0
        room = r.sampling_params.max_new_tokens - len(r.output_ids) - 1  # + the drawn token
        return min(state.length, room)

    def _forced_draft(self, r: Req, k: int) -> list[int]:
        """The constraint's forced text as a draft: text jump-forward would have appended
        where it is off for this request (logprobs asked for, a token restriction, or
        disabled), verified instead of decoded token by token."""
        forced = r.matcher.forced_text() if self.tokenizer is not None else ""
        if not forced:
            return []
        return list(self.tokenizer(forced, add_special_tokens=False).input_ids[:k])

    def verify(self, r: Req, picks: list[tuple], kv: Any) -> tuple[list[tuple], list[int]]:
        """A decode step's outcome for one request: of its draws (token, logprob, top) at the
        verify positions, those it keeps (the accepted draft's and the one after), and the
        accepted draft tokens. The rejected draft tokens' K/V is freed here (the newest
        token's and the accepted ones' stay)."""
        draft = r.draft_ids
        accepted = self.accept(r, draft, [tid for tid, _, _ in picks])
        kv.truncate(r, r.seq_len + accepted)
        return picks[: accepted + 1], draft[:accepted]

    def accept(self, r: Req, draft: list[int], drawn: list[int]) -> int:
        """How many of `draft` a verify step accepted, given the token drawn at each of its
        len(draft) + 1 positions; adapts the request's drafting and counts."""
        accepted = 0
        while accepted < len(draft) and drawn[accepted] == draft[accepted]:
            accepted += 1
        state = self._state(r)
        if draft:
            if accepted == len(draft):
                state.length = min(self.num_draft_tokens, state.length + 2)
            else:
                state.length = max(1, accepted + 1)
            state.misses = 0 if accepted else state.misses + 1
            state.wait = min(2**state.misses - 1, MAX_BACKOFF_STEPS)
            decided = accepted + (accepted < len(draft))
            state.kept = ACCEPT_FORGET * state.kept + accepted
            state.tried = ACCEPT_FORGET * state.tried + decided
            self.stats.decided += decided
        r.spec_verify_ct += 1
        r.spec_draft_tokens += len(draft)
        r.spec_accepted_tokens += accepted
        s = self.stats
        s.verify_steps += 1
        s.drafted += len(draft)
        s.accepted += accepted
        if draft:
            s.by_length[accepted] = s.by_length.get(accepted, 0) + 1
        return accepted

    def info(self) -> dict:
        return {
            "algorithm": self.algorithm,
            "num_draft_tokens": self.num_draft_tokens,
            "step_budget": self.step_budget,
            # measured decode-step ms by rows (None: rationed by the budget alone)
            "step_ms_by_rows": None if self.step_cost is None else self.step_cost.table_ms(),
            **(self.draft_model.info() if self.draft_model is not None else {}),
            **self.stats.as_dict(),
        }


def cost_rationing(tp_size: int) -> bool:
    """Whether drafts are rationed by measured step costs: not under tensor parallelism (each
    rank times its own steps, and the ranks must draft alike), nor with
    SGL_SPEC_COST_RATIONING=0 (the budget alone: reproducible draft counts)."""
    return tp_size == 1 and os.environ.get("SGL_SPEC_COST_RATIONING", "1") != "0"


def _grammar_prefix(matcher, draft: list[int]) -> list[int]:
    """The longest prefix of `draft` the constraint allows, stopping before a token that
    would complete it (a verify position after a complete output has nothing to draw);
    the matcher is left as it was."""
    n = 0
    for t in draft:
        if not matcher.accept(t):
            break
        n += 1
        if matcher.is_done():
            matcher.rollback(1)
            n -= 1
            break
    if n:
        matcher.rollback(n)
    return draft[:n]


def expand_rows(rows: list[int], drafts: list[list[int]]) -> list[int]:
    """Per request, the hidden-state rows of its verify positions: `rows` holds the row of
    each request's last computed token (its last draft token when it drafted)."""
    out: list[int] = []
    for row, draft in zip(rows, drafts):
        out.extend(range(row - len(draft), row + 1))
    return out
