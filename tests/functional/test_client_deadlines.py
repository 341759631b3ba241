"""Each staged deadline fires at its time with its own exception, against a real fault server on
loopback and the real openai package, for the sync and the async client; keep-alives move no
deadline; a stream is never retried once content reached the caller."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Iterator

import openai
import pytest

from tailguard.client import (
    ConnectTimeout, DeadlineExceeded, FirstTokenTimeout, IdleTimeout, RetryPolicy, Timeouts, TotalTimeout,
    async_openai_client,
)
from tests.functional.client_calls import CHAT, KINDS, against, call
from tests.functional.client_faults import fault_server

D = 0.2  # every deadline in this file
LATE = 0.5  # how late a deadline may fire on a busy two-core machine


def _fired(err: Exception | None, cls: type[DeadlineExceeded], elapsed_s: float, limit_s: float = D) -> DeadlineExceeded:
    assert isinstance(err, cls), repr(err)
    assert isinstance(err, openai.APITimeoutError)  # existing `except` clauses still catch it
    assert err.limit_s == pytest.approx(limit_s)
    assert limit_s <= err.elapsed_s < limit_s + LATE
    assert elapsed_s < limit_s + LATE
    return err


@pytest.mark.parametrize("kind", KINDS)
async def test_a_server_that_never_answers_is_a_first_token_timeout(kind: str) -> None:
    out, hits = await against(kind, "hang")
    err = _fired(out.error, FirstTokenTimeout, out.elapsed_s)
    assert err.content_chunks == 0 and "first_token deadline of 0.2 s" in str(err)
    assert len(hits) == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_a_first_token_timeout_over_two_tries_says_both(kind: str) -> None:
    out, hits = await against(kind, "hang", retry=RetryPolicy(max_attempts=2, base_delay=0.01))
    err = out.error
    assert isinstance(err, FirstTokenTimeout) and err.attempts == 2 and len(hits) == 2
    said = str(err)
    assert "; gave up after 2 tries (no tries left): try 1 to http" in said
    assert said.count("first_token deadline of 0.2 s ran out after") == 3  # the last try, then each try in the list
    assert [t.split(" to ")[0] for t in err.tries] == ["try 1", "try 2"]


@pytest.mark.parametrize("kind", KINDS)
async def test_keepalives_after_the_role_chunk_do_not_hold_off_the_first_token_deadline(kind: str) -> None:
    out, hits = await against(kind, "role_then_keepalive")
    _fired(out.error, FirstTokenTimeout, out.elapsed_s)
    assert out.texts == []


@pytest.mark.parametrize("kind", KINDS)
async def test_keepalives_after_content_do_not_reset_the_idle_deadline_and_nothing_is_retried(kind: str) -> None:
    out, hits = await against(kind, "three_then_keepalive", retry=RetryPolicy(max_attempts=4, base_delay=0.01))
    err = _fired(out.error, IdleTimeout, out.elapsed_s)
    assert out.texts == ["one", " two", " three"]
    assert err.content_chunks == 3 and "3 content chunks had arrived" in str(err)
    assert len(hits) == 1  # content had reached the caller


@pytest.mark.parametrize("kind", KINDS)
async def test_a_fixed_total_deadline(kind: str) -> None:
    out, hits = await against(kind, "three_then_keepalive", timeouts=Timeouts(first_token=1, idle=None, total=0.3))
    _fired(out.error, TotalTimeout, out.elapsed_s, limit_s=0.3)
    assert out.texts == ["one", " two", " three"]


@pytest.mark.parametrize("kind", KINDS)
async def test_the_total_deadline_derived_from_max_tokens(kind: str) -> None:
    # (first_token 0.1 + 2 tokens at 10 tokens/s) x slack 1 = 0.3 s
    timeouts = Timeouts(first_token=0.1, idle=None, total=None, tokens_per_s=10, slack=1)
    out, hits = await against(kind, "three_then_keepalive", timeouts=timeouts, max_tokens=2)
    _fired(out.error, TotalTimeout, out.elapsed_s, limit_s=0.3)


@pytest.fixture
def unaccepting() -> Iterator[str]:
    """A loopback listener whose accept queue is full, so a new connection's handshake hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):  # Linux queues backlog + 1; a few more make sure it is full
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        for s in fillers:
            s.close()
        listener.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_connection_that_does_not_open_is_a_connect_timeout(kind: str, unaccepting: str) -> None:
    async with asyncio.timeout(5):
        out = await call(kind, unaccepting, timeouts=Timeouts(connect=D, first_token=5))
    _fired(out.error, ConnectTimeout, out.elapsed_s)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_non_stream_call_is_streamed_underneath_and_assembled(kind: str) -> None:
    out, hits = await against(kind, "ok", stream=False)
    assert out.error is None, repr(out.error)
    assert out.answer.choices[0].message.content == "one two three"
    assert out.answer.choices[0].finish_reason == "stop"
    assert out.answer.usage.completion_tokens == 3


@pytest.mark.parametrize("kind", KINDS)
async def test_a_non_stream_call_has_the_same_deadlines_and_is_retried_since_nothing_reached_the_caller(
        kind: str) -> None:
    async with asyncio.timeout(5), fault_server() as f:
        stalled = await call(kind, f.base("role_then_keepalive"), stream=False)
        idle = await call(kind, f.base("three_then_keepalive"), stream=False,
                          retry=RetryPolicy(max_attempts=2, base_delay=0.01))
    _fired(stalled.error, FirstTokenTimeout, stalled.elapsed_s)
    assert isinstance(idle.error, IdleTimeout)
    assert len(f.hits["three_then_keepalive"]) == 2


async def test_a_call_to_another_endpoint_answers_within_first_token() -> None:
    async with asyncio.timeout(5), fault_server() as f:
        async with async_openai_client(base_url=f.base("hang"), api_key="k", timeouts=Timeouts(first_token=D),
                                       retry=RetryPolicy(max_attempts=1)) as client:
            start = time.monotonic()
            with pytest.raises(TotalTimeout) as info:
                await client.models.list()
    _fired(info.value, TotalTimeout, time.monotonic() - start)


async def test_the_total_deadline_follows_the_speed_the_client_learned() -> None:
    # Told 1 token/s, a 3-token call may take (0.1 + 3 / 1) x 1 = 3.1 s; after three fast streams
    # the client knows better and gives the same call (0.1 + 3 / fast) x 1, about 0.1 s.
    timeouts = Timeouts(first_token=0.1, idle=None, total=None, tokens_per_s=1, slack=1)
    async with asyncio.timeout(5), fault_server() as f:
        async with async_openai_client(base_url=f.base("ok"), api_key="k", timeouts=timeouts,
                                       retry=RetryPolicy(max_attempts=1)) as client:
            for _ in range(3):
                stream = await client.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3, stream=True)
                async for _chunk in stream:
                    pass
            client.base_url = f.base("three_then_keepalive")  # type: ignore[assignment]
            start = time.monotonic()
            with pytest.raises(TotalTimeout) as info:
                stream = await client.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3, stream=True)
                async for _chunk in stream:
                    pass
    err = info.value
    assert 0.1 <= err.limit_s < 0.2
    _fired(err, TotalTimeout, time.monotonic() - start, limit_s=err.limit_s)
