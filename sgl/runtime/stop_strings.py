"""Stop strings: where a streamed output first contains one of a request's ``stop`` strings.

Separate from stop_regex.py (``stop_regex``, patterns run as an NFA): plain strings need only
substring search over a bounded tail, and they are applied first (output.py).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["StopStringMatcher"]


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
        self._pending: tuple[int, int, str] | None = (
            None  # (start, len, stop) awaiting confirmation
        )
        self._done = False
        self.matched_stop: str | None = None
        self.stop_start: int | None = None  # index of the match in ``text``

    @property
    def matched(self) -> bool:
        return self.matched_stop is not None

    @property
    def scan_window(self) -> str:
        """The tail of the text still scanned for a stop (bounded by the longest stop string
        and the last piece fed, however long the text grows)."""
        return self._buf

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
