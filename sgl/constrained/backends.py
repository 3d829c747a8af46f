"""Other constraint engines behind the Grammar/Matcher contract: llguidance and xgrammar.

``GrammarCompiler(vocab, backend=...)`` picks who compiles: ``"sgl"`` (ours: exact masks,
the widest JSON-schema coverage measured, budget-aware completion), ``"llguidance"`` or
``"xgrammar"`` when installed (``pip install llguidance xgrammar``), as SGLang offers. Both
are built from the vocabulary's token bytes alone (no tokenizer object), so every model
sgl loads works with them. Jump-forward works through the same ``forced_text``.

What differs: they compile in this process under their own limits (not the capped child
of the regex route); they ignore ``budget`` (no budget-aware completion); their JSON
semantics are theirs (xgrammar's non-strict mode, llguidance's defaults), measured side by
side in ``benchmarks/bench_maskbench.py``. Our EBNF dialect (llama.cpp's GBNF) is given to
llguidance through its GBNF-to-Lark converter and to xgrammar as is (it reads GBNF).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from sgl.constrained.errors import GrammarError
from sgl.constrained.jump_forward import split_complete_utf8
from sgl.constrained.vocab import TokenVocabulary

__all__ = ["BACKENDS", "available_backends", "make_backend"]

BACKENDS = ("sgl", "llguidance", "xgrammar")
_ANY_OBJECT = '{"type": "object"}'  # the json_object kind


def available_backends() -> list[str]:
    """The backends that can be used here: ours, and the external ones that are installed."""
    return ["sgl"] + [b for b in BACKENDS[1:] if importlib.util.find_spec(b) is not None]


def make_backend(name: str, vocab: TokenVocabulary, tokenizer: Any = None) -> Any:
    """The compiler of an external backend (``name`` != "sgl"): ``build(kind, spec) -> Grammar``.
    ``tokenizer`` (the model's HF tokenizer) lets llguidance tokenize forced text as the
    model does; without it a greedy longest-match encoder stands in."""
    if name not in BACKENDS or name == "sgl":
        raise ValueError(f"grammar_backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    if importlib.util.find_spec(name) is None:
        raise ValueError(
            f"grammar_backend {name!r} is not installed: pip install {name} (installed: "
            f"{', '.join(available_backends())})"
        )
    return LlguidanceBackend(vocab, tokenizer) if name == "llguidance" else XgrammarBackend(vocab)


def _forced(data: bytes) -> str:
    """Forced bytes as text, up to the last complete UTF-8 character."""
    return split_complete_utf8(data)[0]


class _Recorded:
    """Grammar shared by requests: kind and spec, plus how to start a matcher."""

    def __init__(self, kind: str, spec: str, backend: str, start: Any) -> None:
        self.kind, self.spec, self.backend = kind, spec, backend
        self._start = start

    def matcher(self) -> Any:
        return self._start()

    def __repr__(self) -> str:
        return f"<{self.backend} {self.kind} grammar>"


# ---------------------------------------------------------------------------- llguidance


class _GreedyTokenizer:
    """What llguidance's TokenizerWrapper needs from a tokenizer: token bytes, EOS, and an
    encoder (greedy longest match over the vocabulary; used for forced text only)."""

    def __init__(self, vocab: TokenVocabulary) -> None:
        self.tokens = [
            tb if tb is not None else b"" for tb in vocab.token_bytes[: vocab.vocab_size]
        ]
        self.eos_token_id = vocab.eos_token_ids[0]
        self.bos_token_id = None
        eos = set(vocab.eos_token_ids)
        self.special_token_ids = [
            i
            for i, tb in enumerate(vocab.token_bytes[: vocab.vocab_size])
            if tb is None or i in eos
        ]
        self._ids = {tb: i for i, tb in enumerate(self.tokens) if tb and i not in eos}
        self._longest = max((len(tb) for tb in self._ids), default=1)

    def __call__(self, data: bytes) -> list[int]:
        out, i = [], 0
        while i < len(data):
            for n in range(min(self._longest, len(data) - i), 0, -1):
                tid = self._ids.get(data[i : i + n])
                if tid is not None:
                    out.append(tid)
                    i += n
                    break
            else:
                raise ValueError(f"byte {data[i]:#x} has no token")
        return out


class LlguidanceBackend:
    name = "llguidance"

    def __init__(self, vocab: TokenVocabulary, tokenizer: Any = None) -> None:
        import llguidance
        import llguidance.gbnf_to_lark
        import llguidance.torch

        self.ll = llguidance
        self.fill = llguidance.torch.fill_next_token_bitmask
        eos = list(vocab.eos_token_ids)
        if tokenizer is not None and getattr(tokenizer, "is_fast", False):
            # Its forced text is tokenized as the model's tokenizer would (what it lets through
            # depends on it).
            import llguidance.hf

            self.tok = llguidance.hf.from_tokenizer(
                tokenizer, n_vocab=vocab.vocab_size, eos_token=eos
            )
        else:
            self.tok = llguidance.LLTokenizer(
                llguidance.TokenizerWrapper(_GreedyTokenizer(vocab)),
                n_vocab=vocab.vocab_size,
                eos_token=eos,
            )

    def build(self, kind: str, spec: str) -> _Recorded:
        ll = self.ll
        try:
            if kind == "json_schema":
                grammar = ll.LLMatcher.grammar_from_json_schema(spec)
            elif kind == "json_object":
                grammar = ll.LLMatcher.grammar_from_json_schema(_ANY_OBJECT)
            elif kind == "regex":
                grammar = ll.LLMatcher.grammar_from_regex(spec)
            else:
                grammar = ll.LLMatcher.grammar_from_lark(ll.gbnf_to_lark.any_to_lark(spec))
        except Exception as exc:
            raise GrammarError(f"llguidance refused the {kind}: {exc}", kind) from None
        is_error, messages = ll.LLMatcher.validate_grammar_with_warnings(grammar, self.tok)
        if is_error:
            raise GrammarError(f"llguidance refused the {kind}: {'; '.join(messages)}", kind)
        return _Recorded(
            kind, spec, self.name, lambda: LlguidanceMatcher(self, ll.LLMatcher(self.tok, grammar))
        )


class LlguidanceMatcher:
    def __init__(self, backend: LlguidanceBackend, m: Any) -> None:
        self.backend, self.m = backend, m

    def fill_mask(self, row: torch.Tensor, budget: int | None = None) -> None:
        self.backend.fill(self.m, row.view(1, -1), 0)

    def accept(self, token_id: int) -> bool:
        return self.m.try_consume_tokens([token_id]) == 1  # refused: state unchanged

    def is_accepting(self) -> bool:
        return bool(self.m.is_accepting())

    def is_done(self) -> bool:
        return bool(self.m.is_stopped())

    def forced_text(self) -> str:
        return _forced(bytes(self.m.compute_ff_bytes()))

    def completion_fits(self, budget: int) -> bool:
        return True  # no distances here (no budget-aware completion)

    def rollback(self, n: int) -> None:
        if n:
            self.m.rollback(n)

    def copy(self) -> LlguidanceMatcher:
        return LlguidanceMatcher(self.backend, self.m.deep_copy())


# ---------------------------------------------------------------------------- xgrammar


class XgrammarBackend:
    name = "xgrammar"

    def __init__(self, vocab: TokenVocabulary) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        encoded = [tb if tb is not None else b"" for tb in vocab.token_bytes[: vocab.vocab_size]]
        specials = [i for i, tb in enumerate(encoded) if not tb]
        info = xgr.TokenizerInfo(
            encoded,
            xgr.VocabType.RAW,
            vocab_size=vocab.vocab_size,
            stop_token_ids=list(vocab.eos_token_ids),
        )
        self.specials = specials
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)

    def build(self, kind: str, spec: str) -> _Recorded:
        try:
            if kind == "json_schema":
                compiled = self.compiler.compile_json_schema(spec, strict_mode=False)
            elif kind == "json_object":  # an object (its built-in JSON grammar allows any value)
                compiled = self.compiler.compile_json_schema(_ANY_OBJECT, strict_mode=False)
            elif kind == "regex":
                compiled = self.compiler.compile_regex(spec)
            else:
                compiled = self.compiler.compile_grammar(spec)
        except Exception as exc:
            raise GrammarError(f"xgrammar refused the {kind}: {exc}", kind) from None
        return _Recorded(
            kind, spec, self.name, lambda: XgrammarMatcher(self.xgr.GrammarMatcher(compiled))
        )


class XgrammarMatcher:
    def __init__(self, m: Any) -> None:
        self.m = m

    def fill_mask(self, row: torch.Tensor, budget: int | None = None) -> None:
        self.m.fill_next_token_bitmask(row.view(1, -1), 0)

    def accept(self, token_id: int) -> bool:
        if self.m.is_terminated():
            return False
        return bool(self.m.accept_token(token_id))  # refused: state unchanged

    def is_accepting(self) -> bool:
        return bool(self.m.is_completed())

    def is_done(self) -> bool:
        return bool(self.m.is_terminated())

    def forced_text(self) -> str:
        text = self.m.find_jump_forward_string()
        return text if isinstance(text, str) else _forced(text)

    def completion_fits(self, budget: int) -> bool:
        return True  # no distances here (no budget-aware completion)

    def rollback(self, n: int) -> None:
        if n:
            self.m.rollback(n)

    def copy(self) -> XgrammarMatcher:
        return XgrammarMatcher(self.m.fork())
