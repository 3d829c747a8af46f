"""SGLang's native API: /generate, sessions, fork joins, tokenize / detokenize, abort, profiling.

Ranges of sampling values are checked by the engine, whose error names the field; the schema
of `sampling_params` comes from the parameter table (see `.sampling`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from sgl.server.protocol.common import _Strict, _StrictLenient, exactly_one_of
from sgl.server.protocol.openai import ChatMessage
from sgl.server.protocol.sampling import SAMPLING_PARAMS_SCHEMA

# Request examples (in /docs, and the first bodies a schema-driven fuzzer sends): short
# generations, whole and streamed.
GENERATE_EXAMPLES = [
    {
        "text": "The capital of France is",
        "sampling_params": {"max_new_tokens": 8, "temperature": 0},
    },
    {
        "text": ["1, 2, 3,", "a, b, c,"],
        "sampling_params": {"max_new_tokens": 8, "n": 2, "temperature": 0.7, "seed": 1},
        "stream": True,
        "return_logprob": True,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
    },
]


class SessionParams(_Strict):
    """Make a /generate request a turn of an open session (see /open_session)."""

    id: str = Field(description="The session id /open_session returned.")
    rid: str | None = Field(
        None,
        description="Continue this earlier finished turn: its prompt and output tokens "
        "come before this request's input. Null: start from this request's input alone.",
    )
    offset: int | None = Field(
        None, description="Keep only this many tokens of that history (Python slice)."
    )
    drop_previous_output: bool = Field(
        False, description="Continue from the earlier turn's prompt, without its output."
    )
    replace: bool | None = Field(
        None, description="Accepted for SGLang clients; only false/null (true is refused)."
    )


class OpenSessionReqInput(_Strict):
    capacity_tokens: int | None = Field(
        None,
        description="Most tokens (history + input + max_new_tokens) one turn "
        "may use; default: the context length.",
    )
    capacity_of_str_len: int | None = Field(
        None, description="Accepted for SGLang clients; unused (capacity is counted in tokens)."
    )
    session_id: str | None = Field(None, description="Choose the id; default: a random one.")
    timeout: float | None = Field(
        None,
        description="Seconds without use before the session closes itself "
        "(default 600, at most 86400).",
        allow_inf_nan=False,
    )


class CloseSessionReqInput(_Strict):
    session_id: str


class ConcateAndAppendReqInput(_Strict):
    """SGLang's `fork(...).join(mode="concate_and_append")`: the forks' request ids and the
    parent's."""

    src_rids: list[str] = Field(
        min_length=1, description="The forks' request ids (SGLang's StreamExecutor sids)."
    )
    dst_rid: str = Field(description="The parent program's request id.")


class GenerateReqInput(_Strict):
    """`POST /generate`: one prompt or a batch, as text or token ids."""

    model_config = ConfigDict(
        json_schema_extra={**exactly_one_of("text", "input_ids"), "examples": GENERATE_EXAMPLES}
    )

    text: str | list[str] | None = Field(None, description="A prompt or a batch of prompts.")
    input_ids: list[int] | list[list[int]] | None = Field(
        None, description="Token ids instead of text."
    )
    # Checked by the engine (its errors name the field); the schema lists the keys.
    sampling_params: Annotated[
        dict[str, Any] | list[dict[str, Any]] | None, WithJsonSchema(SAMPLING_PARAMS_SCHEMA)
    ] = None
    stream: bool = Field(
        False,
        description="Server-sent events with cumulative text; a batch or n > 1 "
        "interleaves its requests' chunks, each with `index` (prompt k, sample i: k * n + i).",
    )
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    rid: str | list[str] | None = Field(
        None, description="Request id(s), usable with /abort_request."
    )
    session_params: SessionParams | None = Field(
        None, description="Run as a turn of an open session."
    )
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
    data_parallel_rank: int | None = Field(
        None, description="SGLang's; only null or 0 (a worker is one rank)."
    )
    routed_dp_rank: int | None = Field(None, description="SGLang's; only null or 0.")
    background: bool = Field(False, description="SGLang's; only false.")
    return_bytes: bool = Field(False, description="SGLang's; only false.")
    return_entropy: bool = Field(False, description="SGLang's; only false.")
    lora_id: Any = Field(None, description="SGLang's; only null.")
    bootstrap_host: Any = Field(
        None, description="SGLang's (prefill-decode disaggregation); only null."
    )
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
        for name in (
            "token_ids_logprob",
            "lora_path",
            "lora_id",
            "custom_logit_processor",
            "image_data",
            "video_data",
            "audio_data",
            "input_embeds",
            "modalities",
            "bootstrap_host",
            "bootstrap_port",
            "bootstrap_room",
            "bootstrap_pair_key",
        ):
            if getattr(self, name) not in (None, [], [None]):
                return name
        return None


class GenerateOutput(BaseModel):
    """The engine's result dict (a list of them for a batch or n > 1)."""

    text: str
    output_ids: list[int]
    meta_info: dict[str, Any] = Field(
        description="id, prompt_tokens, completion_tokens, cached_tokens, "
        "finish_reason, e2e_latency, ttft, and logprobs when asked for."
    )


class TokenizeRequest(_Strict):
    """Ours: `text`. SGLang's and vLLM's: `prompt` or `messages` (a chat rendered with the model's
    template), with `model` and `add_special_tokens`."""

    text: str | list[str] | None = None
    prompt: str | list[str] | None = None
    messages: list[ChatMessage] | None = None
    model: str | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        given = [k for k in ("text", "prompt", "messages") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of text (ours), prompt or messages (SGLang's / vLLM's); "
                f"got {', '.join(given) or 'none'}"
            )
        return self


class TokenizeResponse(BaseModel):
    input_ids: list[int] | list[list[int]] | None = None  # for `text`
    tokens: list[int] | list[list[int]] | None = (
        None  # for `prompt` / `messages`, with count and max_model_len
    )
    count: int | list[int] | None = None
    max_model_len: int | None = None


class DetokenizeRequest(_Strict):
    """SGLang's and vLLM's body."""

    tokens: list[int] | list[list[int]]
    model: str | None = None
    skip_special_tokens: bool = True


class DetokenizeResponse(BaseModel):
    text: str | list[str]  # SGLang's name
    prompt: str | list[str]  # vLLM's


class AbortRequest(_Strict):
    rid: str


class ProfileReqInput(_StrictLenient):
    """`POST /start_profile` (SGLang's fields; others it sends are ignored)."""

    output_dir: str | None = Field(
        None,
        pattern=r"^[^\x00-\x1f\x7f]*$",
        max_length=1024,
        description="A subdirectory of the server's --profile-dir for the traces: "
        "no control characters, each path component at most 255 bytes (UTF-8).",
    )
    num_steps: int | None = Field(None, description="Stop by itself after this many forward steps.")
    activities: list[str] | None = Field(
        None, description='"CPU" and/or "GPU" (default: both where there is a GPU).'
    )
    record_shapes: bool = False
    with_stack: bool = False

    @field_validator("output_dir")
    @classmethod
    def _file_system_names(cls, value: str | None) -> str | None:
        """A name the file system takes (a longer component is an OSError where the directory is
        made)."""
        if value is not None and any(len(part.encode("utf-8")) > 255 for part in value.split("/")):
            raise ValueError("each path component must be at most 255 bytes (UTF-8)")
        return value


class GenerateChunk(GenerateOutput):
    """A streamed /generate event: the request's text and ids so far."""

    index: int | None = Field(
        None,
        description="A batch or n > 1: the request's place in the flattened (prompt, sample) list.",
    )
