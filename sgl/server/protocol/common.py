"""The bases of request bodies: strict types, valid Unicode, and `exactly_one_of`.

Request models are strict: a string where a number belongs, or a number where a boolean
belongs, is a 400 rather than a silent conversion. Native requests (`_Strict`) reject unknown
fields (a typo should not be ignored); OpenAI requests (`_StrictLenient`) ignore fields this
server does not use, as newer clients send more than older servers know.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator


def _not_unicode_at(value: Any) -> str | None:
    """Where in `value` (a parsed JSON value) a string is not valid Unicode: a lone surrogate,
    which JSON's `\\ud800` escapes can carry and nothing downstream (tokenizer, file names,
    the JSON of the answer) can take. "" for `value` itself, None if every string is valid."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return path
        elif isinstance(v, dict):
            for k, x in v.items():
                stack.append((k, path))
                stack.append((x, f"{path}.{k}" if path else str(k)))
        elif isinstance(v, list):
            stack.extend((x, f"{path}.{i}" if path else str(i)) for i, x in enumerate(v))
    return None


class _ValidUnicode(BaseModel):
    """Request bodies whose strings are all valid Unicode (a 400 naming the field, not a 500
    later)."""

    @field_validator("*", mode="before")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        where = _not_unicode_at(value)
        if where is not None:
            raise ValueError(
                f"a string{' at ' + where if where else ''} is not valid Unicode (it has a lone "
                "surrogate such as \\ud800)"
            )
        return value


class _Strict(_ValidUnicode):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class _StrictLenient(_ValidUnicode):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


def exactly_one_of(*fields: str) -> dict[str, Any]:
    """`json_schema_extra` of a model that takes exactly one of `fields` (set, not null)."""
    return {
        "oneOf": [{"required": [f], "properties": {f: {"not": {"type": "null"}}}} for f in fields]
    }


# A JSON schema the request examples (in /docs, and the first bodies a schema-driven fuzzer
# sends) extract or answer with.
PERSON_SCHEMA_EXAMPLE = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "born": {"type": "integer"}},
    "required": ["name", "born"],
}
