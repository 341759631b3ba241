from tailguard.wire.sse import DONE, SSEDecoder, encode_event


def test_events_split_across_feeds_are_joined() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: {\"a\"") == []
    evs = d.feed(b": 1}\n\ndata: [DONE]\n\n")
    assert [e.data for e in evs] == [b'{"a": 1}', DONE]


def test_crlf_comments_and_multiline_data() -> None:
    d = SSEDecoder()
    evs = d.feed(b": keepalive\r\n\r\nevent: x\r\ndata: a\r\ndata: b\r\n\r\n")
    assert len(evs) == 1
    assert evs[0].event == "x" and evs[0].data == b"a\nb"


def test_flush_returns_unterminated_event() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: tail") == []
    assert [e.data for e in d.flush()] == [b"tail"]
    assert d.flush() == []


def test_encode_roundtrip() -> None:
    d = SSEDecoder()
    assert [e.data for e in d.feed(encode_event(b'{"x":1}'))] == [b'{"x":1}']
