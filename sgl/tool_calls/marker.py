"""The scan shared by formats whose calls follow a marker anywhere in the output (hermes'
`<tool_call>`, mistral's `[TOOL_CALLS]`): the text outside the blocks is content, and a stream
holds back only a possible partial marker or an unfinished block. A format fills in
`MarkerParser.marker` and `_match_block`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sgl.tool_calls.base import ToolCall, ToolCallDelta, ToolParser, ToolStreamer, deltas
from sgl.tool_calls.json_text import MORE, Memo, Need, partial_len, skip_ws


@dataclass
class Block:
    calls: list[ToolCall]
    end: int  # where the block ends in the text


class MarkerParser(ToolParser):
    """Formats where calls follow a marker anywhere in the output; the text outside is content.

    Whitespace that only separates consecutive calls, or trails after the last one, is dropped.
    A marker whose block is not a valid call is content, and scanning goes on after it.
    """

    marker: str = ""

    def _match_block(
        self, text: str, start: int, final: bool, memo: Memo | None = None
    ) -> Block | Need | None:
        """The calls of the block whose marker starts at text[start]; MORE if not known yet."""
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        content, calls, _, _ = self._scan(text, 0, False, True, None)
        return content, calls

    def streamer(self) -> ToolStreamer:
        return MarkerStreamer(self)

    def _scan(
        self, text: str, pos: int, after_call: bool, final: bool, memo: Memo | None
    ) -> tuple[str, list[ToolCall], int, bool]:
        """Consume text[pos:] as far as it is decided -> (content, calls, new pos, after_call).

        It stops, without consuming, where the answer depends on text not seen yet, so running
        it again on a longer text from the returned state gives what one run on it would.
        `after_call`: a call was the last thing consumed, so whitespace now waits to see
        whether another call follows.
        """
        content: list[str] = []
        calls: list[ToolCall] = []
        while True:
            if after_call:
                start = skip_ws(text, pos)
                if start == len(text):  # whitespace only: dropped at the end
                    return "".join(content), calls, (start if final else pos), after_call
                if not text.startswith(self.marker, start):
                    if not final and self.marker.startswith(text[start:]):
                        break
                    after_call = False
                    continue
            else:
                start = text.find(self.marker, pos)
                if start < 0:
                    end = len(text) if final else len(text) - partial_len(text, pos, self.marker)
                    content.append(text[pos:end])
                    pos = end
                    break
                content.append(text[pos:start])
                pos = start
            found = self._match_block(text, start, final, memo)
            if found is MORE:
                break
            if isinstance(found, Block):
                calls.extend(found.calls)
                pos, after_call = found.end, True
            else:  # not a call: the marker (and the whitespace before it) is content
                content.append(text[pos : start + len(self.marker)])
                pos, after_call = start + len(self.marker), False
        return "".join(content), calls, pos, after_call


class MarkerStreamer(ToolStreamer):
    """Runs the parser's scan on what is not consumed yet; holds only undecided text."""

    def __init__(self, parser: MarkerParser) -> None:
        self._parser = parser
        self._buf = ""
        self._after_call = False
        self._count = 0
        self._memo = Memo()

    def feed(self, piece: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += piece
        return self._run(final=False)

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        return self._run(final=True)

    def _run(self, final: bool) -> tuple[str, list[ToolCallDelta]]:
        content, calls, pos, self._after_call = self._parser._scan(
            self._buf, 0, self._after_call, final, self._memo
        )
        self._buf = self._buf[pos:]
        out = deltas(calls, self._count)
        self._count += len(calls)
        return content, out
