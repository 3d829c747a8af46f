"""The string ``format``\\ s we enforce (dates, times, URIs and IRIs, hostnames, IP
addresses, uuid, email) as regexes of the decoded string.

Separate: a table of fixed grammars from RFCs, built once at import, that the string
conversion only looks up.
"""

from __future__ import annotations

from sgl.constrained.json_schema.lexical import _DIGIT, _DIGIT19, _HEX1
from sgl.constrained.json_schema.numbers import integer_range
from sgl.constrained.regex import CharSet, Rx, rx_alt, rx_cat, rx_lit, rx_rep, rx_set


def _lit_seq(*items: Rx | str | None) -> Rx | None:
    return rx_cat(*(rx_lit(i) if isinstance(i, str) else i for i in items))


_D = _DIGIT
_MONTH31 = rx_alt(*(rx_lit(m) for m in ("01", "03", "05", "07", "08", "10", "12")))
_MONTH30 = rx_alt(*(rx_lit(m) for m in ("04", "06", "09", "11")))
_DAY28 = rx_alt(
    _lit_seq(rx_set(CharSet.of("0")), _DIGIT19),
    _lit_seq(rx_set(CharSet.of("1")), _D),
    _lit_seq("2", rx_set(CharSet([(0x30, 0x38)]))),
)
_YEAR = rx_alt(  # 0001-9999 (Python's date range)
    _lit_seq(_D, _D, _D, _DIGIT19),
    _lit_seq(_D, _D, _DIGIT19, "0"),
    _lit_seq(_D, _DIGIT19, "00"),
    _lit_seq(_DIGIT19, "000"),
)
_LEAP_TAIL = rx_alt(*(rx_lit(f"{n:02d}") for n in range(4, 100, 4)))  # 04..96
_LEAP_CENTURY = rx_alt(*(rx_lit(f"{n:02d}") for n in range(4, 100, 4)))  # 04..96 -> 0400..9600
_LEAP_YEAR = rx_alt(_lit_seq(_D, _D, _LEAP_TAIL), _lit_seq(_LEAP_CENTURY, "00"))
_DATE = rx_alt(
    _lit_seq(_YEAR, "-", _MONTH31, "-", rx_alt(_DAY28, rx_lit("29"), rx_lit("30"), rx_lit("31"))),
    _lit_seq(_YEAR, "-", _MONTH30, "-", rx_alt(_DAY28, rx_lit("29"), rx_lit("30"))),
    _lit_seq(_YEAR, "-02-", _DAY28),
    _lit_seq(_LEAP_YEAR, "-02-29"),
)
_HOUR = rx_alt(_lit_seq(rx_set(CharSet.of("01")), _D), _lit_seq("2", rx_set(CharSet.of("0123"))))
_MINSEC = _lit_seq(rx_set(CharSet([(0x30, 0x35)])), _D)
_TIME = _lit_seq(
    _HOUR, ":", _MINSEC, ":", _MINSEC,
    rx_rep(_lit_seq(".", rx_rep(_D, 1, 6)), 0, 1),
    rx_alt(rx_lit("Z"), _lit_seq(rx_set(CharSet.of("+-")), _HOUR, ":", _MINSEC)),
)  # fmt: skip
_HEX = _HEX1
_OCTET = integer_range(0, 255)
_ALNUM = CharSet([(0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A)])
_PCT = _lit_seq("%", _HEX1, _HEX1)
_UNRESERVED_SUB = _ALNUM | CharSet.of("-._~!$&'()*+,;=")  # RFC 3986 unreserved / sub-delims
_UCSCHAR = CharSet(
    [(0xA0, 0xD7FF), (0xF900, 0xFDCF), (0xFDF0, 0xFFEF), (0x10000, 0x1FFFD)]
)  # RFC 3987 (plane 1)


def _uri_forms(extra: CharSet) -> tuple[Rx | None, Rx | None]:
    """(absolute URI, relative reference) of RFC 3986; with ``extra`` = ucschar, the IRIs of
    RFC 3987. Authority without userinfo or IP literals (stricter, still valid): host[:port]."""
    unreserved = _UNRESERVED_SUB | extra
    reg_name = rx_rep(rx_alt(rx_set(unreserved), _PCT), 0, None)
    pchar = rx_alt(rx_set(unreserved | CharSet.of(":@")), _PCT)
    pchar_nc = rx_alt(
        rx_set(unreserved | CharSet.of("@")), _PCT
    )  # no ':' (a relative path's first segment)
    segments = rx_rep(_lit_seq("/", rx_rep(pchar, 0, None)), 0, None)
    tail = rx_rep(rx_alt(pchar, rx_set(CharSet.of("/?"))), 0, None)
    query_frag = _lit_seq(rx_rep(_lit_seq("?", tail), 0, 1), rx_rep(_lit_seq("#", tail), 0, 1))
    authority_path = _lit_seq(
        "//", reg_name, rx_rep(_lit_seq(":", rx_rep(_D, 0, None)), 0, 1), segments
    )
    absolute_path = _lit_seq("/", rx_rep(_lit_seq(rx_rep(pchar, 1, None), segments), 0, 1))
    uri = _lit_seq(
        _SCHEME,
        ":",
        rx_alt(
            authority_path, absolute_path, _lit_seq(rx_rep(pchar, 1, None), segments), rx_lit("")
        ),
        query_frag,
    )
    relative = _lit_seq(
        rx_alt(
            authority_path, absolute_path, _lit_seq(rx_rep(pchar_nc, 1, None), segments), rx_lit("")
        ),
        query_frag,
    )
    return uri, relative


_SCHEME = _lit_seq(
    rx_set(CharSet([(0x41, 0x5A), (0x61, 0x7A)])),
    rx_rep(rx_set(_ALNUM | CharSet.of("+-.")), 0, None),
)
_URI, _RELATIVE_REF = _uri_forms(CharSet())
_IRI, _IRELATIVE_REF = _uri_forms(_UCSCHAR)
_LABEL = _lit_seq(
    rx_set(_ALNUM),
    rx_rep(_lit_seq(rx_rep(rx_set(_ALNUM | CharSet.of("-")), 0, 61), rx_set(_ALNUM)), 0, 1),
)
_HOSTNAME = _lit_seq(
    _LABEL, rx_rep(_lit_seq(".", _LABEL), 0, 3)
)  # <= 4 labels of <= 63: under 253 characters
_H16 = rx_rep(_HEX1, 1, 4)


def _ipv6() -> Rx | None:
    """RFC 4291 text forms without an embedded IPv4 tail: 8 groups, or "::" for a run of zeros."""

    def groups(n: int) -> Rx | None:  # exactly n >= 1 groups
        return _lit_seq(_H16, rx_rep(_lit_seq(":", _H16), n - 1, n - 1))

    forms = [groups(8)]
    for before in range(0, 8):
        head = rx_lit("") if before == 0 else groups(before)
        room = 7 - before  # groups after "::" (it stands for at least one)
        tail = (
            rx_rep(_lit_seq(_H16, rx_rep(_lit_seq(":", _H16), 0, room - 1)), 0, 1)
            if room
            else rx_lit("")
        )
        forms.append(_lit_seq(head, "::", tail))
    return rx_alt(*forms)


_EMAIL_LOCAL = CharSet.of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%+-")
_EMAIL_LABEL = CharSet.of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")

_FORMATS: dict[str, Rx | None] = {
    "uri": _URI,
    "uri-reference": rx_alt(_URI, _RELATIVE_REF),
    "iri": _IRI,
    "iri-reference": rx_alt(_IRI, _IRELATIVE_REF),
    "hostname": _HOSTNAME,
    "ipv6": _ipv6(),
    "date": _DATE,
    "time": _TIME,
    "date-time": _lit_seq(_DATE, "T", _TIME),
    "uuid": _lit_seq(
        rx_rep(_HEX, 8, 8), "-", rx_rep(_HEX, 4, 4), "-", rx_rep(_HEX, 4, 4), "-",
        rx_rep(_HEX, 4, 4), "-", rx_rep(_HEX, 12, 12),
    ),
    "ipv4": _lit_seq(_OCTET, ".", _OCTET, ".", _OCTET, ".", _OCTET),
    "email": _lit_seq(
        rx_rep(rx_set(_EMAIL_LOCAL), 1, None),
        "@",
        rx_rep(rx_set(_EMAIL_LABEL), 1, None),
        rx_rep(_lit_seq(".", rx_rep(rx_set(_EMAIL_LABEL), 1, None)), 1, None),
    ),
}  # fmt: skip
