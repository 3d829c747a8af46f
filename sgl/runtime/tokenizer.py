"""Tokenizer loading (an HF directory or hub id, or the tokenizer embedded in a GGUF file) and
encoding.

Converting a GGUF file's tokenizer is slow, so :func:`load_gguf_tokenizer` caches the
conversion on disk (the cached copy loads in a fraction of the time), chat template included.
Turning output ids back into streamed text is detokenizer.py's; stop strings are stop_strings.py's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # transformers is heavy; import it only where it is used.
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

__all__ = [
    "encode",
    "gguf_tokenizer_cache_dir",
    "load_gguf_tokenizer",
    "load_tokenizer",
    "tokenizer_directory",
]

# Bump when the layout or contents of a cache entry change, so old entries are
# ignored rather than misread.
_CACHE_FORMAT = 1
CACHE_MARKER = "sgl_tokenizer_cache.json"


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
        template = gguf_chat_template(gguf_path)
        if template:
            tok.chat_template = template
    return tok


def gguf_chat_template(gguf_path: Path) -> str | None:
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
    if not (entry / CACHE_MARKER).is_file():
        return None, entry.exists()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(entry)), False
    except Exception:
        logger.warning("ignoring unreadable tokenizer cache entry %s", entry, exc_info=True)
        return None, True


def publish_cache_entry(
    tok: PreTrainedTokenizerBase, entry: Path, source: Path, *, replace: bool = False
) -> None:
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
        (tmp / CACHE_MARKER).write_text(json.dumps(meta), encoding="utf-8")
        if entry.exists() and (replace or not (entry / CACHE_MARKER).is_file()):
            stale = Path(tempfile.mkdtemp(prefix=f".{entry.name}.stale-", dir=entry.parent))
            try:
                os.replace(entry, stale / "old")
            except OSError:
                pass
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, entry)  # atomic on POSIX; fails if entry is a non-empty dir
        except OSError:
            if not (entry / CACHE_MARKER).is_file():
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
        publish_cache_entry(tok, entry, path, replace=broken)
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
