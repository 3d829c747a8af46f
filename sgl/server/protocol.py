"""Request and response bodies (pydantic v2), so /docs and /openapi.json describe the real API.

Request models are strict: a string where a number belongs, or a number where a boolean
belongs, is a 400 rather than a silent conversion. Native requests reject unknown fields
(a typo should not be ignored); OpenAI requests ignore fields this server does not use,
as newer clients send more than older servers know. Ranges of sampling values are checked
by the engine, whose error names the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, WithJsonSchema, field_validator, model_validator

# ---------------------------------------------------------------------------- common


def _not_unicode_at(value: Any) -> str | None:
    """Where in `value` (a parsed JSON value) a string is not valid Unicode: a lone surrogate,
    which JSON's `\\ud800` escapes can carry and nothing downstream (tokenizer, file names,
    the JSON of the answer) can take. "" for `value` itself, None if every string is valid."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return path
        elif isinstance(v, dict):
            for k, x in v.items():
                stack.append((k, path))
                stack.append((x, f"{path}.{k}" if path else str(k)))
        elif isinstance(v, list):
            stack.extend((x, f"{path}.{i}" if path else str(i)) for i, x in enumerate(v))
    return None


class _ValidUnicode(BaseModel):
    """Request bodies whose strings are all valid Unicode (a 400 naming the field, not a 500 later)."""

    @field_validator("*", mode="before")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        where = _not_unicode_at(value)
        if where is not None:
            raise ValueError(f"a string{' at ' + where if where else ''} is not valid Unicode (it has a lone "
                             "surrogate such as \\ud800)")
        return value


class _Strict(_ValidUnicode):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class _StrictLenient(_ValidUnicode):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


def exactly_one_of(*fields: str) -> dict[str, Any]:
    """`json_schema_extra` of a model that takes exactly one of `fields` (set, not null)."""
    return {"oneOf": [{"required": [f], "properties": {f: {"not": {"type": "null"}}}} for f in fields]}


# Request examples (in /docs, and the first bodies a schema-driven fuzzer sends): short
# generations, whole and streamed.
_PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "born": {"type": "integer"}},
           "required": ["name", "born"]}
_PROGRAM = {"format_version": 1, "nodes": [
    {"type": "text", "text": "Q: What is 2 + 2?\nA:"},
    {"type": "gen", "name": "answer", "sampling": {"max_new_tokens": 8, "temperature": 0}, "logprobs": {},
     "dtype": None},
]}
GENERATE_EXAMPLES = [
    {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
    {"text": ["1, 2, 3,", "a, b, c,"], "sampling_params": {"max_new_tokens": 8, "n": 2, "temperature": 0.7, "seed": 1},
     "stream": True, "return_logprob": True, "top_logprobs_num": 2, "return_text_in_logprobs": True},
]
CHAT_EXAMPLES = [
    {"model": "default", "messages": [{"role": "system", "content": "You answer in one word."},
                                      {"role": "user", "content": "Name a color."}], "max_tokens": 8, "temperature": 0},
    {"messages": [{"role": "user", "content": "Count to three."}], "max_tokens": 8, "n": 2, "seed": 1, "stream": True,
     "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2},
    {"messages": [{"role": "user", "content": "What is the weather in Rome?"}], "max_tokens": 8, "stream": True,
     "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
         "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
     "tool_choice": "auto"},
    {"messages": [{"role": "user", "content": "Ada Lovelace, born 1815."}], "max_tokens": 8,
     "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": _PERSON}}},
]
COMPLETION_EXAMPLES = [
    {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0},
    {"prompt": ["Once upon a time", "In a galaxy far away"], "max_tokens": 8, "stream": True, "echo": True,
     "logprobs": 2, "stream_options": {"include_usage": True}},
]
RUN_PROGRAM_EXAMPLES = [
    {"program": _PROGRAM, "stream": True},
    {"program": _PROGRAM, "arguments": [{}, {}]},
]
EXTRACT_EXAMPLES = [
    {"text": "Ada Lovelace was born in 1815.", "schema": _PERSON, "max_tokens": 64},
]


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


# ---------------------------------------------------------------------------- declared error statuses

_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.", "required": True,
                                "schema": {"type": "integer", "minimum": 0}}}
ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "Invalid request: malformed JSON, a field of the wrong type, or a value the engine refuses "
         "(`param` names the field).",
    401: "Missing or invalid API key (a server started with --api-key): send `Authorization: Bearer <key>`.",
    404: "Not found (`param` names what).",
    413: "Too large: the body is over --max-request-bytes, or the request over a size limit (prompt tokens, "
         "max tokens, n, top logprobs).",
    422: "Unprocessable.",
    429: "At capacity (too many requests in flight): retry after `Retry-After` seconds.",
    503: "Draining (shutting down) or the engine failed: retry after `Retry-After` seconds, on another replica "
         "or on this one once restarted.",
}
# What any route may answer whatever it does: the API key check, the body size cap, admission
# (the queue bound) and draining / an engine fault (sgl.server.auth, sgl.server.lifecycle).
COMMON_ERROR_STATUSES = (401, 413, 429, 503)


def error_responses(*statuses: int, descriptions: dict[int, str] | None = None, needs_key: bool = True,
                    media_type: str | None = None) -> dict[int | str, dict[str, Any]]:
    """A route's `responses=`: the statuses every route may answer (COMMON_ERROR_STATUSES; without
    401 for a route open without the key) plus `statuses`, each an `ErrorResponse` (429 and 503
    with `Retry-After`). `descriptions` replaces the generic text of a status (say what 404 is
    about). `media_type`: the route's own success media type when it is not JSON (errors are
    JSON all the same; FastAPI would otherwise declare them under the route's type)."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in sorted({*COMMON_ERROR_STATUSES, *statuses} - (set() if needs_key else {401})):
        text = (descriptions or {}).get(status, ERROR_DESCRIPTIONS[status])
        entry: dict[str, Any] = {"description": text}
        if media_type is None or media_type == "application/json":
            entry["model"] = ErrorResponse
        else:
            entry["content"] = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
        if status in (429, 503):
            entry["headers"] = dict(_RETRY_AFTER)
        out[status] = entry
    return out


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


class ConcateAndAppendReqInput(_Strict):
    """SGLang's `fork(...).join(mode="concate_and_append")`: the forks' request ids and the parent's."""

    src_rids: list[str] = Field(min_length=1, description="The forks' request ids (SGLang's StreamExecutor sids).")
    dst_rid: str = Field(description="The parent program's request id.")


# For the schema only: the engine checks `sampling_params` itself (sgl.runtime.sampling.SamplingParams,
# whose errors name the field); these must stay its fields, types and ranges.
class SamplingParamsSpec(BaseModel):
    """/generate's sampling parameters (SGLang's names); unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int | None = Field(128, ge=0, description="Null: as many as fit in the context.")
    min_new_tokens: int = Field(0, ge=0, description="At most max_new_tokens.")
    stop: Union[str, list[str], None] = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="Token ids below the vocabulary size.")
    temperature: float = Field(1.0, ge=0, description="0: greedy.")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, description="-1 or 0: off.")
    min_p: float = Field(0.0, ge=0, le=1)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0, description="1: off.")
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[Annotated[str, Field(pattern=r"^[0-9]+$")], float] | None = Field(
        None, description="Token id (below the vocabulary size) -> a bias added to its logit.")
    seed: int | None = None
    n: int = Field(1, ge=1, description="Samples per prompt.")
    regex: str | None = Field(None, description="At most one of regex, json_schema, ebnf and structural_tag.")
    json_schema: Union[str, dict[str, Any], None] = Field(None, description="A JSON schema (or its JSON text).")
    ebnf: str | None = None
    json_object: bool = False
    budget_aware: bool = Field(True, description="Constrained output: finish a complete member within "
                               "max_new_tokens when one fits.")
    stop_regex: Union[str, list[str], None] = None
    sampling_seed: int | None = Field(None, description="SGLang's name for seed.")
    stream_interval: int | None = Field(None, ge=1, description="Streamed: a chunk every this many tokens.")
    structural_tag: Union[str, dict[str, Any], None] = None
    custom_params: dict[str, Any] | None = Field(None, description="SGLang's; ignored.")


_SAMPLING_SPEC = TypeAdapter(SamplingParamsSpec).json_schema()
_SAMPLING_PARAMS_SCHEMA = {
    "anyOf": [_SAMPLING_SPEC, {"type": "array", "items": _SAMPLING_SPEC}, {"type": "null"}],
    "description": "Engine sampling parameters; one object for all prompts or one per prompt.",
}


class GenerateReqInput(_Strict):
    """`POST /generate`: one prompt or a batch, as text or token ids."""

    model_config = ConfigDict(json_schema_extra={**exactly_one_of("text", "input_ids"), "examples": GENERATE_EXAMPLES})

    text: Union[str, list[str], None] = Field(None, description="A prompt or a batch of prompts.")
    input_ids: Union[list[int], list[list[int]], None] = Field(None, description="Token ids instead of text.")
    # Checked by the engine (its errors name the field); the schema lists the keys.
    sampling_params: Annotated[Union[dict[str, Any], list[dict[str, Any]], None],
                               WithJsonSchema(_SAMPLING_PARAMS_SCHEMA)] = None
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
    # What the sglang-router and SGLang 0.5 clients add: ignored (one model, one rank, no
    # priorities, request logging set by the server's --log-requests), or only their "off" value.
    model: str | None = Field(None, description="The router's; ignored (one model).")
    no_logs: bool = Field(False, description="SGLang's; ignored (--log-requests decides).")
    priority: int | None = Field(None, description="SGLang's; ignored (no priority scheduling).")
    extra_key: str | None = Field(None, description="SGLang's; ignored.")
    conversation_id: str | None = Field(None, description="SGLang's; ignored.")
    label: str | None = Field(None, description="SGLang's; ignored.")
    custom_labels: dict[str, Any] | None = Field(None, description="SGLang's; ignored.")
    data_parallel_rank: int | None = Field(None, description="SGLang's; only null or 0 (a worker is one rank).")
    routed_dp_rank: int | None = Field(None, description="SGLang's; only null or 0.")
    background: bool = Field(False, description="SGLang's; only false.")
    return_bytes: bool = Field(False, description="SGLang's; only false.")
    return_entropy: bool = Field(False, description="SGLang's; only false.")
    lora_id: Any = Field(None, description="SGLang's; only null.")
    bootstrap_host: Any = Field(None, description="SGLang's (prefill-decode disaggregation); only null.")
    bootstrap_port: Any = Field(None, description="SGLang's; only null.")
    bootstrap_room: Any = Field(None, description="SGLang's; only null.")
    bootstrap_pair_key: Any = Field(None, description="SGLang's; only null.")

    def unsupported_sglang_field(self) -> str | None:
        """The first SGLang-only field set to something sgl does not do, or None."""
        for name in ("return_hidden_states", "background", "return_bytes", "return_entropy"):
            if getattr(self, name):
                return name
        for name in ("data_parallel_rank", "routed_dp_rank"):
            if getattr(self, name) not in (None, 0):
                return name
        for name in ("token_ids_logprob", "lora_path", "lora_id", "custom_logit_processor", "image_data", "video_data",
                     "audio_data", "input_embeds", "modalities", "bootstrap_host", "bootstrap_port", "bootstrap_room",
                     "bootstrap_pair_key"):
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
    """Ours: `text`. SGLang's and vLLM's: `prompt` or `messages` (a chat rendered with the model's
    template), with `model` and `add_special_tokens`."""

    text: Union[str, list[str], None] = None
    prompt: Union[str, list[str], None] = None
    messages: Optional[list["ChatMessage"]] = None
    model: Optional[str] = None
    add_special_tokens: bool = True
    add_generation_prompt: Optional[bool] = None

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        given = [k for k in ("text", "prompt", "messages") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of text (ours), prompt or messages (SGLang's / vLLM's); "
                             f"got {', '.join(given) or 'none'}")
        return self


class TokenizeResponse(BaseModel):
    input_ids: Union[list[int], list[list[int]], None] = None  # for `text`
    tokens: Union[list[int], list[list[int]], None] = None  # for `prompt` / `messages`, with count and max_model_len
    count: Union[int, list[int], None] = None
    max_model_len: Optional[int] = None


class DetokenizeRequest(_Strict):
    """SGLang's and vLLM's body."""

    tokens: Union[list[int], list[list[int]]]
    model: Optional[str] = None
    skip_special_tokens: bool = True


class DetokenizeResponse(BaseModel):
    text: Union[str, list[str]]  # SGLang's name
    prompt: Union[str, list[str]]  # vLLM's


class AbortRequest(_Strict):
    rid: str


class ProfileReqInput(_StrictLenient):
    """`POST /start_profile` (SGLang's fields; others it sends are ignored)."""

    output_dir: str | None = Field(
        None, pattern=r"^[^\x00-\x1f\x7f]*$", max_length=1024,
        description="A subdirectory of the server's --profile-dir for the traces: no control characters, each "
                    "path component at most 255 bytes (UTF-8).")
    num_steps: int | None = Field(None, description="Stop by itself after this many forward steps.")
    activities: list[str] | None = Field(None, description='"CPU" and/or "GPU" (default: both where there is a GPU).')
    record_shapes: bool = False
    with_stack: bool = False

    @field_validator("output_dir")
    @classmethod
    def _file_system_names(cls, value: str | None) -> str | None:
        """A name the file system takes (a longer component is an OSError where the directory is made)."""
        if value is not None and any(len(part.encode("utf-8")) > 255 for part in value.split("/")):
            raise ValueError("each path component must be at most 255 bytes (UTF-8)")
        return value


class RunProgramRequest(_StrictLenient):
    """`POST /run_program`: shipped programs (see sgl.server.programs and sgl.lang.ir_json)."""

    model_config = ConfigDict(json_schema_extra={**exactly_one_of("program", "programs"),
                                                 "examples": RUN_PROGRAM_EXAMPLES})

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
    tokenizer_path: str | None = Field(None, description="A local directory with the tokenizer's files "
                                       "(tokenizer.json, its config and chat template), for routers and clients.")
    chat_roles: ChatRoles
    supports_sessions: bool = Field(True, description="/open_session, /close_session and session_params work.")


class LoadReport(BaseModel):
    """One data-parallel rank's load (`GET /get_load`, a list of these, as SGLang's)."""

    dp_rank: int
    num_reqs: int = Field(description="Requests running and waiting.")
    num_waiting_reqs: int
    num_tokens: int = Field(description="Their tokens: running requests' prompt and output so far, waiting "
                            "requests' prompts.")


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
    model_config = ConfigDict(json_schema_extra={"examples": CHAT_EXAMPLES})

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
    model_config = ConfigDict(json_schema_extra={"examples": COMPLETION_EXAMPLES})

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

    model_config = ConfigDict(json_schema_extra={**exactly_one_of("text", "messages"), "examples": EXTRACT_EXAMPLES})

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


# ---------------------------------------------------------------------------- programs and server info


class ProgramUsage(BaseModel):
    calls: int = Field(description="Generation calls the program made.")
    prompt_tokens: int
    completion_tokens: int
    retries: int


class ProgramResult(BaseModel):
    """One program's final state."""

    text: str
    messages: list[dict[str, Any]]
    variables: dict[str, Any]
    meta_info: dict[str, Any]
    usage: ProgramUsage


class ServerInfo(BaseModel):
    """`GET /get_server_info`: the engine's configuration and live scheduler numbers (more fields
    than these, which are always there)."""

    model_config = ConfigDict(extra="allow")

    max_total_tokens: int = Field(description="The KV pool's capacity in tokens.")
    available_kv_tokens: int = Field(description="Free KV slots (the radix cache's evictable ones are not free).")
    num_running_reqs: int
    num_waiting_reqs: int
    context_length: int
    model_path: str
    served_model_name: str
    version: str


# ---------------------------------------------------------------------------- server-sent events


class GenerateChunk(GenerateOutput):
    """A streamed /generate event: the request's text and ids so far."""

    index: int | None = Field(None, description="A batch or n > 1: the request's place in the flattened "
                              "(prompt, sample) list.")


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
    matched_stop: Union[int, str, None] = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice] = Field(description="One choice's delta; empty in the final usage event.")
    usage: Usage | None = Field(None, description="With stream_options.include_usage: null, then the totals.")


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    matched_stop: Union[int, str, None] = None


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice] = Field(description="One choice's new text; empty in the final usage event.")
    usage: Usage | None = Field(None, description="With stream_options.include_usage: null, then the totals.")


class ProgramTextEvent(BaseModel):
    var: str | None = Field(description="The variable the text is generated into; null: other program text.")
    text: str
    branch: list[list[int]] | None = Field(None, description=(
        "Absent for the program's own text. For text of a fork branch, its place in the fork tree: per "
        "fork level [which fork of the parent state (0 for its first), which branch of it]."))


class ProgramResultEvent(BaseModel):
    result: ProgramResult


def _inline_refs(schema: Any, defs: dict[str, Any]) -> Any:
    """`schema` with every `#/$defs/...` reference replaced by its definition (the models here
    are not recursive), so it stands alone inside the OpenAPI document."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            return {**_inline_refs(defs[ref[len("#/$defs/"):]], defs), **_inline_refs(rest, defs)}
        return {k: _inline_refs(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inline_refs(v, defs) for v in schema]
    return schema


def event_data_schema(*models: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of an SSE event's `data` (one of `models`), with no references."""
    schema = TypeAdapter(Union[tuple(models)] if len(models) > 1 else models[0]).json_schema(mode="serialization")
    return _inline_refs(schema, schema.get("$defs", {}))


def sse_responses(*models: type[BaseModel], description: str) -> dict[int | str, dict[str, Any]]:
    """The `responses=` entry of a route that answers `stream: true` with server-sent events:
    `text/event-stream` beside its JSON, each event's `data` one of `models` as JSON, the last
    one `[DONE]` (OpenAPI 3.2's `itemSchema`: one event; FastAPI declares its own streams so)."""
    item = {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {"anyOf": [
                {"const": "[DONE]", "description": "The last event."},
                {"type": "string", "contentMediaType": "application/json", "contentSchema": event_data_schema(*models)},
            ]},
            "event": {"type": "string"},
            "id": {"type": "string"},
            "retry": {"type": "integer", "minimum": 0},
        },
    }
    return {200: {"description": description, "content": {"text/event-stream": {"itemSchema": item}}}}
