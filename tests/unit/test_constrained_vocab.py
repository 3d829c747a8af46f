"""TokenVocabulary: the byte string of every id, checked against the tokenizer's own decoding."""

from __future__ import annotations

import gc
import random

import pytest
from test_constrained_support import CORPUS, TOKENIZER_KINDS, make_tokenizer, random_text

from sgl.constrained import TokenVocabulary
from sgl.constrained.vocab import gpt2_byte_decoder


def test_gpt2_byte_table_is_a_bijection() -> None:
    table = gpt2_byte_decoder()
    assert sorted(table.values()) == list(range(256))
    assert table["Ġ"] == 0x20 and table["Ċ"] == 0x0A and table["a"] == 0x61


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_every_id_matches_the_tokenizer(kind: str) -> None:
    tok = make_tokenizer(kind)
    vocab = TokenVocabulary.from_tokenizer(tok)
    assert vocab.vocab_size == len(tok)
    special = set(tok.all_special_ids) | set(tok.added_tokens_decoder)
    anchor = tok.convert_tokens_to_ids("a" if kind == "byte_level" else "▁a")
    partial = 0
    for tid, data in enumerate(vocab.token_bytes):
        if tid in special:
            assert data is None, tid
            continue
        assert data, tid
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            partial += 1
            # Alone it decodes to replacement characters, exactly as the tokenizer's decoder does.
            assert tok.decode([tid]) == data.decode("utf-8", errors="replace"), (tid, data)
            continue
        if kind == "byte_level":
            assert tok.decode([tid]) == text, (tid, data)
        else:
            # SentencePiece strips the leading space of a whole text; after another token it stays.
            both = tok.decode([anchor, tid])
            assert both == tok.decode([anchor]) + text, (tid, data, both)
    assert partial > 0, "fixture should contain tokens that end inside a character"


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_concatenation_spells_the_text(kind: str) -> None:
    tok = make_tokenizer(kind)
    vocab = TokenVocabulary.from_tokenizer(tok)
    rng = random.Random(1234)
    texts = CORPUS + [random_text(rng, rng.randrange(1, 40)) for _ in range(300)]
    for text in texts:
        ids = tok(text, add_special_tokens=False).input_ids
        joined = b"".join(vocab.token_bytes[i] for i in ids)  # type: ignore[misc]
        # Metaspace's "always" scheme adds one leading space unless the text has one.
        prefixed = kind == "sentencepiece" and not text.startswith(" ")
        expected = (" " + text if prefixed else text).encode("utf-8")
        assert joined == expected, (text, ids)


def test_vocab_size_padding_and_eos() -> None:
    tok = make_tokenizer("byte_level")
    vocab = TokenVocabulary.from_tokenizer(tok, vocab_size=len(tok) + 7)
    assert vocab.vocab_size == len(tok) + 7 and len(vocab.token_bytes) == vocab.vocab_size
    assert vocab.token_bytes[-7:] == (None,) * 7
    assert vocab.eos_token_ids == (tok.eos_token_id,)
    assert vocab.num_words == (vocab.vocab_size + 31) // 32
    explicit = TokenVocabulary.from_tokenizer(tok, eos_token_ids=[0, 2, 2])
    assert explicit.eos_token_ids == (0, 2)
    small = TokenVocabulary.from_tokenizer(tok, vocab_size=100)
    assert small.token_bytes == TokenVocabulary.from_tokenizer(tok).token_bytes[:100]


def test_cached_per_tokenizer() -> None:
    tok = make_tokenizer("sentencepiece")
    a = TokenVocabulary.from_tokenizer(tok)
    assert TokenVocabulary.from_tokenizer(tok) is a
    assert TokenVocabulary.from_tokenizer(tok, vocab_size=a.vocab_size + 1) is not a


def test_raw_tokenizers_object_and_cache_release() -> None:
    raw = make_tokenizer("byte_level").backend_tokenizer
    vocab = TokenVocabulary.from_tokenizer(raw)
    assert (
        vocab.token_bytes
        == TokenVocabulary.from_tokenizer(make_tokenizer("byte_level")).token_bytes
    )
    assert vocab.eos_token_ids == ()
    gc.collect()


def test_validation() -> None:
    with pytest.raises(ValueError):
        TokenVocabulary(token_bytes=(b"a",), eos_token_ids=(), vocab_size=2)
    with pytest.raises(ValueError):
        TokenVocabulary(token_bytes=(b"a", None), eos_token_ids=(5,), vocab_size=2)
