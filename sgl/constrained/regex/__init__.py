"""Regular expressions -> exact token-level matchers.

One module per concern: :mod:`.algebra` (character sets and the canonical regex text, built
with the ``rx_*`` functions), :mod:`.normalize` (Python regex syntax -> that text) and
:mod:`.index` (the outlines-core token index, its masks, and the per-request matcher).
The names other modules import are re-exported here.
"""

from sgl.constrained.regex.algebra import (
    CharSet,
    Rx,
    rx_alt,
    rx_cat,
    rx_lit,
    rx_ref,
    rx_rep,
    rx_set,
)
from sgl.constrained.regex.index import (
    MAX_POSITIONS,
    RegexGrammar,
    RegexMatcher,
    check_size,
    index_vocab,
)
from sgl.constrained.regex.normalize import normalize_regex, translate_regex

__all__ = [
    "CharSet",
    "MAX_POSITIONS",
    "Rx",
    "RegexGrammar",
    "RegexMatcher",
    "check_size",
    "index_vocab",
    "normalize_regex",
    "translate_regex",
    "rx_alt",
    "rx_cat",
    "rx_lit",
    "rx_ref",
    "rx_rep",
    "rx_set",
]
