"""Token ids -> the exact bytes each token adds to the output text.

Constrained decoding reasons about bytes, not token strings: a byte-level BPE token
spells its bytes through GPT-2's byte-to-unicode table (``Ġ`` is a space), a
SentencePiece token spells a space as ``▁`` and raw bytes as ``<0xNN>``, and a token
may hold only part of a multi-byte UTF-8 character. Getting any of this wrong makes
a mask silently allow text the constraint forbids, so the mapping lives in one place
and is tested against the tokenizer's own decoding.

The bytes are the *mid-stream* bytes of a token: the space a SentencePiece decoder
strips from the very start of a text is kept, because generated tokens follow a
prompt.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["TokenVocabulary", "gpt2_byte_decoder"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class TokenVocabulary:
    """The byte string of every token id of a model, plus its end-of-sequence ids.

    ``token_bytes`` has one entry per id up to ``vocab_size`` (the model's, which may
    exceed the tokenizer's); ``None`` marks ids that are never text (special, added or
    unused tokens). Equality is identity (``eq=False``): comparing two 50k-entry tuples
    by value on every cache lookup would cost more than the lookups save.
    """

    token_bytes: tuple[bytes | None, ...]
    eos_token_ids: tuple[int, ...]
    vocab_size: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_bytes", tuple(self.token_bytes))
        object.__setattr__(
            self, "eos_token_ids", tuple(dict.fromkeys(int(i) for i in self.eos_token_ids))
        )
        if len(self.token_bytes) != self.vocab_size:
            raise ValueError(
                f"token_bytes has {len(self.token_bytes)} entries; vocab_size is {self.vocab_size}"
            )
        bad = [i for i in self.eos_token_ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"eos_token_ids {bad} are outside [0, {self.vocab_size})")

    @property
    def num_words(self) -> int:
        """Width of one bitmask row: 32 token ids per int32 word."""
        return (self.vocab_size + 31) // 32

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, vocab_size: int | None = None, eos_token_ids: Sequence[int] = ()
    ) -> TokenVocabulary:
        """Read the byte string of every id from an HF (or raw ``tokenizers``) tokenizer.

        ``vocab_size`` defaults to the tokenizer's size; ids past the tokenizer are
        ``None``. ``eos_token_ids`` defaults to the tokenizer's ``eos_token_id``.
        Results are cached per tokenizer object, so building the engine twice, or one
        compiler per worker, reads the vocabulary once.
        """
        base = _token_bytes_cached(tokenizer)
        size = len(base) if vocab_size is None else int(vocab_size)
        eos = tuple(int(i) for i in eos_token_ids)
        if not eos:
            default = getattr(tokenizer, "eos_token_id", None)
            eos = (int(default),) if isinstance(default, int) else ()
        key = (size, eos)
        with _CACHE_LOCK:
            per_tok = _VOCAB_CACHE.get(tokenizer)
            if per_tok is not None and key in per_tok:
                return per_tok[key]
        if size >= len(base):
            token_bytes = base + (None,) * (size - len(base))
        else:
            token_bytes = base[:size]
        vocab = cls(token_bytes=token_bytes, eos_token_ids=eos, vocab_size=size)
        with _CACHE_LOCK:
            try:
                _VOCAB_CACHE.setdefault(tokenizer, {})[key] = vocab
            except TypeError:  # not weak-referenceable: no caching
                pass
        return vocab


# ---------------------------------------------------------------------------
# Per-tokenizer cache (the only state kept between calls; weak, so tokenizers die)
# ---------------------------------------------------------------------------

_CACHE_LOCK = threading.Lock()
_BYTES_CACHE: weakref.WeakKeyDictionary[Any, tuple[bytes | None, ...]] = weakref.WeakKeyDictionary()
_VOCAB_CACHE: weakref.WeakKeyDictionary[Any, dict[tuple[int, tuple[int, ...]], TokenVocabulary]] = (
    weakref.WeakKeyDictionary()
)


def _token_bytes_cached(tokenizer: Any) -> tuple[bytes | None, ...]:
    with _CACHE_LOCK:
        try:
            hit = _BYTES_CACHE.get(tokenizer)
        except TypeError:
            hit = None
    if hit is not None:
        return hit
    result = tuple(_read_token_bytes(tokenizer))
    with _CACHE_LOCK:
        try:
            _BYTES_CACHE[tokenizer] = result
        except TypeError:
            pass
    return result


# ---------------------------------------------------------------------------
# Decoding schemes
# ---------------------------------------------------------------------------


def gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's printable-character spelling of each byte, inverted (char -> byte).

    Bytes that are printable Latin-1 spell themselves; the other 68 are shifted to
    U+0100 upwards in byte order. Byte-level BPE vocabularies store tokens this way.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    shifted = 0
    byte_order = list(printable)
    for b in range(256):
        if b not in printable:
            byte_order.append(b)
            chars.append(256 + shifted)
            shifted += 1
    return {chr(c): b for b, c in zip(byte_order, chars)}


def _byte_level_table() -> dict[int, str]:
    """A str.translate table: GPT-2 char -> the Latin-1 char of its byte.

    Latin-1 characters that are *not* GPT-2 spellings map to U+FFFF so that the
    following ``encode("latin-1")`` fails for tokens that are not byte-level text.
    """
    table: dict[int, str] = {c: "\uffff" for c in range(256)}
    for ch, b in gpt2_byte_decoder().items():
        table[ord(ch)] = chr(b)
    return table


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _decoder_steps(tokenizer: Any) -> list[dict[str, Any]] | None:
    """The backend decoder as a flat list of JSON step descriptions (None if unknown)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and hasattr(tokenizer, "id_to_token") and hasattr(tokenizer, "decoder"):
        backend = tokenizer  # a raw `tokenizers.Tokenizer`
    decoder = getattr(backend, "decoder", None) if backend is not None else None
    if decoder is None:
        return None
    try:
        spec = json.loads(decoder.__getstate__())
    except Exception:  # pragma: no cover - exotic decoder objects
        return None
    steps: list[dict[str, Any]] = []

    def flatten(d: dict[str, Any]) -> None:
        if d.get("type") == "Sequence":
            for sub in d.get("decoders", []):
                flatten(sub)
        else:
            steps.append(d)

    flatten(spec)
    return steps


def _id_strings(tokenizer: Any) -> tuple[list[str | None], set[int]]:
    """Every id's token string (None for gaps) and the ids of added tokens."""
    if hasattr(tokenizer, "convert_ids_to_tokens"):  # transformers
        n = len(tokenizer)
        strings = tokenizer.convert_ids_to_tokens(list(range(n)))
        added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
        added.update(getattr(tokenizer, "all_special_ids", ()) or ())
    else:  # tokenizers.Tokenizer
        n = tokenizer.get_vocab_size(with_added_tokens=True)
        strings = [tokenizer.id_to_token(i) for i in range(n)]
        added = set(tokenizer.get_added_tokens_decoder())
    return list(strings), added


def _read_token_bytes(tokenizer: Any) -> list[bytes | None]:
    strings, added = _id_strings(tokenizer)
    steps = _decoder_steps(tokenizer)
    kinds = {s.get("type") for s in steps} if steps is not None else set()
    out: list[bytes | None] = [None] * len(strings)
    if "ByteLevel" in kinds:
        table = _byte_level_table()
        for i, s in enumerate(strings):
            if s is None or i in added:
                continue
            try:
                out[i] = s.translate(table).encode("latin-1")
            except UnicodeEncodeError:  # not a byte-level spelling: take the text as is
                out[i] = s.encode("utf-8")
        return out
    if steps is not None and kinds <= {"ByteFallback", "Metaspace", "Replace", "Fuse", "Strip"}:
        replacements: list[tuple[str, str]] = []
        for s in steps:
            if s["type"] == "Metaspace":
                replacements.append((s.get("replacement", "▁"), " "))
            elif s["type"] == "Replace":
                pattern = s.get("pattern", {})
                if "String" not in pattern:
                    break
                replacements.append((pattern["String"], s.get("content", "")))
        else:
            byte_fallback = "ByteFallback" in kinds
            for i, s in enumerate(strings):
                if s is None or i in added:
                    continue
                m = _BYTE_FALLBACK.fullmatch(s) if byte_fallback else None
                if m is not None:
                    out[i] = bytes([int(m.group(1), 16)])
                    continue
                for old, new in replacements:
                    s = s.replace(old, new)
                out[i] = s.encode("utf-8")
            return out
    # Unknown decoder: decode each token alone. Exact for whole-character tokens only.
    logger.warning(
        "constrained decoding: unrecognised tokenizer decoder %s; token bytes are approximated "
        "by decoding each token on its own",
        sorted(k for k in kinds if k) or None,
    )
    decode = tokenizer.decode
    for i, s in enumerate(strings):
        if s is None or i in added:
            continue
        text = decode([i])
        out[i] = text.encode("utf-8") if text and "\ufffd" not in text else None
    return out
