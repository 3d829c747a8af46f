"""What each kind of OpenAI-compatible server understands beyond OpenAI's own fields.

The OpenAI API has no regex or grammar and only chat has `response_format`; every engine
that serves it adds its own fields for the rest. This module maps the engine's sampling
parameters (as programs produce them) to a request body's extra fields per server kind,
and refuses, naming the parameter, whatever the server cannot enforce: a constraint that
is silently dropped would hand the program unconstrained text.

    kind       regex / dtype            json_schema                     ebnf      choice (select)
    openai     refused                  response_format (chat only)     refused   none
    sgl        `regex`                  response_format                 `ebnf`    regex alternation
    sglang     `regex`                  response_format / `json_schema` `ebnf`    regex alternation
    vllm       structured_outputs.regex structured_outputs.json         .grammar  .choice
               (before 0.10.2: guided_regex / guided_json / guided_grammar / guided_choice)
    llama.cpp  dtype as GBNF; regex     `json_schema`                   `grammar` GBNF alternation
               refused
"""

from __future__ import annotations

import json
from typing import Any

from sgl.lang.interpreter import DTYPE_REGEX
from sgl.runtime.sampling.params import PARAMS

SERVER_KINDS = ("openai", "sgl", "sglang", "vllm", "llama.cpp")

# vLLM replaced guided_* by structured_outputs in 0.10.2 and removed guided_* in 0.12.
VLLM_STRUCTURED_OUTPUTS_SINCE = (0, 10, 2)

# The dtype regexes as llama.cpp grammars (GBNF), so gen_int & co. work there too.
DTYPE_GBNF = {
    "int": 'root ::= "-"? ("0" | [1-9] [0-9]{0,17}) [ \\n]?',
    "float": 'root ::= "-"? ("0" | [1-9] [0-9]{0,14}) ("." [0-9]{1,15})? [ \\n]?',
    "bool": 'root ::= "True" | "False"',
    "str": 'root ::= "\\"" [^"\\\\\\x00-\\x1f]{0,256} "\\""',
}
_DTYPE_OF_REGEX = {rx: name for name, rx in DTYPE_REGEX.items()}

# Sampling parameters beyond OpenAI's: (engine name, program default, {kind: request field}),
# from the runtime's parameter table.
_EXTRAS = tuple((p.name, p.default, dict(p.dialects)) for p in PARAMS if p.dialects)
# The constraints sent by `constraint_fields` (the server's own names for them differ per kind).
CONSTRAINT_PARAMS = ("regex", "json_schema", "ebnf")


class UnsupportedParameterError(ValueError):
    """The endpoint cannot honour a parameter the program set; `param` names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def extra_sampling_fields(kind: str, sampling: dict[str, Any]) -> dict[str, Any]:
    """The non-OpenAI sampling parameters the program set (away from their defaults)."""
    body: dict[str, Any] = {}
    for name, default, fields in _EXTRAS:
        value = sampling.get(name)
        if value is None or value == default or value == []:
            continue
        field = fields.get(kind)
        if field is None:
            raise UnsupportedParameterError(
                f"{name}={value!r}: a {kind} endpoint has no such sampling parameter; leave it "
                "unset",
                name,
            )
        body[field] = value
    return body


def _constraint(sampling: dict[str, Any]) -> tuple[str, str, Any] | None:
    """(kind, the parameter the program used, spec): dtype shows up as its regex."""
    for key in CONSTRAINT_PARAMS:
        spec = sampling.get(key)
        if spec is None:
            continue
        if key == "regex" and spec in _DTYPE_OF_REGEX:
            return "dtype", f"dtype={_DTYPE_OF_REGEX[spec]}", _DTYPE_OF_REGEX[spec]
        if key == "json_schema" and isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except ValueError as e:
                raise UnsupportedParameterError(
                    f"json_schema is not valid JSON: {e}", "json_schema"
                ) from e
        return key, key, spec
    return None


def _json_schema_format(schema: Any) -> dict[str, Any]:
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        }
    }


def constraint_fields(
    kind: str, sampling: dict[str, Any], chat: bool, vllm_version: tuple[int, ...] = ()
) -> dict[str, Any]:
    """Request fields that enforce the gen's regex / json_schema / ebnf / dtype on `kind`."""
    found = _constraint(sampling)
    if found is None:
        return {}
    what, param, spec = found
    regex = DTYPE_REGEX[spec] if what == "dtype" else spec
    if kind in ("sgl", "sglang"):
        if what == "json_schema":
            if kind == "sglang" and not chat:
                return {"json_schema": json.dumps(spec)}
            return _json_schema_format(spec)
        return {"ebnf": spec} if what == "ebnf" else {"regex": regex}
    if kind == "vllm":
        key = {"dtype": "regex", "regex": "regex", "json_schema": "json", "ebnf": "grammar"}[what]
        return vllm_fields(key, regex if key == "regex" else spec, vllm_version)
    if kind == "llama.cpp":
        if what == "json_schema":
            return {"json_schema": spec}
        if what == "dtype":
            return {"grammar": DTYPE_GBNF[spec]}
        if what == "ebnf":
            return {"grammar": spec}
        raise UnsupportedParameterError(
            "regex: llama.cpp's server constrains output by GBNF grammar or JSON schema, not by "
            "regex; "
            "write the constraint as ebnf= (GBNF) or json_schema=",
            "regex",
        )
    if what == "json_schema" and chat:
        return _json_schema_format(spec)
    where = (
        "OpenAI's completions endpoint has no response_format"
        if what == "json_schema"
        else "the OpenAI API can only enforce a JSON schema (response_format, chat models)"
    )
    raise UnsupportedParameterError(
        f"{param}: {where}; use a server that enforces it (server_kind sgl, sglang, vllm or "
        "llama.cpp)",
        param.split("=")[0],
    )


def vllm_fields(key: str, value: Any, version: tuple[int, ...]) -> dict[str, Any]:
    """vLLM's structured_outputs (0.10.2 on) or guided_* (before) field for `key`."""
    if not version or version >= VLLM_STRUCTURED_OUTPUTS_SINCE:
        return {"structured_outputs": {key: value}}
    return {f"guided_{key}": value}


def _regex_literal(text: str) -> str:
    return "".join("\\" + ch if ch in "\\.^$*+?{}[]|()/-" else ch for ch in text)


def _gbnf_literal(text: str) -> str:
    return (
        '"'
        + text.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
        + '"'
    )


def choice_fields(
    kind: str, choices: list[str], vllm_version: tuple[int, ...] = ()
) -> dict[str, Any] | None:
    """Fields that make the output exactly one of `choices`; None where `kind` has none."""
    if kind in ("sgl", "sglang"):
        return {"regex": "(" + "|".join(_regex_literal(c) for c in choices) + ")"}
    if kind == "vllm":
        return vllm_fields("choice", list(choices), vllm_version)
    if kind == "llama.cpp":
        return {"grammar": "root ::= " + " | ".join(_gbnf_literal(c) for c in choices)}
    return None
