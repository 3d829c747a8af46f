"""Reading JSON calls out of a model's output, as far as the text so far decides them: where a
JSON object or array ends (by bracket depth, without waiting for the end of the output when it
cannot close), its members with their source text, and a call object's name and arguments.
Shared by the JSON formats (hermes, mistral, llama3_json); `MORE` is their answer while the
text is still too short to tell.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any

from sgl.tool_calls.base import ToolCall


class Need(enum.Enum):
    MORE = "more"  # the text so far ends before the answer is known


MORE = Need.MORE

# Outside strings a JSON value only has brackets, these characters and literals' letters, so
# any other character means a bracket can no longer close into valid JSON.
_JSON_PLAIN = re.compile(r"[\w\s:,.+\-]*")
_JSON_STRING_BODY = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.S)
_JSON_WS = re.compile(r"[ \t\n\r]*")
_WS = re.compile(r"\s*")
_DECODER = json.JSONDecoder()


def _run_end(text: str, i: int, run: re.Pattern[str]) -> int:
    """Where the run of `run` (a pattern that may match empty) starting at text[i] ends."""
    m = run.match(text, i)
    return m.end() if m else i


def skip_ws(text: str, i: int) -> int:
    return _run_end(text, i, _WS)


def partial_len(text: str, pos: int, marker: str) -> int:
    """Length of the longest end of text[pos:] that could be the start of `marker` (held back)."""
    for n in range(min(len(marker) - 1, len(text) - pos), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


@dataclass
class Memo:
    """How far scans of a growing text got, so a stream does not rescan a long call from its
    start on every piece. Valid while the text starts with the saved text."""

    text: str = ""  # the open bracket's scan: the text scanned, where it started, its state
    start: int = -1
    depth: int = 0
    in_string: bool = False
    calls_text: str = ""  # llama3_json: the text up to the end of the last call read, and the calls
    calls: list[ToolCall] = field(default_factory=list)


def bracket_end(text: str, start: int, final: bool, memo: Memo | None = None) -> int | Need | None:
    """End of the JSON object or array opening at text[start], by bracket depth outside strings.

    MORE when the text ends first (None if `final`); None as soon as a character shows the
    bracket cannot close into JSON, so a malformed call is released without waiting for the end.
    Whether the span is valid JSON is checked afterwards.
    """
    depth, pos, in_string = 0, start, False
    if memo is not None and memo.start == start and text.startswith(memo.text):
        depth, pos, in_string = memo.depth, len(memo.text), memo.in_string
    while pos < len(text):
        if in_string:
            pos = _run_end(text, pos, _JSON_STRING_BODY)
            if (
                pos == len(text) or text[pos] == "\\"
            ):  # the string goes on (or ends in a lone backslash)
                break
            pos, in_string = pos + 1, False
            continue
        pos = _run_end(text, pos, _JSON_PLAIN)
        if pos == len(text):
            break
        ch, pos = text[pos], pos + 1
        if ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return pos
        else:
            return None
    if memo is not None:
        memo.text, memo.start, memo.depth, memo.in_string = text[:pos], start, depth, in_string
    return None if final else MORE


def _walk(src: str, open_: str, close: str, keyed: bool) -> list[tuple[Any, Any, str]]:
    """The members of the JSON object/array `src` (exactly one, nothing around it):
    (key or None, value, the value's source text). Raises ValueError when it is not one."""
    if not src.startswith(open_):
        raise ValueError(f"expected {open_!r}")
    members: list[tuple[Any, Any, str]] = []
    i = _run_end(src, 1, _JSON_WS)
    while src[i : i + 1] != close:
        if members:  # after a member: ',' then the next one
            if src[i : i + 1] != ",":
                raise ValueError("expected ',' or the closing bracket")
            i = _run_end(src, i + 1, _JSON_WS)
        key = None
        if keyed:
            key, i = _DECODER.raw_decode(src, i)
            i = _run_end(src, i, _JSON_WS)
            if not isinstance(key, str) or src[i : i + 1] != ":":
                raise ValueError("expected a string key and ':'")
            i = _run_end(src, i + 1, _JSON_WS)
        value, end = _DECODER.raw_decode(src, i)
        members.append((key, value, src[i:end]))
        i = _run_end(src, end, _JSON_WS)
    if i + 1 != len(src):
        raise ValueError("text after the closing bracket")
    return members


def object_members(src: str) -> dict[str, tuple[Any, str]] | None:
    """key -> (value, value's source text) if `src` is exactly one JSON object, else None.

    The source text lets a call keep its arguments as the model wrote them.
    """
    try:
        return {k: (v, raw) for k, v, raw in _walk(src, "{", "}", keyed=True)}
    except (ValueError, RecursionError):
        return None


def call_from_object(src: str, require_args: bool = False) -> ToolCall | None:
    """`{"name": ..., "arguments"|"parameters": {...}}` -> a call; None if it is not a valid one."""
    members = object_members(src)
    if members is None or "name" not in members:
        return None
    name = members["name"][0]
    if not isinstance(name, str) or not name:
        return None
    for key in ("arguments", "parameters"):
        if key in members:
            value, raw = members[key]
            return ToolCall(name, raw) if isinstance(value, dict) else None
    return None if require_args else ToolCall(name, "{}")


def calls_from_array(src: str) -> list[ToolCall] | None:
    """A JSON array of call objects -> the calls; None unless it is non-empty and all are valid."""
    try:
        items = _walk(src, "[", "]", keyed=False)
    except (ValueError, RecursionError):
        return None
    calls = [c for _, _, raw in items if (c := call_from_object(raw)) is not None]
    return calls if calls and len(calls) == len(items) else None


def not_final(final: bool) -> Need | None:
    """An unfinished block: not a call at the end of the output (None), else MORE."""
    return None if final else MORE
