"""hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, anywhere in the output
(Hermes 2 Pro, Qwen2.5, Qwen3; SGLang calls it qwen25 / qwen too). The default format."""

from __future__ import annotations

from sgl.tool_calls.json_text import (
    MORE,
    Memo,
    Need,
    bracket_end,
    call_from_object,
    not_final,
    skip_ws,
)
from sgl.tool_calls.marker import Block, MarkerParser
from sgl.tool_calls.syntax import CallSyntax, JsonCallFormat


class HermesParser(MarkerParser):
    """Hermes 2 Pro / Qwen2.5 / Qwen3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

    Any whitespace around the JSON; "parameters" is accepted for "arguments"; no arguments: "{}".
    """

    name = "hermes"
    marker = "<tool_call>"
    end_marker = "</tool_call>"

    def _match_block(
        self, text: str, start: int, final: bool, memo: Memo | None = None
    ) -> Block | Need | None:
        i = skip_ws(text, start + len(self.marker))
        if i == len(text):
            return not_final(final)
        if text[i] != "{":
            return None
        end = bracket_end(text, i, final, memo)
        if not isinstance(end, int):
            return end
        j = skip_ws(text, end)
        if not text.startswith(self.end_marker, j):
            return MORE if not final and self.end_marker.startswith(text[j:]) else None
        call = call_from_object(text[i:end])
        return Block([call], j + len(self.end_marker)) if call else None


FORMAT = JsonCallFormat(
    aliases=("qwen25", "qwen"),
    parser=HermesParser,
    syntax=CallSyntax(
        "<tool_call>", '<tool_call>\n{{"name": {name}, "arguments": ', "}\n</tool_call>", "\n"
    ),
    teaches_when=lambda template: "<tool_call>" in template,
)
