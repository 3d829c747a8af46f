"""Tool-call formats and reasoning output: parsing a model's text (whole or streamed) and
the call syntax each format constrains to. Used by the server's OpenAI API and by `gen`
with tools in programs.

One module per format under `formats/`, found by name through `registry` (which also gives
`--tool-call-parser` its choices); `base` holds the contracts they fill, `json_text` and
`marker` the scanning the JSON formats share. Pure Python (stdlib only), so it is tested
without a model and used by the server on detokenized text, whole or streamed.
"""

from __future__ import annotations

from sgl.tool_calls.base import ToolCall, ToolCallDelta, ToolFormat, ToolParser, ToolStreamer
from sgl.tool_calls.formats.hermes import HermesParser
from sgl.tool_calls.formats.llama3_json import Llama3JsonParser
from sgl.tool_calls.formats.mistral import MistralParser
from sgl.tool_calls.formats.pythonic import PythonicParser, pythonic_constraint
from sgl.tool_calls.functions import function_tool
from sgl.tool_calls.reasoning import REASONING_STYLES, ReasoningParser, ReasoningStreamer
from sgl.tool_calls.registry import (
    FORMATS,
    PARSERS,
    SYNTAX,
    call_text,
    detect_parser,
    get_format,
    get_parser,
    structural_tag,
    tools_prompt,
)
from sgl.tool_calls.syntax import CallSyntax

__all__ = [
    "FORMATS",
    "PARSERS",
    "REASONING_STYLES",
    "SYNTAX",
    "CallSyntax",
    "HermesParser",
    "Llama3JsonParser",
    "MistralParser",
    "PythonicParser",
    "ReasoningParser",
    "ReasoningStreamer",
    "ToolCall",
    "ToolCallDelta",
    "ToolFormat",
    "ToolParser",
    "ToolStreamer",
    "call_text",
    "detect_parser",
    "function_tool",
    "get_format",
    "get_parser",
    "pythonic_constraint",
    "structural_tag",
    "tools_prompt",
]
