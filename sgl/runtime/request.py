"""The dataclasses that cross the boundary between callers and the scheduler thread.

Callers build a `GenerateRequest` (already tokenized and validated) and receive
`ReqEvent`s through a `ResultSink`; the scheduler owns the mutable `Req` state.
"""

from __future__ import annotations

import asyncio
import queue
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from sgl.runtime.sampling import SamplingParams


@dataclass
class GenerateRequest:
    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    return_text_in_logprobs: bool = False
    parent_rid: str | None = None  # the caller's rid when this is one of n > 1 samples
    grammar: Any = None  # compiled constraint (regex / json_schema / ebnf), see sgl.constrained
    session_id: str | None = None  # the open session this request is a turn of (sgl.runtime.session)


@dataclass
class ReqEvent:
    """One step's news for one request: new text and ids; `meta_info` and `finished` at the end."""

    rid: str
    text: str
    output_ids: list[int]
    finished: bool = False
    meta_info: dict[str, Any] | None = None
    error: BaseException | None = None
    # Logprob entries added in this step (only when return_logprob).
    output_token_logprobs: list[tuple] = field(default_factory=list)
    output_top_logprobs: list[list[tuple] | None] = field(default_factory=list)


class ResultSink(Protocol):
    def put(self, event: ReqEvent) -> None: ...


class QueueSink:
    """Delivers events to a thread blocked on `get`."""

    def __init__(self) -> None:
        self.queue: queue.Queue[ReqEvent] = queue.Queue()

    def put(self, event: ReqEvent) -> None:
        self.queue.put(event)

    def get(self, timeout: float | None = None) -> ReqEvent:
        return self.queue.get(timeout=timeout)


class AsyncSink:
    """Delivers events into an asyncio queue owned by the caller's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[ReqEvent] = asyncio.Queue()

    def put(self, event: ReqEvent) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the caller's loop is gone; nobody is listening
            pass


def finish_stop(matched: int | str | None) -> dict[str, Any]:
    return {"type": "stop", "matched": matched}


def finish_length(length: int) -> dict[str, Any]:
    return {"type": "length", "length": length}


def finish_abort(message: str) -> dict[str, Any]:
    return {"type": "abort", "message": message}


@dataclass
class Req:
    """Scheduler-side state of one request. Only the scheduler thread touches it."""

    rid: str
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    sink: ResultSink
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    return_text_in_logprobs: bool = False
    parent_rid: str | None = None
    session_id: str | None = None
    created_at: float = field(default_factory=time.monotonic)

    output_ids: list[int] = field(default_factory=list)
    # KV state. `kv_len` tokens of `fill_ids` have K/V in the pool at row `pool_row`;
    # the first `prefix_len` of them belong to the radix tree (locked at `last_node`).
    pool_row: int | None = None
    kv_len: int = 0
    prefix_len: int = 0
    last_node: Any = None
    cached_tokens: int | None = None
    num_retractions: int = 0

    generator: torch.Generator | None = None
    grammar: Any = None  # compiled constraint (sgl.constrained Grammar) or None
    matcher: Any = None  # its per-request matcher
    detokenizer: Any = None
    stop_matcher: Any = None
    text: str = ""
    # Forced at admission (jump-forward from the constraint's start state): already in
    # output_ids, sent to the caller with the first sampled token.
    unsent_forced_ids: list[int] = field(default_factory=list)
    unsent_forced_text: str = ""
    finished_reason: dict[str, Any] | None = None
    first_token_at: float | None = None

    input_logprobs_done: bool = False
    input_token_logprobs: list[tuple] = field(default_factory=list)
    input_top_logprobs: list[list[tuple] | None] = field(default_factory=list)
    output_token_logprobs: list[tuple] = field(default_factory=list)
    output_top_logprobs: list[list[tuple] | None] = field(default_factory=list)

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
