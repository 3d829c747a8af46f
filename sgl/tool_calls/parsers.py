"""Tool calls in a model's output text, for the formats models are trained to write.

The server detokenizes first and splits the text here, so one parser serves a whole response
(`ToolParser.parse`) and a stream (`ToolParser.streamer`). The streamers are built so that, for
any split of the output into pieces, what they emit adds up to `parse` of the whole: a decision
is only taken once the text seen so far fixes it, and a call is only emitted once it is complete
and valid. Text that starts like a call but is not one (bad JSON, no name, unclosed at the end)
stays in the content, verbatim; parsing never raises on model output.

`arguments` is JSON text of an object: for the JSON formats the source text the model wrote
(not re-serialized), for `pythonic` `json.dumps` of the keyword arguments.
"""

from __future__ import annotations

import ast
import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of the arguments object


@dataclass
class ToolCallDelta:
    """One streamed piece of a call: its first delta carries the name (and here all its arguments)."""

    index: int  # the call's position in this response (0, 1, ...)
    name: str | None = None
    arguments: str = ""  # a fragment of the arguments JSON text


class ToolStreamer:
    """Splits a streamed output into content and call deltas, exactly as `parse` splits the whole."""

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


def _deltas(calls: list[ToolCall], first: int = 0) -> list[ToolCallDelta]:
    return [ToolCallDelta(first + k, c.name, c.arguments) for k, c in enumerate(calls)]


# ---------------------------------------------------------------------- JSON pieces


class _Need(enum.Enum):
    MORE = "more"  # the text so far ends before the answer is known


MORE = _Need.MORE

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


def _skip_ws(text: str, i: int) -> int:
    return _run_end(text, i, _WS)


def _partial_len(text: str, pos: int, marker: str) -> int:
    """Length of the longest end of text[pos:] that could be the start of `marker` (held back)."""
    for n in range(min(len(marker) - 1, len(text) - pos), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


@dataclass
class _Memo:
    """How far scans of a growing text got, so a stream does not rescan a long call from its
    start on every piece. Valid while the text starts with the saved text."""

    text: str = ""  # the open bracket's scan: the text scanned, where it started, its state
    start: int = -1
    depth: int = 0
    in_string: bool = False
    calls_text: str = ""  # llama3_json: the text up to the end of the last call read, and the calls
    calls: list[ToolCall] = field(default_factory=list)


def _bracket_end(text: str, start: int, final: bool, memo: _Memo | None = None) -> int | _Need | None:
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
            if pos == len(text) or text[pos] == "\\":  # the string goes on (or ends in a lone backslash)
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
    while src[i:i + 1] != close:
        if members:  # after a member: ',' then the next one
            if src[i:i + 1] != ",":
                raise ValueError("expected ',' or the closing bracket")
            i = _run_end(src, i + 1, _JSON_WS)
        key = None
        if keyed:
            key, i = _DECODER.raw_decode(src, i)
            i = _run_end(src, i, _JSON_WS)
            if not isinstance(key, str) or src[i:i + 1] != ":":
                raise ValueError("expected a string key and ':'")
            i = _run_end(src, i + 1, _JSON_WS)
        value, end = _DECODER.raw_decode(src, i)
        members.append((key, value, src[i:end]))
        i = _run_end(src, end, _JSON_WS)
    if i + 1 != len(src):
        raise ValueError("text after the closing bracket")
    return members


def _object_members(src: str) -> dict[str, tuple[Any, str]] | None:
    """key -> (value, value's source text) if `src` is exactly one JSON object, else None.

    The source text lets a call keep its arguments as the model wrote them.
    """
    try:
        return {k: (v, raw) for k, v, raw in _walk(src, "{", "}", keyed=True)}
    except (ValueError, RecursionError):
        return None


def _call_from_object(src: str, require_args: bool = False) -> ToolCall | None:
    """`{"name": ..., "arguments"|"parameters": {...}}` -> a call; None if it is not a valid one."""
    members = _object_members(src)
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


def _calls_from_array(src: str) -> list[ToolCall] | None:
    """A JSON array of call objects -> the calls; None unless it is non-empty and all are valid."""
    try:
        items = _walk(src, "[", "]", keyed=False)
    except (ValueError, RecursionError):
        return None
    calls = [c for _, _, raw in items if (c := _call_from_object(raw)) is not None]
    return calls if calls and len(calls) == len(items) else None


# ---------------------------------------------------------------------- marker formats


@dataclass
class _Block:
    calls: list[ToolCall]
    end: int  # where the block ends in the text


class _MarkerParser(ToolParser):
    """Formats where calls follow a marker anywhere in the output; the text outside is content.

    Whitespace that only separates consecutive calls, or trails after the last one, is dropped.
    A marker whose block is not a valid call is content, and scanning goes on after it.
    """

    marker: str = ""

    def _match_block(self, text: str, start: int, final: bool,
                     memo: _Memo | None = None) -> _Block | _Need | None:
        """The calls of the block whose marker starts at text[start]; MORE if not known yet."""
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        content, calls, _, _ = self._scan(text, 0, False, True, None)
        return content, calls

    def streamer(self) -> ToolStreamer:
        return _MarkerStreamer(self)

    def _scan(self, text: str, pos: int, after_call: bool, final: bool,
              memo: _Memo | None) -> tuple[str, list[ToolCall], int, bool]:
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
                start = _skip_ws(text, pos)
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
                    end = len(text) if final else len(text) - _partial_len(text, pos, self.marker)
                    content.append(text[pos:end])
                    pos = end
                    break
                content.append(text[pos:start])
                pos = start
            found = self._match_block(text, start, final, memo)
            if found is MORE:
                break
            if isinstance(found, _Block):
                calls.extend(found.calls)
                pos, after_call = found.end, True
            else:  # not a call: the marker (and the whitespace before it) is content
                content.append(text[pos:start + len(self.marker)])
                pos, after_call = start + len(self.marker), False
        return "".join(content), calls, pos, after_call


class _MarkerStreamer(ToolStreamer):
    """Runs the parser's scan on what is not consumed yet; holds only undecided text."""

    def __init__(self, parser: _MarkerParser) -> None:
        self._parser = parser
        self._buf = ""
        self._after_call = False
        self._count = 0
        self._memo = _Memo()

    def feed(self, piece: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += piece
        return self._run(final=False)

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        return self._run(final=True)

    def _run(self, final: bool) -> tuple[str, list[ToolCallDelta]]:
        content, calls, pos, self._after_call = self._parser._scan(self._buf, 0, self._after_call, final,
                                                                   self._memo)
        self._buf = self._buf[pos:]
        deltas = _deltas(calls, self._count)
        self._count += len(calls)
        return content, deltas


def _not_final(final: bool) -> _Need | None:
    return None if final else MORE


class HermesParser(_MarkerParser):
    """Hermes 2 Pro / Qwen2.5 / Qwen3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

    Any whitespace around the JSON; "parameters" is accepted for "arguments"; no arguments: "{}".
    """

    name = "hermes"
    marker = "<tool_call>"
    end_marker = "</tool_call>"

    def _match_block(self, text: str, start: int, final: bool,
                     memo: _Memo | None = None) -> _Block | _Need | None:
        i = _skip_ws(text, start + len(self.marker))
        if i == len(text):
            return _not_final(final)
        if text[i] != "{":
            return None
        end = _bracket_end(text, i, final, memo)
        if not isinstance(end, int):
            return end
        j = _skip_ws(text, end)
        if not text.startswith(self.end_marker, j):
            return MORE if not final and self.end_marker.startswith(text[j:]) else None
        call = _call_from_object(text[i:end])
        return _Block([call], j + len(self.end_marker)) if call else None


_MISTRAL_NAME = re.compile(r"[\w.\-]+")


class MistralParser(_MarkerParser):
    """Mistral: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` (v3 tokenizer) or
    `[TOOL_CALLS]name[ARGS]{...}`, repeated per call (v11+)."""

    name = "mistral"
    marker = "[TOOL_CALLS]"
    args_marker = "[ARGS]"

    def _match_block(self, text: str, start: int, final: bool,
                     memo: _Memo | None = None) -> _Block | _Need | None:
        i = _skip_ws(text, start + len(self.marker))
        if i == len(text):
            return _not_final(final)
        if text[i] == "[":
            end = _bracket_end(text, i, final, memo)
            if not isinstance(end, int):
                return end
            calls = _calls_from_array(text[i:end])
            return _Block(calls, end) if calls else None
        m = _MISTRAL_NAME.match(text, i)
        if m is None:
            return None
        if not text.startswith(self.args_marker, m.end()):  # (the name may still be growing)
            return MORE if not final and self.args_marker.startswith(text[m.end():]) else None
        k = _skip_ws(text, m.end() + len(self.args_marker))
        if k == len(text):
            return _not_final(final)
        if text[k] != "{":
            return None
        end = _bracket_end(text, k, final, memo)
        if not isinstance(end, int):
            return end
        if _object_members(text[k:end]) is None:
            return None
        return _Block([ToolCall(m.group(), text[k:end])], end)


# ---------------------------------------------------------------------- whole-output formats


PYTHON_TAG = "<|python_tag|>"


def _json_call_list(body: str, final: bool, memo: _Memo | None = None) -> list[ToolCall] | _Need | None:
    """`{call}; {call} ...` filling all of `body` (whitespace around, a trailing ';' allowed).

    Each call needs "parameters" (or "arguments"): with no marker, a plain JSON answer such as
    {"name": "Bob"} must not become a call. MORE while `body` can still grow into calls.
    """
    calls: list[ToolCall] = []
    pos = 0
    if memo is not None and memo.calls and body.startswith(memo.calls_text):
        calls, pos = list(memo.calls), len(memo.calls_text)
    while True:
        i = _skip_ws(body, pos)
        if calls:  # after a call: the end, or ';' and the next one
            if i == len(body):
                return calls if final else MORE
            if body[i] != ";":
                return None
            i = _skip_ws(body, i + 1)
        if i == len(body):
            return (calls or None) if final else MORE
        if body[i] != "{":
            return None
        end = _bracket_end(body, i, final, memo)
        if not isinstance(end, int):
            return end
        call = _call_from_object(body[i:end], require_args=True)
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
        pre, body = (text[:i], text[i + len(PYTHON_TAG):]) if i >= 0 else ("", text)
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
        self._memo = _Memo()

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
        i = self._held.find(PYTHON_TAG, max(0, seen - len(PYTHON_TAG) + 1))  # (not in what was seen)
        if i >= 0:
            # before the tag: content, unless (at the start) it is whitespace only, then dropped
            out = ""
            if self._mode == "text" or self._held[:i].strip():
                out, i = self._release(i), 0
            self._mode, self._body_at = "tagged", i + len(PYTHON_TAG)
            return out + self._check_tagged(), []
        cut = len(self._held) - _partial_len(self._held, 0, PYTHON_TAG)
        if self._mode == "start":
            j = _skip_ws(self._held, 0)
            if j >= cut or (self._held[j] == "{" and _json_call_list(self._held, False, self._memo) is not None):
                return "", []
            self._mode = "text"
        return self._release(cut), []

    def _check_tagged(self) -> str:
        if _json_call_list(self._held[self._body_at:], False, self._memo) is None:
            self._mode = "through"
            return self._release(len(self._held))
        return ""

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        if self._mode == "start":
            content, calls = self._parser.parse(self._release(len(self._held)))
            return content, _deltas(calls)
        if self._mode == "tagged":
            calls = _json_call_list(self._held[self._body_at:], final=True)
            if isinstance(calls, list):
                self._held = ""
                return "", _deltas(calls)
        return self._release(len(self._held)), []


PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
# A call list starts `[name(`; a text that cannot grow into that start is content at once.
_PY_CALLS_START = re.compile(r"\[\s*[^\W\d][\w.]*\s*\(")
_PY_CALLS_PREFIX = re.compile(r"(?:\[\s*(?:[^\W\d][\w.]*\s*)?)?\Z")


def _py_literal_kwargs(call: ast.expr) -> tuple[str, str] | None:
    """`name(k=literal, ...)` -> (dotted name, JSON of the keywords); None for anything else."""
    if not isinstance(call, ast.Call) or call.args:
        return None
    parts, func = [], call.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    name = ".".join([func.id, *reversed(parts)])
    try:
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg is not None}
        if len(kwargs) != len(call.keywords):  # a `**mapping`
            return None
        return name, json.dumps(kwargs, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return None


def _py_unwrap(text: str) -> str:
    s = text.strip()
    if s.startswith(PYTHON_START):
        s = s[len(PYTHON_START):]
    s = s.rstrip()
    return (s[:-len(PYTHON_END)] if s.endswith(PYTHON_END) else s).strip()


class PythonicParser(ToolParser):
    """Llama 3.2 / Llama 4 pythonic calls: the whole output is `[f(a=1, b="x"), g()]`, maybe
    inside `<|python_start|>` ... `<|python_end|>`. Keyword arguments with literal values only
    (str, numbers, bool, None, lists, dicts, nested); anything else leaves all as content."""

    name = "pythonic"

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        src = _py_unwrap(text)
        if not _PY_CALLS_START.match(src):
            return text, []
        try:
            tree = ast.parse(src, mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return text, []
        if not isinstance(tree.body, ast.List):
            return text, []
        calls = [_py_literal_kwargs(e) for e in tree.body.elts]
        if not calls or any(c is None for c in calls):
            return text, []
        return "", [ToolCall(*c) for c in calls if c is not None]

    def streamer(self) -> ToolStreamer:
        return _PythonicStreamer(self)


def _may_be_py_calls(text: str) -> bool:
    """Whether `text` (the output so far) can still grow into a pythonic call list."""
    s = text.lstrip()
    if PYTHON_START.startswith(s):  # nothing yet, or part of the tag
        return True
    if s.startswith(PYTHON_START):
        s = s[len(PYTHON_START):].lstrip()
    return bool(_PY_CALLS_START.match(s) or _PY_CALLS_PREFIX.match(s))


class _PythonicStreamer(ToolStreamer):
    """Holds the whole output while it may be a call list (decided at the end); once it cannot
    be, sends it all as content."""

    def __init__(self, parser: PythonicParser) -> None:
        self._parser = parser
        self._held = ""
        self._through = False

    def feed(self, piece: str) -> tuple[str, list[ToolCallDelta]]:
        if self._through:
            return piece, []
        self._held += piece
        if _may_be_py_calls(self._held):
            return "", []
        self._through, out, self._held = True, self._held, ""
        return out, []

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        if self._through:
            return "", []
        content, calls = self._parser.parse(self._held)
        self._held = ""
        return content, _deltas(calls)


# ---------------------------------------------------------------------- registry


PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser, PythonicParser)
}


def get_parser(name: str) -> ToolParser:
    """A parser by its name; ValueError naming the known ones otherwise."""
    cls = PARSERS.get(name)
    if cls is None:
        raise ValueError(f"unknown tool-call parser {name!r}; known parsers: {', '.join(sorted(PARSERS))}")
    return cls()


def detect_parser(chat_template: str | None) -> str:
    """The tool-call format a chat template teaches the model, from its markers; "hermes" if unknown."""
    t = chat_template or ""
    if "<tool_call>" in t:
        return "hermes"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if PYTHON_START in t:  # before llama3_json: Llama 4 templates also mention ipython
        return "pythonic"
    if PYTHON_TAG in t or ('"parameters"' in t and "ipython" in t):
        return "llama3_json"
    return "hermes"
