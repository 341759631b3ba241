"""Content-chunk detection on raw SSE data, usage parsing, and the requests.jsonl round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.bench.recorder import RequestRecord, has_content, is_error_event, read_jsonl, usage_of, write_jsonl
from tailguard.wire.openai import chat_chunk, completion_chunk, usage_dict


@pytest.mark.parametrize("data,expected", [
    (chat_chunk("i", "m", 0, role="assistant"), False),  # role-only chunk
    (chat_chunk("i", "m", 0, content="hi"), True),
    (chat_chunk("i", "m", 0, content=""), False),
    (chat_chunk("i", "m", 0, finish_reason="length"), False),
    (chat_chunk("i", "m", 0, usage=usage_dict(3, 4), empty_choices=True), False),
    (completion_chunk("i", "m", 0, text="x"), True),
    (completion_chunk("i", "m", 0, text="", finish_reason="stop"), False),
    (b'{"choices":[{"delta":{"content": "spaced"}}]}', True),
    (b'{"choices":[{"delta":{"reasoning_content":null,"content":"x"}}]}', True),
    (b'{"choices":[{"delta":{"content":null}}]}', False),
    (b'{"choices":[{"delta":{"content":"\\"quoted\\""}}]}', True),
])
def test_has_content(data: bytes, expected: bool) -> None:
    assert has_content(data) is expected


def test_usage_parsed_only_when_present() -> None:
    assert usage_of(chat_chunk("i", "m", 0, usage=usage_dict(3, 4), empty_choices=True)) == usage_dict(3, 4)
    assert usage_of(b'{"choices":[],"usage":null}') is None
    assert usage_of(chat_chunk("i", "m", 0, content="x")) is None
    assert is_error_event(b'{"error":{"message":"boom"}}')
    assert not is_error_event(chat_chunk("i", "m", 0, content="error"))


def test_jsonl_round_trip(tmp_path: Path) -> None:
    r = RequestRecord(index=3, cls="chat", warmup=False, scheduled_at=1.0, sent_at=1.0005, ended_at=2.5,
                      status=200, ok=True, first_token_at=1.2, chunk_at=[1.2, 1.3, 1.4000001], usage_output_tokens=3,
                      prompt_tokens=12, max_tokens=3, queue_ms=4.5, backend="b1")
    r.finish_tokens()
    bad = RequestRecord(index=4, cls="chat", warmup=True, scheduled_at=2.0, ended_at=2.1, status=503,
                        error_kind="http", error="overloaded")
    write_jsonl([r, bad], tmp_path / "requests.jsonl")
    back = read_jsonl(tmp_path / "requests.jsonl")
    assert back[1] == bad
    assert back[0].chunk_at == [1.2, 1.3, 1.4] and back[0].output_tokens == 3
    assert back[0].e2e_s == pytest.approx(1.5) and back[0].ttft_s == pytest.approx(0.2)
    assert back[0].dispatch_lag_s == pytest.approx(0.0005)
    (tmp_path / "broken.jsonl").write_text('{"index": 1}\n')
    with pytest.raises(ValueError, match="broken.jsonl:1"):
        read_jsonl(tmp_path / "broken.jsonl")
