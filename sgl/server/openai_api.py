"""OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions, /v1/models.

Requests become engine calls: chat messages are rendered with the model's own chat
template (add_generation_prompt=True) and tokenized as the engine tokenizes any prompt;
OpenAI names map to engine sampling names (max_tokens -> max_new_tokens,
response_format -> json_object / json_schema, ...). An engine error names the engine's
field; it is renamed to the field the client sent.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from itertools import repeat
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sgl.runtime.errors import InvalidRequestError
from sgl.server.encoding import JSONBody
from sgl.server.errors import APIError, from_invalid_request
from sgl.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelList,
    OpenAISamplingFields,
)
from sgl.server.state import ServerState, get_state
from sgl.server.streaming import client_gone, merge_streams, sse, sse_response, until_disconnected

router = APIRouter(prefix="/v1", tags=["openai"])
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse}, 401: {"model": ErrorResponse}, 404: {"model": ErrorResponse},
}

# engine field -> OpenAI field, for error messages
_RENAME_COMMON = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "json_schema": "response_format",
    "json_object": "response_format",
}
_RENAME_CHAT = {**_RENAME_COMMON, "prompt": "messages", "input_ids": "messages", "top_logprobs_num": "top_logprobs"}
_RENAME_COMPLETION = {**_RENAME_COMMON, "input_ids": "prompt", "top_logprobs_num": "logprobs"}

# OpenAI name -> engine name, for the values passed through as they are
_PASSTHROUGH = {
    "temperature": "temperature",
    "top_p": "top_p",
    "stop": "stop",
    "seed": "seed",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "logit_bias": "logit_bias",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_new_tokens",
    "ignore_eos": "ignore_eos",
    "stop_token_ids": "stop_token_ids",
    "skip_special_tokens": "skip_special_tokens",
    "no_stop_trim": "no_stop_trim",
    "regex": "regex",
    "ebnf": "ebnf",
}


# ---------------------------------------------------------------------------- shared helpers


def _sampling(req: OpenAISamplingFields, max_tokens: int | None, response_format: Any) -> dict[str, Any]:
    sp: dict[str, Any] = {"n": req.n}
    if max_tokens is not None:
        sp["max_new_tokens"] = max_tokens
    for theirs, ours in _PASSTHROUGH.items():
        value = getattr(req, theirs)
        if value is not None:
            sp[ours] = value
    if response_format is not None and response_format.type != "text":
        if response_format.type == "json_object":
            sp["json_object"] = True
        else:
            spec = response_format.json_schema
            if spec is None or spec.schema_ is None:
                raise APIError(400, "response_format of type json_schema needs json_schema.schema (a JSON schema object)",
                               "response_format.json_schema.schema")
            sp["json_schema"] = spec.schema_
    return sp


def _finish(meta: dict[str, Any]) -> tuple[str | None, Any]:
    """OpenAI's finish_reason ('stop' / 'length' / 'abort') and the matched stop, if any."""
    reason = meta.get("finish_reason")
    if not reason:
        return None, None
    kind = reason.get("type")
    return kind, reason.get("matched") if kind == "stop" else None


def _usage(outs: list[dict], n: int) -> dict[str, Any]:
    """Prompt (and cached) tokens once per prompt; completion tokens of every sample."""
    metas = [o["meta_info"] for o in outs]
    firsts = metas[::n]
    prompt = sum(m.get("prompt_tokens", 0) for m in firsts)
    completion = sum(m.get("completion_tokens", 0) for m in metas)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(m.get("cached_tokens", 0) for m in firsts)},
    }


def _seeded(sp: dict[str, Any], i: int) -> dict[str, Any]:
    """Sample i of n as its own n == 1 request, seeded as the engine seeds sample i."""
    one = {**sp, "n": 1}
    if sp.get("seed") is not None:
        one["seed"] = sp["seed"] + i
    return one


async def _open_streams(state: ServerState, id_lists: list[list[int]], params: list[dict[str, Any]],
                        rid: str, logprob_kwargs: dict[str, Any]) -> tuple[list[AsyncIterator[dict]], list[str]]:
    """One engine stream per (prompt, sample): the engine streams only n == 1 requests."""
    streams: list[AsyncIterator[dict]] = []
    rids: list[str] = []
    total = sum(p["n"] for p in params)
    try:
        for ids, sp in zip(id_lists, params):
            for i in range(sp["n"]):
                sub_rid = rid if total == 1 else f"{rid}-{len(rids)}"
                streams.append(await _engine_stream(state, ids, _seeded(sp, i), sub_rid, logprob_kwargs))
                rids.append(sub_rid)
    except BaseException:
        for r in rids:  # the streams opened so far are not iterated yet: abort them by id
            state.engine.abort(r)
        raise
    return streams, rids


async def _engine_stream(state: ServerState, ids: list[int], sp: dict[str, Any], rid: str,
                         logprob_kwargs: dict[str, Any]) -> AsyncIterator[dict]:
    return await state.engine.async_generate(input_ids=ids, sampling_params=sp, stream=True, rid=rid,
                                             **logprob_kwargs)


def _abort_all(state: ServerState, rids: list[str]):
    def abort() -> None:
        for r in rids:
            state.engine.abort(r)
    return abort


# ---------------------------------------------------------------------------- /v1/models


@router.get("/models", response_model=ModelList, responses=ERRORS)
async def list_models(request: Request) -> JSONBody:
    state = get_state(request)
    card = {"id": state.served_model_name, "object": "model", "created": state.created, "owned_by": "sgl",
            "root": state.model_path, "max_model_len": state.context_len}
    return JSONBody({"object": "list", "data": [card]})


# ---------------------------------------------------------------------------- chat


def _message_text(m: ChatMessage) -> str:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    return "\n".join(part.text for part in m.content)


def render_chat(state: ServerState, messages: list[ChatMessage]) -> str:
    """The prompt text: the model's chat template applied with add_generation_prompt=True."""
    msgs = [{"role": "system" if m.role == "developer" else m.role, "content": _message_text(m)} for m in messages]
    tokenizer = state.engine.tokenizer
    if getattr(tokenizer, "chat_template", None):
        try:
            return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # a template that rejects this conversation (e.g. role order)
            raise APIError(400, f"the model's chat template rejected the messages: {e}", "messages") from e
    tmpl = state.chat_template  # no template: `Role: content` lines
    text = "".join(tmpl.role_prefix(m["role"], i == 0) + m["content"] + tmpl.role_suffix(m["role"])
                   for i, m in enumerate(msgs) if m["role"] in ("system", "user", "assistant"))
    return text + tmpl.role_prefix("assistant", not msgs)


def _chat_logprobs(meta: dict[str, Any]) -> dict[str, Any]:
    def entry(lp: float | None, text: str | None) -> dict[str, Any]:
        text = text or ""
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    content = []
    tops = meta.get("output_top_logprobs") or repeat(None)
    for (lp, _tid, text), top in zip(meta.get("output_token_logprobs") or [], tops):
        content.append({**entry(lp, text), "top_logprobs": [entry(tlp, ttext) for tlp, _t, ttext in top or []]})
    return {"content": content}


@router.post("/chat/completions", response_model=ChatCompletionResponse, responses=ERRORS)
async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
    """OpenAI chat completions (also streamed as `chat.completion.chunk` events)."""
    state = get_state(request)
    state.check_model(req.model)
    if req.tools:
        raise APIError(400, "tool calling is not supported by this server", "tools")
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    engine = state.engine

    def prepare() -> list[int]:
        return engine.encode(render_chat(state, req.messages))

    ids = await asyncio.to_thread(prepare)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if max_tokens is None:
        max_tokens = state.default_max_tokens(len(ids), req.n)
    sp = _sampling(req, max_tokens, req.response_format)
    lp_kwargs = {"return_logprob": req.logprobs, "top_logprobs_num": req.top_logprobs or 0,
                 "return_text_in_logprobs": True}
    cid = f"chatcmpl-{uuid.uuid4().hex}"
    rid = req.rid or cid
    created = int(time.time())
    try:
        if req.stream:
            streams, rids = await _open_streams(state, [ids], [sp], rid, lp_kwargs)
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            events = _chat_events(streams, cid, created, state.served_model_name, req.logprobs, include_usage, req.n)
            return sse_response(request, events, _abort_all(state, rids))
        out = await until_disconnected(
            request, engine.async_generate(input_ids=ids, sampling_params=sp, rid=rid, **lp_kwargs))
    except InvalidRequestError as e:
        raise from_invalid_request(e, _RENAME_CHAT) from e
    if out is None:
        return client_gone()
    outs = out if isinstance(out, list) else [out]
    choices = []
    for i, o in enumerate(outs):
        reason, matched = _finish(o["meta_info"])
        choices.append({
            "index": i,
            "message": {"role": "assistant", "content": o["text"]},
            "logprobs": _chat_logprobs(o["meta_info"]) if req.logprobs else None,
            "finish_reason": reason,
            "matched_stop": matched,
        })
    return JSONBody({"id": cid, "object": "chat.completion", "created": created, "model": state.served_model_name,
                     "choices": choices, "usage": _usage(outs, req.n), "system_fingerprint": None})


async def _chat_events(streams: list[AsyncIterator[dict]], cid: str, created: int, model: str, logprobs: bool,
                       include_usage: bool, n: int) -> AsyncIterator[str]:
    base: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
    if include_usage:
        base["usage"] = None
    started: set[int] = set()
    finals: dict[int, dict] = {}
    async for i, chunk in merge_streams(streams):
        meta = chunk["meta_info"]
        reason, matched = _finish(meta)
        delta: dict[str, Any] = {}
        if i not in started:
            started.add(i)
            delta["role"] = "assistant"
            delta["content"] = chunk["text"]
        elif chunk["text"]:
            delta["content"] = chunk["text"]
        if not delta and reason is None:
            continue
        choice: dict[str, Any] = {"index": i, "delta": delta, "logprobs": None, "finish_reason": reason}
        if reason is not None:
            finals[i] = {"meta_info": meta}
            choice["matched_stop"] = matched
            if logprobs:  # per-token logprobs arrive with the last chunk
                choice["logprobs"] = _chat_logprobs(meta)
        yield sse({**base, "choices": [choice]})
    if include_usage:
        outs = [finals[i] for i in sorted(finals)]
        yield sse({**base, "choices": [], "usage": _usage(outs, n)})


# ---------------------------------------------------------------------------- completions


def _completion_logprobs(meta: dict[str, Any], echo: bool, top_k: int, decode: Any) -> dict[str, Any]:
    entries = list(meta.get("output_token_logprobs") or [])
    tops = list(meta.get("output_top_logprobs") or [None] * len(entries))
    if echo:
        entries = list(meta.get("input_token_logprobs") or []) + entries
        tops = list(meta.get("input_top_logprobs") or [None] * (len(entries) - len(tops))) + tops
    # The first prompt token has no logprob and comes without its text.
    tokens = [text if text is not None else decode([tid]) for _lp, tid, text in entries]
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    top_logprobs = None
    if top_k > 0:
        top_logprobs = [{(text or ""): lp for lp, _tid, text in top} if top else None for top in tops]
    return {"tokens": tokens, "token_logprobs": [lp for lp, _tid, _text in entries], "top_logprobs": top_logprobs,
            "text_offset": offsets}


@router.post("/completions", response_model=CompletionResponse, responses=ERRORS)
async def completions(req: CompletionRequest, request: Request) -> Response:
    """OpenAI text completions: a prompt (text or token ids) or a batch of them, `n` each."""
    state = get_state(request)
    state.check_model(req.model)
    engine = state.engine
    prompt = req.prompt
    if isinstance(prompt, str):
        texts: list[str] | None = [prompt]
    elif prompt and isinstance(prompt[0], str):
        texts = list(prompt)  # type: ignore[arg-type]
    else:
        texts = None
    if not prompt:
        raise APIError(400, "prompt is empty", "prompt")

    def prepare() -> tuple[list[list[int]], list[str]]:
        if texts is not None:
            return [engine.encode(t) for t in texts], texts
        id_lists = [list(prompt)] if isinstance(prompt[0], int) else [list(x) for x in prompt]  # type: ignore
        vocab = engine.model_config.vocab_size
        for ids in id_lists:
            if not ids or any(not 0 <= t < vocab for t in ids):
                raise APIError(400, f"prompt token ids must be integers in [0, {vocab}) and non-empty", "prompt")
        shown = [engine.tokenizer.decode(ids) for ids in id_lists] if req.echo else [""] * len(id_lists)
        return id_lists, shown

    id_lists, prompt_texts = await asyncio.to_thread(prepare)
    max_tokens = req.max_tokens
    params = [
        _sampling(req, max_tokens if max_tokens is not None else state.default_max_tokens(len(ids), req.n),
                  req.response_format)
        for ids in id_lists
    ]
    want_lp = req.logprobs is not None
    lp_kwargs: dict[str, Any] = {"return_logprob": want_lp, "top_logprobs_num": req.logprobs or 0,
                                 "return_text_in_logprobs": True}
    if want_lp and req.echo:
        lp_kwargs["logprob_start_len"] = 0
    cid = f"cmpl-{uuid.uuid4().hex}"
    rid = req.rid or cid
    created = int(time.time())
    n = req.n
    try:
        if req.stream:
            streams, rids = await _open_streams(state, id_lists, params, rid, lp_kwargs)
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            echoes = [prompt_texts[k // n] if req.echo else "" for k in range(len(streams))]
            events = _completion_events(streams, cid, created, state.served_model_name, req.logprobs, req.echo,
                                        echoes, include_usage, n, engine.tokenizer.decode)
            return sse_response(request, events, _abort_all(state, rids))
        batch = id_lists if len(id_lists) > 1 else id_lists[0]
        rids: Any = rid if len(id_lists) == 1 else [f"{rid}-p{k}" for k in range(len(id_lists))]
        out = await until_disconnected(request, engine.async_generate(
            input_ids=batch, sampling_params=params if len(params) > 1 else params[0], rid=rids, **lp_kwargs))
    except InvalidRequestError as e:
        raise from_invalid_request(e, _RENAME_COMPLETION) from e
    if out is None:
        return client_gone()
    outs = out if isinstance(out, list) else [out]
    choices = []
    for k, o in enumerate(outs):
        reason, matched = _finish(o["meta_info"])
        lead = prompt_texts[k // n] if req.echo else ""
        choices.append({
            "index": k,
            "text": lead + o["text"],
            "logprobs": _completion_logprobs(o["meta_info"], req.echo, req.logprobs or 0,
                                             engine.tokenizer.decode) if want_lp else None,
            "finish_reason": reason,
            "matched_stop": matched,
        })
    return JSONBody({"id": cid, "object": "text_completion", "created": created, "model": state.served_model_name,
                     "choices": choices, "usage": _usage(outs, n), "system_fingerprint": None})


async def _completion_events(streams: list[AsyncIterator[dict]], cid: str, created: int, model: str,
                             logprobs: int | None, echo: bool, echoes: list[str], include_usage: bool, n: int,
                             decode: Any) -> AsyncIterator[str]:
    base: dict[str, Any] = {"id": cid, "object": "text_completion", "created": created, "model": model}
    if include_usage:
        base["usage"] = None
    started: set[int] = set()
    finals: dict[int, dict] = {}
    async for i, chunk in merge_streams(streams):
        meta = chunk["meta_info"]
        reason, matched = _finish(meta)
        text = chunk["text"]
        if i not in started:
            started.add(i)
            text = echoes[i] + text
        if not text and reason is None:
            continue
        choice: dict[str, Any] = {"index": i, "text": text, "logprobs": None, "finish_reason": reason}
        if reason is not None:
            finals[i] = {"meta_info": meta}
            choice["matched_stop"] = matched
            if logprobs is not None:
                choice["logprobs"] = _completion_logprobs(meta, echo, logprobs, decode)
        yield sse({**base, "choices": [choice]})
    if include_usage:
        outs = [finals[i] for i in sorted(finals)]
        yield sse({**base, "choices": [], "usage": _usage(outs, n)})
