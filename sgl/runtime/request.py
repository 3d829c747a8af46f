"""`Req`: the scheduler's record of one request. It holds the caller's `GenerateRequest`
by reference and adds only what the scheduler changes: KV state, outputs, decoding state.
Only the scheduler thread touches it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sgl.runtime.messages import FinishReason, GenerateRequest, LogprobOptions, RequestStats
from sgl.runtime.sampling import SamplingParams


@dataclass(eq=False)  # identity semantics: requests are compared and removed by object
class Req:
    request: GenerateRequest
    origin_input_ids: list[int]  # the prompt the model sees (a session turn: history + new input)
    created_at: float = field(default_factory=time.monotonic)

    output_ids: list[int] = field(default_factory=list)
    # KV state. `kv_len` tokens of `fill_ids` have K/V in the pool at row `pool_row`;
    # the first `prefix_len` of them belong to the prefix cache (locked at `last_node`).
    pool_row: int | None = None
    kv_len: int = 0
    prefix_len: int = 0
    last_node: Any = None
    cached_tokens: int | None = None
    num_retractions: int = 0
    # BatchBuilder.admissions when the scheduler's policy first ordered it (the starvation bound)
    queued_at_admission: int | None = None

    matcher: Any = None  # the constraint's per-request matcher (sgl.constrained)
    detokenizer: Any = None
    stop_matcher: Any = None
    stop_regex_matcher: Any = None  # StopRegexMatcher when sampling_params.stop_regex is set
    text: str = ""
    # Forced at admission (jump-forward from the constraint's start state): already in
    # output_ids, sent to the caller with the first sampled token.
    unsent_forced_ids: list[int] = field(default_factory=list)
    unsent_forced_text: str = ""
    # Streamed with stream_interval > 1: what the next event carries, and tokens held since the
    # last.
    unsent_stream: Any = None
    tokens_held: int = 0
    finish: FinishReason | None = None
    first_token_at: float | None = None
    # Speculative decoding: the tokens drafted for this step (verified with its newest token),
    # the drafting state (speculative/speculator.py) and the counts meta_info reports.
    draft_ids: list[int] = field(default_factory=list)
    spec: Any = None
    spec_verify_ct: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0

    input_logprobs_done: bool = False
    input_logprobs_sent: bool = False  # the prompt's entries went out (with the first event)
    input_token_logprobs: list[tuple] = field(default_factory=list)
    input_top_logprobs: list[list[tuple] | None] = field(default_factory=list)
    output_token_logprobs: list[tuple] = field(default_factory=list)
    output_top_logprobs: list[list[tuple] | None] = field(default_factory=list)

    # ---- the caller's request, read through
    @property
    def rid(self) -> str:
        return self.request.rid

    @property
    def parent_rid(self) -> str | None:
        return self.request.parent_rid

    @property
    def sampling_params(self) -> SamplingParams:
        return self.request.sampling_params

    @property
    def logprobs(self) -> LogprobOptions:
        return self.request.logprobs

    @property
    def stream(self) -> bool:
        return self.request.stream

    @property
    def session_id(self) -> str | None:
        return self.request.session.id if self.request.session is not None else None

    # ---- derived
    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def pending_tokens(self) -> int:
        """Tokens without K/V yet: 1 for a plain decode, more after a jump-forward."""
        return self.seq_len - self.kv_len

    def stats(self, now: float | None = None) -> RequestStats:
        now = time.monotonic() if now is None else now
        return RequestStats(
            prompt_tokens=len(self.origin_input_ids),
            completion_tokens=len(self.output_ids),
            cached_tokens=self.cached_tokens or 0,
            e2e_latency=now - self.created_at,
            ttft=None if self.first_token_at is None else self.first_token_at - self.created_at,
            num_retractions=self.num_retractions,
            spec_verify_ct=self.spec_verify_ct,
            spec_draft_tokens=self.spec_draft_tokens,
            spec_accepted_tokens=self.spec_accepted_tokens,
        )
