"""What crosses the boundary between callers and the scheduler: plain, picklable dataclasses.

Callers send `SchedulerMessage`s through a transport (transport.py: a queue to a thread, or
a pipe to a process); the scheduler answers with lists of `SchedulerOutput`s: `ReqEvent`s
(per request), `Reply`s (per query, matched by `reply_id`) and `EngineFaulted` (once, when a
step failed). Nothing here holds a lock, a queue, a callable, a tensor or a compiled
grammar: a constraint travels as its spec in the sampling params and is compiled where it is
used, by the scheduler (grammar_queue.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from sgl.runtime.sampling import SamplingParams
from sgl.runtime.session import SessionParams


@dataclass(frozen=True)
class LogprobOptions:
    """What logprobs a request asks for. `start_len` < 0: no prompt logprobs."""

    enabled: bool = False
    start_len: int = -1
    top_n: int = 0
    with_text: bool = False  # each entry carries the token's text


NO_LOGPROBS = LogprobOptions()


@dataclass
class GenerateRequest:
    """One sample of one prompt, tokenized and validated by the engine."""

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams  # n == 1: the engine expands n > 1 into one request per sample
    logprobs: LogprobOptions = NO_LOGPROBS
    stream: bool = False
    parent_rid: str | None = None  # the caller's rid when this is one of n > 1 samples
    session: SessionParams | None = None  # the open session this request is a turn of


@dataclass(frozen=True)
class FinishReason:
    """Why a request ended. `to_dict` is the public form (meta_info.finish_reason)."""

    type: str  # stop | length | abort
    matched: int | str | None = None  # stop: the stop token id or string (None: EOS-free stop)
    length: int | None = None  # length: the limit reached
    message: str | None = None  # abort: why
    incomplete: bool = False  # length: a constrained output cut short of a complete member

    @classmethod
    def stop(cls, matched: int | str | None) -> FinishReason:
        return cls("stop", matched=matched)

    @classmethod
    def of_length(cls, length: int, incomplete: bool = False) -> FinishReason:
        return cls("length", length=length, incomplete=incomplete)

    @classmethod
    def abort(cls, message: str) -> FinishReason:
        return cls("abort", message=message)

    @property
    def is_abort(self) -> bool:
        return self.type == "abort"

    def to_dict(self) -> dict[str, Any]:
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            if self.incomplete:  # with budget_aware on: even the shortest completion did not fit
                return {"type": "length", "length": self.length, "incomplete": True}
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message}


@dataclass
class RequestStats:
    """Counts and timings of one request, as meta_info reports them."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    e2e_latency: float
    ttft: float | None = None
    num_retractions: int = 0
    spec_verify_ct: int = 0  # decode steps under speculative decoding (SGLang's name)
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0


@dataclass
class ReqEvent:
    """One step's news for one request: new text and ids; `finish` set on the last event."""

    rid: str
    text: str
    output_ids: list[int]
    stats: RequestStats
    finish: FinishReason | None = None
    error: BaseException | None = None  # InvalidRequestError: the caller's fault; else the engine's
    # Logprob entries: added this step (streamed), or all of them (the final non-streamed event).
    output_token_logprobs: list[tuple] = field(default_factory=list)
    output_top_logprobs: list[list[tuple] | None] = field(default_factory=list)
    input_token_logprobs: list[tuple] | None = None  # with the request's first event only
    input_top_logprobs: list[list[tuple] | None] | None = None
    logprob_top_n: int | None = (
        None  # the request asked for logprobs (with this many top entries); else None
    )

    @property
    def finished(self) -> bool:
        return self.finish is not None


# ---------------------------------------------------------------------------- inbox messages


@dataclass
class SubmitRequest:
    request: GenerateRequest


@dataclass
class AbortRequest:
    rid: str  # a request id, or the parent id of n > 1 samples
    message: str = "aborted by request"


@dataclass
class OpenSession:
    reply_id: str
    capacity_tokens: int | None = None
    session_id: str | None = None
    timeout: float | None = None


@dataclass
class CloseSession:
    reply_id: str | None  # None: nobody waits for the answer
    session_id: str


@dataclass
class FlushCache:
    reply_id: str


@dataclass
class GetInfo:
    reply_id: str


@dataclass
class Profile:
    """Start (`options`: StepProfiler.start's arguments) or stop (`options` None) the profiler."""

    reply_id: str
    options: dict[str, Any] | None = None


@dataclass
class UpdateOptions:
    """Change engine options that may change while running (`LIVE_OPTIONS`), between steps."""

    reply_id: str
    values: dict[str, Any]


LIVE_OPTIONS = ("disable_jump_forward",)


@dataclass
class Shutdown:
    pass


SchedulerMessage = Union[  # noqa: UP007 (runtime value)
    SubmitRequest,
    AbortRequest,
    OpenSession,
    CloseSession,
    FlushCache,
    GetInfo,
    Profile,
    UpdateOptions,
    Shutdown,
]


@dataclass
class Reply:
    """The answer to a query message: `value`, or `error` raised in the caller."""

    reply_id: str
    value: Any = None
    error: BaseException | None = None


@dataclass
class EngineFaulted:
    """A step failed (logged under `incident`): the engine refuses new requests from now on."""

    incident: str


SchedulerOutput = Union[ReqEvent, Reply, EngineFaulted]  # noqa: UP007 (runtime value)
