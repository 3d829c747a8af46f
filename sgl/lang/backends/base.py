"""The backend protocol: everything the interpreter needs from a model, in or out of process."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Iterator

from sgl.lang.chat_template import ChatTemplate
from sgl.lang.choices import ChoicesDecision, ChoicesMethod


class Backend(ABC):
    """A model that programs run against.

    Text in, text out: the program state is text, and the backend tokenizes it, so the
    same program runs on an in-process engine and on a server. `sampling` is a dict of
    the engine's sampling parameters (`max_new_tokens`, `stop`, `temperature`, `regex`,
    ...); `logprobs` holds `return_logprob` / `logprob_start_len` / `top_logprobs_num` /
    `return_text_in_logprobs`. Results are the engine's (text, meta_info).

    A chat API takes a conversation, not text: a backend with `wants_messages` true is
    also passed `messages=` (the state's finished role messages; the gen or select opens
    an assistant turn) by `generate`, `generate_stream` and `select`. A backend with
    `supports_speculation` true gets `num_api_spec_tokens` speculation (`speculative.py`).
    """

    wants_messages = False
    supports_speculation = False

    @abstractmethod
    def generate(self, text: str, sampling: dict[str, Any], logprobs: dict[str, Any],
                 session: str | None = None) -> tuple[str, dict[str, Any]]:
        """Continue `text`; returns the generated text and its meta_info. `session` (from
        `open_session`) names the program state the call belongs to."""

    @abstractmethod
    def generate_stream(
        self, text: str, sampling: dict[str, Any], logprobs: dict[str, Any], session: str | None = None
    ) -> Iterator[tuple[str, dict[str, Any] | None]]:
        """Like generate, as (new text, None) pieces; the last piece carries the meta_info."""

    @abstractmethod
    def select(self, text: str, choices: list[str], temperature: float, method: ChoicesMethod) -> ChoicesDecision:
        """Score every choice as a continuation of `text` (in one batched request) and decide."""

    @abstractmethod
    def cache_prefix(self, text: str) -> None:
        """Compute `text` into the prefix cache, so requests that start with it hit."""

    @abstractmethod
    def chat_template(self) -> ChatTemplate:
        """How roles render for this model."""

    def open_session(self) -> str | None:
        """A session for one program state, or None where the model offers none. While it is
        open, the KV of the state's generations stays pinned in the prefix cache, so a long
        program keeps its prefix under memory pressure. The interpreter opens one lazily at
        a state's first generation and closes it when the state ends."""
        return None

    def close_session(self, session: str) -> None:
        pass

    def flush_cache(self) -> bool:
        return False

    def get_server_info(self) -> dict[str, Any]:
        return {}

    def shutdown(self) -> None:
        pass
