"""Reading a streamed answer into a record (content, usage, errors, truncation) and the requests.jsonl round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.bench.recorder import RequestRecord, StreamRecorder, read_jsonl, write_jsonl
from tailguard.wire.openai import chat_chunk, usage_dict


def _record() -> RequestRecord:
    return RequestRecord(index=0, cls="chat", warmup=False, scheduled_at=0.0)


def _stream(*chunks: bytes, end: bytes = b"\n\n") -> bytes:
    return b"".join(b"data: " + c + end for c in chunks)


def test_reasoning_counts_as_the_first_token_as_the_gateway_counts_it() -> None:
    rec = _record()
    r = StreamRecorder(rec)
    assert not r.feed(_stream(chat_chunk("i", "m", 0, role="assistant")), 0.1)
    assert r.feed(_stream(b'{"choices":[{"delta":{"reasoning_content":"think"}}]}'), 0.2)
    assert not r.feed(_stream(chat_chunk("i", "m", 0, content="x")), 0.3)
    r.feed(_stream(chat_chunk("i", "m", 0, usage=usage_dict(3, 2), empty_choices=True), b"[DONE]"), 0.4)
    r.finish(0.5)
    assert rec.first_token_at == 0.2 and rec.chunk_at == [0.2, 0.3]
    assert (rec.usage_prompt_tokens, rec.usage_output_tokens, rec.error_kind) == (3, 2, None)


@pytest.mark.parametrize("end", [b"\n\n", b"\r\n\r\n", b"\r\r"])
def test_every_line_end_and_a_last_event_without_its_blank_line(end: bytes) -> None:
    rec = _record()
    r = StreamRecorder(rec)
    body = _stream(chat_chunk("i", "m", 0, content="a"), chat_chunk("i", "m", 0, content="b"), end=end)
    for k, byte in enumerate(body + b"data: [DONE]"):  # one byte a read, and EOF right after [DONE]
        r.feed(bytes([byte]), float(k))
    r.finish(999.0)
    assert len(rec.chunk_at) == 2 and rec.error_kind is None


def test_error_event_and_truncation() -> None:
    rec = _record()
    r = StreamRecorder(rec)
    r.feed(_stream(b'{"error":{"message":"boom"}}'), 0.1)
    r.finish(0.2)
    assert rec.error_kind == "stream_error" and rec.error is not None and "boom" in rec.error
    rec = _record()
    r = StreamRecorder(rec)
    r.feed(_stream(chat_chunk("i", "m", 0, content="a")), 0.1)
    r.finish(0.2)
    assert rec.error_kind == "truncated"


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
