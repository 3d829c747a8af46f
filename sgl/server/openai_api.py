"""OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions, /v1/models.

Each request is one engine call: chat passes its `messages` (the engine renders them with
the model's chat template), completions pass their prompts as they are (text or token
ids), and `n`, its seeds and streaming of several choices are the engine's. OpenAI names
map to engine sampling names (max_tokens -> max_new_tokens, response_format ->
json_object / json_schema, ...); an unset max_tokens is max_new_tokens=None, "as many as
fit". An engine error names the engine's field; it is renamed to the field the client sent.
Chat and text completions share one builder of choices and usage (whole and streamed),
told what differs: a message or text, and the logprob format.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sgl.runtime.errors import InvalidRequestError
from sgl.runtime.results import LOGPROB_KEYS, merge_logprobs
from sgl.server.encoding import JSONBody
from sgl.server.errors import APIError, from_invalid_request
from sgl.server.openai_logprobs import achat_logprobs, completion_logprobs_for
from sgl.server.openai_tools import (
    ChoiceOutput,
    ToolRequest,
    constrain_after_reasoning,
    history_as_text,
    history_for_template,
    parse_tools,
    template_takes_tools,
    tool_constraint,
)
from sgl.server.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    NamedToolChoice,
    OpenAISamplingFields,
    error_responses,
    sse_responses,
)
from sgl.server.protocol.sampling import V1_TO_ENGINE
from sgl.server.state import ServerState, get_state
from sgl.server.streaming import client_gone, sse, sse_response, until_disconnected

router = APIRouter(prefix="/v1", tags=["openai"])
_NO_MODEL = {404: "`model` names a model this server does not serve."}
_STREAMED = (
    "; with `stream: true`, server-sent events of {}, then `[DONE]` (an error after the stream "
    "started is "
    'an `{{"error"}}` event).'
)
CHAT_RESPONSES = {
    **sse_responses(
        ChatCompletionChunk,
        ErrorResponse,
        description="The completion" + _STREAMED.format("`chat.completion.chunk` objects"),
    ),
    **error_responses(400, 404, descriptions=_NO_MODEL),
}
COMPLETION_RESPONSES = {
    **sse_responses(
        CompletionChunk,
        ErrorResponse,
        description="The completion" + _STREAMED.format("`text_completion` chunks"),
    ),
    **error_responses(400, 404, descriptions=_NO_MODEL),
}

# engine field -> OpenAI field, for error messages
_RENAME_COMMON = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "json_schema": "response_format",
    "json_object": "response_format",
}
_RENAME_CHAT = {
    **_RENAME_COMMON,
    "prompt": "messages",
    "input_ids": "messages",
    "top_logprobs_num": "top_logprobs",
}
_RENAME_COMPLETION = {**_RENAME_COMMON, "input_ids": "prompt", "top_logprobs_num": "logprobs"}

# /v1 field -> engine name (from the parameter table); max_tokens and n are read by hand.
_PASSTHROUGH = {v1: name for v1, name in V1_TO_ENGINE.items() if v1 not in ("max_tokens", "n")}


# ---------------------------------------------------------------------------- shared helpers


def _sampling(
    req: OpenAISamplingFields, max_tokens: int | None, response_format: Any
) -> dict[str, Any]:
    """The engine's sampling params. max_tokens None: max_new_tokens None, which the engine
    reads as "as many as fit in the context (and the KV pool, shared by the n samples)"."""
    sp: dict[str, Any] = {"n": req.n, "max_new_tokens": max_tokens}
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
                raise APIError(
                    400,
                    "response_format of type json_schema needs json_schema.schema (a JSON schema "
                    "object)",
                    "response_format.json_schema.schema",
                )
            sp["json_schema"] = spec.schema_
    return sp


def _finish(meta: dict[str, Any]) -> tuple[str | None, Any]:
    """OpenAI's finish_reason ('stop' / 'length' / 'abort') and the matched stop, if any."""
    reason = meta.get("finish_reason")
    if not reason:
        return None, None
    kind = reason.get("type")
    return kind, reason.get("matched") if kind == "stop" else None


def _usage(metas: list[dict], n: int) -> dict[str, Any]:
    """Prompt (and cached) tokens once per prompt; completion tokens of every sample. `metas`
    are in the engine's order: prompt k's sample i at k * n + i."""
    firsts = metas[::n]
    prompt = sum(m.get("prompt_tokens", 0) for m in firsts)
    completion = sum(m.get("completion_tokens", 0) for m in metas)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(m.get("cached_tokens", 0) for m in firsts)},
    }


@dataclass
class _Choices:
    """How one endpoint's engine results become OpenAI choices, whole or streamed. Chat and
    text completions differ only in what is given here."""

    object: str  # the response's `object`
    chunk_object: str  # a streamed event's `object`
    chat: bool  # the text goes in `message` / `delta` (chat) or in `text` (completions)
    n: int  # samples per prompt: choice k * n + i is prompt k's sample i
    # meta_info -> the choice's logprobs; None: not asked for (awaited: it may decode off the loop)
    logprobs: Callable[[dict[str, Any]], Awaitable[Any]] | None = None
    leads: list[str] = field(
        default_factory=list
    )  # text before each prompt's choices (completions' echo)
    # chat: a choice's text -> message fields (tool calls, reasoning); None: the text is the content
    output: Callable[[], ChoiceOutput] | None = None
    _outputs: dict[int, ChoiceOutput] = field(default_factory=dict)

    def lead(self, index: int) -> str:
        return self.leads[index // self.n] if self.leads else ""

    def _output(self, index: int) -> ChoiceOutput | None:
        if self.output is None:
            return None
        if index not in self._outputs:
            self._outputs[index] = self.output()
        return self._outputs[index]

    def whole(self, index: int, text: str) -> dict[str, Any]:
        if self.chat:
            out = self._output(index)
            return {
                "message": out.whole(text)
                if out is not None
                else {"role": "assistant", "content": text}
            }
        return {"text": self.lead(index) + text}

    def piece(self, index: int, text: str, first: bool, last: bool) -> dict[str, Any]:
        """A streamed choice's new text; empty when there is nothing new to send."""
        if self.chat:
            out = self._output(index)
            fields = out.feed(text, last) if out is not None else {"content": text} if text else {}
            if first:  # the first event of a choice carries the role (and its text, even if empty)
                return {"delta": {"role": "assistant", "content": "", **fields}}
            return {"delta": fields} if fields else {}
        text = self.lead(index) + text if first else text
        return {"text": text} if text else {}

    def finish_reason(self, index: int, reason: str | None) -> str | None:
        """'tool_calls' for a choice that stopped after making calls."""
        out = self._output(index)
        return "tool_calls" if reason == "stop" and out is not None and out.calls else reason

    async def choice_logprobs(self, meta: dict[str, Any]) -> Any:
        return await self.logprobs(meta) if self.logprobs is not None else None

    async def response(self, head: dict[str, Any], outs: list[dict]) -> dict[str, Any]:
        choices = []
        for index, out in enumerate(outs):
            meta = out["meta_info"]
            reason, matched = _finish(meta)
            whole = self.whole(index, out["text"])
            choices.append(
                {
                    "index": index,
                    **whole,
                    "logprobs": await self.choice_logprobs(meta),
                    "finish_reason": self.finish_reason(index, reason),
                    "matched_stop": matched,
                }
            )
        return {
            **head,
            "object": self.object,
            "choices": choices,
            "usage": _usage([o["meta_info"] for o in outs], self.n),
            "system_fingerprint": None,
        }

    async def events(
        self, head: dict[str, Any], chunks: AsyncIterator[dict], include_usage: bool
    ) -> AsyncIterator[str]:
        """The engine's chunks (one call: all choices interleaved, each with its "index") as
        SSE events of one choice each; then the usage event if asked for."""
        base: dict[str, Any] = {**head, "object": self.chunk_object}
        if include_usage:
            base["usage"] = None
        started: set[int] = set()
        finals: dict[int, dict] = {}
        held: dict[int, dict] = {}  # logprob entries of chunks that had no text to send yet
        try:
            async for chunk in chunks:
                index = chunk.get("index", 0)  # a single request's chunks have no index
                meta = chunk["meta_info"]
                reason, matched = _finish(meta)
                piece = self.piece(index, chunk["text"], index not in started, reason is not None)
                started.add(index)
                if "output_token_logprobs" in meta:
                    meta = {**meta, **merge_logprobs(held.pop(index, {}), meta)}
                if not piece and reason is None:
                    if "output_token_logprobs" in meta:
                        held[index] = {k: meta[k] for k in LOGPROB_KEYS if k in meta}
                    continue
                if not piece:
                    piece = {"delta": {}} if self.chat else {"text": ""}
                # Each event carries the logprobs of its own tokens, as OpenAI streams them.
                choice: dict[str, Any] = {
                    "index": index,
                    **piece,
                    "logprobs": await self.choice_logprobs(meta),
                    "finish_reason": self.finish_reason(index, reason),
                }
                if reason is not None:
                    finals[index] = meta
                    choice["matched_stop"] = matched
                yield sse({**base, "choices": [choice]})
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
        if include_usage:
            yield sse(
                {
                    **base,
                    "choices": [],
                    "usage": _usage([finals[i] for i in sorted(finals)], self.n),
                }
            )


async def _complete(
    request: Request,
    state: ServerState,
    choices: _Choices,
    cid: str,
    rid: str | list[str],
    stream: bool,
    include_usage: bool,
    rename: dict[str, str],
    **engine_kwargs: Any,
) -> Response:
    """One engine call for the whole request (every prompt and sample), answered whole or
    streamed."""
    head = {"id": cid, "created": int(time.time()), "model": state.served_model_name}
    engine = state.engine
    try:
        if stream:
            chunks = await engine.async_generate(rid=rid, stream=True, **engine_kwargs)
            rids = (
                rid if isinstance(rid, list) else [rid]
            )  # an abandoned stream is aborted by id, even unstarted
            return sse_response(
                request,
                choices.events(head, chunks, include_usage),
                lambda: [engine.abort(r) for r in rids],
            )
        out = await until_disconnected(request, engine.async_generate(rid=rid, **engine_kwargs))
    except InvalidRequestError as e:
        raise from_invalid_request(e, rename) from e
    if out is None:
        return client_gone()
    return JSONBody(await choices.response(head, out if isinstance(out, list) else [out]))


def _include_usage(req: OpenAISamplingFields) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


# ---------------------------------------------------------------------------- /v1/models


@router.get("/models", response_model=ModelList, responses=error_responses())
async def list_models(request: Request) -> JSONBody:
    state = get_state(request)
    return JSONBody({"object": "list", "data": [_model_card(state)]})


@router.get("/models/{model_id:path}", response_model=ModelCard, responses=error_responses(404))
async def retrieve_model(model_id: str, request: Request) -> JSONBody:
    """OpenAI's retrieve model: the served model's card; 404 for any other id."""
    state = get_state(request)
    if model_id != state.served_model_name:
        raise APIError(
            404,
            f"The model '{model_id}' does not exist; this server serves "
            f"'{state.served_model_name}'",
            param="model",
        )
    return JSONBody(_model_card(state))


def _model_card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.served_model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "sgl",
        "root": state.model_path,
        "max_model_len": state.context_len,
    }


# ---------------------------------------------------------------------------- chat


def _message_text(m: ChatMessage) -> str:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    return "\n".join(part.text for part in m.content)


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The conversation as the engine takes it: developer is system; content parts joined;
    an assistant's tool calls and a tool message's call id kept."""
    out = []
    for m in messages:
        msg: dict[str, Any] = {
            "role": "system" if m.role == "developer" else m.role,
            "content": _message_text(m),
        }
        if m.tool_calls:
            msg["tool_calls"] = [c.model_dump() for c in m.tool_calls]
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.name is not None and m.role == "tool":
            msg["name"] = m.name
        out.append(msg)
    return out


@router.post("/chat/completions", response_model=ChatCompletionResponse, responses=CHAT_RESPONSES)
async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
    """OpenAI chat completions (also streamed as `chat.completion.chunk` events)."""
    state = get_state(request)
    state.check_model(req.model)
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    tools = parse_tools(
        [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None,
        req.tool_choice.model_dump()
        if isinstance(req.tool_choice, NamedToolChoice)
        else req.tool_choice,
        req.parallel_tool_calls,
    )
    thinking = (req.chat_template_kwargs or {}).get("enable_thinking", True) is not False
    sampling, rename = _chat_sampling(req, state, tools, thinking)
    parser = state.tool_call_parser if tools is not None and tools.choice != "none" else None
    reasoning = state.reasoning_parser if req.separate_reasoning and thinking else None
    validators = tools.validators() if parser else None
    choices = _Choices(
        "chat.completion",
        "chat.completion.chunk",
        chat=True,
        n=req.n,
        logprobs=achat_logprobs if req.logprobs else None,
        output=(lambda: ChoiceOutput(parser, reasoning, validators))
        if parser or reasoning
        else None,
    )
    try:
        prompt = await asyncio.to_thread(
            _render_chat, state, chat_messages(req.messages), tools, req.chat_template_kwargs
        )
    except InvalidRequestError as e:
        raise from_invalid_request(e, rename) from e
    cid = f"chatcmpl-{uuid.uuid4().hex}"
    return await _complete(
        request,
        state,
        choices,
        cid,
        req.rid or cid,
        req.stream,
        _include_usage(req),
        rename,
        prompt=prompt,
        sampling_params=sampling,
        return_logprob=req.logprobs,
        top_logprobs_num=req.top_logprobs or 0,
        return_text_in_logprobs=True,
    )


def _chat_sampling(
    req: ChatCompletionRequest, state: ServerState, tools: ToolRequest | None, thinking: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """The engine's sampling params (tool calls as a structural tag; with a reasoning model
    every constraint after its reasoning) and the renames of its fields for errors."""
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    sampling = _sampling(req, max_tokens, req.response_format)
    rename = _RENAME_CHAT
    if tools is not None:
        tag, tag_fields = tool_constraint(tools, state.tool_call_parser)
        if tag is not None:
            if "json_schema" in sampling or "json_object" in sampling:
                raise APIError(
                    400,
                    "response_format cannot be combined with tools (the calls are constrained "
                    "already); use tool_choice 'none' to constrain the text",
                    "response_format",
                )
            sampling["structural_tag"] = tag
            rename = {**rename, **tag_fields}
    if state.reasoning_parser is not None and thinking:
        rename = {**rename, **constrain_after_reasoning(sampling)}
    return sampling, rename


def _render_chat(
    state: ServerState,
    messages: list[dict[str, Any]],
    tools: ToolRequest | None,
    template_kwargs: dict[str, Any] | None,
) -> str:
    """The prompt: the model's template with the tools where it takes them; else the tools
    in a system message and the calls and results written as text."""
    engine = state.engine
    if template_takes_tools(engine.tokenizer):
        return engine.render_messages(
            history_for_template(messages),
            tools=list(tools.given) if tools is not None else None,
            template_kwargs=template_kwargs,
        )
    return engine.render_messages(
        history_as_text(messages, tools, state.tool_call_parser), template_kwargs=template_kwargs
    )


# ---------------------------------------------------------------------------- completions


@router.post("/completions", response_model=CompletionResponse, responses=COMPLETION_RESPONSES)
async def completions(req: CompletionRequest, request: Request) -> Response:
    """OpenAI text completions: a prompt (text or token ids) or a batch of them, `n` each."""
    state = get_state(request)
    state.check_model(req.model)
    engine = state.engine
    prompt = req.prompt
    if not prompt:
        raise APIError(400, "prompt is empty", "prompt")
    texts = isinstance(prompt, str) or isinstance(prompt[0], str)
    batch = not isinstance(prompt, str) and not isinstance(prompt[0], int)
    count = len(prompt) if batch else 1
    leads: list[str] = []
    if req.echo:  # the prompt's text before each choice: as sent, or the token ids decoded
        if texts:
            leads = list(prompt) if batch else [prompt]  # type: ignore[list-item]
        else:
            id_lists = list(prompt) if batch else [prompt]
            vocab = (
                engine.model_config.vocab_size
            )  # checked before decoding, as the engine checks them
            if any(not 0 <= t < vocab for ids in id_lists for t in ids):  # type: ignore[union-attr]
                raise APIError(400, f"prompt token ids must be integers in [0, {vocab})", "prompt")
            leads = await asyncio.to_thread(lambda: [engine.decode(list(ids)) for ids in id_lists])
    want_lp = req.logprobs is not None
    lp_kwargs: dict[str, Any] = {
        "return_logprob": want_lp,
        "top_logprobs_num": req.logprobs or 0,
        "return_text_in_logprobs": True,
    }
    if want_lp and req.echo:
        lp_kwargs["logprob_start_len"] = 0
    choices = _Choices(
        "text_completion",
        "text_completion",
        chat=False,
        n=req.n,
        leads=leads,
        logprobs=completion_logprobs_for(engine, req.echo, req.logprobs or 0) if want_lp else None,
    )
    cid = f"cmpl-{uuid.uuid4().hex}"
    rid = req.rid or cid
    return await _complete(
        request,
        state,
        choices,
        cid,
        rid if count == 1 else [f"{rid}-p{k}" for k in range(count)],
        req.stream,
        _include_usage(req),
        _RENAME_COMPLETION,
        **({"prompt": prompt} if texts else {"input_ids": prompt}),
        sampling_params=_sampling(req, req.max_tokens, req.response_format),
        **lp_kwargs,
    )
