"""The SSE decoder on bytes, no sockets: every line-end style, every field, every split point."""

from __future__ import annotations

import time

import pytest

from tailguard.wire.sse import DONE, EventTooLarge, SSEDecoder, SSEEvent, encode_event, is_done

# One stream with every kind of line the spec allows, written with "\n" and re-ended below.
STREAM = (
    ": a comment, then a keep-alive comment alone\n\n"
    ": ping\n\n"
    "data: {\"a\": 1}\n\n"
    "data:{\"no\":\"space\"}\n\n"
    "event: delta\nid: 7\ndata: line one\ndata: line two\n\n"
    "retry: 1000\ndata\n\n"
    "data: [DONE]\n\n"
)
EXPECTED = [(b'{"a": 1}', None, None), (b'{"no":"space"}', None, None), (b"line one\nline two", "delta", "7"),
            (b"", None, None), (DONE, None, None)]
ENDS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}


def _stream(end: bytes) -> bytes:
    return STREAM.encode().replace(b"\n", end)


def _triples(events: list[SSEEvent]) -> list[tuple[bytes, str | None, str | None]]:
    return [(e.data, e.event, e.id) for e in events]


@pytest.mark.parametrize("end", ENDS.values(), ids=ENDS.keys())
def test_every_split_point_gives_the_same_events(end: bytes) -> None:
    raw = _stream(end)
    for cut in range(len(raw) + 1):
        d = SSEDecoder()
        events = d.feed(raw[:cut]) + d.feed(raw[cut:]) + d.flush()
        assert _triples(events) == EXPECTED, f"split at byte {cut}"


@pytest.mark.parametrize("end", ENDS.values(), ids=ENDS.keys())
def test_byte_by_byte_each_event_comes_out_once_it_is_whole(end: bytes) -> None:
    raw = _stream(end)
    d = SSEDecoder()
    seen: list[SSEEvent] = []
    for i in range(len(raw)):
        seen += d.feed(raw[i:i + 1])
    assert _triples(seen + d.flush()) == EXPECTED
    # With CR line ends the blank line is only certain once the byte after it shows no LF;
    # with LF or CRLF the last event is out as soon as its blank line has come.
    assert len(seen) == len(EXPECTED)


@pytest.mark.parametrize("end", ENDS.values(), ids=ENDS.keys())
def test_frame_passes_the_bytes_on_as_they_came(end: bytes) -> None:
    raw = _stream(end)
    for cut in range(len(raw) + 1):
        d = SSEDecoder()
        out = b""
        n = 0
        for part in (raw[:cut], raw[cut:]):
            buf, ends = d.frame(part)
            assert ends == sorted(ends) and (not ends or ends[-1] == len(buf))
            out += buf
            n += len(ends)
        # At EOF only trailing line ends may differ (the lone LF of a CRLF cut after its CR).
        assert (out + d.flush_raw()).rstrip(b"\r\n") == raw.rstrip(b"\r\n") and n == STREAM.count("\n\n")


def test_frame_does_not_copy_whole_lf_events() -> None:
    d = SSEDecoder()
    data = encode_event(b'{"x":1}') + encode_event(b'{"y":2}')
    buf, ends = d.frame(data)
    assert buf is data and ends == [len(encode_event(b'{"x":1}')), len(data)]


def test_mixed_line_ends_and_a_crlf_split_between_cr_and_lf() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: a\r") == []
    assert [e.data for e in d.feed(b"\n\r")] == [b"a"]  # CRLF then CR: a blank line
    assert [e.data for e in d.feed(b"\ndata: b\n\r\n")] == [b"b"]  # the lone LF left is an empty line


def test_last_event_without_its_blank_line_at_eof() -> None:
    for tail in (b"data: [DONE]", b"data: [DONE]\n", b"data: [DONE]\r\n", b"data: [DONE]\r"):
        d = SSEDecoder()
        assert d.feed(b"data: x\n\n" + tail)[0].data == b"x"
        assert [e.data for e in d.flush()] == [DONE]
        assert d.flush() == []


def test_flush_raw_ends_the_last_event_and_nothing_else() -> None:
    d = SSEDecoder()
    d.frame(b"data: tail\r\n")
    assert d.flush_raw() == b"data: tail\n\n"
    d.frame(b"\r\n")
    assert d.flush_raw() == b""


def test_byte_order_mark_is_skipped_even_split() -> None:
    d = SSEDecoder()
    assert d.feed(b"\xef\xbb") == []
    assert [e.data for e in d.feed(b"\xbfdata: x\n\n")] == [b"x"]


def test_is_done_only_for_the_done_event() -> None:
    for ev in (b"data: [DONE]\n\n", b"data:[DONE]\r\n\r\n"):
        assert is_done(b"xx" + ev, 2, 2 + len(ev))
    content = encode_event(b'{"choices":[{"delta":{"content":"[DONE]"}}]}')
    assert not is_done(content, 0, len(content))


def test_encode_roundtrip() -> None:
    d = SSEDecoder()
    assert [e.data for e in d.feed(encode_event(b'{"x":1}'))] == [b'{"x":1}']


def test_a_100_mb_event_in_4_kib_pieces_is_decoded_in_linear_time() -> None:
    """A backend that sends one endless event: each piece is searched once and the pieces joined
    once (re-joining and re-scanning the whole event per read took 6.7 s for 8 MB, so 100 MB
    would take about 17 minutes; linear work is well under a second)."""
    d = SSEDecoder()
    piece = b"x" * 4096
    started = time.perf_counter()
    assert d.feed(b"data: ") == []
    for _ in range(100 * 1024 * 1024 // 4096):
        assert d.frame(piece) == (b"", [])
    events = d.feed(b"\r\n\r\n")
    assert time.perf_counter() - started < 10.0
    assert len(events) == 1 and len(events[0].data) == 100 * 1024 * 1024


@pytest.mark.parametrize("end", ENDS.values(), ids=ENDS.keys())
def test_an_event_past_max_event_bytes_raises_and_smaller_ones_pass(end: bytes) -> None:
    d = SSEDecoder(max_event_bytes=1024)
    small = b"data: " + b"y" * 1000 + end + end
    assert [len(e.data) for e in d.feed(small * 3)] == [1000] * 3  # many events in one read: each is small
    assert d.feed(b"data: " + b"z" * 1000) == []
    with pytest.raises(EventTooLarge, match="over 1024 bytes"):
        d.feed(b"z" * 100)
    with pytest.raises(EventTooLarge):
        SSEDecoder(max_event_bytes=1024).feed(b"data: " + b"z" * 2000 + end)  # one read, no end yet
