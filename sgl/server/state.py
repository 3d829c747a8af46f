"""What the route handlers share: the (metered) engine and facts about the served model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request

from sgl.lang.chat_template import ChatTemplate
from sgl.server.errors import APIError
from sgl.server.metrics import Metrics, MeteredEngine


@dataclass
class ServerState:
    engine: MeteredEngine  # use this, never the raw engine, so every request is counted
    served_model_name: str
    metrics: Metrics
    chat_template: ChatTemplate  # the model's chat roles as prefix/suffix strings
    model_path: str
    context_len: int
    kv_capacity: int  # KV pool size in tokens
    created: int  # unix time the app was built (OpenAI's `created` of the model)
    extract_backend: Any = None  # the lang backend extraction programs run on

    def check_model(self, model: str | None) -> None:
        """OpenAI requests name a model: accept the served name (and 'default'), else 404."""
        if model is not None and model not in (self.served_model_name, "default"):
            raise APIError(404, f"The model {model!r} does not exist; this server serves {self.served_model_name!r}",
                           "model")

    def default_max_tokens(self, prompt_len: int, n: int = 1) -> int:
        """OpenAI's max_tokens=None: as many as fit in the context (and the KV pool)."""
        return max(0, min(self.context_len - prompt_len, (self.kv_capacity - 1 - prompt_len) // max(n, 1)))


def get_state(request: Request) -> ServerState:
    return request.app.state.sgl
