"""mistral: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` (v3 tokenizer) or
`[TOOL_CALLS]name[ARGS]{...}` per call (v11+), anywhere in the output."""

from __future__ import annotations

import re

from sgl.tool_calls.base import ToolCall
from sgl.tool_calls.json_text import (
    MORE,
    Memo,
    Need,
    bracket_end,
    calls_from_array,
    not_final,
    object_members,
    skip_ws,
)
from sgl.tool_calls.marker import Block, MarkerParser
from sgl.tool_calls.syntax import CallSyntax, JsonCallFormat

_MISTRAL_NAME = re.compile(r"[\w.\-]+")


class MistralParser(MarkerParser):
    """Mistral: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` (v3 tokenizer) or
    `[TOOL_CALLS]name[ARGS]{...}`, repeated per call (v11+)."""

    name = "mistral"
    marker = "[TOOL_CALLS]"
    args_marker = "[ARGS]"

    def _match_block(
        self, text: str, start: int, final: bool, memo: Memo | None = None
    ) -> Block | Need | None:
        i = skip_ws(text, start + len(self.marker))
        if i == len(text):
            return not_final(final)
        if text[i] == "[":
            end = bracket_end(text, i, final, memo)
            if not isinstance(end, int):
                return end
            calls = calls_from_array(text[i:end])
            return Block(calls, end) if calls else None
        m = _MISTRAL_NAME.match(text, i)
        if m is None:
            return None
        if not text.startswith(self.args_marker, m.end()):  # (the name may still be growing)
            return MORE if not final and self.args_marker.startswith(text[m.end() :]) else None
        k = skip_ws(text, m.end() + len(self.args_marker))
        if k == len(text):
            return not_final(final)
        if text[k] != "{":
            return None
        end = bracket_end(text, k, final, memo)
        if not isinstance(end, int):
            return end
        if object_members(text[k:end]) is None:
            return None
        return Block([ToolCall(m.group(), text[k:end])], end)


FORMAT = JsonCallFormat(
    parser=MistralParser,
    syntax=CallSyntax("[TOOL_CALLS]", '[TOOL_CALLS] [{{"name": {name}, "arguments": ', "}]", ""),
    teaches_when=lambda template: "[TOOL_CALLS]" in template,
)
