"""Plain `/v1/completions` calls, written as a user of vLLM, llama.cpp or SGLang writes them.

One request per generation with the whole prompt every time (the server's own prefix cache is
all that saves work), greedy; a fork's branches sent at once from a thread pool; a select as
one request constrained to the choices (each server's own constraint field, from
`sgl.lang.backends.openai_dialects`), which is the fastest form on every one of them.

`Recorder` answers the same calls at once and keeps their prompts: with `RecordingBackend`
(the sgl program's side) it checks that both forms of a workload send the same text.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import requests

from sgl.lang import Backend, ChatTemplate
from sgl.lang.backends.openai_dialects import choice_fields, vllm_fields
from sgl.lang.choices import ChoicesDecision

T = TypeVar("T")


class Completions(Protocol):
    chat_template: ChatTemplate

    def complete(
        self,
        prompt: str,
        max_tokens: int,
        *,
        stop: str | None = None,
        regex: str | None = None,
        gbnf: str | None = None,
        ignore_eos: bool = False,
    ) -> str: ...

    def choose(self, prompt: str, choices: list[str]) -> str: ...

    def concurrently(self, calls: list[Callable[[], T]]) -> list[T]: ...


class HttpCompletions:
    """`/v1/completions` of the server at `url`; `kind` is "sgl", "vllm" or "llama.cpp"."""

    def __init__(
        self,
        url: str,
        model: str,
        kind: str,
        chat_template: ChatTemplate,
        *,
        vllm_version: tuple[int, ...] = (),
        branch_threads: int = 64,
        timeout: float = 600,
    ) -> None:
        self.url, self.model, self.kind, self.chat_template = (
            url.rstrip("/"),
            model,
            kind,
            chat_template,
        )
        self.vllm_version, self.timeout = vllm_version, timeout
        self._local = threading.local()  # one HTTP session (kept-alive connection) per thread
        self._branches = ThreadPoolExecutor(branch_threads, thread_name_prefix="plain-branch")

    def _post(self, body: dict[str, Any]) -> str:
        session = self._local.__dict__.setdefault("session", requests.Session())
        r = session.post(
            self.url + "/v1/completions",
            json={"model": self.model, "temperature": 0, **body},
            timeout=self.timeout,
        )
        if r.status_code != 200:
            raise RuntimeError(
                f"{self.kind} /v1/completions answered {r.status_code}: {r.text[:300]}"
            )
        return r.json()["choices"][0]["text"]

    def complete(
        self,
        prompt: str,
        max_tokens: int,
        *,
        stop: str | None = None,
        regex: str | None = None,
        gbnf: str | None = None,
        ignore_eos: bool = False,
    ) -> str:
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens}
        if stop is not None:
            body["stop"] = [stop]
        if ignore_eos:
            body["ignore_eos"] = True  # an extra field on all three servers
        if regex is not None:
            body.update(self._constraint(regex, gbnf))
        return self._post(body)

    def _constraint(self, regex: str, gbnf: str | None) -> dict[str, Any]:
        if self.kind == "vllm":
            return vllm_fields("regex", regex, self.vllm_version)
        if self.kind == "llama.cpp":
            if gbnf is None:
                raise ValueError("llama.cpp constrains by GBNF grammar, not regex: give gbnf= too")
            return {"grammar": gbnf}
        return {"regex": regex}

    def choose(self, prompt: str, choices: list[str]) -> str:
        fields = choice_fields(self.kind, choices, self.vllm_version)
        longest = max(len(c) for c in choices)  # a token is at least one character
        return self._post({"prompt": prompt, "max_tokens": longest + 1, **(fields or {})})

    def concurrently(self, calls: list[Callable[[], T]]) -> list[T]:
        return [f.result() for f in [self._branches.submit(call) for call in calls]]

    def close(self) -> None:
        self._branches.shutdown(wait=True)


def recorded_answer(prompt: str) -> str:
    """What both recorders answer: a function of the prompt alone, so both forms of a workload
    go on with the same text."""
    return f" w{sum(map(ord, prompt)) % 997}"


def recorded_choice(prompt: str, choices: list[str]) -> str:
    """What both recorders pick: a function of the prompt alone, as `recorded_answer`."""
    return choices[sum(map(ord, prompt)) % len(choices)]


class Recorder:
    """Completions that answer at once and record (prompt, what was asked)."""

    def __init__(self, chat_template: ChatTemplate) -> None:
        self.chat_template, self.calls, self._lock = chat_template, [], threading.Lock()

    def _record(self, entry: tuple) -> None:
        with self._lock:
            self.calls.append(entry)

    def complete(
        self,
        prompt: str,
        max_tokens: int,
        *,
        stop: str | None = None,
        regex: str | None = None,
        gbnf: str | None = None,
        ignore_eos: bool = False,
    ) -> str:
        self._record(("gen", prompt, max_tokens, stop, regex, ignore_eos))
        return recorded_answer(prompt)

    def choose(self, prompt: str, choices: list[str]) -> str:
        self._record(("select", prompt, tuple(choices)))
        return recorded_choice(prompt, choices)

    def concurrently(self, calls: list[Callable[[], T]]) -> list[T]:
        return [call() for call in calls]


class RecordingBackend(Backend):
    """The sgl program's side of the check: every gen and select recorded, answered as
    `Recorder`."""

    def __init__(self, chat_template: ChatTemplate) -> None:
        self._template, self.calls, self._lock = chat_template, [], threading.Lock()

    def generate(self, text, sampling, logprobs, session=None):
        stop = sampling.get("stop")
        with self._lock:
            self.calls.append(
                (
                    "gen",
                    text,
                    sampling.get("max_new_tokens"),
                    stop[0] if isinstance(stop, list) else stop,
                    sampling.get("regex"),
                    bool(sampling.get("ignore_eos")),
                )
            )
        return recorded_answer(text), {"finish_reason": {"type": "length"}}

    def generate_stream(self, text, sampling, logprobs, session=None) -> Iterator[tuple[str, Any]]:
        yield self.generate(text, sampling, logprobs, session)

    def select(self, text, choices, temperature, method):
        with self._lock:
            self.calls.append(("select", text, tuple(choices)))
        return ChoicesDecision(recorded_choice(text, choices))

    def cache_prefix(self, text):
        pass

    def chat_template(self):
        return self._template
