"""The two contracts every tool-call format fills: `ToolParser` (a model's output text -> content
and calls, whole or streamed) and `ToolFormat` (everything else about the format: its names,
how a chat template shows it, how a call is written and constrained). Kept apart from the
formats so each format module depends on these contracts only, and the registry on the formats.

The parsers are built so that, for any split of the output into pieces, what a streamer emits
adds up to `parse` of the whole: a decision is only taken once the text seen so far fixes it,
and a call is only emitted once it is complete and valid. Text that starts like a call but is
not one (bad JSON, no name, unclosed at the end) stays in the content, verbatim; parsing never
raises on model output.

`arguments` is JSON text of an object: for the JSON formats the source text the model wrote
(not re-serialized), for `pythonic` `json.dumps` of the keyword arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of the arguments object


@dataclass
class ToolCallDelta:
    """One streamed piece of a call: its first delta carries the name (and here all its
    arguments)."""

    index: int  # the call's position in this response (0, 1, ...)
    name: str | None = None
    arguments: str = ""  # a fragment of the arguments JSON text


class ToolStreamer:
    """Splits a streamed output into content and call deltas, exactly as `parse` splits the
    whole."""

    def feed(self, piece: str) -> tuple[str, list[ToolCallDelta]]:
        """New output text -> (content safe to send now, call deltas)."""
        raise NotImplementedError

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """End of output -> whatever was held back."""
        raise NotImplementedError


class ToolParser:
    """One tool-call format; `name` is what `--tool-call-parser` calls it."""

    name: str = ""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """The whole output -> (the text outside the calls, the calls)."""
        raise NotImplementedError

    def streamer(self) -> ToolStreamer:
        raise NotImplementedError


def deltas(calls: list[ToolCall], first: int = 0) -> list[ToolCallDelta]:
    """Whole calls as stream deltas, numbered from `first`."""
    return [ToolCallDelta(first + k, c.name, c.arguments) for k, c in enumerate(calls)]


Functions = list[tuple[str, dict[str, Any]]]  # (name, parameters schema) of each callable function


class ToolFormat:
    """Everything about one tool-call format, declared once in its module under
    `sgl.tool_calls.formats` and found by name through `sgl.tool_calls.registry`."""

    parser: type[ToolParser]  # reads the format out of a model's output
    aliases: tuple[
        str, ...
    ] = ()  # SGLang's names for the same format, taken by `--tool-call-parser`

    @property
    def name(self) -> str:
        """What `--tool-call-parser` and a gen's `tool_format` call it: its parser's name."""
        return self.parser.name

    def teaches(self, chat_template: str) -> bool:
        """Whether a chat template's text teaches the model this format (from its markers)."""
        raise NotImplementedError

    def call_text(self, name: str, arguments: str) -> str:
        """One call written in the format (for rendering history the template cannot);
        `arguments` is the arguments object's JSON text."""
        raise NotImplementedError

    def constraint(self, functions: Functions, free_text: bool, one_call: bool) -> dict[str, Any]:
        """The structural tag that constrains output to calls to `functions` in the format: free
        text with calls in it (`free_text`), or calls only; at most one call (`one_call`) or any."""
        raise NotImplementedError

    def function_fields(self, k: int) -> dict[str, str]:
        """The fields of `constraint`'s tag built from the k-th function -> the part of that
        function they come from ("name", "parameters"), so a constraint error names the tool."""
        raise NotImplementedError

    def prompt_example(self) -> str:
        """How a call looks, for the system prompt that describes tools (`tools_prompt`)."""
        return self.call_text("<function name>", "<arguments as a JSON object>")
