"""Prompt lookup: draft the tokens that followed the last occurrence of the sequence's own
suffix (an n-gram of 1..max_n tokens) earlier in its prompt or output.

Why it pays in structured programs: extraction copies spans of its input, JSON repeats keys
and punctuation, and a few-shot prompt shows the very shapes the answer takes. The index
is per request and incremental (each step adds the n-grams ending at the new tokens), so a
lookup is a few dictionary probes whatever the sequence length.
"""

from __future__ import annotations


class NgramIndex:
    """Where each n-gram (1 <= n <= max_n) of one token sequence last ended.

    `propose(tokens, k)` looks up the longest suffix of `tokens` (at least `min_n` long)
    that occurred earlier and returns up to `k` tokens that followed it there. The index
    only ever sees a growing sequence; a caller whose tokens were rolled back (jump-forward
    re-tokenizes a tail) calls `truncate`."""

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._last_end: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending at positions < this are in the index

    def truncate(self, length: int) -> None:
        """The sequence was cut to `length` tokens: forget what was indexed past it (rare:
        rebuilt lazily from scratch)."""
        if length < self._indexed:
            self._last_end.clear()
            self._indexed = 0

    def _extend(self, tokens: list[int]) -> None:
        """Index every n-gram ending before the last position (the suffix being looked up
        must find an earlier occurrence, not itself)."""
        end = len(tokens) - 1
        for e in range(max(self._indexed, 1), end + 1):
            for n in range(1, min(self.max_n, e) + 1):
                self._last_end[tuple(tokens[e - n : e])] = e
        self._indexed = max(self._indexed, end + 1)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the longest earlier occurrence of the suffix."""
        if k <= 0 or len(tokens) < self.min_n + 1:
            return []
        self._extend(tokens)
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            end = self._last_end.get(tuple(tokens[len(tokens) - n :]))
            if end is not None:
                return tokens[end : end + k]
        return []
