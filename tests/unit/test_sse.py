"""The SSE parser the client backends share: events split on CR / LF / CRLF bytes only."""

import json

import pytest

from sgl.lang.backends.sse import sse_data, sse_lines

# every separator str.splitlines breaks at, besides CR and LF
SEPARATORS = "\u2028\u2029\u0085\x1c\x1d\x1e\x0b\x0c"


def _chunkings(data: bytes):
    """The stream cut into pieces of every size, and cut at every single byte position."""
    for size in range(1, len(data) + 1):
        yield [data[i : i + size] for i in range(0, len(data), size)]
    for cut in range(len(data) + 1):
        yield [data[:cut], data[cut:]]


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"])
def test_events_hold_unicode_separators_whatever_the_chunking(ending):
    events = [{"text": f"a{SEPARATORS}b"}, {"text": "ü\u2028€"}, "[DONE]"]
    wire = "".join(
        f"data: {e if isinstance(e, str) else json.dumps(e, ensure_ascii=False)}{ending}{ending}"
        for e in events
    ).encode("utf-8")
    for chunks in _chunkings(wire):
        got = list(sse_data(chunks))
        assert got[-1] == "[DONE]"
        assert [json.loads(d) for d in got[:-1]] == events[:-1], chunks


def test_lines_end_at_cr_lf_and_crlf_only():
    wire = "one\u2028\x85\rtwo\r\nthree\nfour\x0c".encode("utf-8")
    expected = ["one\u2028\x85", "two", "three", "four\x0c"]
    for chunks in _chunkings(wire):
        assert [line.decode("utf-8") for line in sse_lines(chunks)] == expected, chunks


def test_multi_line_data_comments_and_other_fields():
    wire = b": keep-alive\n\nevent: x\ndata: first\ndata:second\nid: 7\n\ndata: last"
    assert list(sse_data([wire])) == ["first\nsecond", "last"]
