"""What the route handlers share: the engine and facts about the served model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request

from sgl.lang.chat_template import ChatTemplate
from sgl.server.errors import APIError
from sgl.server.metrics import Metrics


@dataclass
class ServerState:
    engine: Any  # the sgl Engine; its finish listener feeds `metrics`, so every request is counted
    served_model_name: str
    metrics: Metrics
    chat_template: (
        ChatTemplate  # the model's chat roles as prefix/suffix strings (for remote programs)
    )
    # local: the HF directory, or a GGUF's tokenizer files (runtime/tokenizer.py
    # tokenizer_directory)
    model_path: str
    context_len: int
    created: int  # unix time the app was built (OpenAI's `created` of the model)
    bos_token_id: int | None = None
    extract_backend: Any = None  # the lang backend extraction programs run on
    profile_dir: str | None = None  # /start_profile writes traces under it; None: profiling is off
    tool_call_parser: str = (
        "hermes"  # the format of tool calls in the model's output (sgl.tool_calls)
    )
    reasoning_parser: str | None = None  # "qwen3" / "deepseek-r1": reasoning split from the answer
    lifecycle: Any = None  # sgl.server.lifecycle.Lifecycle: draining, requests in flight

    def check_model(self, model: str | None) -> None:
        """OpenAI requests name a model: accept the served name (and 'default'), else 404."""
        if model is not None and model not in (self.served_model_name, "default"):
            raise APIError(
                404,
                f"The model {model!r} does not exist; this server serves "
                f"{self.served_model_name!r}",
                "model",
            )


def get_state(request: Request) -> ServerState:
    return request.app.state.sgl
