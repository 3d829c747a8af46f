"""Streaming (incremental) detokenization: one request's output ids, as text pieces.

The text a request produces must be exactly what ``tokenizer.decode(output_ids)`` would give,
whether it is delivered in one piece or streamed token by token: :class:`IncrementalDetokenizer`
turns a stream of token ids into a stream of text pieces that never contain a half-decoded
character, using a few facts about the tokenizer computed once per tokenizer (byte-fallback ids,
skipped special ids, whether ``decode`` cleans up spaces).
"""

from __future__ import annotations

import logging
import operator
import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # transformers is heavy; import it only where it is used.
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

__all__ = ["IncrementalDetokenizer"]

_REPLACEMENT_CHAR = "\ufffd"


# ---------------------------------------------------------------------------
# Per-tokenizer facts the detokenizer needs (computed once per tokenizer)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _TokenizerInfo:
    # Ids of SentencePiece byte-fallback tokens (``<0xE4>``). Their decoder
    # turns a *whole run* of them into U+FFFDs if any byte in the run is
    # invalid, so a run can only be decoded for good once it has ended.
    byte_ids: frozenset[int]
    # Ids ``decode(skip_special_tokens=True)`` may drop. Dropped tokens are
    # removed *before* the decoder runs, so a byte run continues across them.
    special_ids: frozenset[int]
    # Whether tokenizer.decode applies the Python-level
    # ``clean_up_tokenization`` (" ." -> "." etc.) to its output.
    cleanup: bool


_INFO_CACHE: weakref.WeakKeyDictionary[object, _TokenizerInfo] = weakref.WeakKeyDictionary()


def tokenizer_info(tokenizer: PreTrainedTokenizerBase) -> _TokenizerInfo:
    try:
        return _INFO_CACHE[tokenizer]
    except (KeyError, TypeError):
        pass
    info = _TokenizerInfo(
        byte_ids=_byte_fallback_ids(tokenizer),
        special_ids=_special_ids(tokenizer),
        cleanup=_cleanup_active(tokenizer),
    )
    try:
        _INFO_CACHE[tokenizer] = info
    except TypeError:  # not weak-referenceable: recompute per request
        pass
    return info


def _byte_fallback_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Ids of tokens spelled ``<0xHH>``. Over-including is harmless (only delays text)."""
    ids: set[int] = set()
    for byte in range(256):
        for spelled in {f"<0x{byte:02X}>", f"<0x{byte:02x}>"}:
            tid = tokenizer.convert_tokens_to_ids(spelled)
            if isinstance(tid, int) and tokenizer.convert_ids_to_tokens(tid) == spelled:
                ids.add(tid)
    return frozenset(ids)


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Named special tokens plus added tokens flagged special (what the backend skips)."""
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(tid for tid, tok in added.items() if getattr(tok, "special", False))
    return frozenset(ids)


def _cleanup_active(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Does ``decode`` (with defaults) run ``clean_up_tokenization``?

    The flag alone is not enough: transformers 5 ignores it for BPE models. So
    when the flag is set, probe with a string whose raw decode contains " .".
    """
    if not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return False
    try:
        ids = tokenizer.encode("a .", add_special_tokens=False)
        raw = tokenizer.decode(ids, clean_up_tokenization_spaces=False)
        if " ." in raw:
            return tokenizer.decode(ids, clean_up_tokenization_spaces=True) != raw
    except Exception:  # exotic tokenizer: trust the flag
        logger.debug("cleanup probe failed", exc_info=True)
    return True


def _last_safe_cut(buf: str) -> int:
    """Largest cut ``p`` with ``buf[p-3:p]`` free of spaces (0 if none).

    Every ``clean_up_tokenization`` pattern starts with a space and is at most
    4 characters long, and cleaning only deletes spaces, so no pattern can
    straddle a cut preceded by 3 non-space characters: cleaning the parts
    separately equals cleaning the whole.
    """
    p = len(buf)
    while p >= 3:
        space = buf.rfind(" ", p - 3, p)
        if space < 0:
            return p
        p = space
    return 0


class CleanupStream:
    """Streams ``clean_up_tokenization`` by holding text after the last safe cut."""

    def __init__(self, clean: Callable[[str], str]) -> None:
        self._clean = clean
        self._buf = ""

    def feed(self, raw: str) -> str:
        self._buf += raw
        cut = _last_safe_cut(self._buf)
        if cut == 0:
            return ""
        out = self._clean(self._buf[:cut])
        self._buf = self._buf[cut:]
        return out

    def flush(self) -> str:
        out = self._clean(self._buf) if self._buf else ""
        self._buf = ""
        return out


# ---------------------------------------------------------------------------
# Incremental detokenization
# ---------------------------------------------------------------------------


class IncrementalDetokenizer:
    """Turns one request's output token ids into text, piece by piece.

    Guarantee (without ``prompt_ids``): the concatenation of everything
    :meth:`feed` returned plus :meth:`flush` equals
    ``tokenizer.decode(output_ids, skip_special_tokens=...)``; and since text
    is never retracted, no piece holds a U+FFFD that the final decode lacks.

    How: each step decodes a small window ``ids[prefix:]`` and emits what it
    adds beyond ``decode(ids[prefix:read])`` (the window alone). Diffing two
    decodes of the same window sidesteps decoders whose decode of a suffix is
    not the suffix of the decode (SentencePiece strips the first token's
    leading space, WordPiece joins ``##`` pieces). Text is held back while

    * the window's decode ends in U+FFFD (an incomplete UTF-8 sequence), and
    * the ids end in a run of byte-fallback tokens (``<0xE4>``): HF decodes a
      run as a whole and turns *all* of it into U+FFFDs if any byte is bad, so
      a run is decoded only once a non-byte token ends it (or at flush).
      Skipped special tokens do not end a run (they are dropped first).

    The window start only moves to a point whose window decodes to non-empty
    text, so a run of skipped special tokens never becomes the window's
    "first token" (which would wrongly lose a SentencePiece leading space).

    ``prompt_ids`` (optional): the last few prompt tokens seed the window, so
    the first output token is decoded in context, as in
    ``decode(prompt + output)[len(decode(prompt)):]``; e.g. a SentencePiece
    "▁Hello" then yields " Hello" instead of "Hello". For byte-level BPE
    tokenizers (GPT-2 style, SmolLM2) both conventions give the same text.
    The prompt context is not used when the prompt's decode ends in U+FFFD or
    its last token is a byte-fallback token (a byte run that could continue
    into the output); the output is then decoded on its own.

    ``clean_up_tokenization_spaces``: decoding is done raw, and when the
    tokenizer's ``decode`` would clean up, the cleanup is applied as a stream
    (see :class:`CleanupStream`), which gives the same result as cleaning
    the whole text.
    """

    # Prompt tokens used as initial context; more if they decode to nothing.
    _PROMPT_CONTEXT = 8
    _PROMPT_CONTEXT_MAX = 64

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_ids: Sequence[int] | None = None,
        *,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        info = tokenizer_info(tokenizer)
        self._byte_ids = info.byte_ids
        # Trailing ids that may still belong to an unfinished byte run: byte
        # tokens, plus (when skipping) special tokens, which the backend drops
        # before decoding so that a run continues across them. Read-only; public
        # because what `flush` may still release depends on it.
        self.run_ids = (
            info.byte_ids | info.special_ids
            if info.byte_ids and skip_special_tokens
            else info.byte_ids
        )
        self._cleanup = CleanupStream(tokenizer.clean_up_tokenization) if info.cleanup else None

        seed = self._prompt_seed(
            [] if prompt_ids is None else [operator.index(t) for t in prompt_ids]
        )
        self._ids: list[int] = seed
        self._n_seed = len(seed)
        self._prefix_offset = 0
        self._read_offset = len(seed)
        self._prefix_text = self._decode(0, len(seed)) if seed else ""
        self._pieces: list[str] = []
        self._finished = False

    def _decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(
            self._ids[start:end],
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            clean_up_tokenization_spaces=False,
        )

    def _prompt_seed(self, prompt: list[int]) -> list[int]:
        """The prompt tail used as context, or [] when it would not be reliable."""
        last = len(prompt)
        while (
            last > 0 and prompt[last - 1] in self.run_ids and prompt[last - 1] not in self._byte_ids
        ):
            last -= 1  # skipped specials: look through them
        if not prompt or (last > 0 and prompt[last - 1] in self._byte_ids):
            return []
        n = self._PROMPT_CONTEXT
        while True:
            seed = prompt[-n:]
            text = self.tokenizer.decode(
                seed,
                skip_special_tokens=self.skip_special_tokens,
                spaces_between_special_tokens=self.spaces_between_special_tokens,
                clean_up_tokenization_spaces=False,
            )
            if text or n >= len(prompt) or n >= self._PROMPT_CONTEXT_MAX:
                break
            n *= 2
        if not text or text.endswith(_REPLACEMENT_CHAR):
            return []
        return seed

    @property
    def output_ids(self) -> list[int]:
        """All output ids fed so far (the prompt context excluded)."""
        return self._ids[self._n_seed :]

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return "".join(self._pieces)

    def feed(self, new_ids: int | Sequence[int]) -> str:
        """Add the ids of one decoding step; return the text they finalize (maybe "")."""
        if self._finished:
            raise RuntimeError("feed() after flush()")
        if hasattr(new_ids, "__iter__"):  # list, tuple, tensor or array of ids
            self._ids.extend(operator.index(t) for t in new_ids)
        else:
            self._ids.append(operator.index(new_ids))
        return self._emit(self._step(final=False))

    def flush(self) -> str:
        """Return everything still held back; call once when the request ends."""
        if self._finished:
            return ""
        raw = self._step(final=True)
        self._finished = True
        out = raw
        if self._cleanup is not None:
            out = self._cleanup.feed(raw) + self._cleanup.flush()
        if out:
            self._pieces.append(out)
        return out

    def _emit(self, raw: str) -> str:
        out = self._cleanup.feed(raw) if self._cleanup is not None and raw else raw
        if out:
            self._pieces.append(out)
        return out

    def _step(self, *, final: bool) -> str:
        """Raw (uncleaned) text newly finalized; advances the window on success."""
        ids = self._ids
        end = len(ids)
        if not final and self.run_ids:
            while end > self._read_offset and ids[end - 1] in self.run_ids:
                end -= 1
        if end <= self._read_offset:
            return ""
        new_text = self._decode(self._prefix_offset, end)
        prefix_text = self._prefix_text
        if not final and new_text.endswith(_REPLACEMENT_CHAR):
            return ""  # incomplete character (or an invalid byte we cannot judge yet)
        if not new_text.startswith(prefix_text):
            # Not expected for HF decoders; waiting for more context is the
            # only safe thing while streaming. At the end, emit the best guess.
            if not final:
                return ""
            return new_text[len(os.path.commonprefix([new_text, prefix_text])) :]
        piece = new_text[len(prefix_text) :]
        if not piece or final:
            return piece
        # Advance: the just-decoded ids become the next window's prefix. Keep
        # the old start if they decode to nothing (e.g. skipped specials).
        next_prefix = self._decode(self._read_offset, end)
        if next_prefix:
            self._prefix_offset = self._read_offset
            self._prefix_text = next_prefix
        else:
            self._prefix_text = new_text
        self._read_offset = end
        return piece
