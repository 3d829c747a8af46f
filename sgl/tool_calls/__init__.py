"""Tool-call formats and reasoning output: parsing a model's text (whole or streamed) and
the call syntax each format constrains to. Used by the server's OpenAI API and by `gen`
with tools in programs.

Pure Python (stdlib only), so it is tested without a model and used by the server on
detokenized text, whole or streamed.
"""

from __future__ import annotations

from sgl.tool_calls.parsers import (
    PARSERS,
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    PythonicParser,
    ToolCall,
    ToolCallDelta,
    ToolParser,
    ToolStreamer,
    detect_parser,
    get_parser,
)
from sgl.tool_calls.reasoning import REASONING_STYLES, ReasoningParser, ReasoningStreamer
from sgl.tool_calls.functions import function_tool
from sgl.tool_calls.syntax import SYNTAX, CallSyntax, call_text, pythonic_constraint, structural_tag, tools_prompt

__all__ = [
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
    "ToolParser",
    "ToolStreamer",
    "call_text",
    "detect_parser",
    "function_tool",
    "get_parser",
    "pythonic_constraint",
    "structural_tag",
    "tools_prompt",
]
