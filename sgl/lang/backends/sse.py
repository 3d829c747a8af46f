"""Server-sent events read on bytes, as the SSE spec frames them.

Lines end with CRLF, LF or CR only, so the stream is split on those bytes before anything is
decoded: text decoded first and split with `str.splitlines` would also break at U+2028,
U+2029, U+0085 and other separators a model may well write (servers send JSON with
`ensure_ascii=False`), cutting an event in half. UTF-8 never uses the bytes CR and LF inside
a multi-byte character, so each line is decoded whole afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def sse_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of a byte stream (without their ending), whatever the chunking: a CR at a
    chunk's end waits for the next chunk, where an LF would make it one CRLF."""
    pending = b""
    for chunk in chunks:
        if not chunk:
            continue
        pending += chunk
        start = 0
        while True:
            cr, lf = pending.find(b"\r", start), pending.find(b"\n", start)
            if cr < 0 and lf < 0:
                break
            if lf >= 0 and (cr < 0 or lf < cr):
                yield pending[start:lf]
                start = lf + 1
            elif cr + 1 < len(pending):
                yield pending[start:cr]
                start = cr + (2 if pending[cr + 1 : cr + 2] == b"\n" else 1)
            else:
                break  # a CR ending the chunk: the next one may hold its LF
        pending = pending[start:]
    if pending.endswith(b"\r"):
        pending = pending[:-1]
        yield pending
        pending = b""
    if pending:
        yield pending


def sse_data(chunks: Iterable[bytes]) -> Iterator[str]:
    """The `data` of each event (its `data:` lines joined by LF, decoded as UTF-8), in order;
    comments and other fields are skipped, and an event is dispatched at its blank line (or at
    the end of the stream)."""
    data: list[bytes] = []
    for line in sse_lines(chunks):
        if not line:
            if data:
                yield b"\n".join(data).decode("utf-8")
                data = []
            continue
        field, _, value = line.partition(b":")
        if field != b"data":
            continue  # a comment (":..."), "event:", "id:", "retry:": nothing a client here uses
        data.append(value[1:] if value.startswith(b" ") else value)
    if data:
        yield b"\n".join(data).decode("utf-8")
