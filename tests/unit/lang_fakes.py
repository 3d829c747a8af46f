"""A deterministic fake `sgl.lang.Backend` for the interpreter tests (no model, no torch).

Generation: the reply is looked up by the end of the prompt (`replies={"A:": " 4"}`; a list
of replies is a queue), or computed by `respond(text, sampling)`, or, for the dtype regexes,
a fixed value of that type; otherwise `default`. Then it is cut like the engine would: at the
first stop string (finish_reason {"type": "stop", "matched": stop}) or at `max_new_tokens`
characters, one character being one token (finish_reason {"type": "length", ...}).

Choices: each choice's per-token logprobs come from `table` (and `uncond` for the
unconditional ones), and `sgl.lang.choices.decide` makes the decision.

Sessions: with `sessions=True`, `open_session` hands out "session-N"; `open_sessions` is
the set not closed yet and each generation call records the session it came with.

Every call is recorded in `calls` (kind, text, sampling, logprobs, ...). `fail_on(call)`
returning true makes that call raise `FakeBackendError`; `on_call(call)` runs before a call
produces anything (to block on a barrier or an event).
"""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sgl.lang import Backend, ChatTemplate
from sgl.lang.choices import ChoiceScores, ChoicesDecision, ChoicesMethod, decide
from sgl.lang.generation import DTYPE_REGEX

CHATML = ChatTemplate(
    prefix={
        "system": "<|im_start|>system\n",
        "user": "<|im_start|>user\n",
        "assistant": "<|im_start|>assistant\n",
    },
    suffix={"system": "<|im_end|>\n", "user": "<|im_end|>\n", "assistant": "<|im_end|>\n"},
    default_system="<|im_start|>system\nYou are a fake assistant.<|im_end|>\n",
    name="fake-chatml",
)

# What a gen constrained by a dtype regex returns when no reply is scripted.
DTYPE_REPLY = {
    DTYPE_REGEX["int"]: "42",
    DTYPE_REGEX["float"]: "3.25",
    DTYPE_REGEX["bool"]: "True",
    DTYPE_REGEX["str"]: '"fake"',
}


class FakeBackendError(RuntimeError):
    """What the fake raises when `fail_on` says so."""


@dataclass
class Call:
    kind: str  # "generate" | "generate_stream" | "select" | "cache_prefix" | "chat_template" | ...
    text: str = ""
    sampling: dict[str, Any] = field(default_factory=dict)
    logprobs: dict[str, Any] = field(default_factory=dict)
    choices: list[str] | None = None
    temperature: float | None = None
    method: ChoicesMethod | None = None
    session: str | None = None
    result: Any = None  # the generated text or the decision, once produced


class FakeBackend(Backend):
    def __init__(
        self,
        replies: dict[str, str | list[str]] | None = None,
        respond: Callable[[str, dict[str, Any]], str] | None = None,
        default: str = "fake output",
        table: dict[str, list[float]] | None = None,
        uncond: dict[str, list[float]] | None = None,
        template: ChatTemplate | None = None,
        fail_on: Callable[[Call], bool] | None = None,
        on_call: Callable[[Call], None] | None = None,
        stream_pieces: int = 3,
        seed: int = 0,
        server_info: dict[str, Any] | None = None,
        sessions: bool = False,
    ) -> None:
        self.replies = {
            k: (list(v) if isinstance(v, list) else v) for k, v in (replies or {}).items()
        }
        self.respond = respond
        self.default = default
        self.table = dict(table or {})
        self.uncond = dict(uncond or {})
        self.template = template if template is not None else CHATML
        self.fail_on = fail_on
        self.on_call = on_call
        self.stream_pieces = stream_pieces
        self.rng = random.Random(seed)
        self.server_info = (
            server_info if server_info is not None else {"model_path": "fake", "version": "0"}
        )
        self.calls: list[Call] = []
        self.flushes = 0
        self.sessions = sessions
        self.open_sessions: set[str] = set()
        self.sessions_opened = 0
        self._lock = threading.Lock()
        self._ids = 0

    # ------------------------------------------------------------------ recording

    def _record(self, call: Call) -> Call:
        with self._lock:
            self.calls.append(call)
        if self.on_call is not None:
            self.on_call(call)
        if self.fail_on is not None and self.fail_on(call):
            raise FakeBackendError(f"fake backend failed on {call.kind} after {call.text[-20:]!r}")
        return call

    def of_kind(self, *kinds: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.kind in kinds]

    @property
    def gen_calls(self) -> list[Call]:
        return self.of_kind("generate", "generate_stream")

    @property
    def select_calls(self) -> list[Call]:
        return self.of_kind("select")

    @property
    def prefixes(self) -> list[str]:
        return [c.text for c in self.of_kind("cache_prefix")]

    # ------------------------------------------------------------------ generation

    def _reply(self, text: str, sampling: dict[str, Any]) -> str:
        if self.respond is not None:
            return self.respond(text, sampling)
        with self._lock:
            # The longest cue that the prompt ends with wins.
            for cue in sorted(self.replies, key=len, reverse=True):
                if text.endswith(cue):
                    value = self.replies[cue]
                    if isinstance(value, list):
                        if not value:
                            raise AssertionError(f"fake backend: no replies left for cue {cue!r}")
                        return value.pop(0)
                    return value
        regex = sampling.get("regex")
        if regex in DTYPE_REPLY:
            return DTYPE_REPLY[regex]
        return self.default

    def _complete(self, call: Call) -> tuple[str, dict[str, Any]]:
        raw = self._reply(call.text, call.sampling)
        stops = call.sampling.get("stop")
        stops = [stops] if isinstance(stops, str) else list(stops or [])
        limit = call.sampling.get("max_new_tokens")
        cut, matched = len(raw), None
        for stop in stops:
            i = raw.find(stop)
            if i >= 0 and i < cut:
                cut, matched = i, stop
        if limit is not None and limit < cut:
            out, finish = raw[:limit], {"type": "length", "length": limit}
        else:
            out, finish = raw[:cut], {"type": "stop", "matched": matched}
        with self._lock:
            self._ids += 1
            rid = f"fake-{self._ids}"
        meta: dict[str, Any] = {
            "id": rid,
            "prompt_tokens": len(call.text),
            "completion_tokens": len(out),
            "cached_tokens": 0,
            "finish_reason": finish,
        }
        if call.logprobs.get("return_logprob"):
            meta["output_token_logprobs"] = [(-0.5, ord(ch), None) for ch in out]
        call.result = out
        return out, meta

    def generate(
        self,
        text: str,
        sampling: dict[str, Any],
        logprobs: dict[str, Any],
        session: str | None = None,
    ) -> tuple[str, dict[str, Any]]:
        call = self._record(Call("generate", text, dict(sampling), dict(logprobs), session=session))
        return self._complete(call)

    def generate_stream(
        self,
        text: str,
        sampling: dict[str, Any],
        logprobs: dict[str, Any],
        session: str | None = None,
    ) -> Iterator[tuple[str, dict[str, Any] | None]]:
        call = self._record(
            Call("generate_stream", text, dict(sampling), dict(logprobs), session=session)
        )
        out, meta = self._complete(call)
        pieces = split_pieces(out, self.stream_pieces)
        done = 0
        for piece in pieces[:-1]:  # the meta info so far with each piece, as the real backends
            done += len(piece)
            yield piece, {**meta, "completion_tokens": done, "finish_reason": None}
        yield (pieces[-1] if pieces else ""), meta

    # ------------------------------------------------------------------ choices

    def scores(self, choices: list[str], unconditional: bool) -> ChoiceScores:
        cond = [list(self.table.get(c, [-5.0] * len(c))) for c in choices]
        unc = (
            [list(self.uncond.get(c, [-5.0] * len(lp))) for c, lp in zip(choices, cond)]
            if unconditional
            else None
        )
        return ChoiceScores(list(choices), cond, unc)

    def select(
        self, text: str, choices: list[str], temperature: float, method: ChoicesMethod
    ) -> ChoicesDecision:
        call = self._record(
            Call("select", text, choices=list(choices), temperature=temperature, method=method)
        )
        with self._lock:
            seed = self.rng.random()
        decision = decide(
            method,
            self.scores(choices, method.requires_unconditional),
            temperature,
            random.Random(seed),
        )
        call.result = decision.decision
        return decision

    # ------------------------------------------------------------------ the rest

    def cache_prefix(self, text: str) -> None:
        self._record(Call("cache_prefix", text))

    def chat_template(self) -> ChatTemplate:
        with self._lock:
            self.calls.append(Call("chat_template"))
        return self.template

    def open_session(self) -> str | None:
        if not self.sessions:
            return None
        self._record(Call("open_session"))
        with self._lock:
            self.sessions_opened += 1
            sid = f"session-{self.sessions_opened}"
            self.open_sessions.add(sid)
        return sid

    def close_session(self, session: str) -> None:
        self._record(Call("close_session", session=session))
        with self._lock:
            self.open_sessions.remove(session)

    def flush_cache(self) -> bool:
        with self._lock:
            self.flushes += 1
        return True

    def get_server_info(self) -> dict[str, Any]:
        return dict(self.server_info)


def split_pieces(text: str, n: int) -> list[str]:
    """`text` in up to `n` non-empty consecutive pieces."""
    if not text:
        return []
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)]


def within(seconds: float = 10.0):
    """Decorator: run the test body on a thread and fail (instead of hanging) after `seconds`."""

    def wrap(test):
        @functools.wraps(test)
        def run(*args, **kwargs):
            outcome: list[BaseException | None] = []

            def target():
                try:
                    test(*args, **kwargs)
                    outcome.append(None)
                except BaseException as e:  # re-raised on the test's thread
                    outcome.append(e)

            t = threading.Thread(target=target, name=f"test-{test.__name__}", daemon=True)
            t.start()
            t.join(seconds)
            if t.is_alive():
                raise AssertionError(f"{test.__name__} did not finish within {seconds} s (hang)")
            if outcome[0] is not None:
                raise outcome[0]

        return run

    return wrap
