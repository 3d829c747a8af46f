"""Seeded synthetic data for the program workloads: made here, no files from other projects.

Texts are sentences of common English words, so a small model reads them as language; what
matters for speed is their length and which parts repeat (shots, instructions, documents)."""

from __future__ import annotations

import random

WORDS = (
    "river town market bridge library harbour garden winter summer morning evening farmer teacher "
    "doctor painter sailor engine signal letter window mountain forest valley island village "
    "castle "
    "kitchen bakery station museum theatre journey storm lantern festival cliff meadow orchard "
    "mill "
    "quiet bright heavy narrow ancient modern gentle careful sudden distant golden silver wooden "
    "carries builds finds keeps opens paints reads sells watches writes repairs follows remembers"
).split()
SUBJECTS = (
    "astronomy",
    "biology",
    "chemistry",
    "economics",
    "geography",
    "history",
    "law",
    "logic",
    "medicine",
    "music",
    "philosophy",
    "physics",
    "psychology",
    "statistics",
    "engineering",
    "ethics",
)


def sentence(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n_words)]
    return " ".join(words).capitalize() + "."


def paragraph(rng: random.Random, n_sentences: int, words: tuple[int, int] = (8, 14)) -> str:
    return " ".join(sentence(rng, rng.randint(*words)) for _ in range(n_sentences))


def mcq(rng: random.Random) -> tuple[str, list[str], str]:
    """A multiple-choice question: its text, four options and the answer letter."""
    return (
        sentence(rng, rng.randint(8, 14))[:-1] + "?",
        [sentence(rng, rng.randint(2, 5)) for _ in range(4)],
        rng.choice("ABCD"),
    )


def seeded(seed: int, *parts: object) -> random.Random:
    """A generator for one piece of data: the same (seed, parts) always gives the same text."""
    return random.Random(f"{seed}:" + ":".join(map(str, parts)))
