"""A request's chunk bookkeeping (`Tally`): the first content chunk (TTFT, and the end of the
watchdog's first-token phase), the inter-token gaps it observes, the content chunk count, and
the usage chunk's counts. Every relay path (push, tracked, assembler) counts through it, so
TTFT, ITL and the output-token fallback are only as right as these numbers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tailguard.clock import monotonic
from tailguard.gateway.ops.histograms import ChunkHistogram
from tailguard.gateway.request import Request
from tailguard.gateway.upstream.tally import MAX_CHOICES, Tally
from tailguard.gateway.upstream.watchdog import DeadlineWatch
from tailguard.wire.chunks import Usage

BOUNDS = (0.001, 0.3, 1.0)  # ITL buckets: "none", up to 0.3 s, up to 1 s, more


def _request() -> Request:
    """A request's record as the exchange makes it (the one place to adapt if it moves)."""
    return Request("r", arrived_at=0.0)


@pytest.fixture
async def tally() -> AsyncIterator[Tally]:
    """A tally over a real watchdog whose deadlines are an hour away: it never fires here, but
    it must be told when a run's first content arrives."""
    wd = DeadlineWatch(asyncio.get_running_loop(), monotonic, total_at=monotonic() + 3600, idle_s=3600)
    wd.start_attempt(first_token_at=monotonic() + 3600)
    yield Tally(_request(), wd, ChunkHistogram(BOUNDS), monotonic)
    wd.stop()


def _itl(t: Tally) -> tuple[list[int], float]:
    return t.itl.counts, round(t.itl.sum, 9)


async def test_the_first_content_chunk_is_the_first_token_and_no_gap(tally: Tally) -> None:
    tally.content(10.0)
    t = tally.request
    assert (t.first_content_at, t.last_content_at, t.content_chunks) == (10.0, 10.0, 1)
    assert _itl(tally) == ([0, 0, 0, 0], 0.0)
    assert tally.watchdog.first_seen and tally.watchdog.last_at == 10.0  # the idle deadline applies now


async def test_each_later_chunk_observes_its_gap_since_the_last(tally: Tally) -> None:
    for now in (10.0, 10.25, 10.75, 12.0):
        tally.content(now)
    t = tally.request
    assert (t.first_content_at, t.last_content_at, t.content_chunks) == (10.0, 12.0, 4)
    assert _itl(tally) == ([0, 1, 1, 1], 2.0)  # 0.25, 0.5, 1.25
    # Only a run's first chunk tells the watchdog: the relay stores later instants itself.
    assert tally.watchdog.last_at == 10.0


async def test_chunks_of_one_read_have_one_gap_and_zeros(tally: Tally) -> None:
    """Three chunks in one read at 10.0 (the first of them the first token), then two at 10.5:
    one observation per chunk after the first, the gap on the first of each read."""
    tally.content(10.0, 3)
    tally.content(10.5, 2)
    t = tally.request
    assert (t.first_content_at, t.last_content_at, t.content_chunks) == (10.0, 10.5, 5)
    assert _itl(tally) == ([3, 0, 1, 0], 0.5)


async def test_a_resumed_run_is_a_first_token_for_the_watchdog_only(tally: Tally) -> None:
    """After a suspension the new run's first chunk ends the watchdog's first-token phase
    again, but it is not the request's first token: its gap since the last chunk before the
    suspension is an ITL sample (the client waited that long)."""
    tally.content(10.0)
    tally.content(10.1)
    wd = tally.watchdog
    wd.start_attempt(first_token_at=monotonic() + 3600)  # the continuation's attempt
    tally.start_run()
    assert not wd.first_seen
    tally.content(14.1)
    t = tally.request
    assert (t.first_content_at, t.last_content_at, t.content_chunks) == (10.0, 14.1, 3)
    assert _itl(tally) == ([0, 1, 0, 1], 4.1)  # 0.1, then the 4 s the suspension took
    assert wd.first_seen and wd.last_at == 14.1


def test_usage_counts_come_from_the_last_chunk_that_has_them() -> None:
    """`Tally.usage` reads the usage chunk; True marks a usage-only chunk (which a client that
    did not ask for usage must not get). Running usage on content chunks (vLLM's continuous
    usage stats) is read too, the last one winning; anything malformed is ignored."""
    u = Usage()
    running = {"choices": [{"index": 0, "delta": {"content": "a"}}],
               "usage": {"prompt_tokens": 7, "completion_tokens": 1}}
    assert u.read(running) is False and (u.prompt_tokens, u.completion_tokens) == (7, 1)
    final = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 12, "total_tokens": 19}}
    assert u.read(final) is True and (u.prompt_tokens, u.completion_tokens) == (7, 12)
    junk: list[object] = [None, [], "usage", {"usage": None, "choices": [{}]}, {"usage": {"completion_tokens": "9"}}]
    for obj in junk:
        assert u.read(obj) is False
    assert (u.prompt_tokens, u.completion_tokens) == (7, 12)
    assert Usage().read({"choices": []}) is True  # usage-only in shape, with nothing to count


async def test_a_traced_request_keeps_how_its_answer_ended() -> None:
    """Only a traced request's chunks are scanned: the first event's id, then each finish reason,
    bounded in number whatever a backend sends."""
    wd = DeadlineWatch(asyncio.get_running_loop(), monotonic, total_at=monotonic() + 3600, idle_s=3600)
    untraced = Tally(_request(), wd, ChunkHistogram(BOUNDS), monotonic)
    assert not untraced.traced
    req = _request()
    t = Tally(req, wd, ChunkHistogram(BOUNDS), monotonic, traced=True)  # its line has a trace
    assert t.traced
    role = b'data: {"id":"chatcmpl-1","choices":[{"delta":{"role":"assistant"},"finish_reason":null}]}\n\n'
    last = b'data: {"id":"chatcmpl-1","choices":[{"delta":{"content":"x"},"finish_reason":"length"}]}\n\n'
    t.answer_end(role, 0, len(role))
    assert (req.response_id, req.finish_reasons) == ("chatcmpl-1", ())
    t.answer_end(last, 0, len(last))
    assert req.finish_reasons == ("length",)
    many = b'{"id":"other",' + b'"finish_reason":"stop",' * 300 + b'}'
    t.answer_end(many, 0, len(many))
    assert req.response_id == "chatcmpl-1" and len(req.finish_reasons) == MAX_CHOICES
    wd.stop()
