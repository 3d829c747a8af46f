"""Constrained decoding: regex / JSON schema / EBNF -> exact token masks + jump-forward.

A leaf package: it imports no other sgl package. The engine builds one
:class:`TokenVocabulary` per model, one :class:`GrammarCompiler` over it, compiles
each request's constraint into a shared :class:`Grammar` and drives a per-request
:class:`Matcher` (``fill_mask`` / ``accept`` / ``forced_text`` / ``rollback``).
"""

from __future__ import annotations

from sgl.constrained.compiler import KINDS, GrammarCompiler
from sgl.constrained.errors import GrammarError
from sgl.constrained.json_schema import json_schema_to_regex
from sgl.constrained.matcher import (
    Grammar,
    Matcher,
    allocate_bitmask,
    apply_bitmask_,
    bitmask_to_bool,
)
from sgl.constrained.regex.index import RegexGrammar, RegexMatcher
from sgl.constrained.regex.normalize import normalize_regex
from sgl.constrained.vocab import TokenVocabulary

__all__ = [
    "KINDS",
    "Grammar",
    "GrammarCompiler",
    "GrammarError",
    "Matcher",
    "RegexGrammar",
    "RegexMatcher",
    "TokenVocabulary",
    "allocate_bitmask",
    "apply_bitmask_",
    "bitmask_to_bool",
    "json_schema_to_regex",
    "normalize_regex",
]
