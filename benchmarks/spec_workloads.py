"""The prompts of the speculative-decoding benchmark (`bench_speculative.py`): seeded, made here.

Prompt-lookup drafting pays off where the output copies the input, so the workloads span that:

    extraction        a ~600-token document of short sentences about places and people; the
                      request asks to quote, word for word, the sentences about one place
    json_extraction   a document naming people among other sentences; the request asks for
                      them as JSON under a schema (given in the prompt too, as users do), so
                      the values are copied from the document
    chat              open-ended questions: nothing to copy, drafting's cost without its gain

Held out (`HELD_OUT`, run only when named: never measured while speculation was tuned), other
copy-heavy tasks in other words:

    proofread         prose on other subjects with a few letters swapped; the request asks for
                      it back with the spelling corrected and nothing else changed
    code_edit         small Python functions; the request asks for the code back with one
                      argument renamed everywhere

Each prompt is one user message rendered with the model's own chat template (the same text
goes to every engine's `/v1/completions`).
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from typing import Any

NAMES = "Mara Ilse Tomas Oren Vera Lukas Nadia Felix Rosa Anton Greta Milan Sofia Emil".split()
SURNAMES = "Halden Brook Varga Lindqvist Moreau Castell Dunmore Ashby Kovac Feld".split()
TOWNS = "Brenford Kellmoor Ostvik Larrow Danholm Pellis Arnmouth Wexley".split()
PLACES = "harbour library mill bridge market lighthouse bakery museum".split()
JOBS = "baker sailor teacher painter doctor farmer clockmaker librarian carpenter".split()
COLOURS = "red blue green yellow white grey".split()

PEOPLE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "age": {"type": "integer"},
                    "town": {"type": "string"},
                    "job": {"type": "string"},
                },
                "required": ["name", "age", "town", "job"],
            },
        }
    },
    "required": ["people"],
}


@dataclass
class SpecWorkload:
    """The requests of one (workload, batch) cell: rendered prompts, the cap on new tokens and
    the JSON schema every request is constrained to (None: free text)."""

    name: str
    prompts: list[str]
    max_new_tokens: int
    json_schema: dict[str, Any] | None = None


@functools.cache
def _tokenizer():
    from sgl.runtime.model.paths import resolve_model_path
    from sgl.runtime.tokenizer import load_tokenizer

    return load_tokenizer(str(resolve_model_path("default")))


def render(user_message: str) -> str:
    """One user turn in the model's chat template, ready for the assistant's answer."""
    return _tokenizer().apply_chat_template(
        [{"role": "user", "content": user_message}], tokenize=False, add_generation_prompt=True
    )


def place_sentence(rng: random.Random, place: str) -> str:
    name, town, year = rng.choice(NAMES), rng.choice(TOWNS), rng.randint(1700, 1990)
    return rng.choice(
        (
            f"The {place} in {town} was rebuilt in {year} after a long winter storm.",
            f"{name} worked at the {place} of {town} for {rng.randint(3, 40)} years.",
            f"Every spring, the people of {town} paint the old {place} a bright "
            f"{rng.choice(COLOURS)}.",
            f"In {year}, {name} wrote a short book about the {place} and its visitors.",
        )
    )


def extraction_prompt(rng: random.Random, sentences: int) -> str:
    """Sentences about the places (~17 tokens each), then a request to quote those about one
    of the places they mention."""
    places = [rng.choice(PLACES) for _ in range(sentences)]
    text = " ".join(place_sentence(rng, place) for place in places)
    return (
        f"{text}\n\nQuote, word for word, every sentence of the text above that mentions the "
        f"{rng.choice(places)}."
    )


def person_sentence(rng: random.Random) -> str:
    name = f"{rng.choice(NAMES)} {rng.choice(SURNAMES)}"
    return (
        f"{name}, aged {rng.randint(19, 80)}, lives in {rng.choice(TOWNS)} and works as a "
        f"{rng.choice(JOBS)}."
    )


def json_extraction_prompt(rng: random.Random, sentences: int) -> str:
    """Every third sentence introduces a person; the rest are the places' sentences."""
    text = " ".join(
        person_sentence(rng) if i % 3 == 0 else place_sentence(rng, rng.choice(PLACES))
        for i in range(sentences)
    )
    return (
        "List every person the text names, as JSON matching this schema:\n"
        f"{json.dumps(PEOPLE_SCHEMA)}\n\nText: {text}"
    )


CHAT_TASKS = (
    "Write a short story about a {who} who finds a {thing} in a {where}.",
    "Explain to a ten-year-old how a {thing} works.",
    "What would a {who} need to know before moving to a {where}? Give practical advice.",
    "Describe an ordinary day in the life of a {who} who lives near a {where}.",
    "Write a friendly letter from a {who} to a neighbour about a lost {thing}.",
    "What are the pros and cons of building a {thing} next to a {where}?",
)
CHAT_WHO = ("retired sailor", "young baker", "clockmaker", "village doctor", "street musician")
CHAT_THING = ("compass", "windmill", "telescope", "music box", "steam engine", "bicycle")
CHAT_WHERE = ("lighthouse", "mountain village", "busy harbour", "quiet forest", "old library")


def chat_prompt(rng: random.Random, sentences: int) -> str:
    del sentences  # a question is as long as it is
    return rng.choice(CHAT_TASKS).format(
        who=rng.choice(CHAT_WHO), thing=rng.choice(CHAT_THING), where=rng.choice(CHAT_WHERE)
    )


TOPICS = ("the tide", "a glacier", "the orchard", "the observatory", "a canal", "the choir")
VERBS = ("shapes", "follows", "changes", "outlasts", "measures", "remembers")
OBJECTS = ("the seasons", "every visitor", "the old maps", "the night sky", "the valley floor")


def _typo(rng: random.Random, word: str) -> str:
    """The word with two neighbouring letters swapped (words of 5+ letters, 1 in 6)."""
    if len(word) < 5 or not word.isalpha() or rng.random() > 1 / 6:
        return word
    i = rng.randrange(1, len(word) - 2)
    return word[:i] + word[i + 1] + word[i] + word[i + 2 :]


def proofread_prompt(rng: random.Random, sentences: int) -> str:
    text = " ".join(
        rng.choice(
            (
                f"Nobody living near {rng.choice(TOPICS)} doubts that it {rng.choice(VERBS)} "
                f"{rng.choice(OBJECTS)}.",
                f"Scientists returned to {rng.choice(TOPICS)} in {rng.randint(1850, 2020)} "
                f"with better instruments and patient assistants.",
                f"Visitors often say that {rng.choice(TOPICS)} {rng.choice(VERBS)} "
                f"{rng.choice(OBJECTS)} more than anything else nearby.",
                f"Careful records describe how {rng.choice(TOPICS)} {rng.choice(VERBS)} "
                f"{rng.choice(OBJECTS)} over many decades.",
            )
        )
        for _ in range(sentences)
    )
    text = " ".join(_typo(rng, w) for w in text.split(" "))
    return (
        "Rewrite the following text with its spelling mistakes corrected. Change nothing "
        f"else.\n\n{text}"
    )


def _function(rng: random.Random, n: int) -> str:
    op, start = rng.choice((("+", 0), ("*", 1), ("-", 0))), rng.randint(2, 9)
    return (
        f"def combine_{n}(items, limit={start * 10}):\n"
        f"    total = {op[1]}\n"
        f"    for index, value in enumerate(items):\n"
        f"        if index >= limit:\n"
        f"            break\n"
        f"        total = total {op[0]} value * {start}\n"
        f"    return total\n"
    )


def code_edit_prompt(rng: random.Random, sentences: int) -> str:
    code = "\n\n".join(_function(rng, n) for n in range(max(1, sentences // 5)))
    return (
        "Rename the argument `items` to `records` everywhere in this code and write the whole "
        f"code again.\n\n```python\n{code}```"
    )


MAKERS = {
    "extraction": (extraction_prompt, None),
    "json_extraction": (json_extraction_prompt, PEOPLE_SCHEMA),
    "chat": (chat_prompt, None),
}
HELD_OUT = {
    "proofread": (proofread_prompt, None),
    "code_edit": (code_edit_prompt, None),
}


def build(name: str, n: int, seed: str, sentences: int, max_new_tokens: int) -> SpecWorkload:
    """`n` requests of workload `name`, each from its own seeded generator (`seed` names the
    cell, so no two cells share a prompt, or the prefix cache serves one from another)."""
    makers = MAKERS | HELD_OUT
    if name not in makers:
        raise ValueError(f"workload must be one of {sorted(makers)}; got {name!r}")
    make, schema = makers[name]
    prompts = [render(make(random.Random(f"{seed}:{name}:{i}"), sentences)) for i in range(n)]
    return SpecWorkload(name, prompts, max_new_tokens, schema)
