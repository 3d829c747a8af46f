"""The OpenAI-compatible API: chat and text completions (with tools and response formats),
their streamed chunks, and /v1/models.

The sampling fields beyond OpenAI's own come from the parameter table (see `.sampling`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from sgl.server.protocol.common import PERSON_SCHEMA_EXAMPLE, _StrictLenient
from sgl.server.protocol.sampling import v1_extension_fields

CHAT_EXAMPLES = [
    {
        "model": "default",
        "messages": [
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": "Name a color."},
        ],
        "max_tokens": 8,
        "temperature": 0,
    },
    {
        "messages": [{"role": "user", "content": "Count to three."}],
        "max_tokens": 8,
        "n": 2,
        "seed": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": True,
        "top_logprobs": 2,
    },
    {
        "messages": [{"role": "user", "content": "What is the weather in Rome?"}],
        "max_tokens": 8,
        "stream": True,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            }
        ],
        "tool_choice": "auto",
    },
    {
        "messages": [{"role": "user", "content": "Ada Lovelace, born 1815."}],
        "max_tokens": 8,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON_SCHEMA_EXAMPLE},
        },
    },
]
COMPLETION_EXAMPLES = [
    {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0},
    {
        "prompt": ["Once upon a time", "In a galaxy far away"],
        "max_tokens": 8,
        "stream": True,
        "echo": True,
        "logprobs": 2,
        "stream_options": {"include_usage": True},
    },
]


class ContentPart(_StrictLenient):
    type: Literal["text"]
    text: str


class FunctionCall(_StrictLenient):
    name: str
    arguments: str | dict[str, Any] = Field(
        description="The arguments as JSON text (or an object)."
    )


class ToolCall(_StrictLenient):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_StrictLenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = Field(None, description="An assistant message's calls.")
    tool_call_id: str | None = Field(None, description="A tool message: the call it answers.")
    reasoning_content: str | None = None


class FunctionDefinition(_StrictLenient):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = Field(
        None, description="A JSON schema; the arguments are constrained to it."
    )
    strict: bool | None = Field(
        None, description="Accepted; arguments are always constrained to the parameters."
    )


class Tool(_StrictLenient):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_StrictLenient):
    name: str


class NamedToolChoice(_StrictLenient):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaFormat(_StrictLenient):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_StrictLenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_StrictLenient):
    include_usage: bool = False


class _OpenAIFields(_StrictLenient):
    """OpenAI's own fields of chat and text completions (the extensions come from the table)."""

    model: str | None = Field(None, description="The served model name (or 'default').")
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = Field(1, ge=1, le=128)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    rid: str | None = None


OpenAISamplingFields = create_model(
    "OpenAISamplingFields",
    __base__=_OpenAIFields,
    __doc__="Sampling fields shared by chat and text completions "
    "(OpenAI's plus the engine's extras).",
    __module__=__name__,
    **v1_extension_fields(),
)


class ChatCompletionRequest(OpenAISamplingFields):
    model_config = ConfigDict(json_schema_extra={"examples": CHAT_EXAMPLES})

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(
        None, description="Functions the model may call (see tool_choice)."
    )
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None,
        description="'auto' (the default with tools): text or calls; 'required': calls only; "
        "a named function: one call to it; 'none': no calls parsed. Calls are constrained to the "
        "format's syntax and each function's parameters.",
    )
    parallel_tool_calls: bool | None = Field(
        None, description="False: at most one call (default true)."
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description='Extra variables for the chat template, e.g. {"enable_thinking": false}.'
    )
    separate_reasoning: bool = Field(
        True, description="With a reasoning parser: reasoning in reasoning_content."
    )


class CompletionRequest(OpenAISamplingFields):
    model_config = ConfigDict(json_schema_extra={"examples": COMPLETION_EXAMPLES})

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    response_format: ResponseFormat | None = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()


class TopLogprob(BaseModel):
    token: str
    logprob: float | None
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    matched_stop: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int] = []


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    matched_stop: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "sgl"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ToolCallDeltaFunction(BaseModel):
    name: str | None = None
    arguments: str


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ToolCallDeltaFunction


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    matched_stop: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice] = Field(
        description="One choice's delta; empty in the final usage event."
    )
    usage: Usage | None = Field(
        None, description="With stream_options.include_usage: null, then the totals."
    )


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    matched_stop: int | str | None = None


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice] = Field(
        description="One choice's new text; empty in the final usage event."
    )
    usage: Usage | None = Field(
        None, description="With stream_options.include_usage: null, then the totals."
    )
