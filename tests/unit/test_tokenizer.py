"""Unit tests for sgl.runtime.tokenizer, detokenizer and stop_strings, on tokenizers trained in
memory (no model files).

The oracles are HF's own behaviour: streaming detokenization must add up to
``tokenizer.decode(ids)``, and stop matching must agree with a brute-force
search over the full text, whatever the chunking.
"""

from __future__ import annotations

import functools
import json
import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from sgl.runtime import tokenizer as tk  # noqa: E402
from sgl.runtime.detokenizer import (  # noqa: E402
    CleanupStream,
    IncrementalDetokenizer,
    tokenizer_info,
)
from sgl.runtime.stop_strings import StopStringMatcher  # noqa: E402
from sgl.runtime.tokenizer import (  # noqa: E402
    encode,
    gguf_tokenizer_cache_dir,
    load_gguf_tokenizer,
    load_tokenizer,
)

HYPO = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "Café crème brûlée, naïve façade, résumé — déjà vu; Ångström, Zoë, Øresund.",
    "中文文本测试，你好世界。日本語のテキスト、こんにちは。한국어 텍스트 안녕하세요.",
    "Emoji: 😀 😃 🎉 👍🏽 🇫🇷 👨\u200d👩\u200d👧 ❤️ 🚀 and symbols ∑ ∫ √ ≤ ≥ € £ ¥.",
    "def f(x):\n    return x ** 2  # square\n\tindent\ttabs   spaces",
    "I don't know, isn't it? We're here; they've gone. It's fine . really ! I'm ' ok",
]
# Characters for random "realistic" texts: all of the corpus plus some it never saw.
TEXT_ALPHABET = "".join(sorted(set("".join(CORPUS)))) + "Ωж🦀ẞ"


def _corpus():
    for _ in range(20):
        yield from CORPUS


def _wrap(tok: Tokenizer, **kwargs) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


def _with_byte_fallback(tok: Tokenizer) -> Tokenizer:
    """Add SentencePiece-style <0xHH> tokens as ordinary vocab entries."""
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    next_id = max(vocab.values()) + 1
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = next_id
        next_id += 1
    data["model"]["byte_fallback"] = True
    return Tokenizer.from_str(json.dumps(data))


@functools.cache
def make_tokenizer(kind: str) -> PreTrainedTokenizerFast:
    """Tiny tokenizers of the families the runtime meets in practice."""
    if kind in ("byte_level", "byte_level_cleanup"):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=500,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            show_progress=False,
        )
        tok.train_from_iterator(_corpus(), trainer)
        extra = {}
        if kind == "byte_level_cleanup":
            # Forces transformers' space cleanup even though the model is BPE.
            extra = dict(
                clean_up_tokenization_spaces=True,
                clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output=True,
            )
        hf = _wrap(
            tok,
            bos_token="<|im_start|>",
            eos_token="<|im_end|>",
            unk_token="<|endoftext|>",
            **extra,
        )
        hf.add_tokens(["<tool>"])  # a non-special added token
        return hf
    if kind in ("sp_metaspace", "sp_llama"):
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        if kind == "sp_metaspace":
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
            tok.decoder = decoders.Sequence(
                [
                    decoders.ByteFallback(),
                    decoders.Metaspace(replacement="▁", prepend_scheme="always"),
                ]
            )
        else:  # Llama-2 layout
            tok.normalizer = normalizers.Sequence(
                [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
            )
            tok.decoder = decoders.Sequence(
                [
                    decoders.Replace("▁", " "),
                    decoders.ByteFallback(),
                    decoders.Fuse(),
                    decoders.Strip(" ", 1, 0),
                ]
            )
        # A small alphabet so that rarer characters go through byte fallback.
        trainer = trainers.BpeTrainer(
            vocab_size=300,
            limit_alphabet=60,
            special_tokens=["<unk>", "<s>", "</s>"],
            show_progress=False,
        )
        tok.train_from_iterator(_corpus(), trainer)
        return _wrap(_with_byte_fallback(tok), bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    if kind == "wordpiece_cleanup":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=False)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        trainer = trainers.WordPieceTrainer(
            vocab_size=400, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]"], show_progress=False
        )
        tok.train_from_iterator(_corpus(), trainer)
        return _wrap(
            tok,
            unk_token="[UNK]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            pad_token="[PAD]",
            clean_up_tokenization_spaces=True,
        )
    raise ValueError(kind)


KINDS = ["byte_level", "byte_level_cleanup", "sp_metaspace", "sp_llama", "wordpiece_cleanup"]


def test_tokenizer_families_behave_as_intended() -> None:
    """Guard the fixtures: each family exercises the decoder quirk it is here for."""
    bl = make_tokenizer("byte_level")
    assert bl.decode(bl("Hi 中文 😀").input_ids) == "Hi 中文 😀"
    for kind in ("sp_metaspace", "sp_llama"):
        sp = make_tokenizer(kind)
        ids = sp("x 🦀 é", add_special_tokens=False).input_ids
        assert any(t.startswith("<0x") for t in sp.convert_ids_to_tokens(ids)), (
            "byte fallback unused"
        )
        assert sp.decode(ids) == "x 🦀 é"
        assert tokenizer_info(sp).byte_ids  # detected
    assert tokenizer_info(make_tokenizer("wordpiece_cleanup")).cleanup
    assert tokenizer_info(make_tokenizer("byte_level_cleanup")).cleanup
    assert not tokenizer_info(bl).cleanup
    assert not tokenizer_info(bl).byte_ids


def test_encode_matches_hf_default() -> None:
    for kind in KINDS:
        tok = make_tokenizer(kind)
        for text in CORPUS + ["", "  ", "<|im_start|>user\nhi<|im_end|>"]:
            assert encode(tok, text) == tok(text).input_ids


# ---------------------------------------------------------------------------
# Incremental detokenizer
# ---------------------------------------------------------------------------


def _stream(
    tok: PreTrainedTokenizerFast,
    ids: list[int],
    chunks: list[int],
    *,
    skip: bool,
    spaces: bool = True,
    prompt: list[int] | None = None,
) -> list[str]:
    """Feed ids in the given chunk sizes (cycled); return all pieces incl. flush."""
    detok = IncrementalDetokenizer(
        tok, prompt, skip_special_tokens=skip, spaces_between_special_tokens=spaces
    )
    pieces: list[str] = []
    i, k = 0, 0
    while i < len(ids):
        n = max(1, chunks[k % len(chunks)]) if chunks else 1
        pieces.append(detok.feed(ids[i : i + n]))
        i += n
        k += 1
    pieces.append(detok.flush())
    assert detok.output_ids == ids
    assert detok.text == "".join(pieces)
    return pieces


def _check_oracle(
    tok: PreTrainedTokenizerFast, ids: list[int], chunks: list[int], skip: bool, spaces: bool = True
) -> None:
    oracle = tok.decode(ids, skip_special_tokens=skip, spaces_between_special_tokens=spaces)
    pieces = _stream(tok, ids, chunks, skip=skip, spaces=spaces)
    got = "".join(pieces)
    assert got == oracle, (ids, chunks, pieces)
    # Never a broken character that a later token "fixes": every U+FFFD that
    # was emitted is one the final decode also has at that position.
    pos = 0
    for piece in pieces:
        for j, ch in enumerate(piece):
            if ch == "\ufffd":
                assert oracle[pos + j] == "\ufffd"
        pos += len(piece)


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("kind", KINDS)
@HYPO
@given(data=st.data())
def test_detok_random_ids_hypothesis(kind: str, skip: bool, data: st.DataObject) -> None:
    tok = make_tokenizer(kind)
    ids = data.draw(st.lists(st.integers(0, len(tok) - 1), max_size=40), label="ids")
    chunks = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=8), label="chunks")
    _check_oracle(tok, ids, chunks, skip)


@pytest.mark.parametrize("kind", KINDS)
@HYPO
@given(data=st.data())
def test_detok_real_text_hypothesis(kind: str, data: st.DataObject) -> None:
    """Ids of real text (what models mostly produce), with specials sprinkled in."""
    tok = make_tokenizer(kind)
    text = data.draw(st.text(alphabet=TEXT_ALPHABET, max_size=60), label="text")
    ids = tok(text, add_special_tokens=False).input_ids
    specials = tok.all_special_ids
    for _ in range(data.draw(st.integers(0, 3), label="n_specials")):
        at = data.draw(st.integers(0, len(ids)), label="at")
        ids.insert(at, data.draw(st.sampled_from(specials), label="special"))
    chunks = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=8), label="chunks")
    skip = data.draw(st.booleans(), label="skip")
    _check_oracle(tok, ids, chunks, skip)


@pytest.mark.parametrize("kind", KINDS)
def test_detok_fixed_seeds(kind: str) -> None:
    """Many seeded sequences, longer than hypothesis draws, mixing random ids and text."""
    tok = make_tokenizer(kind)
    rng = random.Random(1234 + KINDS.index(kind))
    vocab = len(tok)
    for trial in range(150):
        if trial % 2:
            ids = [rng.randrange(vocab) for _ in range(rng.randint(0, 120))]
        else:
            text = "".join(rng.choice(TEXT_ALPHABET) for _ in range(rng.randint(0, 150)))
            ids = tok(text, add_special_tokens=False).input_ids
        chunks = [rng.randint(1, 6) for _ in range(rng.randint(1, 10))]
        _check_oracle(tok, ids, chunks, skip=bool(trial % 3), spaces=bool(trial % 5))


@pytest.mark.parametrize("kind", ["byte_level", "sp_metaspace", "sp_llama"])
def test_detok_liveness(kind: str) -> None:
    """Text is held back only while it can still change.

    Byte-level: whenever the decode of the ids so far does not end in U+FFFD,
    all of it has been emitted. Byte fallback: at most the trailing byte run
    is held, so ids not ending in a byte token leave nothing for flush().
    """
    tok = make_tokenizer(kind)
    rng = random.Random(7)
    for trial in range(100):
        text = "".join(rng.choice(TEXT_ALPHABET) for _ in range(rng.randint(1, 80)))
        ids = tok(text, add_special_tokens=False).input_ids
        if trial % 2:
            ids = [rng.randrange(len(tok)) for _ in range(30)]
        detok = IncrementalDetokenizer(tok, skip_special_tokens=True)
        for k in range(len(ids)):
            detok.feed(ids[k])
            so_far = tok.decode(ids[: k + 1], skip_special_tokens=True)
            if kind == "byte_level" and not so_far.endswith("\ufffd"):
                assert detok.text == so_far
        tail = detok.flush()
        ends_in_run = bool(ids) and ids[-1] in detok.run_ids
        if not ends_in_run and not tok.decode(ids, skip_special_tokens=True).endswith("\ufffd"):
            assert tail == ""


def test_detok_holds_incomplete_utf8() -> None:
    """An emoji split over byte tokens appears only when complete."""
    tok = make_tokenizer("byte_level")
    # ByteLevel spells every byte as one vocab char, so each byte is a token.
    ids = [tok.convert_tokens_to_ids(_byte_level_char(b)) for b in "🦀".encode()]
    detok = IncrementalDetokenizer(tok, skip_special_tokens=True)
    assert [detok.feed(i) for i in ids] == ["", "", "", "🦀"]
    assert detok.flush() == ""
    # Truncated at the end: flush gives exactly what HF decode gives.
    detok = IncrementalDetokenizer(tok)
    assert detok.feed(ids[:2]) == ""
    assert detok.flush() == tok.decode(ids[:2]) and "\ufffd" in tok.decode(ids[:2])


def _byte_level_char(b: int) -> str:
    """GPT-2's byte -> printable char table."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {x: chr(x) for x in printable}
    n = 0
    for x in range(256):
        if x not in table:
            table[x] = chr(256 + n)
            n += 1
    return table[b]


def test_detok_byte_fallback_run_is_decoded_as_a_whole() -> None:
    """A valid char followed by a bad byte in the same run: HF turns the whole run into U+FFFDs."""
    tok = make_tokenizer("sp_llama")
    b = [tok.convert_tokens_to_ids(f"<0x{x:02X}>") for x in "中".encode() + b"\xff"]
    word = tok("hi", add_special_tokens=False).input_ids
    ids = word + b + word
    oracle = tok.decode(ids)
    assert oracle.count("\ufffd") == 4  # the whole run, including the valid 中
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.feed(i) for i in ids] + [detok.flush()]
    assert "中" not in "".join(pieces)
    assert "".join(pieces) == oracle


@pytest.mark.parametrize("kind", ["sp_metaspace", "sp_llama", "byte_level"])
def test_detok_prompt_context(kind: str) -> None:
    """With prompt ids the output is decoded in context: decode(prompt+out) minus decode(prompt)."""
    tok = make_tokenizer(kind)
    rng = random.Random(99)
    words = ["hello", "the dog", "Café", "fox jumps", "x"]
    for trial in range(120):
        prompt_text = rng.choice(words) + rng.choice(["", " over", " lazy"])
        prompt = tok(prompt_text, add_special_tokens=False).input_ids
        if trial % 3 == 0:
            prompt = prompt + [tok.eos_token_id]  # prompt ending in a special token
        if trial % 2:
            out = tok(" " + rng.choice(words) + " 中文", add_special_tokens=False).input_ids
        else:
            out = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 20))]
        skip = bool(trial % 4)
        full = tok.decode(prompt + out, skip_special_tokens=skip)
        head = tok.decode(prompt, skip_special_tokens=skip)
        assert full.startswith(head)
        pieces = _stream(tok, out, [rng.randint(1, 3)], skip=skip, prompt=prompt)
        assert "".join(pieces) == full[len(head) :], (prompt, out, pieces)
    if kind != "byte_level":
        # The point of the context: SentencePiece keeps the first output space.
        prompt = tok("hello", add_special_tokens=False).input_ids
        out = tok("world", add_special_tokens=False).input_ids  # "▁world"
        assert tok.decode(out) == "world"
        assert "".join(_stream(tok, out, [1], skip=True, prompt=prompt)) == " world"
        assert "".join(_stream(tok, out, [1], skip=True)) == "world"


def test_detok_accepts_numpy_ids() -> None:
    """Engines hand over ids as numpy/torch scalars and arrays."""
    np = pytest.importorskip("numpy")
    tok = make_tokenizer("byte_level")
    ids = tok("Café 中文 😀", add_special_tokens=False).input_ids
    detok = IncrementalDetokenizer(tok, np.array(ids[:2]))
    out = (
        detok.feed(np.int64(ids[0])) + detok.feed(np.array(ids[1:], dtype=np.int32)) + detok.flush()
    )
    assert out == tok.decode(ids) and detok.output_ids == ids


def test_detok_feed_after_flush_raises() -> None:
    detok = IncrementalDetokenizer(make_tokenizer("byte_level"))
    detok.flush()
    assert detok.flush() == ""
    with pytest.raises(RuntimeError):
        detok.feed([1])


@HYPO
@given(pieces=st.lists(st.text(alphabet=" .,!?'nstmrvea", max_size=8), max_size=12))
def test_cleanup_stream_equals_cleaning_whole(pieces: list[str]) -> None:
    clean = make_tokenizer("wordpiece_cleanup").clean_up_tokenization
    stream = CleanupStream(clean)
    out = "".join(stream.feed(p) for p in pieces) + stream.flush()
    assert out == clean("".join(pieces))


# ---------------------------------------------------------------------------
# Stop strings
# ---------------------------------------------------------------------------


def _earliest(text: str, stops: list[str]) -> tuple[int, str] | None:
    """Brute force: smallest start index; on a tie, the shortest stop."""
    best: tuple[int, int, str] | None = None
    for s in stops:
        if not s:
            continue
        i = text.find(s)
        if i >= 0 and (best is None or (i, len(s)) < best[:2]):
            best = (i, len(s), s)
    return None if best is None else (best[0], best[2])


def _pending_prefix_start(text: str, stops: list[str]) -> int:
    """Earliest j whose suffix text[j:] is a proper prefix of some stop (else len)."""
    for j in range(len(text)):
        suffix = text[j:]
        if any(len(s) > len(suffix) and s.startswith(suffix) for s in stops if s):
            return j
    return len(text)


def _check_stops(pieces: list[str], stops: list[str]) -> None:
    full = "".join(pieces)
    want = _earliest(full, stops)
    m = StopStringMatcher(stops)
    emitted: list[str] = []
    fed = ""
    matched = False
    for piece in pieces:
        out, matched = m.feed(piece)
        emitted.append(out)
        fed += piece
        so_far = "".join(emitted)
        # Exactly as much as can no longer change is released.
        now = _earliest(fed, stops)
        hold = _pending_prefix_start(fed, stops)
        expect_match = now is not None and hold >= now[0]
        assert matched == expect_match, (fed, stops)
        if matched:
            assert so_far == fed[: now[0]]
            break
        assert so_far == fed[: min(hold, now[0] if now else len(fed))]
        # Never past a stop that matches later.
        if want is not None:
            assert len(so_far) <= want[0]
    if not matched:
        emitted.append(m.flush())
    out_text = "".join(emitted)
    assert m.text == fed
    assert m.output_text == out_text
    if want is None:
        assert not m.matched and m.matched_stop is None
        assert out_text == full
    else:
        assert m.matched and m.matched_stop == want[1] and m.stop_start == want[0]
        assert out_text == full[: want[0]]
        # The untrimmed text lets a caller re-append the stop (no_stop_trim).
        assert m.text[m.stop_start :].startswith(m.matched_stop)
    assert m.feed("more") == ("", m.matched)
    assert m.flush() == ""


@settings(max_examples=600, deadline=None)
@given(
    pieces=st.lists(st.text(alphabet="ab c中é", max_size=5), max_size=10),
    stops=st.lists(st.text(alphabet="ab c中é", max_size=4), max_size=4),
)
def test_stop_strings_hypothesis(pieces: list[str], stops: list[str]) -> None:
    _check_stops(pieces, stops)


def test_stop_strings_fixed_seeds() -> None:
    rng = random.Random(5)
    for _ in range(2000):
        alphabet = rng.choice(["ab", "abc", "ab \n", "xyz."])
        full = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        cuts = sorted(rng.randint(0, len(full)) for _ in range(rng.randint(0, 12)))
        pieces = [full[i:j] for i, j in zip([0] + cuts, cuts + [len(full)])]
        stops = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))
            for _ in range(rng.randint(0, 4))
        ]
        _check_stops(pieces, stops)


def test_stop_examples() -> None:
    # Spans pieces.
    m = StopStringMatcher(["</answer>"])
    assert m.feed("The result</an") == ("The result", False)
    assert m.feed("swer> trailing") == ("", True)
    assert m.matched_stop == "</answer>" and m.text == "The result</answer> trailing"
    # Earliest start wins even if a later-starting stop completes first.
    m = StopStringMatcher(["abcd", "c"])
    assert m.feed("xabc") == ("x", False)  # "c" done, but "abcd" could start earlier
    assert m.feed("d") == ("", True) and m.matched_stop == "abcd"
    m = StopStringMatcher(["abcd", "c"])
    m.feed("xabc")
    assert m.feed("e") == ("ab", True) and m.matched_stop == "c" and m.output_text == "xab"
    m = StopStringMatcher(["abcd", "c"])
    m.feed("xabc")
    assert m.flush() == "ab" and m.matched_stop == "c"  # request ended: pending match stands
    # Ties at the same start: the shorter stop.
    m = StopStringMatcher(["abc", "ab"])
    assert m.feed("zabc") == ("z", True) and m.matched_stop == "ab"
    # No stops / empty stops: pass-through.
    m = StopStringMatcher(["", ""])
    assert m.feed("abc") == ("abc", False) and m.flush() == ""
    # Held back then released.
    m = StopStringMatcher(["STOP"])
    assert m.feed("go ST") == ("go ", False)
    assert m.feed("ay") == ("STay", False)
    assert m.feed("S") == ("", False)
    assert m.flush() == "S" and not m.matched


def test_stop_scan_window_is_bounded() -> None:
    """Only the tail is kept for scanning, however long the text gets."""
    stops = ["<|stop|>", "never"]
    m = StopStringMatcher(stops)
    longest = max(map(len, stops))
    fed = 0
    for i in range(20000):
        piece = "abcdefgh<|stop"[i % 5 : i % 5 + 3]
        out, matched = m.feed(piece)
        fed += len(piece)
        assert not matched
        assert len(m.scan_window) <= longest - 1 + len(piece)
    assert len(m.text) == fed


def test_detok_then_stop_end_to_end() -> None:
    """Detokenizer pieces feed the stop matcher; stops spanning tokens are found."""
    tok = make_tokenizer("byte_level")
    text = "Café 中文 says: STOP here 😀 and more"
    ids = tok(text, add_special_tokens=False).input_ids
    detok = IncrementalDetokenizer(tok)
    m = StopStringMatcher(["STOP", "😀"])
    out = []
    for i in ids:
        piece, matched = m.feed(detok.feed(i))
        out.append(piece)
        if matched:
            break
    assert "".join(out) == "Café 中文 says: " and m.matched_stop == "STOP"


# ---------------------------------------------------------------------------
# GGUF tokenizer cache (the converter is replaced by an in-memory tokenizer)
# ---------------------------------------------------------------------------


@pytest.fixture
def fake_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[Path]]:
    monkeypatch.setenv("SGL_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "models" / "tiny.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF fake")
    calls: list[Path] = []

    def convert(path: Path) -> PreTrainedTokenizerFast:
        calls.append(path)
        tok = make_tokenizer.__wrapped__("byte_level")  # a private copy we may modify
        tok.chat_template = (
            "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
        )
        return tok

    monkeypatch.setattr(tk, "_convert_gguf", convert)
    return gguf, calls


def test_gguf_cache_roundtrip(fake_gguf: tuple[Path, list[Path]], tmp_path: Path) -> None:
    gguf, calls = fake_gguf
    entry = gguf_tokenizer_cache_dir(gguf)
    assert entry.parent == tmp_path / "cache" / "tokenizers"
    tok1, hit1 = load_gguf_tokenizer(gguf)
    assert (hit1, len(calls)) == (False, 1)
    assert (entry / tk.CACHE_MARKER).is_file()
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left
    tok2, hit2 = load_gguf_tokenizer(str(gguf))
    assert (hit2, len(calls)) == (True, 1)
    for text in CORPUS:
        assert encode(tok2, text) == encode(tok1, text)
    assert tok2.chat_template == tok1.chat_template
    # Both load_tokenizer spellings go through the cache.
    assert encode(load_tokenizer(str(gguf)), CORPUS[2]) == encode(tok1, CORPUS[2])
    assert encode(load_tokenizer(str(gguf.parent), gguf_file=gguf.name), CORPUS[3]) == encode(
        tok1, CORPUS[3]
    )
    assert len(calls) == 1


def test_gguf_cache_key_tracks_file(fake_gguf: tuple[Path, list[Path]]) -> None:
    gguf, calls = fake_gguf
    first = gguf_tokenizer_cache_dir(gguf)
    load_gguf_tokenizer(gguf)
    gguf.write_bytes(b"GGUF fake, but changed")
    assert gguf_tokenizer_cache_dir(gguf) != first
    assert load_gguf_tokenizer(gguf)[1] is False and len(calls) == 2
    st_ = gguf.stat()
    os.utime(gguf, ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))
    assert load_gguf_tokenizer(gguf)[1] is False and len(calls) == 3


def test_gguf_cache_concurrent_publish_and_broken_entry(fake_gguf: tuple[Path, list[Path]]) -> None:
    gguf, _ = fake_gguf
    entry = gguf_tokenizer_cache_dir(gguf)
    tok = make_tokenizer("byte_level")
    # Another process published first: ours is dropped, theirs kept, no error.
    tk.publish_cache_entry(tok, entry, gguf)
    marker = (entry / tk.CACHE_MARKER).stat().st_mtime_ns
    tk.publish_cache_entry(tok, entry, gguf)
    assert (entry / tk.CACHE_MARKER).stat().st_mtime_ns == marker
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".")]
    # A half-written directory (no marker) is not trusted, and gets replaced.
    (entry / tk.CACHE_MARKER).unlink()
    (entry / "tokenizer.json").write_text("{ truncated")
    assert load_gguf_tokenizer(gguf)[1] is False
    assert load_gguf_tokenizer(gguf)[1] is True
    # A complete-looking entry that no longer loads is replaced as well.
    (entry / "tokenizer.json").write_text("{ truncated")
    (entry / "tokenizer_config.json").write_text("{ truncated")
    assert load_gguf_tokenizer(gguf)[1] is False
    assert load_gguf_tokenizer(gguf)[1] is True


def test_gguf_cache_unwritable_still_loads(
    fake_gguf: tuple[Path, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf, _ = fake_gguf
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    monkeypatch.setenv("SGL_CACHE_DIR", str(blocker))
    tok, hit = load_gguf_tokenizer(gguf)
    assert not hit and encode(tok, "hello") == encode(make_tokenizer("byte_level"), "hello")


def test_load_tokenizer_hf_directory(tmp_path: Path) -> None:
    tok = make_tokenizer("sp_llama")
    tok.save_pretrained(str(tmp_path / "hf"))
    loaded = load_tokenizer(str(tmp_path / "hf"))
    for text in CORPUS:
        assert encode(loaded, text) == encode(tok, text)
