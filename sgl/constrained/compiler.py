"""Constraint text -> compiled Grammar, cached.

Compiling a JSON schema against a 49k vocabulary takes a few hundred milliseconds,
which would stall every running request if the scheduler loop did it inline. The
engine calls :meth:`GrammarCompiler.compile` on the caller's thread while it builds the
request (`async_generate` runs that in a worker thread), so the scheduler only ever
receives compiled grammars. Identical constraints (the common case: one schema, many
requests) hit an LRU cache. Failures are cached too, so a client resubmitting a bad
schema costs nothing. `compile_async` offers the same as a future.

Compiling is bounded: the JSON-schema translation has a budget (`json_schema`), and with
``isolate=True`` (the engine's setting) the regex automaton is built in a child process
capped in memory and time (`isolation.IndexBuilder`), so no constraint a client sends can
exhaust the server's memory or stall it.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from sgl.constrained.errors import ConstraintTooLarge, GrammarError
from sgl.constrained.gcpause import gc_paused
from sgl.constrained.matcher import Grammar
from sgl.constrained.vocab import TokenVocabulary

__all__ = ["GrammarCompiler", "KINDS"]

KINDS = ("regex", "json_schema", "json_object", "ebnf", "structural_tag")
# A JSON schema's regex automaton gets this much CPU time to build before the grammar route is taken
# (with an isolated builder; in process there is no limit). The grammar route compiles MaskBench's
# schemas in under 0.6 s, so a timed-out attempt plus the grammar stays under 1 s.
REGEX_ROUTE_TIMEOUT_S = 0.4
# ... and is not tried at all for a regex longer than this: on MaskBench's schemas no such regex
# built its index within that time (the attempt only delayed the grammar route).
REGEX_ROUTE_MAX_TEXT = 10_000


class GrammarCompiler:
    """Compiles regex / JSON-schema / EBNF constraints for one vocabulary; ``backend``
    "llguidance" or "xgrammar" hands every compile to that engine (see ``backends``)."""

    def __init__(
        self,
        vocab: TokenVocabulary,
        cache_size: int = 64,
        max_workers: int = 1,
        *,
        isolate: bool = False,
        compile_timeout_s: float | None = None,
        compile_memory_bytes: int | None = None,
        backend: str = "sgl",
        tokenizer: Any = None,
    ) -> None:
        self.vocab = vocab
        self.backend = backend
        self._builder: Any = None
        self._external: Any = None
        if backend != "sgl":  # llguidance / xgrammar: they compile everything, in process
            from sgl.constrained.backends import make_backend

            self._external = make_backend(backend, vocab, tokenizer)
        elif isolate:
            from sgl.constrained import isolation
            from sgl.constrained.ebnf_runtime import native_walk
            from sgl.constrained.regex.index import index_vocab

            # the grammar route's mask walk: built (once per machine) at start, not mid-request
            native_walk()

            ivocab = index_vocab(vocab)
            self._builder = isolation.IndexBuilder(
                ivocab.by_bytes,
                vocab.vocab_size + 1,
                timeout_s=compile_timeout_s or isolation.DEFAULT_COMPILE_TIMEOUT_S,
                memory_bytes=compile_memory_bytes or isolation.DEFAULT_COMPILE_MEMORY_BYTES,
            )
        self.cache_size = max(0, int(cache_size))
        self.max_workers = max(1, int(max_workers))
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()  # done futures only
        self._inflight: dict[tuple[str, str], Future] = {}
        self._executor: ThreadPoolExecutor | None = None

    # -- public ----------------------------------------------------------------------

    def compile(self, kind: str, spec: str | dict) -> Grammar:
        """Compile (or fetch from the cache); raises GrammarError for a bad constraint."""
        key = self._key(kind, spec)
        with self._lock:
            fut = self._lookup(key)
            if fut is None:
                fut = self._inflight.get(key)
            owner = fut is None
            if owner:
                fut = Future()
                self._inflight[key] = fut
        if owner:
            self._run(key, spec, fut)
        return fut.result()

    def compile_async(self, kind: str, spec: str | dict) -> Future[Grammar]:
        """A future of the compiled grammar; a cached result is returned already done.

        A malformed ``kind`` or spec raises GrammarError here, synchronously; errors of
        the compilation itself arrive through the future.
        """
        key = self._key(kind, spec)
        with self._lock:
            fut = self._lookup(key)
            if fut is not None:
                return fut
            fut = self._inflight.get(key)
            if fut is not None:
                return fut
            fut = Future()
            self._inflight[key] = fut
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    self.max_workers, thread_name_prefix="sgl-grammar"
                )
            executor = self._executor
        executor.submit(self._run, key, spec, fut)
        return fut

    def cache_info(self) -> dict[str, int]:
        with self._lock:
            return {
                "size": len(self._cache),
                "capacity": self.cache_size,
                "inflight": len(self._inflight),
            }

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()

    def shutdown(self, wait: bool = True) -> None:
        """Stop the worker threads (pending compiles finish when ``wait``) and the index builder."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=wait)
        if self._builder is not None:
            self._builder.close()

    # -- internals -------------------------------------------------------------------

    def _key(self, kind: str, spec: Any) -> tuple[str, str]:
        """(kind, normalised spec): dict and JSON-text schemas that are equal share an entry."""
        if kind not in KINDS:
            raise GrammarError(
                f"unknown constraint kind {kind!r}; expected one of {', '.join(KINDS)}", str(kind)
            )
        if kind == "json_object":
            return kind, ""
        if kind == "structural_tag":
            from sgl.constrained.structural import load_structural_tag, parse_structural_tag

            tag = parse_structural_tag(spec)
            if tag.get("type") != "pythonic_calls":  # (that one is checked as its rules are built)
                load_structural_tag(tag)  # a bad tag fails here, naming its field
            return kind, json.dumps(tag, separators=(",", ":"), ensure_ascii=False)
        if kind == "json_schema":
            from sgl.constrained.json_schema import load_schema

            schema = load_schema(spec)
            # Key order is kept: property order changes the generated output.
            return kind, json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
        if not isinstance(spec, str):
            raise GrammarError(f"{kind} must be a string, got {type(spec).__name__}", kind)
        return kind, spec

    def _lookup(self, key: tuple[str, str]) -> Future | None:
        fut = self._cache.get(key)
        if fut is not None:
            self._cache.move_to_end(key)
        return fut

    def _run(self, key: tuple[str, str], spec: Any, fut: Future) -> None:
        try:
            with gc_paused():  # 2x faster compiles on a big heap (see gcpause)
                grammar = self._build(key[0], key[1], spec)
        except GrammarError as exc:
            fut.set_exception(exc)
            self._finish(key, fut, cache=True)
        except Exception as exc:  # an internal failure: report it, do not cache it
            fut.set_exception(exc)
            self._finish(key, fut, cache=False)
        else:
            fut.set_result(grammar)
            self._finish(key, fut, cache=True)

    def _finish(self, key: tuple[str, str], fut: Future, cache: bool) -> None:
        with self._lock:
            self._inflight.pop(key, None)
            if cache and self.cache_size:
                self._cache[key] = fut
                self._cache.move_to_end(key)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)

    def _build(self, kind: str, normalized: str, spec: Any) -> Grammar:
        if kind == "structural_tag":
            return self._build_structural_tag(normalized)
        if self._external is not None:
            return self._external.build(kind, normalized)
        if kind in ("ebnf", "json_object"):
            from sgl.constrained import ebnf  # written separately; imported only when used

            text = ebnf.JSON_GRAMMAR if kind == "json_object" else normalized
            grammar = ebnf.compile_ebnf(text, self.vocab)
            return grammar
        from sgl.constrained.regex.index import RegexGrammar, check_size
        from sgl.constrained.regex.normalize import normalize_regex

        if kind == "regex":
            rx = normalize_regex(normalized, param="regex")
            if rx is None:
                raise GrammarError("regex matches no string at all", "regex")
            check_size(rx, "regex", "the regex")
            return RegexGrammar(
                "regex", normalized, rx.text, self.vocab, param="regex", builder=self._builder
            )
        return self._build_json_schema(normalized)

    def _build_structural_tag(self, normalized: str) -> Grammar:
        """Free text with constrained segments, as one grammar (see `structural`). Built by
        sgl's grammar engine whatever the backend: the external ones take other forms of it."""
        from sgl.constrained import ebnf
        from sgl.constrained.pythonic import pythonic_rules
        from sgl.constrained.structural import (
            load_structural_tag,
            parse_structural_tag,
            structural_tag_rules,
        )

        spec = parse_structural_tag(normalized)
        if spec.get("type") == "pythonic_calls":
            rules = pythonic_rules(spec)
        else:
            rules = structural_tag_rules(load_structural_tag(spec))
        return ebnf.EbnfGrammar(normalized, self.vocab, rules=rules, kind="structural_tag")

    def _build_json_schema(self, normalized: str) -> Grammar:
        """The regex route (precomputed masks: the fastest to decode) when its automaton is
        small; else the grammar route (rules, masks computed lazily; no token automaton is
        built, so it compiles in well under a second unless long bounded repetitions make
        a big network, which the grammar's state limit caps). The grammar is built in this
        process, bounded by that limit, not in the capped child."""
        from sgl.constrained.json_schema import json_schema_to_rx
        from sgl.constrained.regex.index import RegexGrammar, check_size

        schema = json.loads(normalized)
        try:
            rx = json_schema_to_rx(
                schema, max_text=REGEX_ROUTE_MAX_TEXT if self._builder is not None else None
            )
            check_size(rx, "json_schema", "the JSON schema")
            if self._builder is not None and len(rx.text) > REGEX_ROUTE_MAX_TEXT:
                raise ConstraintTooLarge(
                    f"the JSON schema's regex is too long for the regex route ({len(rx.text)} "
                    f"characters, more than {REGEX_ROUTE_MAX_TEXT})",
                    "json_schema",
                )
            return RegexGrammar(
                "json_schema",
                normalized,
                rx.text,
                self.vocab,
                param="json_schema",
                builder=self._builder,
                build_timeout_s=REGEX_ROUTE_TIMEOUT_S,
            )
        except ConstraintTooLarge as too_large:
            try:
                return self._json_schema_grammar(schema, normalized)
            except GrammarError as exc:
                raise GrammarError(
                    f"{too_large.message}; as a grammar: {exc.message}", "json_schema"
                ) from None

    def _json_schema_grammar(self, schema: Any, normalized: str) -> Grammar:
        from sgl.constrained import ebnf
        from sgl.constrained.json_schema import json_schema_to_rules

        rules = json_schema_to_rules(schema)
        try:
            return ebnf.EbnfGrammar(normalized, self.vocab, rules=rules, kind="json_schema")
        except GrammarError as exc:
            raise GrammarError(
                exc.message.replace("EBNF grammar: 'root'", "the schema"), "json_schema"
            ) from None
