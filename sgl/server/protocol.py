"""Request and response bodies (pydantic v2), so /docs and /openapi.json describe the real API.

Request models are strict: a string where a number belongs, or a number where a boolean
belongs, is a 400 rather than a silent conversion. Native requests reject unknown fields
(a typo should not be ignored); OpenAI requests ignore fields this server does not use,
as newer clients send more than older servers know. Ranges of sampling values are checked
by the engine, whose error names the field.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

# ---------------------------------------------------------------------------- common


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class _StrictLenient(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class SuccessResponse(BaseModel):
    success: bool
    message: str | None = None


# ---------------------------------------------------------------------------- native


class SessionParams(_Strict):
    """Make a /generate request a turn of an open session (see /open_session)."""

    id: str = Field(description="The session id /open_session returned.")
    rid: str | None = Field(None, description="Continue this earlier finished turn: its prompt and output tokens "
                            "come before this request's input. Null: start from this request's input alone.")
    offset: int | None = Field(None, description="Keep only this many tokens of that history (Python slice).")
    drop_previous_output: bool = Field(False, description="Continue from the earlier turn's prompt, without its output.")
    replace: bool | None = Field(None, description="Accepted for SGLang clients; only false/null (true is refused).")


class OpenSessionReqInput(_Strict):
    capacity_tokens: int | None = Field(None, description="Most tokens (history + input + max_new_tokens) one turn "
                                        "may use; default: the context length.")
    capacity_of_str_len: int | None = Field(None, description="Accepted for SGLang clients; unused (capacity is "
                                            "counted in tokens).")
    session_id: str | None = Field(None, description="Choose the id; default: a random one.")
    timeout: float | None = Field(None, description="Seconds without use before the session closes itself "
                                  "(default 600, at most 86400).", allow_inf_nan=False)


class CloseSessionReqInput(_Strict):
    session_id: str


class GenerateReqInput(_Strict):
    """`POST /generate`: one prompt or a batch, as text or token ids."""

    text: Union[str, list[str], None] = Field(None, description="A prompt or a batch of prompts.")
    input_ids: Union[list[int], list[list[int]], None] = Field(None, description="Token ids instead of text.")
    sampling_params: Union[dict[str, Any], list[dict[str, Any]], None] = Field(
        None, description="Engine sampling parameters (max_new_tokens, temperature, stop, regex, json_schema, ...); "
        "one dict for all prompts or one per prompt.")
    stream: bool = Field(False, description="Server-sent events with cumulative text; a batch or n > 1 "
                         "interleaves its requests' chunks, each with `index` (prompt k, sample i: k * n + i).")
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    rid: Union[str, list[str], None] = Field(None, description="Request id(s), usable with /abort_request.")
    session_params: SessionParams | None = Field(None, description="Run as a turn of an open session.")
    # SGLang's other fields: accepted with their "off" value (what its clients send); anything
    # else is refused by the handler, naming the field (sgl has no LoRA, multimodal input,
    # hidden-state output or custom logit processors).
    log_metrics: bool = Field(True, description="SGLang's; metrics are always recorded (ignored).")
    return_hidden_states: bool = Field(False, description="SGLang's; only false.")
    token_ids_logprob: Any = Field(None, description="SGLang's; only null.")
    lora_path: Any = Field(None, description="SGLang's; only null.")
    custom_logit_processor: Any = Field(None, description="SGLang's; only null.")
    image_data: Any = Field(None, description="SGLang's; only null (text models).")
    video_data: Any = Field(None, description="SGLang's; only null.")
    audio_data: Any = Field(None, description="SGLang's; only null.")
    input_embeds: Any = Field(None, description="SGLang's; only null.")
    modalities: Any = Field(None, description="SGLang's; only null.")

    def unsupported_sglang_field(self) -> str | None:
        """The first SGLang-only field set to something sgl does not do, or None."""
        if self.return_hidden_states:
            return "return_hidden_states"
        for name in ("token_ids_logprob", "lora_path", "custom_logit_processor", "image_data", "video_data",
                     "audio_data", "input_embeds", "modalities"):
            if getattr(self, name) not in (None, [], [None]):
                return name
        return None


class GenerateOutput(BaseModel):
    """The engine's result dict (a list of them for a batch or n > 1)."""

    text: str
    output_ids: list[int]
    meta_info: dict[str, Any] = Field(
        description="id, prompt_tokens, completion_tokens, cached_tokens, finish_reason, e2e_latency, ttft, "
        "and logprobs when asked for.")


class TokenizeRequest(_Strict):
    text: Union[str, list[str]]


class TokenizeResponse(BaseModel):
    input_ids: Union[list[int], list[list[int]]]


class AbortRequest(_Strict):
    rid: str


class ProfileReqInput(_StrictLenient):
    """`POST /start_profile` (SGLang's fields; others it sends are ignored)."""

    output_dir: str | None = Field(None, description="A subdirectory of the server's --profile-dir for the traces.")
    num_steps: int | None = Field(None, description="Stop by itself after this many forward steps.")
    activities: list[str] | None = Field(None, description='"CPU" and/or "GPU" (default: both where there is a GPU).')
    record_shapes: bool = False
    with_stack: bool = False


class RunProgramRequest(_StrictLenient):
    """`POST /run_program`: shipped programs (see sgl.server.programs and sgl.lang.ir_json)."""

    program: dict[str, Any] | None = Field(None, description="One program's IR: {format_version, nodes}.")
    programs: list[dict[str, Any]] | None = Field(None, description="A batch of programs, run concurrently.")
    arguments: dict[str, Any] | list[dict[str, Any]] | None = Field(
        None, description="Values of the IR's argument nodes: one object, or one per program; a list with "
                          "`program` runs that program once per object (the batch form, answered with a list).")
    sampling: dict[str, Any] | None = Field(None, description="The run's sampling and logprob defaults.")
    stream: bool = Field(False, description="One program: SSE events {var, text}, then {result}.")


class ChatRoles(BaseModel):
    prefix: dict[str, str]
    suffix: dict[str, str]
    default_system: str


class ModelInfo(BaseModel):
    model_path: str
    served_model_name: str
    is_generation: bool = True
    vocab_size: int
    context_length: int
    eos_token_ids: list[int]
    bos_token_id: int | None = None
    chat_roles: ChatRoles
    supports_sessions: bool = Field(True, description="/open_session, /close_session and session_params work.")


class HealthResponse(BaseModel):
    status: str


# ---------------------------------------------------------------------------- OpenAI


class ContentPart(_StrictLenient):
    type: Literal["text"]
    text: str


class FunctionCall(_StrictLenient):
    name: str
    arguments: Union[str, dict[str, Any]] = Field(description="The arguments as JSON text (or an object).")


class ToolCall(_StrictLenient):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_StrictLenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = Field(None, description="An assistant message's calls.")
    tool_call_id: str | None = Field(None, description="A tool message: the call it answers.")
    reasoning_content: str | None = None


class FunctionDefinition(_StrictLenient):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="A JSON schema; the arguments are constrained to it.")
    strict: bool | None = Field(None, description="Accepted; arguments are always constrained to the parameters.")


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


class OpenAISamplingFields(_StrictLenient):
    """Sampling fields shared by chat and text completions (OpenAI's plus the engine's extras)."""

    model: str | None = Field(None, description="The served model name (or 'default').")
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = Field(1, ge=1, le=128)
    stop: Union[str, list[str], None] = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # Extensions (as in SGLang / vLLM).
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    regex: str | None = None
    ebnf: str | None = None
    budget_aware: bool | None = Field(
        None, description="Constrained output: finish a complete member within max_tokens when one fits (default true).")
    rid: str | None = None


class ChatCompletionRequest(OpenAISamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(None, description="Functions the model may call (see tool_choice).")
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = Field(
        None, description="'auto' (the default with tools): text or calls; 'required': calls only; a named "
                          "function: one call to it; 'none': no calls parsed. Calls are constrained to the "
                          "format's syntax and each function's parameters.")
    parallel_tool_calls: bool | None = Field(None, description="False: at most one call (default true).")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Extra variables for the chat template, e.g. {\"enable_thinking\": false}.")
    separate_reasoning: bool = Field(True, description="With a reasoning parser: reasoning in reasoning_content.")


class CompletionRequest(OpenAISamplingFields):
    prompt: Union[str, list[str], list[int], list[list[int]]]
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
    matched_stop: Union[int, str, None] = None


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
    matched_stop: Union[int, str, None] = None


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


# ---------------------------------------------------------------------------- extraction


class ExtractRequest(_Strict):
    """`POST /v1/extract`: pull data matching `schema` out of `text` or a conversation."""

    model: str | None = None
    text: str | None = Field(None, description="The text to extract from (or give `messages`).")
    messages: list[ChatMessage] | None = Field(None, description="A conversation to extract from.")
    schema_: dict[str, Any] = Field(alias="schema", description="The JSON schema the answer must match.")
    instructions: str | None = Field(None, description="Replaces the default extraction instructions.")
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, description="Default 0 (greedy).")
    seed: int | None = None


class ExtractResponse(BaseModel):
    data: Any = Field(description="A JSON value valid against the schema.")
    usage: Usage
