"""The native API: `POST /generate` (the engine's result dict, as JSON or SSE) and
`POST /tokenize`. The remote DSL backend is a thin client of these two."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any, Union

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sgl.runtime.results import merge_logprobs
from sgl.server.encoding import JSONBody
from sgl.server.errors import APIError
from sgl.server.protocol import (
    ConcateAndAppendReqInput,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    GenerateChunk,
    GenerateOutput,
    GenerateReqInput,
    SuccessResponse,
    TokenizeRequest,
    TokenizeResponse,
    error_responses,
    sse_responses,
)
from sgl.server.state import get_state
from sgl.server.streaming import client_gone, sse, sse_response, until_disconnected

router = APIRouter(tags=["native"])
GENERATE_RESPONSES = {
    **sse_responses(
        GenerateChunk,
        ErrorResponse,
        description="The result dict (a list of them for a batch or n > 1); "
        "with `stream: true`, server-sent events of the results so far, then `[DONE]` (an error "
        "after "
        'the stream started is an `{"error"}` event).',
    ),
    **error_responses(400, 404, descriptions={404: "`session_params.id` names no open session."}),
}


@router.post(
    "/generate",
    response_model=Union[GenerateOutput, list[GenerateOutput]],  # noqa: UP007 (runtime value)
    responses=GENERATE_RESPONSES,
)
async def generate(req: GenerateReqInput, request: Request) -> Response:
    """Generate for one prompt (a result dict) or a batch / n > 1 (a list of them).

    With `stream: true` the response is server-sent events `data: {...}`, each the engine's
    chunk with the *cumulative* `text` and `output_ids` so far (as SGLang's /generate), then
    `data: [DONE]`. A batch or n > 1 streams too: the chunks of all its requests interleave,
    each with `index`, the request's place in the flattened (prompt, sample) list (prompt k's
    sample i is k * n + i); each request's last chunk has meta_info.finish_reason.
    """
    state = get_state(request)
    if (req.text is None) == (req.input_ids is None):
        raise APIError(400, "give exactly one of text and input_ids", "text")
    unsupported = req.unsupported_sglang_field()
    if unsupported is not None:
        raise APIError(
            400,
            f"{unsupported} is not supported by sgl (no LoRA adapters, multimodal input, "
            "hidden-state, "
            "byte or entropy output, custom logit processors, background requests, prefill-decode "
            "disaggregation; a worker is one data-parallel rank); leave it null / false",
            unsupported,
        )
    kwargs = dict(
        input_ids=req.input_ids,
        return_logprob=req.return_logprob,
        logprob_start_len=req.logprob_start_len,
        top_logprobs_num=req.top_logprobs_num,
        return_text_in_logprobs=req.return_text_in_logprobs,
        session_params=req.session_params.model_dump() if req.session_params is not None else None,
    )
    if not req.stream:
        out = await until_disconnected(
            request,
            state.engine.async_generate(req.text, req.sampling_params, rid=req.rid, **kwargs),
        )
        return client_gone() if out is None else JSONBody(_count_logprobs(out))
    rid = req.rid if req.rid is not None else _new_rids(req)
    chunks = await state.engine.async_generate(
        req.text, req.sampling_params, rid=rid, stream=True, **kwargs
    )
    rids = rid if isinstance(rid, list) else [rid]
    return sse_response(request, _cumulative(chunks), lambda: [state.engine.abort(r) for r in rids])


@router.post(
    "/concate_and_append_request", response_model=SuccessResponse, responses=error_responses(400)
)
async def concate_and_append_request(req: ConcateAndAppendReqInput) -> JSONBody:
    """SGLang's frontend calls this when forks join with `mode="concate_and_append"`, after
    it appended the forks' texts to the parent's text itself. SGLang splices the forks' KV
    (each encoded apart, "parallel encoding") onto the parent's; sgl's engine keeps no KV per
    request id to splice, so the join is a text concatenation: the parent's next /generate
    prefills the joined text, its prefix (the parent's, and the first fork's) reused from the
    radix cache. The answer is the same as a text join (where SGLang's statements do not attend
    to each other), and the call succeeds so SGLang's program goes on."""
    return JSONBody(
        {
            "success": True,
            "message": "joined as text: the next request prefills it through the radix cache",
        }
    )


def _count_logprobs(out: dict | list) -> dict | list:
    """SGLang's `output_token_logprobs_length` beside the output logprob entries (how many so
    far, streamed), wherever they are returned."""
    for item in out if isinstance(out, list) else [out]:
        meta = item.get("meta_info") or {}
        if "output_token_logprobs" in meta:
            meta["output_token_logprobs_length"] = len(meta["output_token_logprobs"])
    return out


def _new_rids(req: GenerateReqInput) -> str | list[str]:
    """Request ids the handler knows, so an abandoned stream can be aborted by id even before
    it started (n > 1 samples are aborted with their prompt's id)."""
    batch = (
        req.text
        if isinstance(req.text, list)
        else req.input_ids
        if req.input_ids and isinstance(req.input_ids[0], list)
        else None
    )
    return uuid.uuid4().hex if batch is None else [uuid.uuid4().hex for _ in batch]


async def _cumulative(chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
    """The engine's chunks (text, ids and logprob entries since the request's previous chunk)
    as SSE events with each request's text, ids and logprob entries so far; several
    requests' chunks keep their "index"."""
    texts: dict[Any, str] = {}
    ids: dict[Any, list[int]] = {}
    logprobs: dict[Any, dict[str, list]] = {}
    try:
        async for chunk in chunks:
            i = chunk.get("index")
            texts[i] = texts.get(i, "") + chunk["text"]
            ids.setdefault(i, []).extend(chunk["output_ids"])
            meta = chunk["meta_info"]
            if (
                "output_token_logprobs" in meta
            ):  # the entries so far, like the text (as SGLang streams them)
                meta = {
                    **meta,
                    **merge_logprobs(logprobs.setdefault(i, {}), meta),
                }  # (serialized at once)
                _count_logprobs({"meta_info": meta})
            out: dict[str, Any] = {"text": texts[i], "output_ids": list(ids[i]), "meta_info": meta}
            if i is not None:
                out["index"] = i
            yield sse(out)
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


@router.post(
    "/tokenize",
    response_model=TokenizeResponse,
    response_model_exclude_none=True,
    responses=error_responses(400),
)
@router.post(
    "/v1/tokenize",
    response_model=TokenizeResponse,
    response_model_exclude_none=True,
    responses=error_responses(400),
    include_in_schema=False,
)
async def tokenize(req: TokenizeRequest, request: Request) -> JSONBody:
    """Token ids exactly as the engine tokenizes prompts. Ours: `{"text"}` ->
    `{"input_ids"}`; SGLang's and vLLM's: `{"prompt"}` or `{"messages"}` ->
    `{"tokens", "count", "max_model_len"}`."""
    state = get_state(request)
    engine = state.engine
    if req.text is not None:
        return JSONBody(
            {"input_ids": await asyncio.to_thread(_encode_each, engine, req.text, True)}
        )
    if req.messages is not None:
        from sgl.server.openai_api import chat_messages

        gen = True if req.add_generation_prompt is None else req.add_generation_prompt
        prompt: str | list[str] = engine.render_messages(
            chat_messages(req.messages), add_generation_prompt=gen
        )
        special = (
            req.add_special_tokens and "add_special_tokens" in req.model_fields_set
        )  # the template has BOS
    else:
        prompt, special = req.prompt, req.add_special_tokens  # type: ignore[assignment]
    tokens = await asyncio.to_thread(_encode_each, engine, prompt, special)
    count = len(tokens) if isinstance(prompt, str) else [len(t) for t in tokens]
    return JSONBody({"tokens": tokens, "count": count, "max_model_len": state.context_len})


def _encode_each(engine: Any, text: str | list[str], add_special_tokens: bool) -> Any:
    if isinstance(text, str):
        return engine.encode(text, add_special_tokens=add_special_tokens)
    return [engine.encode(t, add_special_tokens=add_special_tokens) for t in text]


@router.post("/detokenize", response_model=DetokenizeResponse, responses=error_responses(400))
@router.post(
    "/v1/detokenize",
    response_model=DetokenizeResponse,
    responses=error_responses(400),
    include_in_schema=False,
)
async def detokenize(req: DetokenizeRequest, request: Request) -> JSONBody:
    """SGLang's and vLLM's `{"tokens"}` -> the text, under SGLang's name (`text`) and vLLM's
    (`prompt`)."""
    engine = get_state(request).engine
    skip = req.skip_special_tokens
    vocab = (
        engine.model_config.vocab_size
    )  # checked before decoding, as /v1/completions echo checks them
    for i in (t for row in req.tokens for t in (row if isinstance(row, list) else [row])):
        if not 0 <= i < vocab:
            raise APIError(
                400, f"token id {i} is outside the vocabulary [0, {vocab})", param="tokens"
            )
    if req.tokens and isinstance(req.tokens[0], list):
        text: Any = await asyncio.to_thread(
            lambda: [engine.decode(t, skip_special_tokens=skip) for t in req.tokens]
        )
    else:
        text = await asyncio.to_thread(engine.decode, req.tokens, skip)
    return JSONBody({"text": text, "prompt": text})
