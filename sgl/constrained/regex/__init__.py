"""Regular expressions -> exact token-level matchers: the names other modules import (moving
to a package of one module per concern).
"""

from sgl.constrained.regex.index import (
    MAX_POSITIONS,
    CharSet,
    RegexGrammar,
    RegexMatcher,
    Rx,
    check_size,
    index_vocab,
    normalize_regex,
    rx_alt,
    rx_cat,
    rx_lit,
    rx_ref,
    rx_rep,
    rx_set,
    translate_regex,
)

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
