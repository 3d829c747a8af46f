"""Regexes of JSON containers from the regexes of their parts: arrays of counted elements
(a prefix, then the rest), maps of members, and free-form values nested ``FREE_DEPTH`` deep.

Separate from :mod:`.members` (declared properties in order): these shapes know nothing of
names, and the grammar's recursive JSON rule is built from them too.
"""

from __future__ import annotations

from sgl.constrained.json_schema.lexical import _BOOLEAN, _COLON, _NULL, _NUMBER, _SEP, _STRING
from sgl.constrained.regex import Rx, rx_alt, rx_cat, rx_lit, rx_rep

FREE_DEPTH = 2  # container nesting allowed in free-form values


def _free_value(depth: int) -> Rx | None:
    """Any JSON value with at most ``depth`` levels of containers."""
    scalars = [_STRING, _NUMBER, _BOOLEAN, _NULL]
    if depth <= 0:
        return rx_alt(*scalars)
    inner = _free_value(depth - 1)
    return rx_alt(*scalars, _map_object(inner, 0, None), _array_of([], inner, 0, None))


def _map_object(value: Rx | None, lo: int, hi: int | None, key: Rx | None = _STRING) -> Rx | None:
    """``{}``-style objects with ``key`` strings (any, by default) mapping to ``value``, ``lo..hi``
    members."""
    return _map_of(rx_cat(key, _COLON, value), lo, hi)


def _map_of(member: Rx | None, lo: int, hi: int | None) -> Rx | None:
    """Objects of ``lo..hi`` comma-separated members."""
    return _array_like("{", "}", [], member, lo, hi)


def _array_of(prefix: list[Rx | None], rest: Rx | None, lo: int, hi: int | None) -> Rx | None:
    return _array_like("[", "]", prefix, rest, lo, hi)


def _array_like(
    open_: str, close: str, prefix: list[Rx | None], rest: Rx | None, lo: int, hi: int | None
) -> Rx | None:
    """Comma-separated elements: element i matches ``prefix[i]``, later ones ``rest``
    (None: no more), between ``lo`` and ``hi`` elements."""
    k = len(prefix)
    if rest is None:
        hi = k if hi is None else min(hi, k)
    if hi is not None and hi < lo:
        return None

    def tail(i: int) -> Rx | None:
        # Elements i.. given i elements already written (so each starts with a comma).
        if hi is not None and i >= hi:
            return rx_lit("")
        sep = rx_lit("") if i == 0 else _SEP
        if i >= k:
            # Only `rest` elements remain: a closed-form counted repetition.
            need = max(lo - i, 0)
            more = None if hi is None else hi - i
            if i == 0:
                if more == 0:
                    return rx_lit("")
                body = rx_cat(
                    rest,
                    rx_rep(
                        rx_cat(_SEP, rest), max(need - 1, 0), None if more is None else more - 1
                    ),
                )
                return body if need > 0 else rx_rep(body, 0, 1)
            return rx_rep(rx_cat(_SEP, rest), need, more)
        step = rx_cat(sep, prefix[i], tail(i + 1))
        return step if i < lo else rx_alt(step, rx_lit(""))

    return rx_cat(rx_lit(open_), tail(0), rx_lit(close))
