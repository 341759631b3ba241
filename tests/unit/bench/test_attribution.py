"""Attribution on hand-made records: each part where the timeline puts it, and the parts add up."""

from __future__ import annotations

import pytest

from tailguard.bench.attribution import PARTS, attribute, attribute_all, prefill_floors, stall_s, tail_parts
from tailguard.bench.recorder import RequestRecord, parse_server_timing


def rec(i: int, *, prompt: int = 100, sched: float = 0.0, sent: float = 0.0, first: float | None = 0.1,
        chunks: list[float] | None = None, end: float = 0.5, queue_ms: float | None = None, ok: bool = True,
        stream: bool = True, cls: str = "chat") -> RequestRecord:
    return RequestRecord(index=i, cls=cls, warmup=False, scheduled_at=sched, sent_at=sent, ended_at=end,
                         first_token_at=first, chunk_at=chunks if chunks is not None else [], ok=ok,
                         prompt_tokens=prompt, queue_ms=queue_ms, stream=stream)


def test_server_timing_header_is_read_in_seconds() -> None:
    assert parse_server_timing("queue;dur=12.5, connect;dur=1, ttft;dur=80") == \
        {"queue": 0.0125, "connect": 0.001, "ttft": 0.08}
    assert parse_server_timing("cache;desc=hit, queue;dur=oops, x") == {}


def test_the_fastest_first_token_of_a_size_is_its_prefill_and_the_rest_is_queue() -> None:
    fast = rec(0, first=0.05, chunks=[0.05, 0.06, 0.07], end=0.07)
    slow = rec(1, sched=1.0, sent=1.01, first=1.61, chunks=[1.61, 1.62, 1.63], end=1.63, queue_ms=200.0)
    floors = prefill_floors([fast, slow])
    parts = attribute(slow, floors)
    assert parts["dispatch_s"] == pytest.approx(0.01)
    assert parts["gateway_queue_s"] == pytest.approx(0.2)
    assert parts["prefill_s"] == pytest.approx(0.05)
    assert parts["engine_queue_s"] == pytest.approx(0.35)
    assert parts["decode_s"] == pytest.approx(0.02)
    assert sum(parts.values()) == pytest.approx(slow.e2e_s)


def test_a_longer_prompt_never_gets_a_smaller_floor() -> None:
    floors = prefill_floors([rec(0, prompt=100, first=0.2), rec(1, prompt=5000, first=0.1)])
    assert floors[12] == pytest.approx(0.2)


def test_a_gap_far_above_the_streams_own_pace_is_a_stall() -> None:
    chunks = [1.0, 1.01, 1.02, 1.03, 2.03, 2.04]  # 10 ms pace, one 1 s gap
    assert stall_s(chunks) == pytest.approx(1.0 - 0.05)
    r = rec(0, first=1.0, chunks=chunks, end=2.04)
    parts = attribute(r, prefill_floors([r]))
    assert parts["stall_s"] == pytest.approx(0.95)
    assert parts["decode_s"] == pytest.approx(2.04 - 1.0 - 0.95)


def test_failed_and_non_stream_requests_still_add_up() -> None:
    never = rec(0, first=None, end=3.0, ok=False)
    whole = rec(1, first=0.9, end=0.9, stream=False, queue_ms=100.0)
    attribute_all([never, whole])
    assert never.attribution is not None and never.attribution["engine_queue_s"] == pytest.approx(3.0)
    assert whole.attribution is not None and whole.attribution["decode_s"] == pytest.approx(0.8)
    for r in (never, whole):
        assert set(r.attribution or {}) == set(PARTS)
        assert sum((r.attribution or {}).values()) == pytest.approx(r.e2e_s)


def test_tail_parts_average_the_slowest_of_each_class() -> None:
    rs = [rec(i, sched=0.0, first=0.1, end=0.2 + i / 100, cls="chat") for i in range(100)]
    attribute_all(rs)
    tail = tail_parts(rs)
    assert sum(tail["chat"].values()) == pytest.approx(rs[-1].e2e_s)
