"""Reasoning ("thinking") in a model's output: `<think>reasoning</think>content`.

The API returns the reasoning apart (`reasoning_content`), so it is split off before tool calls
are parsed. The opening `<think>` may be missing from the output when the chat template put it
in the prompt; then everything before `</think>` is reasoning. The styles differ only when
there is no tag at all: deepseek-r1 always thinks (all reasoning), qwen3 may have thinking off
(all content).

Reasoning is stripped of surrounding whitespace and content of leading newlines; empty
reasoning is None. The streamer gives the same text for any split of the output: it holds
whitespace and a possible partial tag until the next text decides them.
"""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# style -> whether an output with no tag at all is reasoning: the one table of styles, which
# `--reasoning-parser` takes its choices from (`reasoning_parser_names`)
ALWAYS_THINKS = {"qwen3": False, "deepseek-r1": True}
REASONING_STYLES = tuple(ALWAYS_THINKS)


def reasoning_parser_names() -> dict[str, str]:
    """Every name `--reasoning-parser` takes -> the style (no aliases yet)."""
    return {style: style for style in REASONING_STYLES}


def _check_style(style: str) -> str:
    if style not in REASONING_STYLES:
        raise ValueError(
            f"unknown reasoning parser {style!r}; known: {', '.join(REASONING_STYLES)}"
        )
    return style


def _partial_len(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could be the start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class ReasoningParser:
    """Splits an output into (reasoning_content, content) for one model family's style."""

    def __init__(self, style: str) -> None:
        self.style = _check_style(style)

    def parse(self, text: str) -> tuple[str | None, str]:
        s = text.lstrip()
        opened = s.startswith(THINK_OPEN)
        body = s[len(THINK_OPEN) :] if opened else text
        c = body.find(THINK_CLOSE)
        if c < 0:
            if not ALWAYS_THINKS[self.style] and not opened:  # thinking was off
                return None, text
            return body.strip() or None, ""
        return body[:c].strip() or None, body[c + len(THINK_CLOSE) :].lstrip("\n")

    def streamer(self) -> ReasoningStreamer:
        return ReasoningStreamer(self.style)


class ReasoningStreamer:
    """`ReasoningParser.parse` over a stream: feed() -> (reasoning delta, content delta).

    States: start (is there an opening tag?), undecided (qwen3 with no opening tag: reasoning
    only if `</think>` comes, so the text is held until it does or the output ends), reasoning,
    content.
    """

    def __init__(self, style: str) -> None:
        self.style = _check_style(style)
        self._state = "start"
        self._buf = ""  # text not sent yet
        self._searched = 0  # undecided: `</think>` is not in _buf before this
        self._reasoning_started = False  # leading whitespace of the reasoning is dropped
        self._content_started = False  # leading newlines of the content are dropped
        self._out: tuple[list[str], list[str]] = ([], [])

    def feed(self, piece: str) -> tuple[str, str]:
        self._buf += piece
        return self._advance(final=False)

    def finish(self) -> tuple[str, str]:
        return self._advance(final=True)

    def _advance(self, final: bool) -> tuple[str, str]:
        self._out = ([], [])
        while True:
            state = self._state
            getattr(self, f"_step_{state}")(final)
            if self._state == state:
                break
        return "".join(self._out[0]), "".join(self._out[1])

    def _step_start(self, final: bool) -> None:
        s = self._buf.lstrip()
        if s.startswith(THINK_OPEN):
            self._buf, self._state = s[len(THINK_OPEN) :], "reasoning"
        elif final or not THINK_OPEN.startswith(s):
            self._state = "reasoning" if ALWAYS_THINKS[self.style] else "undecided"

    def _step_undecided(self, final: bool) -> None:
        if self._buf.find(THINK_CLOSE, self._searched) >= 0:
            self._state = "reasoning"
        elif final:
            self._out[1].append(self._buf)
            self._buf = ""
        else:
            self._searched = max(0, len(self._buf) - len(THINK_CLOSE) + 1)

    def _step_reasoning(self, final: bool) -> None:
        c = self._buf.find(THINK_CLOSE)
        if c >= 0:
            self._emit_reasoning(self._buf[:c].rstrip())
            self._buf, self._state = self._buf[c + len(THINK_CLOSE) :], "content"
            return
        keep = 0 if final else _partial_len(self._buf, THINK_CLOSE)
        ready = self._buf[
            : len(self._buf) - keep
        ].rstrip()  # trailing whitespace: dropped before </think>
        self._emit_reasoning(ready)
        self._buf = "" if final else self._buf[len(ready) :]

    def _emit_reasoning(self, text: str) -> None:
        if not self._reasoning_started:
            text = text.lstrip()
            self._reasoning_started = bool(text)
        if text:
            self._out[0].append(text)

    def _step_content(self, final: bool) -> None:
        if not self._content_started:
            self._buf = self._buf.lstrip("\n")
            self._content_started = bool(self._buf)
        self._out[1].append(self._buf)
        self._buf = ""
