"""What a chunk carries, read from its bytes: the one content definition of gateway and bench."""

from __future__ import annotations

import pytest

from tailguard.wire.chunks import (
    MAX_FINISH_REASON, Usage, content_text, delta_text, finish_reasons, has_content, has_usage, is_error, parse,
    response_id, usage_of,
)
from tailguard.wire.openai import chat_chunk, completion_chunk, usage_dict
from tailguard.wire.sse import encode_event


@pytest.mark.parametrize("data,expected", [
    (chat_chunk("i", "m", 0, role="assistant"), False),  # role-only chunk
    (chat_chunk("i", "m", 0, content="hi"), True),
    (chat_chunk("i", "m", 0, content=""), False),
    (chat_chunk("i", "m", 0, finish_reason="length"), False),
    (chat_chunk("i", "m", 0, usage=usage_dict(3, 4), empty_choices=True), False),  # usage-only
    (completion_chunk("i", "m", 0, text="x"), True),
    (completion_chunk("i", "m", 0, text="", finish_reason="stop"), False),
    (b'{"choices":[{"delta":{"content": "spaced"}}]}', True),
    (b'{"choices":[{"delta":{"reasoning_content":null,"content":"x"}}]}', True),
    (b'{"choices":[{"delta":{"content":null}}]}', False),
    (b'{"choices":[{"delta":{"content":"\\"quoted\\""}}]}', True),
    # A reasoning model's thinking and a tool call are generated tokens too.
    (b'{"choices":[{"delta":{"reasoning_content":"Let me think","content":null}}]}', True),
    (b'{"choices":[{"delta":{"reasoning":"hmm"}}]}', True),
    (b'{"choices":[{"delta":{"reasoning_content":""}}]}', False),
    (b'{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\\"a\\""}}]}}]}', True),
    (b'{"choices":[{"delta":{"tool_calls":[]}}]}', False),
    # A key inside a string (escaped quotes) is not a key.
    (b'{"choices":[{"delta":{"tool_calls":[],"role":"{\\"content\\":\\"x\\"}"}}]}', False),
])
def test_has_content(data: bytes, expected: bool) -> None:
    assert has_content(data) is expected
    framed = b"data: " + data + b"\r\n\r\n"  # the same answer on the raw bytes of an event
    assert has_content(b"xx" + framed + b"yy", 2, 2 + len(framed)) is expected


def test_scans_stay_inside_their_range() -> None:
    a, b = chat_chunk("i", "m", 0, role="assistant"), chat_chunk("i", "m", 0, content="x")
    buf = a + b
    assert not has_content(buf, 0, len(a)) and has_content(buf, len(a), len(buf))
    u = chat_chunk("i", "m", 0, usage=usage_dict(1, 2), empty_choices=True)
    assert has_usage(b + u, len(b)) and not has_usage(b + u, 0, len(b))


def test_usage_and_errors() -> None:
    assert usage_of(chat_chunk("i", "m", 0, usage=usage_dict(3, 4), empty_choices=True)) == usage_dict(3, 4)
    assert usage_of(b'{"choices":[],"usage":null}') is None
    assert usage_of(chat_chunk("i", "m", 0, content="x")) is None
    assert is_error(b'{"error":{"message":"boom"}}') and is_error(b'data: { "error": {}}\n\n')
    assert not is_error(chat_chunk("i", "m", 0, content="error"))
    u = Usage()
    assert u.read({"choices": [], "usage": usage_dict(3, 4)}) is True
    assert (u.prompt_tokens, u.completion_tokens) == (3, 4)
    assert u.read({"choices": [{}], "usage": usage_dict(5, 6)}) is False and u.completion_tokens == 6


def test_with_service_tier_replaces_the_engines_value_or_puts_it_first() -> None:
    from tailguard.wire.chunks import with_service_tier

    two = b'data: {"id":"a","service_tier":null,"choices":[]}\n\ndata: {"id":"a", "service_tier": "x"}\n\n'
    assert with_service_tier(two, b"flex") == (
        b'data: {"id":"a","service_tier":"flex","choices":[]}\n\ndata: {"id":"a", "service_tier":"flex"}\n\n')
    assert with_service_tier(b'data: {"id":"a"}\n\ndata: [DONE]\n\n', b"default") == (
        b'data: {"service_tier":"default","id":"a"}\n\ndata: [DONE]\n\n')
    # Every framing: `data:` without its space, CRLF line ends.
    for end in (b"\n", b"\r\n", b"\r"):
        two = (b'data:{"id":"a"}' + end * 2) * 2
        assert with_service_tier(two, b"flex") == (b'data:{"service_tier":"flex","id":"a"}' + end * 2) * 2


@pytest.mark.parametrize("text", [" tok", "héllo ✓", "", "a b"])
def test_content_text_reads_the_compact_chunk_as_a_parse_would(text: str) -> None:
    for chat, chunk in ((True, chat_chunk("x", "m", 1, content=text)), (False, completion_chunk("x", "m", 1, text=text))):
        event = encode_event(chunk)
        assert content_text(event, chat) == text == delta_text(parse(chunk), chat)


@pytest.mark.parametrize("event", [
    encode_event(chat_chunk("x", "m", 1, content='say "hi"')),  # an escape: only a parse can tell
    encode_event(chat_chunk("x", "m", 1, content="line\nbreak")),
    encode_event(chat_chunk("x", "m", 1, content="t", usage=usage_dict(3, 1))),  # a running usage counts tokens
    encode_event(chat_chunk("x", "m", 1, content="a")) + encode_event(chat_chunk("x", "m", 1, content="b")),
])
def test_content_text_leaves_anything_else_to_a_parse(event: bytes) -> None:
    assert content_text(event, chat=True) is None


def test_finish_reasons_and_response_id_are_read_from_bytes() -> None:
    two = (b'data: {"id":"chatcmpl-7","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"length"},'
           b'{"index":1,"delta":{},"finish_reason": "stop"},{"index":2,"finish_reason":null}]}\n\n')
    assert finish_reasons(two) == ["length", "stop"]
    assert response_id(two) == "chatcmpl-7"
    # Only the range is read; a role chunk has none; a hostile reason is cut.
    assert finish_reasons(two, 0, two.index(b"length")) == []
    assert finish_reasons(b'data: {"choices":[{"delta":{"role":"assistant"},"finish_reason":null}]}') == []
    assert finish_reasons(b'{"finish_reason":"' + b"x" * 500 + b'"}') == ["x" * MAX_FINISH_REASON]
    assert finish_reasons(b'{"finish_reason":"unterminated') == []
    # llama.cpp writes `choices` first: still the top-level id, the first one in the event.
    llama = b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant"}}],"id":"chatcmpl-x"}'
    assert response_id(llama) == "chatcmpl-x"
    assert response_id(b'data: {"choices":[]}') is None
