"""The backend protocol: everything the interpreter needs from a model, in or out of process."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sgl.lang.chat_template import ChatTemplate
from sgl.lang.choices import ChoicesDecision, ChoicesMethod


class ProgramsNotServed(Exception):
    """The server behind a backend cannot run shipped programs (e.g. a router in front of sgl
    workers forwards no `/run_program`): the program runs here, one request per call."""


@dataclass
class TokenUsage:
    """Tokens a backend's generations used (SGLang's `backend.token_usage`): per call, the
    prompt and completion tokens it reports (an API backend also counts its retries)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, usage: dict[str, Any] | None) -> None:
        """One call; `usage` (a gen's meta_info, or an API's `usage`) has the token counts."""
        usage = usage or {}
        with self._lock:
            self.calls += 1
            self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            self.completion_tokens += int(usage.get("completion_tokens") or 0)

    def merge(self, counts: dict[str, Any]) -> None:
        """Add another counter's `snapshot()` (a shipped program's, counted by the server)."""
        with self._lock:
            for key in ("calls", "prompt_tokens", "completion_tokens", "retries"):
                setattr(self, key, getattr(self, key) + int(counts.get(key) or 0))

    def retried(self) -> None:
        with self._lock:
            self.retries += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {
                "calls": self.calls,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "retries": self.retries,
            }

    def reset(self) -> None:
        with self._lock:
            self.calls = self.prompt_tokens = self.completion_tokens = self.retries = 0


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
    def generate(
        self,
        text: str,
        sampling: dict[str, Any],
        logprobs: dict[str, Any],
        session: str | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """Continue `text`; returns the generated text and its meta_info. `session` (from
        `open_session`) names the program state the call belongs to."""

    @abstractmethod
    def generate_stream(
        self,
        text: str,
        sampling: dict[str, Any],
        logprobs: dict[str, Any],
        session: str | None = None,
    ) -> Iterator[tuple[str, dict[str, Any] | None]]:
        """Like generate, as (new text, meta_info so far) pieces: completion tokens and
        logprob entries up to that piece; the last piece's has the finish reason."""

    @abstractmethod
    def select(
        self, text: str, choices: list[str], temperature: float, method: ChoicesMethod
    ) -> ChoicesDecision:
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

    def close_session(self, session: str) -> None:  # noqa: B027 (optional: no sessions, nothing to close)
        pass

    @property
    def token_usage(self) -> TokenUsage:
        return self.__dict__.setdefault("_token_usage", TokenUsage())

    @token_usage.setter
    def token_usage(self, usage: TokenUsage) -> None:
        self.__dict__["_token_usage"] = usage

    def record_usage(self, meta_info: dict[str, Any]) -> None:
        """The interpreter reports each gen here; a backend that counts its own calls (an
        HTTP API's billed usage) overrides it to do nothing."""
        self.token_usage.add(meta_info)

    def get_model_name(self) -> str:
        """The model as the server or engine was given it (its path or served name)."""
        info = self.get_server_info()
        return str(info.get("served_model_name") or info.get("model_path") or "unknown")

    def flush_cache(self) -> bool:
        return False

    def get_server_info(self) -> dict[str, Any]:
        return {}

    def shutdown(self) -> None:  # noqa: B027 (optional: nothing to release)
        pass
