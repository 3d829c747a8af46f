"""How a program state's gen and select call the backend: sampling and constraint options
(`dtype=`), the backend session that pins the state's KV, a chat backend's messages, streaming
pieces and speculative fills. A mixin of `StreamExecutor` (executor.py), apart from its
thread and bookkeeping because it is the one part that talks to the backend."""

from __future__ import annotations

import json
import logging
from typing import Any

from sgl.lang import ir
from sgl.lang.choices import token_length_normalized
from sgl.lang.errors import ProgramError
from sgl.lang.speculative import Speculation, speculable, speculative_meta
from sgl.tool_calls import get_parser

CONSTRAINTS = ("regex", "json_schema", "ebnf", "structural_tag")


def parsed_calls(text: str, tool_format: str) -> list[dict[str, Any]]:
    """A gen's tool calls as [{"name", "arguments": dict}] (the constraint made them valid)."""
    return [
        {"name": c.name, "arguments": json.loads(c.arguments)}
        for c in get_parser(tool_format).parse(text)[1]
    ]


# dtype= of gen: the regex that constrains the output (bounded, so it always terminates). Numbers
# and strings are spelled as JSON spells them (no leading zeros, no "+", no control characters),
# so a program can write them into JSON; they are also Python literals.
DTYPE_REGEX = {
    "int": r"-?(0|[1-9][0-9]{0,17})[ \n]?",
    "float": r"-?(0|[1-9][0-9]{0,14})(\.[0-9]{1,15})?[ \n]?",
    "bool": r"(True|False)",
    "str": r'"[^"\\\x00-\x1f]{0,256}"',
}
# As SGLang does, a number may end at a space or newline: stop strings, so the value holds neither.
# A small model ends a number where it would write a separator far more readily than with EOS.
DTYPE_STOP = {"int": [" ", "\n"], "float": [" ", "\n"]}

logger = logging.getLogger(__name__)


class GenerationMixin:
    """`StreamExecutor`'s gen and select (it holds the state these methods read and write)."""

    def _params(self, gen: ir.Gen) -> tuple[dict[str, Any], dict[str, Any]]:
        sampling = {
            k: v for k, v in self.defaults.items() if k in ir.SAMPLING_KEYS and v is not None
        }
        logprobs = {
            k: v for k, v in self.defaults.items() if k in ir.LOGPROB_KEYS and v is not None
        }
        sampling.update(gen.sampling)
        logprobs.update(gen.logprobs)
        if gen.dtype is not None:
            if any(sampling.get(k) is not None for k in CONSTRAINTS):
                raise ValueError(
                    f"gen {gen.name!r}: dtype cannot be combined with regex, json_schema or ebnf"
                )
            sampling["regex"] = DTYPE_REGEX[gen.dtype]
            if gen.dtype in DTYPE_STOP:
                stop = sampling.get("stop") or []
                sampling["stop"] = [
                    *([stop] if isinstance(stop, str) else stop),
                    *DTYPE_STOP[gen.dtype],
                ]
        if sum(sampling.get(k) is not None for k in CONSTRAINTS) > 1:
            raise ValueError(
                f"gen {gen.name!r}: give at most one of regex, json_schema, ebnf and tools"
            )
        if logprobs.get("return_logprob") and "logprob_start_len" not in logprobs:
            logprobs[
                "logprob_start_len"
            ] = -1  # output logprobs only, unless asked for the prompt's
        if not logprobs.get("return_logprob"):
            logprobs = {}
        return sampling, logprobs

    def _session_kwargs(self) -> dict[str, Any]:
        if not self._session_asked:
            self._session_asked = True
            try:
                self._session = self.backend.open_session()
            except Exception:  # sessions only pin the cache: run without one
                logger.warning("could not open a backend session; running without", exc_info=True)
        return {"session": self._session} if self._session is not None else {}

    def _close_session(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            try:
                self.backend.close_session(session)
            except Exception:  # the backend times it out anyway
                logger.warning("could not close backend session %s", session, exc_info=True)

    def _chat_messages(self, what: str) -> dict[str, Any]:
        """`messages=` for a backend that takes the conversation (a chat API), else nothing.

        A chat API writes a whole assistant message after the conversation, so the gen or
        select must open an assistant turn, and no text may lie outside the roles."""
        if not getattr(self.backend, "wants_messages", False):
            return {}
        if self.role != "assistant" or len(self.text_) != self.role_start:
            where = (
                "outside any role"
                if self.role is None
                else f"inside a {self.role} turn"
                if self.role != "assistant"
                else "after text already in the assistant turn"
            )
            raise ProgramError(
                f"{what}: this backend is a chat model, which answers with a whole assistant "
                "message, so a gen or "
                "select must be the first thing in an assistant turn (s += "
                "sgl.assistant(sgl.gen(...))); this one "
                f"is {where}. Move that text into the user turn, or use a completion model "
                "(is_chat_model=False)."
            )
        if self.loose_text:
            raise ProgramError(
                f"{what}: this backend is a chat model and receives only the role messages, but "
                "the program added "
                "text outside any role, which it would never see. Put that text inside "
                "sgl.system/user/assistant, "
                f"or use a completion model (is_chat_model=False)."
            )
        return {"messages": [dict(m) for m in self.messages_]}

    def _gen(self, gen: ir.Gen) -> None:
        sampling, logprobs = self._params(gen)
        if self._speculative_gen(gen, sampling, logprobs):
            return
        try:
            text, meta = self._generate(gen, sampling, logprobs, self._session_kwargs())
        except ValueError as e:  # the backends' request errors name their field in `param`
            if self._session is None or getattr(e, "param", None) != "session_params.id":
                raise
            # The session is gone (it timed out while the program sat idle). It only pinned
            # the cache, so the state goes on without one; nothing was generated yet.
            self._session = None
            text, meta = self._generate(gen, sampling, logprobs, {})
        self.backend.record_usage(meta)
        logger.debug(
            "gen %r: %r (%s prompt tokens, %s completion tokens)",
            gen.name,
            text[:80],
            meta.get("prompt_tokens"),
            meta.get("completion_tokens"),
        )
        if gen.tool_format is not None:  # the variable holds the calls: [{"name", "arguments"}]
            meta = {**meta, "tool_calls": parsed_calls(text, gen.tool_format)}
        if gen.name is not None:
            self.set_variable(gen.name, meta["tool_calls"] if gen.tool_format is not None else text)
            self.meta_info[gen.name] = meta

    def _generate(
        self,
        gen: ir.Gen,
        sampling: dict[str, Any],
        logprobs: dict[str, Any],
        session: dict[str, Any],
    ) -> tuple[str, dict[str, Any]]:
        """Run one gen on the backend, appending its text (piece by piece when streaming)."""
        kwargs = {**session, **self._chat_messages(f"gen {gen.name!r}")}
        if not self.stream:
            text, meta = self.backend.generate(self.text_, sampling, logprobs, **kwargs)
            self._append(text, gen.name)
            return text, meta
        pieces = []
        meta: dict[str, Any] = {}
        for piece, m in self.backend.generate_stream(self.text_, sampling, logprobs, **kwargs):
            if (
                m is not None
            ):  # the meta info so far (completion tokens, logprobs), final on the last piece
                meta = m
            if piece:
                pieces.append(piece)
                self._append(piece, gen.name, meta)
        return "".join(pieces), meta

    def _select(self, sel: ir.Select) -> None:
        method = sel.choices_method or token_length_normalized
        decision = self.backend.select(
            self.text_,
            list(sel.choices),
            sel.temperature,
            method,
            **self._chat_messages(f"select {sel.name!r}"),
        )
        self._append(decision.decision, sel.name)
        if sel.name is not None:
            self.set_variable(sel.name, decision.decision)
            self.meta_info[sel.name] = decision.meta_info

    def _speculative_gen(
        self, gen: ir.Gen, sampling: dict[str, Any], logprobs: dict[str, Any]
    ) -> bool:
        """Fill the gen from the speculation, making one call for it first if there is none
        that fits; False (nothing done) where speculation does not apply or cannot be proven."""
        if (
            not (self.spec_tokens and getattr(self.backend, "supports_speculation", False))
            or self.stream
            or logprobs
            or not speculable(sampling)
            or sampling.get("max_new_tokens") is None
        ):
            return False
        filled = self.spec.take(sampling) if self.spec is not None else None
        call_meta: dict[str, Any] = {}
        if filled is None:
            wide = {**sampling, "max_new_tokens": max(sampling["max_new_tokens"], self.spec_tokens)}
            wide.pop("stop", None)
            text, call_meta = self.backend.generate(
                self.text_,
                wide,
                {"return_logprob": True, "top_logprobs_num": 0, "logprob_start_len": -1},
            )
            self.spec = Speculation.from_result(text, call_meta, wide)
            if self.spec is None:  # the endpoint gave no token boundaries: stop speculating here
                self.spec_tokens = None
            filled = self.spec.take(sampling) if self.spec is not None else None
            if filled is None:  # this gen's own call decides
                return False
        text, meta = filled
        meta = (
            {**{k: call_meta.get(k) for k in ("id", "prompt_tokens", "cached_tokens")}, **meta}
            if call_meta
            else speculative_meta(meta)
        )
        self._append(text, gen.name)
        if gen.name is not None:
            self.set_variable(gen.name, text)
            self.meta_info[gen.name] = meta
        return True
