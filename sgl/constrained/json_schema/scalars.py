"""Scalars: ``enum``/``const`` literals, strings (length, ``pattern``, ``format``) and
numbers (bounds, ``multipleOf`` in decimal arithmetic).

A mixin of :class:`~sgl.constrained.json_schema.converter.Converter`: it reads the
converter's keyword checks (``count``, ``number``, ``fail``) and its grammar sharing.
"""

from __future__ import annotations

import math
from typing import Any

from sgl.constrained.json_schema.formats import _FORMATS
from sgl.constrained.json_schema.keywords import PARAM
from sgl.constrained.json_schema.lexical import (
    _ESCAPES_UP_TO,
    _QUOTE,
    _RAW_CHAR,
    _STR_CHAR,
    _STRING,
    json_char,
)
from sgl.constrained.json_schema.numbers import (
    _FRAC_ZERO,
    integer_multiples,
    integer_range,
    number_range,
)
from sgl.constrained.json_schema.values import _has_type, _json_equal, _value_literal
from sgl.constrained.regex import Rx, rx_alt, rx_cat, rx_lit, rx_rep, translate_regex


class ScalarsMixin:
    """The enum, string and number methods of the converter."""

    def convert_enum(self, schema: dict, where: str) -> Rx | None:
        values: list[Any]
        if "enum" in schema:
            if not isinstance(schema["enum"], list):
                raise self.fail(where, "enum must be a list")
            values = list(schema["enum"])
            if "const" in schema:
                values = [v for v in values if _json_equal(v, schema["const"])]
        else:
            values = [schema["const"]]
        extra = [k for k in schema if k not in ("enum", "const", "type")]
        if extra:
            raise self.fail(
                where,
                f"{extra[0]} together with enum/const is not supported; list only valid values",
            )
        if "type" in schema:
            types = self.types(schema, where)
            values = [v for v in values if any(_has_type(v, t) for t in types)]
        return rx_alt(*(_value_literal(v, where) for v in values))

    def convert_string(self, schema: dict, where: str) -> Rx | None:
        rx = self.convert_string_rx(schema, where)
        return (
            rx if rx is None or rx.text == _STRING.text else self.string_rule(rx)
        )  # json_string: a rule already

    def convert_string_rx(self, schema: dict, where: str) -> Rx | None:
        lo = self.count(schema, "minLength", where) or 0
        hi = self.count(schema, "maxLength", where)
        fmt, pattern = schema.get("format"), schema.get("pattern")
        if fmt is not None:
            if fmt not in _FORMATS:
                raise self.fail(
                    where,
                    f"format {fmt!r} is not supported (supported: {', '.join(sorted(_FORMATS))})",
                )
            if pattern is not None or "minLength" in schema or "maxLength" in schema:
                raise self.fail(where, "format cannot be combined with pattern/minLength/maxLength")
            return rx_cat(_QUOTE, _FORMATS[fmt], _QUOTE)
        if pattern is not None:
            length = (lo, hi) if "minLength" in schema or "maxLength" in schema else None
            anything = rx_rep(_STR_CHAR, 0, None)
            body, start, end = translate_regex(
                pattern,
                param=PARAM,
                emit=json_char,
                search=True,
                what=f"json_schema at {where}: pattern",
                length=length,
                pad=anything,
            )
            if body is None:
                return None
            return rx_cat(
                _QUOTE,
                rx_lit("") if start else anything,
                body,
                rx_lit("") if end else anything,
                _QUOTE,
            )
        char = _STR_CHAR if hi is None and lo <= _ESCAPES_UP_TO else _RAW_CHAR
        if lo == 0 and hi is None:
            return self.shared("json_string")
        return rx_cat(_QUOTE, rx_rep(char, lo, hi), _QUOTE)

    def convert_number(self, t: str, schema: dict, where: str) -> Rx | None:
        step, places = self.multiple_of(t, schema, where)
        if step == 1 and places == 0:
            t = "integer" if t == "integer" else "integral"
        lo = self.number(schema, "minimum", where)
        hi = self.number(schema, "maximum", where)
        lo_excl = hi_excl = False
        ex_lo, ex_hi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
        if isinstance(ex_lo, bool):  # draft 4: a flag on minimum
            lo_excl = ex_lo and lo is not None
        elif ex_lo is not None:
            v = self.number(schema, "exclusiveMinimum", where)
            if lo is None or v >= lo:  # type: ignore[operator]
                lo, lo_excl = v, True
        if isinstance(ex_hi, bool):
            hi_excl = ex_hi and hi is not None
        elif ex_hi is not None:
            v = self.number(schema, "exclusiveMaximum", where)
            if hi is None or v <= hi:  # type: ignore[operator]
                hi, hi_excl = v, True
        if t in ("integer", "integral") or places == 0:
            ilo = None if lo is None else (math.floor(lo) + 1 if lo_excl else math.ceil(lo))
            ihi = None if hi is None else (math.ceil(hi) - 1 if hi_excl else math.floor(hi))
            if step > 1:
                ints = integer_multiples(step, ilo, ihi)
                if isinstance(ints, str):
                    raise self.fail(where, ints)
            else:
                ints = (
                    self.shared("json_integer")
                    if ilo is None and ihi is None
                    else integer_range(ilo, ihi)
                )
            return ints if t == "integer" else rx_cat(ints, _FRAC_ZERO)  # a number: 5.0 is integral
        if lo is None and hi is None and places is None:
            return self.shared("json_number")
        for key, v in (("minimum", lo), ("maximum", hi)):
            if v is not None and not float(v).is_integer():
                raise self.fail(
                    where,
                    f"a non-integer bound ({key}/exclusive{key.capitalize()} = {v}) on a number "
                    "is not supported; "
                    "integer-valued bounds are",
                )
        return number_range(
            None if lo is None else int(lo),
            lo_excl,
            None if hi is None else int(hi),
            hi_excl,
            places,
        )

    def multiple_of(self, t: str, schema: dict, where: str) -> tuple[int, int | None]:
        """multipleOf as ``step * 10**-places`` (decimal arithmetic, as the drafts define it:
        0.07 is a multiple of 0.01). (1, None): none. Steps of one significant digit block:
        integers (any divisor of 1000, or few multiples in range) and 10**-k."""
        mult = schema.get("multipleOf")
        if mult is None:
            return 1, None
        if (
            isinstance(mult, bool)
            or not isinstance(mult, (int, float))
            or not math.isfinite(mult)
            or mult <= 0
        ):
            raise self.fail(where, "multipleOf must be a number greater than 0")
        from decimal import Decimal

        sign, digits, exp = Decimal(repr(mult)).normalize().as_tuple()
        step = int("".join(map(str, digits)))
        if exp >= 0:
            return step * 10**exp, 0
        if t == "integer":  # n * 10**-exp divisible by step
            return step // math.gcd(step, 10**-exp), 0
        if step != 1:
            raise self.fail(
                where,
                f"multipleOf {mult} is not supported: a fractional step must be a power of ten "
                "(0.1, 0.01, ...), or the step an integer",
            )
        return 1, -exp
