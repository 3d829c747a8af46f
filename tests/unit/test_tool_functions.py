"""Python functions as OpenAI tools (`sgl.tool_calls.function_tool`): the parameters'
schema from the annotations, checked with `jsonschema` on arguments that fit and that do
not; and `gen(tools=...)`'s constraint choices."""

from __future__ import annotations

from typing import Literal

import jsonschema
import pytest

import sgl
from sgl.tool_calls import function_tool


def book(
    city: str,
    nights: int,
    budget: float = 100.0,
    pets: bool = False,
    room: Literal["single", "double"] = "double",
    guests: list[str] | None = None,
    extras: dict | None = None,
) -> str:
    """Book a hotel.

    Longer notes that stay out of the description."""
    return city


def test_the_schema_follows_the_annotations():
    tool = function_tool(book)
    fn = tool["function"]
    assert (
        tool["type"] == "function" and fn["name"] == "book" and fn["description"] == "Book a hotel."
    )
    params = fn["parameters"]
    assert params["required"] == ["city", "nights"] and params["additionalProperties"] is False
    good = {
        "city": "Rome",
        "nights": 2,
        "budget": 80.5,
        "pets": True,
        "room": "single",
        "guests": ["a", "b"],
        "extras": None,
    }
    jsonschema.validate(good, params)
    for bad in (
        {"city": "Rome"},
        {**good, "nights": "2"},
        {**good, "room": "suite"},
        {**good, "guests": [1]},
        {**good, "other": 1},
        {**good, "pets": "yes"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, params)


def test_what_cannot_be_described_is_refused_naming_it():
    def no_hint(x):
        return x

    def odd(x: set[int]):
        return x

    def star(*xs: int):
        return xs

    for fn, word in (
        (no_hint, "needs a type annotation"),
        (odd, "cannot describe"),
        (star, "by keyword"),
    ):
        with pytest.raises(TypeError, match=word):
            function_tool(fn)
    assert function_tool({"type": "function", "function": {"name": "f"}})["function"]["name"] == "f"
    with pytest.raises(TypeError):
        function_tool({"function": "f"})


def test_gen_tool_choices_make_the_constraint():
    auto = sgl.gen("c", tools=[book]).sampling["structural_tag"]
    assert (
        auto["free_text"] is True
        and auto["max_structures"] == 1
        and auto["triggers"] == ["<tool_call>"]
    )
    other = {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}
    many = sgl.gen("c", tools=[book, other], tool_choice="required", parallel_tool_calls=True)
    tag = many.sampling["structural_tag"]
    assert tag["free_text"] is False and "max_structures" not in tag and len(tag["structures"]) == 2
    named = sgl.gen(
        "c", tools=[book, {"type": "function", "function": {"name": "other"}}], tool_choice="other"
    )
    assert [s["begin"] for s in named.sampling["structural_tag"]["structures"]] == [
        '<tool_call>\n{"name": "other", "arguments": '
    ]
    with pytest.raises(ValueError, match="tool_choice"):
        sgl.gen("c", tools=[book], tool_choice="nope")
