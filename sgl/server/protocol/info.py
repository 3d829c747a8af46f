"""Server and model information: /get_model_info, /get_server_info, /get_load, /health."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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
    tokenizer_path: str | None = Field(
        None,
        description="A local directory with the tokenizer's files "
        "(tokenizer.json, its config and chat template), for routers and clients.",
    )
    chat_roles: ChatRoles
    supports_sessions: bool = Field(
        True, description="/open_session, /close_session and session_params work."
    )


class LoadReport(BaseModel):
    """One data-parallel rank's load (`GET /get_load`, a list of these, as SGLang's)."""

    dp_rank: int
    num_reqs: int = Field(description="Requests running and waiting.")
    num_waiting_reqs: int
    num_tokens: int = Field(
        description="Their tokens: running requests' prompt and output so far, waiting "
        "requests' prompts."
    )


class HealthResponse(BaseModel):
    status: str


class ServerInfo(BaseModel):
    """`GET /get_server_info`: the engine's configuration and live scheduler numbers (more fields
    than these, which are always there)."""

    model_config = ConfigDict(extra="allow")

    max_total_tokens: int = Field(description="The KV pool's capacity in tokens.")
    available_kv_tokens: int = Field(
        description="Free KV slots (the radix cache's evictable ones are not free)."
    )
    num_running_reqs: int
    num_waiting_reqs: int
    context_length: int
    model_path: str
    served_model_name: str
    version: str
