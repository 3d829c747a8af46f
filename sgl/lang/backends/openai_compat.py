"""Programs on OpenAI-compatible APIs: OpenAI itself, vLLM, llama.cpp's llama-server, SGLang, sgl.

`OpenAI(model, base_url, api_key, is_chat_model=True, server_kind="auto")` speaks only the
`/v1/chat/completions` and `/v1/completions` endpoints (plus cheap probes), with `requests`.

- Chat models (the default: a model name says too little to guess) get the program's
  finished role segments as `messages`; a gen or select must open an assistant turn (the
  interpreter checks, since it knows the state). Completion models (`is_chat_model=False`)
  get the program text as `prompt`, so results equal the native backends' on the same server.
- `select` is decided by the first that applies, named in its meta_info `select_method`:
  "logprobs" (the endpoint echoes prompt logprobs: each choice scored as in process),
  "constrained" (the server can force one of the choices: sgl/SGLang regex, vLLM choice,
  llama.cpp grammar), "generation" (generate, then match a choice exactly).
- Constraints go in each server kind's own fields (`openai_dialects`); what a server
  cannot enforce is refused naming the parameter.
- `server_kind="auto"` probes once: `/get_model_info` with `chat_roles` is sgl, another
  `/get_server_info` is SGLang, `/props` is llama.cpp, `/version` is vLLM, else "openai"
  (the strictest: it refuses every extra).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from sgl.lang.backends.base import Backend, TokenUsage
from sgl.lang.backends.openai_dialects import (
    CONSTRAINT_PARAMS,
    SERVER_KINDS,
    UnsupportedParameterError,
    choice_fields,
    constraint_fields,
    extra_sampling_fields,
    version_tuple,
)
from sgl.lang.backends.openai_http import Http
from sgl.lang.backends.openai_select import choice_token_bound, match_choice, score_by_echo
from sgl.lang.chat_template import ChatTemplate
from sgl.lang.choices import ChoicesDecision, ChoicesMethod, decide
from sgl.runtime.sampling.params import PARAMS

OPENAI_URL = "https://api.openai.com/v1"
# Sampling keys sent in OpenAI's own fields, or by openai_dialects; any other one set is refused.
_HANDLED = {p.name for p in PARAMS if p.dsl is not None and (p.openai or p.dialects)} | set(
    CONSTRAINT_PARAMS
)


class OpenAI(Backend):
    """A backend over an OpenAI-compatible HTTP API. `token_usage` counts calls and billed
    tokens."""

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        is_chat_model: bool = True,
        server_kind: str = "auto",
        chat_template: ChatTemplate | None = None,
        timeout: float = 600.0,
        max_retries: int = 4,
        retry_backoff: float = 0.5,
        max_retry_wait: float = 60.0,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be the served model's name, got {model!r}")
        if server_kind not in (*SERVER_KINDS, "auto"):
            raise ValueError(
                f"server_kind must be one of {', '.join(SERVER_KINDS)} or 'auto'; got "
                f"{server_kind!r}"
            )
        if not isinstance(is_chat_model, bool):
            raise ValueError(f"is_chat_model must be True or False, got {is_chat_model!r}")
        if max_retries < 0 or timeout <= 0:
            raise ValueError("max_retries must be >= 0 and timeout > 0")
        self.model = model
        self.base_url = (base_url or OPENAI_URL).rstrip("/")
        if api_key is None and base_url is None:
            api_key = os.environ.get("OPENAI_API_KEY")
        self.is_chat_model = is_chat_model
        self.token_usage = TokenUsage()
        self.http = Http(
            self.base_url,
            api_key,
            timeout,
            max_retries,
            retry_backoff,
            max_retry_wait,
            self.token_usage,
        )
        self.vllm_version: tuple[int, ...] = ()
        model_info = None
        if server_kind == "auto" or server_kind == "sgl":
            server_kind, model_info = self._detect(server_kind)
        self.server_kind = server_kind
        self._template, self._template_is_servers = self._pick_template(chat_template, model_info)
        self._echo_logprobs: bool | None = (
            None  # prompt logprobs through /completions echo (probed)
        )

    # ------------------------------------------------------------------ set-up

    @property
    def wants_messages(self) -> bool:
        """Chat models take the conversation, not the rendered text (see the interpreter)."""
        return self.is_chat_model

    @property
    def supports_speculation(self) -> bool:
        """num_api_spec_tokens applies to completion models (a continuation of the program text)."""
        return not self.is_chat_model

    def record_usage(self, meta_info: dict[str, Any]) -> None:
        """Nothing: `token_usage` counts every HTTP call with the usage the API billed."""

    def _root(self) -> str:
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    def _detect(self, asked: str) -> tuple[str, dict | None]:
        """Which server this is, from one cheap GET each (see the module docstring)."""
        root = self._root()
        info = self.http.probe(root + "/get_model_info")
        if isinstance(info, dict) and "chat_roles" in info:
            return "sgl", info
        if asked == "sgl":
            return "sgl", None
        if isinstance(info, dict) and isinstance(self.http.probe(root + "/get_server_info"), dict):
            return "sglang", None
        props = self.http.probe(root + "/props")
        if isinstance(props, dict) and "default_generation_settings" in props:
            return "llama.cpp", None
        version = self.http.probe(root + "/version")
        if isinstance(version, dict) and isinstance(version.get("version"), str):
            self.vllm_version = version_tuple(version["version"])
            return "vllm", None
        return "openai", None

    def _pick_template(
        self, given: ChatTemplate | None, model_info: dict | None
    ) -> tuple[ChatTemplate, bool]:
        """Roles in the program text: given, else sgl's own roles (exact), else `Role: content`
        lines."""
        if given is not None:
            return given, True
        roles = (model_info or {}).get("chat_roles")
        if roles:
            return ChatTemplate(
                roles["prefix"], roles["suffix"], roles.get("default_system", ""), "server"
            ), True
        return ChatTemplate.plain(), False

    # ------------------------------------------------------------------ requests

    def _body(
        self, sampling: dict[str, Any], logprobs: dict[str, Any], chat: bool
    ) -> dict[str, Any]:
        unknown = sorted(
            k for k, v in sampling.items() if k not in _HANDLED and v not in (None, False)
        )
        if unknown:
            raise UnsupportedParameterError(
                f"{unknown[0]}: not available through an OpenAI-compatible API", unknown[0]
            )
        body: dict[str, Any] = {"model": self.model}
        if sampling.get("max_new_tokens") is not None:
            key = "max_completion_tokens" if chat and self.server_kind == "openai" else "max_tokens"
            body[key] = sampling["max_new_tokens"]
        for key in ("temperature", "top_p", "seed"):
            if sampling.get(key) is not None:
                body[key] = sampling[key]
        for key in ("frequency_penalty", "presence_penalty"):
            if sampling.get(key):
                body[key] = sampling[key]
        if sampling.get("stop"):
            body["stop"] = (
                [sampling["stop"]] if isinstance(sampling["stop"], str) else list(sampling["stop"])
            )
        body.update(extra_sampling_fields(self.server_kind, sampling))
        body.update(constraint_fields(self.server_kind, sampling, chat, self.vllm_version))
        body.update(_logprob_fields(logprobs, chat, self.server_kind))
        return body

    def _call(
        self, text: str, messages: list[dict[str, str]] | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        if self.is_chat_model:
            return self.http.post(
                "/chat/completions", {**body, "messages": _chat_messages(messages)}
            )
        return self.http.post("/completions", {**body, "prompt": text})

    def generate(
        self,
        text: str,
        sampling: dict[str, Any],
        logprobs: dict[str, Any],
        session: str | None = None,
        messages: list[dict[str, str]] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        out = self._call(text, messages, self._body(sampling, logprobs, self.is_chat_model))
        choice = out["choices"][0]
        content = choice["message"].get("content") if self.is_chat_model else choice.get("text")
        meta = _meta(out, choice, sampling)
        if logprobs.get("return_logprob"):
            meta.update(_parse_logprobs(choice.get("logprobs"), self.is_chat_model))
        return content or "", meta

    def generate_stream(
        self,
        text: str,
        sampling: dict[str, Any],
        logprobs: dict[str, Any],
        session: str | None = None,
        messages: list[dict[str, str]] | None = None,
    ) -> Iterator[tuple[str, dict[str, Any] | None]]:
        if logprobs.get("return_logprob"):
            raise UnsupportedParameterError(
                "return_logprob: not available with stream=True on this backend", "return_logprob"
            )
        body = {
            **self._body(sampling, {}, self.is_chat_model),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.is_chat_model:
            path, body = "/chat/completions", {**body, "messages": _chat_messages(messages)}
        else:
            path, body = "/completions", {**body, "prompt": text}
        last: dict[str, Any] = {}
        head: dict[str, Any] = {}
        for chunk in self.http.post_stream(path, body):
            head = chunk
            for choice in chunk.get("choices") or []:
                piece = (
                    (choice.get("delta") or {}).get("content")
                    if self.is_chat_model
                    else choice.get("text")
                )
                if choice.get("finish_reason") is not None:
                    last = choice
                if piece:
                    yield piece, None
        yield "", _meta(head, last, sampling)

    # ------------------------------------------------------------------ select

    def select(
        self,
        text: str,
        choices: list[str],
        temperature: float,
        method: ChoicesMethod,
        messages: list[dict[str, str]] | None = None,
    ) -> ChoicesDecision:
        """Logprob scoring, else a constrained choice, else generation + exact match."""
        if self._echo_logprobs is not False and (
            not self.is_chat_model or self._template_is_servers
        ):
            scores = score_by_echo(self, text, choices, method.requires_unconditional)
            self._echo_logprobs = scores is not None
            if scores is not None:
                decision = decide(method, scores, temperature)
                decision.meta_info["select_method"] = "logprobs"
                return decision
        fields = choice_fields(self.server_kind, choices, self.vllm_version)
        sampling = {"max_new_tokens": choice_token_bound(choices), "temperature": temperature}
        body = self._body(sampling, {}, self.is_chat_model)
        out = self._call(text, messages, {**body, **(fields or {})})
        choice = out["choices"][0]
        produced = (
            choice["message"].get("content") if self.is_chat_model else choice.get("text")
        ) or ""
        how = "constrained" if fields is not None else "generation"
        picked = (
            produced
            if fields is not None and produced in choices
            else match_choice(produced, choices)
        )
        if picked is None:
            raise ValueError(
                f"select: the model answered {produced!r}, which is none of {choices!r} "
                f"(select_method {how}: this endpoint returns no prompt logprobs"
                f"{'' if fields is None else ' and ignored the constraint'})"
            )
        return ChoicesDecision(
            picked, {**_meta(out, choice, sampling), "select_method": how, "generated": produced}
        )

    # ------------------------------------------------------------------ the rest of the protocol

    def cache_prefix(self, text: str) -> None:
        """Nothing to do: an OpenAI-compatible API has no explicit cache (servers cache by
        themselves)."""

    def chat_template(self) -> ChatTemplate:
        return self._template

    def get_server_info(self) -> dict[str, Any]:
        return {
            "server_kind": self.server_kind,
            "base_url": self.base_url,
            "model": self.model,
            "is_chat_model": self.is_chat_model,
            "token_usage": self.token_usage.snapshot(),
        }


class OpenAICompatible(OpenAI):
    """`OpenAI` for any OpenAI-compatible server: the same class, with `base_url` required."""

    def __init__(
        self, model: str, base_url: str, api_key: str | None = None, **kwargs: Any
    ) -> None:
        if not base_url:
            raise ValueError(
                "base_url is required: the server's OpenAI API root, e.g. http://127.0.0.1:30000/v1"
            )
        super().__init__(model, base_url, api_key, **kwargs)


# ---------------------------------------------------------------------- request / response shapes


def _chat_messages(messages: list[dict[str, str]] | None) -> list[dict[str, str]]:
    if not messages:
        raise ValueError(
            "a chat model needs the conversation: the program has no finished user or system turn "
            "before the assistant turn"
        )
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _logprob_fields(logprobs: dict[str, Any], chat: bool, kind: str) -> dict[str, Any]:
    if not logprobs.get("return_logprob"):
        return {}
    if logprobs.get("logprob_start_len", -1) != -1:
        raise UnsupportedParameterError(
            "logprob_start_len: prompt logprobs are not available through the "
            "OpenAI API's generation calls",
            "logprob_start_len",
        )
    top = int(logprobs.get("top_logprobs_num") or 0)
    if chat:
        return {"logprobs": True, **({"top_logprobs": top} if top else {})}
    return {"logprobs": top or (1 if kind == "llama.cpp" else 0)}  # llama.cpp reads 0 as "none"


def _parse_logprobs(lp: dict[str, Any] | None, chat: bool) -> dict[str, Any]:
    """meta_info's output_token_logprobs [(logprob, None, token text)] (the API gives no token
    ids)."""
    if not lp:
        return {"output_token_logprobs": [], "input_token_logprobs": []}
    if chat or "content" in lp:  # llama.cpp answers completions in the chat format too
        items = lp.get("content") or []
        out = [(e.get("logprob"), None, e.get("token")) for e in items]
        tops = [
            [(t.get("logprob"), None, t.get("token")) for t in e.get("top_logprobs") or []]
            for e in items
        ]
    else:
        out = list(
            zip(
                lp.get("token_logprobs") or [],
                [None] * len(lp.get("tokens") or []),
                lp.get("tokens") or [],
            )
        )
        tops = [[(v, None, k) for k, v in (t or {}).items()] for t in lp.get("top_logprobs") or []]
    meta: dict[str, Any] = {"output_token_logprobs": out, "input_token_logprobs": []}
    if any(tops):
        meta["output_top_logprobs"] = tops
    return meta


def _meta(out: dict[str, Any], choice: dict[str, Any], sampling: dict[str, Any]) -> dict[str, Any]:
    """The engine's meta_info shape, from what the API tells: finish reason and usage."""
    reason = choice.get("finish_reason")
    if reason == "stop":
        matched = choice.get("matched_stop", choice.get("stop_reason"))
        finish: dict[str, Any] | None = {"type": "stop", "matched": matched}
    elif reason == "length":
        finish = {"type": "length", "length": sampling.get("max_new_tokens")}
    else:
        finish = {"type": reason} if reason else None
    usage = out.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return {
        "id": out.get("id"),
        "finish_reason": finish,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": details.get("cached_tokens") or 0,
    }
