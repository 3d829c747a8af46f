"""Numbers between bounds as regexes: integer ranges, decimals between integer bounds with
at most so many decimals, and the multiples of an integer step.

Separate because it is digit-string arithmetic with no schema in it (``integer_range`` also
builds the ipv4 octet of :mod:`.formats`).
"""

from __future__ import annotations

from sgl.constrained.json_schema.lexical import _DIGIT, _DIGIT19, _FRACTION
from sgl.constrained.regex import CharSet, Rx, rx_alt, rx_cat, rx_lit, rx_rep, rx_set


def _digits_range(lo: str, hi: str) -> Rx | None:
    """Digit strings of one length between ``lo`` and ``hi`` (inclusive)."""
    if lo == hi:
        return rx_lit(lo)
    if len(lo) == 1:
        return rx_set(CharSet([(ord(lo), ord(hi))]))
    if lo[0] == hi[0]:
        return rx_cat(rx_lit(lo[0]), _digits_range(lo[1:], hi[1:]))
    rest = len(lo) - 1
    low_full = lo[1:] == "0" * rest  # lo[0] may join the middle block
    high_full = hi[1:] == "9" * rest
    first = ord(lo[0]) + (0 if low_full else 1)
    last = ord(hi[0]) - (0 if high_full else 1)
    parts: list[Rx | None] = []
    if not low_full:
        parts.append(rx_cat(rx_lit(lo[0]), _digits_range(lo[1:], "9" * rest)))
    if first <= last:
        parts.append(rx_cat(rx_set(CharSet([(first, last)])), rx_rep(_DIGIT, rest, rest)))
    if not high_full:
        parts.append(rx_cat(rx_lit(hi[0]), _digits_range("0" * rest, hi[1:])))
    return rx_alt(*parts)


def _uint_range(lo: int, hi: int | None) -> Rx | None:
    """Non-negative integers in ``[lo, hi]`` without leading zeros (``hi`` None: unbounded)."""
    if hi is not None and hi < lo:
        return None
    parts: list[Rx | None] = []
    if lo == 0:
        parts.append(rx_lit("0"))
        lo = 1
        if hi is not None and hi < 1:
            return rx_alt(*parts)
    width = len(str(lo))
    if hi is None:
        parts.append(_digits_range(str(lo), "9" * width))
        parts.append(rx_cat(_DIGIT19, rx_rep(_DIGIT, width, None)))
    else:
        for n in range(width, len(str(hi)) + 1):
            a, b = max(lo, 10 ** (n - 1)), min(hi, 10**n - 1)
            if a <= b:
                parts.append(_digits_range(str(a), str(b)))
    return rx_alt(*parts)


def integer_range(lo: int | None, hi: int | None) -> Rx | None:
    """Integers in ``[lo, hi]`` (either end may be None), in canonical JSON spelling."""
    if lo is not None and hi is not None and hi < lo:
        return None
    parts: list[Rx | None] = []
    if hi is None or hi >= 0:
        parts.append(_uint_range(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        top = -1 if hi is None else min(hi, -1)
        ylo, yhi = -top, None if lo is None else -lo
        if yhi is None or ylo <= yhi:
            parts.append(rx_cat(rx_lit("-"), _uint_range(ylo, yhi)))
    return rx_alt(*parts)


_FRAC_ANY = rx_rep(_FRACTION, 0, 1)
_FRAC_ZERO = rx_rep(rx_cat(rx_lit("."), rx_rep(rx_lit("0"), 1, None)), 0, 1)
_FRAC_NONZERO = rx_cat(rx_lit("."), rx_rep(_DIGIT, 0, None), _DIGIT19, rx_rep(_DIGIT, 0, None))
_ZEROS = rx_rep(rx_lit("0"), 0, None)


def _fractions(places: int | None) -> tuple[Rx | None, Rx | None]:
    """(any fraction, a non-zero fraction) with at most ``places`` significant decimals
    (trailing zeros are free: 1.50 is a multiple of 0.01); None: unlimited."""
    if places is None:
        return _FRAC_ANY, _FRAC_NONZERO
    if places == 0:
        return _FRAC_ZERO, None
    any_ = rx_rep(rx_cat(rx_lit("."), rx_rep(_DIGIT, 1, places), _ZEROS), 0, 1)
    return any_, rx_cat(rx_lit("."), rx_rep(_DIGIT, 0, places - 1), _DIGIT19, _ZEROS)


def _magnitude(
    lo: int, lo_excl: bool, hi: int | None, hi_excl: bool, places: int | None = None
) -> Rx | None:
    """Decimals ``y >= 0`` (no sign, no exponent) with ``lo <(=) y <(=) hi``, integer bounds,
    at most ``places`` significant decimals."""
    frac_any, frac_nonzero = _fractions(places)
    parts: list[Rx | None] = []
    n_lo = lo + 1 if lo_excl else lo
    n_hi = None if hi is None else hi - 1
    # Integer part strictly inside the bounds: any fraction.
    if n_hi is None or n_lo <= n_hi:
        parts.append(rx_cat(_uint_range(n_lo, n_hi), frac_any))
    # y = lo + f with f > 0, when y must exceed lo.
    if lo_excl and (hi is None or lo < hi):
        parts.append(rx_cat(_uint_range(lo, lo), frac_nonzero))
    # y == hi exactly, when hi is allowed.
    if hi is not None and not hi_excl and (hi > lo if lo_excl else hi >= lo):
        parts.append(rx_cat(_uint_range(hi, hi), _FRAC_ZERO))
    return rx_alt(*parts)


def number_range(
    lo: int | None, lo_excl: bool, hi: int | None, hi_excl: bool, places: int | None = None
) -> Rx | None:
    """JSON numbers between integer bounds (either may be None), without exponents, with at
    most ``places`` significant decimals (None: any)."""
    parts: list[Rx | None] = []
    # x >= 0
    if hi is None or hi > 0 or (hi == 0 and not hi_excl):
        if lo is None or lo < 0:
            parts.append(_magnitude(0, False, hi, hi_excl, places))
        else:
            parts.append(_magnitude(lo, lo_excl, hi, hi_excl, places))
    # x < 0, written -y with y > 0
    if lo is None or lo < 0:
        if hi is None or hi >= 0:
            ylo, ylo_excl = 0, True
        else:
            ylo, ylo_excl = -hi, hi_excl
        yhi, yhi_excl = (None, False) if lo is None else (-lo, lo_excl)
        mag = _magnitude(ylo, ylo_excl, yhi, yhi_excl, places)
        if mag is not None:
            parts.append(rx_cat(rx_lit("-"), mag))
    return rx_alt(*parts)


MAX_LISTED_MULTIPLES = (
    1024  # multipleOf over a bounded range: the multiples are listed up to this many
)


def integer_multiples(step: int, lo: int | None, hi: int | None) -> Rx | str:
    """Integers in ``[lo, hi]`` divisible by ``step`` > 1, or a message saying why not:
    listed when the range holds few; else, when ``step`` divides 1000, by their last
    digits (any sign, or one sign when the bound is 0)."""
    if lo is not None and hi is not None:
        first, last = -(-lo // step) * step, (hi // step) * step
        if first > last:
            return rx_alt()
        if (last - first) // step < MAX_LISTED_MULTIPLES:
            return rx_alt(*(rx_lit(str(v)) for v in range(first, last + 1, step)))
    places = next((j for j in (1, 2, 3) if 10**j % step == 0), None)
    if places is None:
        return (
            f"multipleOf {step} on a range with more than {MAX_LISTED_MULTIPLES} multiples "
            "(only divisors of 1000 are)"
        )
    nonneg = lo is not None and -step < lo <= 0 and hi is None
    nonpos = hi is not None and 0 <= hi < step and lo is None
    if (lo is not None or hi is not None) and not (nonneg or nonpos):
        return (
            f"multipleOf {step} with bounds other than 0 on a range with more than "
            f"{MAX_LISTED_MULTIPLES} multiples"
        )
    suffix = rx_alt(*(rx_lit(f"{v:0{places}d}") for v in range(0, 10**places, step)))
    positive = rx_alt(
        *(rx_lit(str(v)) for v in range(step, 10**places, step)),
        rx_cat(_DIGIT19, rx_rep(_DIGIT, 0, None), suffix),
    )
    negative = rx_cat(rx_lit("-"), positive)  # never "-0"
    return rx_alt(rx_lit("0"), None if nonpos else positive, None if nonneg else negative)
