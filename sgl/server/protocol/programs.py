"""Shipped programs (/run_program and its events) and structured extraction (/v1/extract)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sgl.server.protocol.common import (
    PERSON_SCHEMA_EXAMPLE,
    _Strict,
    _StrictLenient,
    exactly_one_of,
)
from sgl.server.protocol.openai import ChatMessage, Usage

_PROGRAM = {
    "format_version": 1,
    "nodes": [
        {"type": "text", "text": "Q: What is 2 + 2?\nA:"},
        {
            "type": "gen",
            "name": "answer",
            "sampling": {"max_new_tokens": 8, "temperature": 0},
            "logprobs": {},
            "dtype": None,
        },
    ],
}


RUN_PROGRAM_EXAMPLES = [
    {"program": _PROGRAM, "stream": True},
    {"program": _PROGRAM, "arguments": [{}, {}]},
]


class RunProgramRequest(_StrictLenient):
    """`POST /run_program`: shipped programs (see sgl.server.programs and sgl.lang.ir_json)."""

    model_config = ConfigDict(
        json_schema_extra={
            **exactly_one_of("program", "programs"),
            "examples": RUN_PROGRAM_EXAMPLES,
        }
    )

    program: dict[str, Any] | None = Field(
        None, description="One program's IR: {format_version, nodes}."
    )
    programs: list[dict[str, Any]] | None = Field(
        None, description="A batch of programs, run concurrently."
    )
    arguments: dict[str, Any] | list[dict[str, Any]] | None = Field(
        None,
        description="Values of the IR's argument nodes: one object, or one per program; a list "
        "with `program` runs that program once per object (the batch form, answered with a list).",
    )
    sampling: dict[str, Any] | None = Field(
        None, description="The run's sampling and logprob defaults."
    )
    stream: bool = Field(False, description="One program: SSE events {var, text}, then {result}.")


class ProgramUsage(BaseModel):
    calls: int = Field(description="Generation calls the program made.")
    prompt_tokens: int
    completion_tokens: int
    retries: int


class ProgramResult(BaseModel):
    """One program's final state."""

    text: str
    messages: list[dict[str, Any]]
    variables: dict[str, Any]
    meta_info: dict[str, Any]
    usage: ProgramUsage


class ProgramTextEvent(BaseModel):
    var: str | None = Field(
        description="The variable the text is generated into; null: other program text."
    )
    text: str
    branch: list[list[int]] | None = Field(
        None,
        description=(
            "Absent for the program's own text. For text of a fork branch, its place in the fork "
            "tree: per "
            "fork level [which fork of the parent state (0 for its first), which branch of it]."
        ),
    )


class ProgramResultEvent(BaseModel):
    result: ProgramResult


EXTRACT_EXAMPLES = [
    {"text": "Ada Lovelace was born in 1815.", "schema": PERSON_SCHEMA_EXAMPLE, "max_tokens": 64},
]


class ExtractRequest(_Strict):
    """`POST /v1/extract`: pull data matching `schema` out of `text` or a conversation."""

    model_config = ConfigDict(
        json_schema_extra={**exactly_one_of("text", "messages"), "examples": EXTRACT_EXAMPLES}
    )

    model: str | None = None
    text: str | None = Field(None, description="The text to extract from (or give `messages`).")
    messages: list[ChatMessage] | None = Field(None, description="A conversation to extract from.")
    schema_: dict[str, Any] = Field(
        alias="schema", description="The JSON schema the answer must match."
    )
    instructions: str | None = Field(
        None, description="Replaces the default extraction instructions."
    )
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, description="Default 0 (greedy).")
    seed: int | None = None


class ExtractResponse(BaseModel):
    data: Any = Field(description="A JSON value valid against the schema.")
    usage: Usage
