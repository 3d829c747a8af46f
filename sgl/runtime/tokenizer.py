"""Tokenizer loading, encoding, streaming detokenization and stop-string matching.

Three concerns live here because they all have to agree on one thing: the text a
request produces must be exactly what ``tokenizer.decode(output_ids)`` would
give, whether it is delivered in one piece or streamed token by token.

* :func:`load_tokenizer` loads an HF tokenizer directory, or converts the
  tokenizer embedded in a GGUF file and caches the conversion on disk (the
  conversion is slow; the cached copy loads in a fraction of the time).
* :class:`IncrementalDetokenizer` turns a stream of token ids into a stream of
  text pieces that never contain a half-decoded character.
* :class:`StopStringMatcher` finds stop strings across piece boundaries and
  holds back text that may still turn out to be the start of one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import operator
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

if TYPE_CHECKING:  # transformers is heavy; import it only where it is used.
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

__all__ = [
    "IncrementalDetokenizer",
    "StopStringMatcher",
    "encode",
    "gguf_tokenizer_cache_dir",
    "load_gguf_tokenizer",
    "load_tokenizer",
]

# Bump when the layout or contents of a cache entry change, so old entries are
# ignored rather than misread.
_CACHE_FORMAT = 1
_CACHE_MARKER = "sgl_tokenizer_cache.json"
_REPLACEMENT_CHAR = "\ufffd"


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def _cache_root() -> Path:
    """Cache root: ``$SGL_CACHE_DIR`` if set, so tests and sandboxes can redirect it."""
    base = os.environ.get("SGL_CACHE_DIR") or os.path.join("~", ".cache", "sgl")
    return Path(base).expanduser() / "tokenizers"


def gguf_tokenizer_cache_dir(gguf_path: str | os.PathLike[str]) -> Path:
    """Where the converted tokenizer of ``gguf_path`` is (or would be) cached.

    The key covers the file's absolute path, size and mtime, so replacing the
    file invalidates the entry, plus the transformers/tokenizers versions,
    because a different converter could produce a different tokenizer.
    """
    import tokenizers
    import transformers

    path = Path(gguf_path).expanduser().resolve()
    st = path.stat()
    ident = "\0".join(
        [
            str(_CACHE_FORMAT),
            str(path),
            str(st.st_size),
            str(st.st_mtime_ns),
            transformers.__version__,
            tokenizers.__version__,
        ]
    )
    digest = hashlib.sha256(ident.encode("utf-8")).hexdigest()[:20]
    return _cache_root() / f"{path.stem}-{digest}"


def _convert_gguf(gguf_path: Path) -> PreTrainedTokenizerBase:
    """Run transformers' GGUF -> HF tokenizer conversion (the slow path, ~seconds)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if not getattr(tok, "chat_template", None):
        # Older converters dropped the template; read it from the GGUF metadata
        # ourselves so that save_pretrained writes it into the cache entry.
        template = _gguf_chat_template(gguf_path)
        if template:
            tok.chat_template = template
    return tok


def _gguf_chat_template(gguf_path: Path) -> str | None:
    """The ``tokenizer.chat_template`` metadata string of a GGUF file, if any."""
    try:
        from gguf import GGUFReader

        field = GGUFReader(str(gguf_path)).get_field("tokenizer.chat_template")
        if field is None:
            return None
        value = field.contents()
        return value if isinstance(value, str) and value else None
    except Exception:  # metadata is best effort; the tokenizer itself is fine
        logger.debug("could not read chat template from %s", gguf_path, exc_info=True)
        return None


def _load_cached(entry: Path) -> tuple[PreTrainedTokenizerBase | None, bool]:
    """Load a complete cache entry: ``(tokenizer or None, entry_is_broken)``."""
    if not (entry / _CACHE_MARKER).is_file():
        return None, entry.exists()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(entry)), False
    except Exception:
        logger.warning("ignoring unreadable tokenizer cache entry %s", entry, exc_info=True)
        return None, True


def _publish(tok: PreTrainedTokenizerBase, entry: Path, source: Path, *, replace: bool = False) -> None:
    """Write ``tok`` to ``entry`` atomically: save into a temp dir, then rename.

    A reader therefore sees either no entry or a complete one. If another
    process published first, its entry wins and ours is discarded. A broken
    entry (no completion marker, or ``replace`` because it failed to load) is
    moved aside first.
    """
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.parent))
    try:
        tok.save_pretrained(str(tmp))
        meta = {"format": _CACHE_FORMAT, "source": str(source)}
        (tmp / _CACHE_MARKER).write_text(json.dumps(meta), encoding="utf-8")
        if entry.exists() and (replace or not (entry / _CACHE_MARKER).is_file()):
            stale = Path(tempfile.mkdtemp(prefix=f".{entry.name}.stale-", dir=entry.parent))
            try:
                os.replace(entry, stale / "old")
            except OSError:
                pass
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, entry)  # atomic on POSIX; fails if entry is a non-empty dir
        except OSError:
            if not (entry / _CACHE_MARKER).is_file():
                raise
            logger.debug("tokenizer cache %s was published concurrently", entry)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_gguf_tokenizer(gguf_path: str | os.PathLike[str]) -> tuple[PreTrainedTokenizerBase, bool]:
    """Load the tokenizer embedded in a GGUF file, via the on-disk cache.

    Returns ``(tokenizer, from_cache)`` so callers and tests can tell whether
    the slow conversion ran. A cache that cannot be written (read-only home,
    full disk) only costs speed: the converted tokenizer is still returned.
    """
    path = Path(gguf_path).expanduser().resolve()
    entry = gguf_tokenizer_cache_dir(path)
    tok, broken = _load_cached(entry)
    if tok is not None:
        logger.info("loaded tokenizer for %s from cache %s", path.name, entry)
        return tok, True
    tok = _convert_gguf(path)
    try:
        _publish(tok, entry, path, replace=broken)
        logger.info("cached converted tokenizer for %s at %s", path.name, entry)
    except OSError:
        logger.warning("could not write tokenizer cache %s", entry, exc_info=True)
    return tok, False


def tokenizer_directory(tok_path: str | None) -> str | None:
    """A local directory with the tokenizer's files (`tokenizer.json`, its config and chat
    template) that other programs load, e.g. the sglang-router: an HF directory itself, or a
    GGUF's converted tokenizer in the cache (written when the engine loaded it); None for a
    dummy model's byte-level tokenizer or where the cache could not be written."""
    if tok_path is None:
        return None
    if os.path.isfile(tok_path):
        entry = gguf_tokenizer_cache_dir(tok_path)
        return str(entry) if (entry / "tokenizer.json").is_file() else None
    return str(Path(tok_path).resolve()) if os.path.isdir(tok_path) else None


def load_tokenizer(path: str, gguf_file: str | None = None) -> PreTrainedTokenizerBase:
    """Load a tokenizer from an HF model directory (or hub id) or a GGUF file.

    ``path`` may be a directory (optionally with ``gguf_file`` naming a GGUF
    file inside it, mirroring ``AutoTokenizer.from_pretrained``) or a ``.gguf``
    file. GGUF tokenizers go through :func:`load_gguf_tokenizer`'s cache.
    """
    if gguf_file is not None:
        return load_gguf_tokenizer(os.path.join(path, gguf_file))[0]
    if os.path.isfile(path):
        return load_gguf_tokenizer(path)[0]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of ``text`` exactly as HF's default call produces them.

    Uses the default ``add_special_tokens`` so that prompts tokenized here match
    what the model saw in HF-based training/evaluation pipelines.
    """
    return list(tokenizer(text).input_ids)


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


_INFO_CACHE: "weakref.WeakKeyDictionary[object, _TokenizerInfo]" = weakref.WeakKeyDictionary()


def _tokenizer_info(tokenizer: PreTrainedTokenizerBase) -> _TokenizerInfo:
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


class _CleanupStream:
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
    (see :class:`_CleanupStream`), which gives the same result as cleaning
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
        info = _tokenizer_info(tokenizer)
        self._byte_ids = info.byte_ids
        # Trailing ids that may still belong to an unfinished byte run: byte
        # tokens, plus (when skipping) special tokens, which the backend drops
        # before decoding so that a run continues across them.
        self._run_ids = (
            info.byte_ids | info.special_ids if info.byte_ids and skip_special_tokens else info.byte_ids
        )
        self._cleanup = _CleanupStream(tokenizer.clean_up_tokenization) if info.cleanup else None

        seed = self._prompt_seed([] if prompt_ids is None else [operator.index(t) for t in prompt_ids])
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
        while last > 0 and prompt[last - 1] in self._run_ids and prompt[last - 1] not in self._byte_ids:
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
        if not final and self._run_ids:
            while end > self._read_offset and ids[end - 1] in self._run_ids:
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


# ---------------------------------------------------------------------------
# Stop strings
# ---------------------------------------------------------------------------


class StopStringMatcher:
    """Finds the earliest stop string in a streamed text and trims output there.

    Semantics: the result depends only on the full text, not on how it was
    split into pieces. The match is the occurrence with the smallest start
    index across all stop strings; on a tie (one stop is a prefix of another,
    both at the same index) the shortest stop wins, since it completes first
    and the trimmed text is the same either way. The output is the text before
    that index.

    Streaming consequences:

    * text that could still be the beginning of a stop string is held back;
    * a completed stop is only reported (``matched``) once no stop string that
      would start *earlier* can still complete (e.g. stops ``["abcd", "c"]``
      with text "abc": "c" is held pending until the next piece rules "abcd"
      in or out). This is rare and bounded by the longest stop's length.

    Cost per :meth:`feed` is O(len(longest stop) + len(new_text)) per stop:
    only the tail window that new occurrences can touch is scanned.

    Empty strings in ``stops`` are ignored (they would match immediately).
    """

    def __init__(self, stops: Iterable[str]) -> None:
        self.stops: tuple[str, ...] = tuple(dict.fromkeys(s for s in stops if s))
        self._max_len = max((len(s) for s in self.stops), default=0)
        self._prefixes = frozenset(s[:k] for s in self.stops for k in range(1, len(s)))
        self._first_chars = frozenset(s[0] for s in self.stops)
        self._pieces: list[str] = []
        self._total = 0  # length of all text fed
        self._buf = ""  # text[self._buf_start:], the only part still scanned
        self._buf_start = 0
        self._emitted = 0  # text[:self._emitted] has been returned
        self._pending: tuple[int, int, str] | None = None  # (start, len, stop) awaiting confirmation
        self._done = False
        self.matched_stop: str | None = None
        self.stop_start: int | None = None  # index of the match in ``text``

    @property
    def matched(self) -> bool:
        return self.matched_stop is not None

    @property
    def text(self) -> str:
        """Everything fed so far, untrimmed (including text after a stop)."""
        return "".join(self._pieces)

    @property
    def output_text(self) -> str:
        """The text emitted so far (trimmed before the stop once matched)."""
        return self.text[: self._emitted]

    def feed(self, new_text: str) -> tuple[str, bool]:
        """Add a piece; return (text safe to emit now, whether a stop matched).

        After a match further pieces are ignored and ``("", True)`` returned.
        """
        if self._done:
            return "", self.matched
        if new_text:
            self._pieces.append(new_text)
        old_total = self._total
        self._total += len(new_text)
        self._buf += new_text
        if not self.stops:
            out = self._emit_to(self._total)
            self._trim()
            return out, False

        best = self._pending
        # An occurrence that ends in the new text starts at or after scan_from;
        # anything earlier was already examined by previous calls.
        scan_from = max(self._buf_start, old_total - (self._max_len - 1))
        for stop in self.stops:
            i = self._buf.find(stop, scan_from - self._buf_start)
            if i >= 0:
                cand = (self._buf_start + i, len(stop), stop)
                if best is None or cand[:2] < best[:2]:
                    best = cand
        hold = self._earliest_partial()
        if best is not None and hold >= best[0]:
            self._done = True
            self.matched_stop = best[2]
            self.stop_start = best[0]
            return self._emit_to(best[0]), True
        self._pending = best
        out = self._emit_to(hold)
        self._trim()
        return out, False

    def flush(self) -> str:
        """Return the held-back text when the request ends for another reason.

        A completed stop that was pending confirmation becomes the match (no
        earlier-starting stop can complete any more): check ``matched_stop``.
        """
        if self._done:
            return ""
        self._done = True
        if self._pending is not None:
            self.stop_start, _, self.matched_stop = self._pending
            return self._emit_to(self.stop_start)
        return self._emit_to(self._total)

    def _earliest_partial(self) -> int:
        """Start of the earliest suffix that is a proper prefix of a stop (else total)."""
        lo = max(self._emitted, self._total - (self._max_len - 1))
        buf, base = self._buf, self._buf_start
        for j in range(lo, self._total):
            if buf[j - base] in self._first_chars and buf[j - base :] in self._prefixes:
                return j
        return self._total

    def _emit_to(self, end: int) -> str:
        out = self._buf[self._emitted - self._buf_start : end - self._buf_start]
        self._emitted = end
        return out

    def _trim(self) -> None:
        keep_from = min(self._emitted, max(0, self._total - (self._max_len - 1)))
        if keep_from > self._buf_start:
            self._buf = self._buf[keep_from - self._buf_start :]
            self._buf_start = keep_from
