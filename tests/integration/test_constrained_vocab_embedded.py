"""The embedded SmolLM2 tokenizer: every id's bytes, and constrained walks over the real vocabulary.

Oracles: the tokenizer's own decoding (per id, and for whole encodings of many texts),
and jsonschema / re.fullmatch for text produced by walking real masks.
"""

from __future__ import annotations

import json
import os
import random
import re

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jsonschema  # noqa: E402
import torch  # noqa: E402

from sgl.constrained import GrammarCompiler, TokenVocabulary, allocate_bitmask, bitmask_to_bool  # noqa: E402

pytestmark = pytest.mark.integration

TEXTS = [
    "Hello, world!",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}',
    "Café crème brûlée — naïve façade, déjà vu.",
    "中文文本测试，你好世界。日本語のテキスト、こんにちは。한국어 안녕하세요.",
    "Emoji 😀🎉👍🏽 family 👨\u200d👩\u200d👧 flag 🇫🇷 heart ❤️ \x00\x07\t\r\n ∑∫√",
]


@pytest.fixture(scope="module")
def tokenizer():
    from sgl.runtime.model.paths import resolve_model_path
    from sgl.runtime.tokenizer import load_tokenizer

    try:
        path = resolve_model_path("default")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return load_tokenizer(os.path.dirname(path), gguf_file=os.path.basename(path))


@pytest.fixture(scope="module")
def vocab(tokenizer) -> TokenVocabulary:
    return TokenVocabulary.from_tokenizer(tokenizer)


def test_every_id_decodes_like_the_tokenizer(tokenizer, vocab: TokenVocabulary) -> None:
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    assert vocab.vocab_size == len(tokenizer) == 49152
    partial = 0
    for tid in range(vocab.vocab_size):
        data = vocab.token_bytes[tid]
        if tid in special:
            assert data is None, tid
            continue
        assert data, tid
        decoded = tokenizer.decode([tid])
        assert decoded == data.decode("utf-8", errors="replace"), (tid, data, decoded)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            partial += 1
    assert partial > 100  # byte-level BPE: many tokens end inside a character


def test_encodings_concatenate_to_the_text(tokenizer, vocab: TokenVocabulary) -> None:
    rng = random.Random(0)
    alphabet = "".join(sorted(set("".join(TEXTS))))
    texts = TEXTS + [
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60))) for _ in range(500)
    ]
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert b"".join(vocab.token_bytes[i] for i in ids) == text.encode("utf-8"), text  # type: ignore[misc]


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "active": {"type": "boolean"},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["name", "age", "email", "tags", "active", "score"],
}


def _walk(grammar, vocab: TokenVocabulary, rng: random.Random, max_steps: int = 300) -> str:
    closing_ids = {
        t for t, b in enumerate(vocab.token_bytes) if b and any(c in b for c in b'@."],}0123456789')
    }
    m = grammar.matcher()
    row = allocate_bitmask(1, vocab.vocab_size)
    data = b""
    eos = set(vocab.eos_token_ids)
    for _ in range(max_steps):
        row.zero_()
        m.fill_mask(row[0])
        allowed = torch.nonzero(bitmask_to_bool(row, vocab.vocab_size)[0]).flatten().tolist()
        if eos & set(allowed):
            assert m.accept(next(iter(eos & set(allowed))))
            return data.decode("utf-8")
        forced = m.forced_text()
        if forced and rng.random() < 0.5:
            assert m.accept_text(forced)
            data += forced.encode()
            continue
        if rng.random() < 0.6:  # lean towards tokens that close strings, arrays, addresses
            closing = [t for t in allowed if t in closing_ids]
            allowed = closing or allowed
        tid = rng.choice(allowed)
        assert m.accept(tid)
        data += vocab.token_bytes[tid]  # type: ignore[operator]
    raise AssertionError(f"no complete value: {data[:200]!r}")


def test_real_vocab_walks_are_valid(vocab: TokenVocabulary) -> None:
    compiler = GrammarCompiler(vocab)
    rng = random.Random(1)
    g = compiler.compile("json_schema", SCHEMA)
    assert g.matcher().forced_text() == '{"name":'
    for _ in range(3):
        jsonschema.validate(json.loads(_walk(g, vocab, rng)), SCHEMA)
    pattern = r"\d{3}-\d{3}-\d{4}"
    r = compiler.compile("regex", pattern)
    for _ in range(3):
        assert re.fullmatch(pattern, _walk(r, vocab, rng))
