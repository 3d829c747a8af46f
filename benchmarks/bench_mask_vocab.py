"""Mask time against vocabulary size: the embedded model's 49k vocabulary and a 128k one
(Llama-3-sized, built here: the real tokens plus the most frequent longer substrings of a
text corpus, then random ASCII words), for both JSON-schema routes and an EBNF grammar.

For each (vocabulary, constraint): compile (timed), then walk several valid documents token
by token (greedy longest-match tokenization), timing every `fill_mask`: the first visit of
a state (computed) and revisits (cached) together, as a decode would see them.

    .venv/bin/python benchmarks/bench_mask_vocab.py
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from common import machine_info, print_table, write_result

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Closed objects, as structured-output schemas usually are (OpenAI's strict mode requires it):
# an open one would also generate undeclared members, a much larger regex automaton.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object",
                    "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city"], "additionalProperties": False},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}  # fmt: skip
DOCS = [
    {
        "name": "Ann Smith",
        "age": 42,
        "email": "ann@example.com",
        "tags": ["admin", "ops"],
        "address": {"city": "Oslo"},
    },
    {"name": "Bo", "age": 7, "tags": [], "address": {"city": "Rome", "zip": "00184"}},
    {"name": "Chandra Q. Public", "age": 150, "email": "c.q@pub.org", "tags": ["a", "b", "c", "d"]},
]
ARRAY_GRAMMAR = 'root ::= "[" item ("," item)* "]"\nitem ::= "\\"" [a-zA-Z ]+ "\\"" | [0-9]+'
ARRAY_DOCS = ['["alpha","beta gamma",42,"delta"]', "[1,2,3]", '["x y z",7,"Long Item Here"]']


def build_vocab(base: Any, size: int, seed: int = 0) -> Any:
    """``base``'s tokens, then frequent corpus substrings and random words, up to ``size``."""
    from sgl.constrained import TokenVocabulary

    tokens = list(base.token_bytes[: base.vocab_size])
    seen = {t for t in tokens if t}
    root = (
        Path(__file__).resolve().parent.parent
    )  # this project's own code (not .venv: the same text everywhere)
    corpus = "".join(
        p.read_text(errors="ignore")
        for d in ("sgl", "tests", "benchmarks")
        for p in sorted((root / d).glob("**/*.py"))
    )
    counts = Counter(
        corpus[i : i + n] for n in (3, 4, 5, 6, 8) for i in range(0, len(corpus) - n, 3)
    )
    rng = random.Random(seed)
    for text, _ in counts.most_common():
        if len(tokens) >= size:
            break
        tb = text.encode()
        if tb not in seen:
            seen.add(tb)
            tokens.append(tb)
    while len(tokens) < size:
        tb = "".join(
            rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(rng.randint(3, 10))
        ).encode()
        if tb not in seen:
            seen.add(tb)
            tokens.append(tb)
    return TokenVocabulary(
        token_bytes=tuple(tokens), eos_token_ids=base.eos_token_ids, vocab_size=size
    )


def tokenize(vocab: Any, text: str) -> list[int]:
    ids = {tb: i for i, tb in enumerate(vocab.token_bytes) if tb and i not in vocab.eos_token_ids}
    longest = max(len(t) for t in ids)
    data, out, i = text.encode(), [], 0
    while i < len(data):
        for n in range(min(longest, len(data) - i), 0, -1):
            if data[i : i + n] in ids:
                out.append(ids[data[i : i + n]])
                i += n
                break
        else:
            raise ValueError(f"no token for {data[i : i + 1]!r}")
    return out


def measure(vocab: Any, make: Any, texts: list[str]) -> dict[str, Any]:
    from sgl.constrained import allocate_bitmask

    t0 = time.perf_counter()
    grammar = make(vocab)
    compile_s = time.perf_counter() - t0
    row, times = allocate_bitmask(1, vocab.vocab_size)[0], []
    for text in texts:
        m = grammar.matcher()
        for tok in tokenize(vocab, text) + [vocab.eos_token_ids[0]]:
            row.zero_()
            t = time.perf_counter()
            m.fill_mask(row)
            times.append((time.perf_counter() - t) * 1e6)
            assert (int(row[tok // 32]) >> (tok % 32)) & 1, (text, tok)
            if tok not in vocab.eos_token_ids:
                assert m.accept(tok)
    arr = np.array(times)
    return {
        "compile_ms": compile_s * 1e3,
        "masks": int(arr.size),
        "mask_us_p50": float(np.percentile(arr, 50)),
        "mask_us_p99": float(np.percentile(arr, 99)),
        "mask_us_max": float(arr.max()),
    }


def main() -> None:
    from sgl.constrained import GrammarCompiler, TokenVocabulary
    from sgl.constrained.ebnf import EbnfGrammar, compile_ebnf
    from sgl.constrained.json_schema import json_schema_to_rules
    from sgl.runtime.model.paths import resolve_model_path
    from sgl.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer(resolve_model_path("default"))
    base = TokenVocabulary.from_tokenizer(tok, vocab_size=len(tok))
    docs = [json.dumps(d) for d in DOCS]
    routes = {
        "json_schema (regex route)": (
            lambda v: GrammarCompiler(v, cache_size=0).compile("json_schema", SCHEMA),
            docs,
        ),
        "json_schema (grammar route)": (
            lambda v: EbnfGrammar(
                json.dumps(SCHEMA), v, rules=json_schema_to_rules(SCHEMA), kind="json_schema"
            ),
            docs,
        ),
        "ebnf": (lambda v: compile_ebnf(ARRAY_GRAMMAR, v), ARRAY_DOCS),
    }
    results: dict[str, Any] = {}
    rows = []
    for size in (base.vocab_size, 128_256):
        vocab = base if size == base.vocab_size else build_vocab(base, size)
        for name, (make, texts) in routes.items():
            r = measure(vocab, make, texts)
            results[f"{name} @ {size}"] = {"vocab_size": size, **r}
            rows.append(
                (
                    name,
                    size,
                    f"{r['compile_ms']:.0f}",
                    r["masks"],
                    f"{r['mask_us_p50']:.0f}",
                    f"{r['mask_us_p99']:.0f}",
                )
            )
    print_table(
        "mask time against vocabulary size",
        rows,
        ("constraint", "vocab", "compile ms", "masks", "mask p50 us", "mask p99 us"),
    )
    write_result(
        "mask_vocab", {"benchmark": "mask_vocab", "machine": machine_info(), "results": results}
    )


if __name__ == "__main__":
    main()
