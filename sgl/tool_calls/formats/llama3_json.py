"""llama3_json: Llama 3.1-3.3's JSON calls, `{"name": ..., "parameters": {...}}` joined by ';',
as the whole output or after `<|python_tag|>` (SGLang calls it llama3 too). Unlike the marker
formats a call has no begin marker, so the whole output is held while it may still be calls."""

from __future__ import annotations

from sgl.tool_calls.base import ToolCall, ToolCallDelta, ToolParser, ToolStreamer, deltas
from sgl.tool_calls.json_text import (
    MORE,
    Memo,
    Need,
    bracket_end,
    call_from_object,
    partial_len,
    skip_ws,
)
from sgl.tool_calls.syntax import CallSyntax, JsonCallFormat

PYTHON_TAG = "<|python_tag|>"


def _json_call_list(
    body: str, final: bool, memo: Memo | None = None
) -> list[ToolCall] | Need | None:
    """`{call}; {call} ...` filling all of `body` (whitespace around, a trailing ';' allowed).

    Each call needs "parameters" (or "arguments"): with no marker, a plain JSON answer such as
    {"name": "Bob"} must not become a call. MORE while `body` can still grow into calls.
    """
    calls: list[ToolCall] = []
    pos = 0
    if memo is not None and memo.calls and body.startswith(memo.calls_text):
        calls, pos = list(memo.calls), len(memo.calls_text)
    while True:
        i = skip_ws(body, pos)
        if calls:  # after a call: the end, or ';' and the next one
            if i == len(body):
                return calls if final else MORE
            if body[i] != ";":
                return None
            i = skip_ws(body, i + 1)
        if i == len(body):
            return (calls or None) if final else MORE
        if body[i] != "{":
            return None
        end = bracket_end(body, i, final, memo)
        if not isinstance(end, int):
            return end
        call = call_from_object(body[i:end], require_args=True)
        if call is None:
            return None
        calls.append(call)
        pos = end
        if memo is not None:
            memo.calls_text, memo.calls = body[:end], list(calls)


class Llama3JsonParser(ToolParser):
    """Llama 3.1-3.3 JSON calls: `{"name": ..., "parameters": {...}}`, several joined by ';'.

    Calls only if all of the output is calls, after optional leading whitespace, or after the
    first `<|python_tag|>` (the text before the tag is then content); otherwise all is content.
    """

    name = "llama3_json"

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        i = text.find(PYTHON_TAG)
        pre, body = (text[:i], text[i + len(PYTHON_TAG) :]) if i >= 0 else ("", text)
        calls = _json_call_list(body, final=True)
        if not isinstance(calls, list):
            return text, []
        return (pre if pre.strip() else ""), calls

    def streamer(self) -> ToolStreamer:
        return _Llama3Streamer(self)


class _Llama3Streamer(ToolStreamer):
    """Holds the output while it may be calls: from the start while it looks like JSON calls,
    and all that follows `<|python_tag|>`. Modes: start (nothing sent yet), text (no tag yet,
    the output is not calls from its start), tagged (holding after the tag), through (all content).
    """

    def __init__(self, parser: Llama3JsonParser) -> None:
        self._parser = parser
        self._held = ""
        self._mode = "start"
        self._body_at = 0  # tagged: where the calls begin in _held
        self._memo = Memo()

    def _release(self, n: int) -> str:
        out, self._held = self._held[:n], self._held[n:]
        return out

    def feed(self, piece: str) -> tuple[str, list[ToolCallDelta]]:
        seen = len(self._held)
        self._held += piece
        if self._mode == "through":
            return self._release(len(self._held)), []
        if self._mode == "tagged":
            return self._check_tagged(), []
        i = self._held.find(
            PYTHON_TAG, max(0, seen - len(PYTHON_TAG) + 1)
        )  # (not in what was seen)
        if i >= 0:
            # before the tag: content, unless (at the start) it is whitespace only, then dropped
            out = ""
            if self._mode == "text" or self._held[:i].strip():
                out, i = self._release(i), 0
            self._mode, self._body_at = "tagged", i + len(PYTHON_TAG)
            return out + self._check_tagged(), []
        cut = len(self._held) - partial_len(self._held, 0, PYTHON_TAG)
        if self._mode == "start":
            j = skip_ws(self._held, 0)
            if j >= cut or (
                self._held[j] == "{" and _json_call_list(self._held, False, self._memo) is not None
            ):
                return "", []
            self._mode = "text"
        return self._release(cut), []

    def _check_tagged(self) -> str:
        if _json_call_list(self._held[self._body_at :], False, self._memo) is None:
            self._mode = "through"
            return self._release(len(self._held))
        return ""

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        if self._mode == "start":
            content, calls = self._parser.parse(self._release(len(self._held)))
            return content, deltas(calls)
        if self._mode == "tagged":
            calls = _json_call_list(self._held[self._body_at :], final=True)
            if isinstance(calls, list):
                self._held = ""
                return "", deltas(calls)
        return self._release(len(self._held)), []


def _teaches(template: str) -> bool:
    return PYTHON_TAG in template or ('"parameters"' in template and "ipython" in template)


FORMAT = JsonCallFormat(
    aliases=("llama3",),
    parser=Llama3JsonParser,
    syntax=CallSyntax('{"name": ', '{{"name": {name}, "parameters": ', "}", "; "),
    teaches_when=_teaches,
)
