"""Tool calling on /v1/chat/completions: OpenAI's `tools` in, `tool_calls` out, well-formed.

A request's tools are validated (`parse_tools`), put into the prompt (the model's chat
template when it takes tools, `history_for_template`; else a system message describing
them in the call syntax of the server's format, `history_as_text`) and turned into a
structural-tag constraint
(`tool_constraint`): with `tool_choice` "auto" the model writes free text but every call
it starts is a call to a declared function with arguments valid against its parameters;
"required" and a named function allow calls only. The output is parsed back into
`tool_calls` by the format's parser (`sgl.tool_calls`), whole or streamed
(`ChoiceOutput`), together with the reasoning parser where one is configured.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import jsonschema

from sgl.server.errors import APIError
from sgl.tool_calls import ReasoningParser, call_text, get_format, get_parser, tools_prompt
from sgl.tool_calls.reasoning import THINK_CLOSE
from sgl.tool_calls.syntax import object_schema

FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_TOOLS = 64


@dataclass(frozen=True)
class Function:
    name: str
    description: str
    parameters: dict[str, Any]
    index: int  # in the request's `tools`


@dataclass(frozen=True)
class ToolRequest:
    functions: tuple[Function, ...]
    choice: str  # "none", "auto", "required", or "function" (then `named` is the one)
    named: str | None
    parallel: bool
    given: tuple[
        dict[str, Any], ...
    ]  # the tools as the request gave them: what a chat template reads

    def validators(self) -> dict[str, Any]:
        """A `jsonschema` validator of each callable function's parameters (what its calls
        are checked against): built once per request, shared by its choices."""
        return {
            f.name: jsonschema.validators.validator_for(f.parameters)(f.parameters)
            for f in self.calls_allowed
        }

    @property
    def calls_allowed(self) -> tuple[Function, ...]:
        return tuple(f for f in self.functions if self.named is None or f.name == self.named)


def parse_tools(
    tools: list[dict[str, Any]] | None, tool_choice: Any, parallel: bool | None
) -> ToolRequest | None:
    """The request's tools, or None without any; APIError 400 naming the field."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools", "tool_choice")
        return None
    if len(tools) > MAX_TOOLS:
        raise APIError(400, f"at most {MAX_TOOLS} tools per request", "tools")
    functions, names = [], set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(fn, dict)
        ):
            raise APIError(
                400,
                'each tool must be {"type": "function", "function": {name, parameters}}',
                f"tools[{i}]",
            )
        name = fn.get("name")
        if not isinstance(name, str) or not FUNCTION_NAME.match(name):
            raise APIError(
                400,
                "a function name is 1-64 characters of letters, digits, _ . -",
                f"tools[{i}].function.name",
            )
        if name in names:
            raise APIError(400, f"two tools are named {name!r}", f"tools[{i}].function.name")
        names.add(name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        try:
            params = object_schema(params, name) if isinstance(params, dict) else None
        except ValueError as e:
            raise APIError(400, str(e), f"tools[{i}].function.parameters") from None
        if params is None:
            raise APIError(
                400, "parameters must be a JSON schema object", f"tools[{i}].function.parameters"
            )
        try:
            jsonschema.validators.validator_for(params).check_schema(params)
        except jsonschema.SchemaError as e:
            raise APIError(
                400,
                f"parameters is not a valid JSON schema: {e.message}",
                f"tools[{i}].function.parameters",
            ) from None
        description = fn.get("description") or ""
        if not isinstance(description, str):
            raise APIError(400, "description must be a string", f"tools[{i}].function.description")
        functions.append(Function(name, description, params, i))
    choice, named = _choice(tool_choice, names)
    return ToolRequest(
        tuple(functions), choice, named, True if parallel is None else bool(parallel), tuple(tools)
    )


def _choice(tool_choice: Any, names: set[str]) -> tuple[str, str | None]:
    if tool_choice is None:
        return "auto", None
    if tool_choice in ("none", "auto", "required"):
        return tool_choice, None
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if (
        not isinstance(fn, dict)
        or tool_choice.get("type") != "function"
        or not isinstance(fn.get("name"), str)
    ):
        raise APIError(
            400,
            "tool_choice is 'none', 'auto', 'required' or {\"type\": \"function\", "
            '"function": {"name": ...}}',
            "tool_choice",
        )
    if fn["name"] not in names:
        raise APIError(
            400,
            f"tool_choice names {fn['name']!r}, which is not among the tools",
            "tool_choice.function.name",
        )
    return "function", fn["name"]


# ---------------------------------------------------------------------- call syntax


def tool_constraint(
    tools: ToolRequest, parser: str
) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """(the structural tag for the engine in the format's syntax, or None; engine field ->
    request field for its errors). "none" leaves the output free."""
    if tools.choice == "none":
        return None, {}
    allowed = tools.calls_allowed
    functions = [(f.name, f.parameters) for f in allowed]
    one_call = not tools.parallel or tools.choice == "function"
    fmt = get_format(parser)
    tag = fmt.constraint(functions, tools.choice == "auto", one_call)
    rename = {"structural_tag": "tools"}
    for k, f in enumerate(allowed):
        for path, part in fmt.function_fields(k).items():
            rename[f"structural_tag.{path}"] = f"tools[{f.index}].function.{part}"
    return tag, rename


def constrain_after_reasoning(sampling: dict[str, Any]) -> dict[str, str]:
    """Move the request's constraint (tools' structural tag, response_format) after the
    reasoning model's `</think>`, so it thinks freely and its answer is constrained; returns
    the engine field -> request field renames. Regex and EBNF cannot be moved (400)."""
    for field in ("regex", "ebnf"):
        if sampling.get(field) is not None:
            raise APIError(
                400,
                f"{field} would constrain the reasoning too; with a reasoning model use "
                "response_format or tools, or turn thinking off "
                '(chat_template_kwargs: {"enable_thinking": false})',
                field,
            )
    if "structural_tag" in sampling:
        sampling["structural_tag"] = {**sampling["structural_tag"], "start_after": THINK_CLOSE}
        return {}
    schema = sampling.pop("json_schema", None)
    if sampling.pop("json_object", None):
        schema = {"type": "object"}
    if schema is None:
        return {}
    sampling["structural_tag"] = {
        "type": "structural_tag",
        "structures": [{"begin": "", "schema": schema, "end": ""}],
        "free_text": False,
        "max_structures": 1,
        "start_after": THINK_CLOSE,
    }
    return {
        "structural_tag.structures[0].schema": "response_format",
        "structural_tag": "response_format",
    }


# ---------------------------------------------------------------------- the prompt


def template_takes_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def openai_tools(tools: ToolRequest) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": f.name, "description": f.description, "parameters": f.parameters},
        }
        for f in tools.functions
    ]


def history_for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool calls with their arguments as objects, as chat templates read them."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": _as_object(c["function"].get("arguments")),
                    },
                }
                for c in m["tool_calls"]
            ]
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def history_as_text(
    messages: list[dict[str, Any]], tools: ToolRequest | None, parser: str
) -> list[dict[str, Any]]:
    """The conversation for a template without tool support: the tools in the system
    message, calls written into the assistant's text, results as user messages."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = "\n".join(
                call_text(parser, c["function"]["name"], _as_text(c["function"].get("arguments")))
                for c in m["tool_calls"]
            )
            m = {
                "role": "assistant",
                "content": ((m.get("content") or "") + "\n" + calls).lstrip("\n"),
            }
        elif m["role"] == "tool":
            m = {
                "role": "user",
                "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>",
            }
        else:
            m = {k: v for k, v in m.items() if k in ("role", "content")}
        out.append(m)
    if tools is not None:
        prompt = tools_prompt(openai_tools(tools), parser)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _as_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _as_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


# ---------------------------------------------------------------------- the output


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ChoiceOutput:
    """One choice's text -> message fields (content, reasoning_content, tool_calls), whole
    or as streamed deltas; `parser` None: no tools to parse, `reasoning` None: no reasoning.

    Every call is checked against the declared functions (`validators`: name -> the
    `jsonschema` validator of its parameters). The constraint makes every call pass; this is the
    guarantee's last
    line: a call that fails is not returned as a tool call, its text goes to the end of
    the content instead."""

    def __init__(
        self, parser: str | None, reasoning: str | None, validators: dict[str, Any] | None = None
    ) -> None:
        self.parser_name = parser
        self.tool_parser = get_parser(parser) if parser else None
        self.reasoning = ReasoningParser(reasoning) if reasoning else None
        self.calls = 0
        self._validators = validators or {}
        self._index: dict[int, int | None] = {}  # the parser's call index -> ours (None: rejected)
        self._rejected: list[str] = []
        self._tools_stream = self.tool_parser.streamer() if self.tool_parser else None
        self._reasoning_stream = self.reasoning.streamer() if self.reasoning else None

    def whole(self, text: str) -> dict[str, Any]:
        reasoning, content = self.reasoning.parse(text) if self.reasoning else (None, text)
        fields: dict[str, Any] = {"role": "assistant"}
        if reasoning is not None:
            fields["reasoning_content"] = reasoning
        if self.tool_parser is None:
            return {**fields, "content": content}
        content, parsed = self.tool_parser.parse(content)
        calls = [c for c in parsed if self._accept(c.name, c.arguments)]
        content += "".join(self._rejected)
        self.calls = len(calls)
        fields["content"] = content if content or not calls else None
        if calls:
            fields["tool_calls"] = [
                {
                    "id": new_call_id(),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in calls
            ]
        return fields

    def _accept(self, name: str, arguments: str) -> bool:
        validator = self._validators.get(name)
        try:
            ok = validator is not None and validator.is_valid(json.loads(arguments))
        except ValueError:
            ok = False
        if not ok:
            self._rejected.append(call_text(self.parser_name or "hermes", name, arguments))
        return ok

    def feed(self, text: str, last: bool) -> dict[str, Any]:
        """The delta fields for new text (empty when nothing is ready to send)."""
        reasoning, content = "", text
        if self._reasoning_stream is not None:
            reasoning, content = self._reasoning_stream.feed(text)
            if last:
                r, c = self._reasoning_stream.finish()
                reasoning, content = reasoning + r, content + c
        deltas: list[Any] = []
        if self._tools_stream is not None:
            content, deltas = self._tools_stream.feed(content)
            if last:
                c, d = self._tools_stream.finish()
                content, deltas = content + c, deltas + d
        calls = [out for out in (self._delta(d) for d in deltas) if out is not None]
        if last:
            content += "".join(self._rejected)
        fields: dict[str, Any] = {}
        if reasoning:
            fields["reasoning_content"] = reasoning
        if content:
            fields["content"] = content
        if calls:
            fields["tool_calls"] = calls
        return fields

    def _delta(self, d: Any) -> dict[str, Any] | None:
        """A streamed call (the parsers give each call whole: name and arguments at once)."""
        if d.name is not None:
            self._index[d.index] = self.calls if self._accept(d.name, d.arguments) else None
            if self._index[d.index] is None:
                return None
            self.calls += 1
            return {
                "index": self._index[d.index],
                "id": new_call_id(),
                "type": "function",
                "function": {"name": d.name, "arguments": d.arguments},
            }
        if self._index.get(d.index) is None:
            return None
        return {"index": self._index[d.index], "function": {"arguments": d.arguments}}
