"""From what a caller passes to `Engine.generate` to validated `GenerateRequest`s, in named
steps: normalize the inputs, check that each prompt fits, compile its constraint, expand
n > 1 into seeded samples. Runs on the caller's thread (a slow compile never stalls the
scheduler); every error is an InvalidRequestError naming the field."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sgl.runtime.errors import InvalidRequestError, RequestTooLargeError
from sgl.runtime.messages import GenerateRequest, LogprobOptions
from sgl.runtime.sampling import SamplingParams
from sgl.runtime.session import SessionParams


@dataclass
class Inputs:
    """One call's prompts, normalized: token ids, params and rid per prompt."""

    id_lists: list[list[int]]
    params: list[SamplingParams]
    rids: list[str]
    is_batch: bool  # the caller passed a list, so gets a list back
    session: SessionParams | None = None


def normalize_inputs(
    prompt: Any,
    input_ids: Any,
    sampling_params: Any,
    rid: Any,
    session_params: Any,
    encode: Callable[[str], list[int]],
    vocab_size: int,
) -> Inputs:
    if (prompt is None) == (input_ids is None):
        raise InvalidRequestError("give exactly one of prompt (text) and input_ids", param="prompt")
    if prompt is not None:
        is_batch = isinstance(prompt, (list, tuple))
        texts = list(prompt) if is_batch else [prompt]
        for t in texts:
            if not isinstance(t, str):
                raise InvalidRequestError(
                    f"prompt must be a string or a list of strings, got {type(t).__name__}",
                    "prompt",
                )
        id_lists = [encode(t) for t in texts]
    else:
        if not isinstance(input_ids, (list, tuple)):
            raise InvalidRequestError(
                "input_ids must be a list of ints or a list of lists", "input_ids"
            )
        is_batch = bool(input_ids) and isinstance(input_ids[0], (list, tuple))
        id_lists = [list(x) for x in input_ids] if is_batch else [list(input_ids)]
    n = len(id_lists)
    if n == 0:
        raise InvalidRequestError("the batch is empty", param="prompt")
    for ids in id_lists:
        if any(
            not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size for t in ids
        ):
            raise InvalidRequestError(
                f"input_ids must be integers in [0, {vocab_size})", "input_ids"
            )
    return Inputs(
        id_lists,
        _params(sampling_params, n, vocab_size),
        _rids(rid, n),
        is_batch,
        _session(session_params, n),
    )


def _params(sampling_params: Any, n: int, vocab_size: int) -> list[SamplingParams]:
    if isinstance(sampling_params, (list, tuple)):
        if len(sampling_params) != n:
            raise InvalidRequestError(
                f"sampling_params has {len(sampling_params)} entries for {n} prompts",
                "sampling_params",
            )
        given = list(sampling_params)
    else:
        given = [sampling_params] * n
    out = []
    for sp in given:
        p = (
            dataclasses.replace(sp)
            if isinstance(sp, SamplingParams)
            else SamplingParams.from_dict(sp)
        )
        out.append(p.validate(vocab_size))
    return out


def _rids(rid: Any, n: int) -> list[str]:
    if rid is None:
        return [uuid.uuid4().hex for _ in range(n)]
    rids = list(rid) if isinstance(rid, (list, tuple)) else [rid]
    if len(rids) != n:
        raise InvalidRequestError(f"rid has {len(rids)} entries for {n} prompts", "rid")
    if any(not isinstance(r, str) or not r for r in rids):
        raise InvalidRequestError(
            "rid must be a non-empty string (or a list of them for a batch)", "rid"
        )
    if len(set(rids)) != len(rids):
        raise InvalidRequestError("rid values must be unique within a batch", "rid")
    return rids


def _session(session_params: Any, n: int) -> SessionParams | None:
    if session_params is None:
        return None
    session = SessionParams.from_any(session_params)
    if n != 1:
        raise InvalidRequestError("session_params takes one prompt, not a batch", "session_params")
    return session


def logprob_options(
    return_logprob: bool,
    logprob_start_len: int,
    top_logprobs_num: Any,
    with_text: bool,
    vocab_size: int,
) -> LogprobOptions:
    if (
        not isinstance(top_logprobs_num, int)
        or isinstance(top_logprobs_num, bool)
        or not 0 <= top_logprobs_num <= vocab_size
    ):
        raise InvalidRequestError(
            f"top_logprobs_num must be an integer in [0, {vocab_size}], got {top_logprobs_num!r}",
            "top_logprobs_num",
        )
    if not return_logprob:
        return LogprobOptions()
    return LogprobOptions(True, logprob_start_len, top_logprobs_num, with_text)


def check_limits(inputs: Inputs, logprobs: LogprobOptions, cfg: Any) -> None:
    """The configured size limits (EngineConfig.max_*): past one, a RequestTooLargeError that
    names the field, the limit and the option that raises it."""
    for ids, p in zip(inputs.id_lists, inputs.params):
        if cfg.max_prompt_tokens is not None and len(ids) > cfg.max_prompt_tokens:
            raise RequestTooLargeError(
                f"the prompt has {len(ids)} tokens; this server takes at most "
                f"{cfg.max_prompt_tokens} (max_prompt_tokens)",
                "prompt",
            )
        if p.n > cfg.max_n:
            raise RequestTooLargeError(
                f"n is {p.n}; this server takes at most {cfg.max_n} (max_n)", "n"
            )
        limit = cfg.max_new_tokens_limit
        if limit is not None and p.max_new_tokens is not None and p.max_new_tokens > limit:
            raise RequestTooLargeError(
                f"max_new_tokens is {p.max_new_tokens}; this server takes at most {limit} "
                "(max_new_tokens_limit)",
                "max_new_tokens",
            )
    if logprobs.enabled and logprobs.top_n > cfg.max_top_logprobs:
        raise RequestTooLargeError(
            f"top_logprobs_num is {logprobs.top_n}; this server takes at most "
            f"{cfg.max_top_logprobs} (max_top_logprobs)",
            "top_logprobs_num",
        )
    count = sum(p.n for p in inputs.params)
    if cfg.max_in_flight is not None and count > cfg.max_in_flight:
        raise RequestTooLargeError(
            f"the request makes {count} generations (prompts x n); at most "
            f"{cfg.max_in_flight} can be in flight (max_running_requests + "
            "max_queued_requests): split it",
            "prompt",
        )


def check_fit(
    ids: list[int],
    p: SamplingParams,
    logprobs: LogprobOptions,
    context_len: int,
    capacity: int,
    max_new_tokens_limit: int | None = None,
) -> None:
    """The prompt (a session turn: with its history) and its new tokens fit the context and the
    KV pool. max_new_tokens None ("as many as fit", up to `max_new_tokens_limit`) is resolved
    here, in place."""
    if not ids:
        raise InvalidRequestError("the prompt is empty: give at least one token", "prompt")
    if len(ids) >= context_len:
        raise InvalidRequestError(
            f"the prompt has {len(ids)} tokens; the context length is {context_len}", "prompt"
        )
    if p.max_new_tokens is None:
        p.max_new_tokens = max(
            0,
            min(
                context_len - len(ids),
                (capacity - 1 - len(ids)) // p.n,
                max_new_tokens_limit or context_len,
            ),
        )
        p.min_new_tokens = min(p.min_new_tokens, p.max_new_tokens)
    if len(ids) + p.max_new_tokens > context_len:
        raise InvalidRequestError(
            f"prompt ({len(ids)} tokens) + max_new_tokens ({p.max_new_tokens}) exceeds the "
            "context length "
            f"{context_len}; lower max_new_tokens",
            "max_new_tokens",
        )
    if len(ids) + p.max_new_tokens * p.n > capacity - 1:
        raise InvalidRequestError(
            f"prompt ({len(ids)} tokens) + max_new_tokens ({p.max_new_tokens}) x n ({p.n}) does "
            "not fit in the "
            f"KV pool ({capacity} tokens); lower max_new_tokens or raise max_total_tokens",
            "max_new_tokens",
        )
    if logprobs.enabled and logprobs.start_len >= len(ids):
        raise InvalidRequestError(
            f"logprob_start_len ({logprobs.start_len}) must be < the prompt length ({len(ids)})",
            "logprob_start_len",
        )


def constraint_of(p: SamplingParams) -> tuple[str, Any] | None:
    """(kind, spec) of the request's constraint, or None."""
    if p.regex is not None:
        return "regex", p.regex
    if p.json_schema is not None:
        return "json_schema", p.json_schema
    if p.ebnf is not None:
        return "ebnf", p.ebnf
    if p.structural_tag is not None:
        return "structural_tag", p.structural_tag
    if p.json_object:
        return "json_object", ""
    return None


def expand_n(
    rid: str,
    ids: list[int],
    p: SamplingParams,
    logprobs: LogprobOptions,
    stream: bool,
    session: SessionParams | None,
) -> list[GenerateRequest]:
    """One request per sample: n > 1 gives rids `rid-i`, each seeded `seed + i` when seeded."""
    if p.n == 1:
        return [GenerateRequest(rid, ids, p, logprobs, stream, None, session)]
    return [
        GenerateRequest(
            f"{rid}-{i}",
            ids,
            dataclasses.replace(p, n=1, seed=None if p.seed is None else p.seed + i),
            logprobs,
            stream,
            rid,
            session,
        )
        for i in range(p.n)
    ]


def check_unique(reqs: list[GenerateRequest], rids: list[str]) -> None:
    if len(reqs) > len(rids) and len({r.rid for r in reqs} | set(rids)) != len(reqs) + len(rids):
        raise InvalidRequestError(
            "rid values (and their n > 1 sample ids rid-i) must be unique", "rid"
        )
