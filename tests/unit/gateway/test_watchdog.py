"""The watchdog's phase deadlines (first token, idle, total), driven on a real asyncio loop whose
time the test controls: the loop never sleeps, it jumps to its next timer, and the watchdog
reads the same clock. So a deadline fires at exactly its instant, and a test that waits for
more than its own timers fails at once instead of hanging.

A deadline is seen as the request task's cancellation, told apart from a client leaving by
`take_expiry`; these tests await a long sleep (in virtual time) and look at when and why it
was cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator

import pytest

from tailguard.gateway.upstream.watchdog import DeadlineWatch
from tests.unit.gateway.virtual_loop import VirtualClock as _Clock, run

START = 1000.0  # virtual seconds at a test's start


@pytest.fixture
def clock() -> Iterator[_Clock]:
    """The one clock of a test, which the watchdog is given as the gateway gives it its own."""
    yield _Clock()


async def _expiry(wd: DeadlineWatch, clock: _Clock, work: Awaitable[None]) -> tuple[str | None, float]:
    """Await `work` in the watchdog's task; returns the deadline that cancelled it (None: it ended
    on its own) and when, in seconds since the start."""
    try:
        await work
    except asyncio.CancelledError:
        kind = wd.take_expiry()
        assert kind is not None, "cancelled from outside, not by a deadline"
        return kind, clock.now - START
    return None, clock.now - START


async def _chunks_every(clock: _Clock, wd: DeadlineWatch, gap_s: float, n: int) -> None:
    """`n` chunks of bytes from the backend, `gap_s` apart, as the relay records them."""
    for _ in range(n):
        await asyncio.sleep(gap_s)
        wd.last_at = clock()


def test_no_token_by_the_first_token_deadline(clock: _Clock) -> None:
    """Armed at the sooner of the idle and first-token deadlines; at the idle one, with no token
    yet, it re-arms for the first-token one, and fires there."""
    async def main(loop: asyncio.AbstractEventLoop) -> tuple[str | None, float]:
        wd = DeadlineWatch(loop, clock, total_at=START + 100, idle_s=10)
        wd.start_attempt(first_token_at=START + 30)
        return await _expiry(wd, clock, asyncio.sleep(1000))

    assert run(clock, main) == ("timeout_first_token", 30)


def test_bytes_that_are_not_content_do_not_meet_the_first_token_deadline(clock: _Clock) -> None:
    """A role-only chunk or a keep-alive comment is bytes (`last_at`), not a token."""
    async def main(loop: asyncio.AbstractEventLoop) -> tuple[str | None, float]:
        wd = DeadlineWatch(loop, clock, total_at=START + 100, idle_s=10)
        wd.start_attempt(first_token_at=START + 30)
        return await _expiry(wd, clock, _chunks_every(clock, wd, 5, 100))

    assert run(clock, main) == ("timeout_first_token", 30)


def test_the_idle_deadline_follows_the_last_chunk(clock: _Clock) -> None:
    """After the first token, a gap longer than `idle_s` since the last chunk ends the request;
    chunks only store their instant, and the timer, when it fires early, re-arms itself."""
    async def main(loop: asyncio.AbstractEventLoop) -> tuple[str | None, float]:
        wd = DeadlineWatch(loop, clock, total_at=START + 100, idle_s=10)
        wd.start_attempt(first_token_at=START + 30)

        async def stream() -> None:
            await asyncio.sleep(5)
            wd.first_content(clock())
            await _chunks_every(clock, wd, 7, 2)  # at 12 and 19, then silence
            await asyncio.sleep(1000)

        return await _expiry(wd, clock, stream())

    assert run(clock, main) == ("timeout_idle", 29)


def test_the_total_deadline_ends_a_stream_that_never_stalls(clock: _Clock) -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> tuple[str | None, float]:
        wd = DeadlineWatch(loop, clock, total_at=START + 50, idle_s=10)
        wd.start_attempt(first_token_at=START + 30)

        async def stream() -> None:
            await asyncio.sleep(1)
            wd.first_content(clock())
            await _chunks_every(clock, wd, 3, 1000)

        return await _expiry(wd, clock, stream())

    assert run(clock, main) == ("timeout_total", 50)


def test_the_total_deadline_caps_the_first_token_one(clock: _Clock) -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> tuple[str | None, float]:
        wd = DeadlineWatch(loop, clock, total_at=START + 20, idle_s=10)
        wd.start_attempt(first_token_at=START + 30)
        return await _expiry(wd, clock, asyncio.sleep(1000))

    assert run(clock, main) == ("timeout_total", 20)


def test_a_stream_within_its_deadlines_runs_to_its_end(clock: _Clock) -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> tuple[str | None, float]:
        wd = DeadlineWatch(loop, clock, total_at=START + 100, idle_s=10)
        wd.start_attempt(first_token_at=START + 30)

        async def stream() -> None:
            await asyncio.sleep(25)
            wd.first_content(clock())
            await _chunks_every(clock, wd, 9, 5)  # ends at 70

        out = await _expiry(wd, clock, stream())
        wd.stop()
        return out

    assert run(clock, main) == (None, 70)


def test_each_attempt_has_its_own_first_token_deadline(clock: _Clock) -> None:
    """A retry (or a resumed run) starts a new attempt: the first token is awaited again, even
    though the previous attempt had one, and the idle deadline no longer applies."""
    async def main(loop: asyncio.AbstractEventLoop) -> tuple[str | None, float]:
        wd = DeadlineWatch(loop, clock, total_at=START + 1000, idle_s=10)
        wd.start_attempt(first_token_at=START + 30)
        await asyncio.sleep(2)
        wd.first_content(clock())
        await asyncio.sleep(3)  # the attempt fails at 5; a new one starts with 40 s for its first token
        wd.start_attempt(first_token_at=clock() + 40)
        assert not wd.first_seen and wd.last_at == 0.0
        return await _expiry(wd, clock, _chunks_every(clock, wd, 5, 100))  # bytes, never content

    assert run(clock, main) == ("timeout_first_token", 45)


def test_stop_disarms(clock: _Clock) -> None:
    """Stopped (the request ended, or was suspended), no deadline fires any more."""
    async def main(loop: asyncio.AbstractEventLoop) -> tuple[str | None, float]:
        wd = DeadlineWatch(loop, clock, total_at=START + 20, idle_s=10)
        wd.start_attempt(first_token_at=START + 15)
        wd.stop()
        out = await _expiry(wd, clock, asyncio.sleep(500))
        assert wd.expired is None
        return out

    assert run(clock, main) == (None, 500)


def test_a_client_that_leaves_is_not_a_deadline(clock: _Clock) -> None:
    """The task cancelled from outside (aiohttp cancels the handler of a client that left):
    `take_expiry` says None, so the caller re-raises; and when a deadline fired too, the
    outside cancellation still wins."""
    async def main(loop: asyncio.AbstractEventLoop) -> list[str | None]:
        seen: list[str | None] = []
        for deadline_too in (False, True):
            wd = DeadlineWatch(loop, clock, total_at=clock() + 100, idle_s=10)
            wd.start_attempt(first_token_at=clock() + 30)
            task = asyncio.current_task()
            assert task is not None
            loop.call_later(30 if deadline_too else 12, task.cancel)  # the client leaves
            try:
                await asyncio.sleep(1000)
            except asyncio.CancelledError:
                seen.append(wd.take_expiry())
                if seen[-1] is None:
                    task.uncancel()  # what a handler would re-raise: swallowed here to go on
            wd.stop()
        return seen

    assert run(clock, main) == [None, None]


def test_a_client_that_leaves_after_a_deadline_was_retried_is_not_that_deadline(clock: _Clock) -> None:
    """A backend that sent no headers by the first-token deadline is retried elsewhere (the
    exchange takes the expiry and starts a new attempt with the same watchdog). If the client
    then leaves, that cancellation is the client's: the first attempt's expiry, already taken,
    must not be reported again (the exchange would retry, or end with a 504, for a client that
    is gone)."""
    async def main(loop: asyncio.AbstractEventLoop) -> tuple[str | None, str | None]:
        wd = DeadlineWatch(loop, clock, total_at=START + 1000, idle_s=10)
        wd.start_attempt(first_token_at=START + 30)
        first = await _expiry(wd, clock, asyncio.sleep(1000))
        wd.start_attempt(first_token_at=clock() + 30)  # the retry
        task = asyncio.current_task()
        assert task is not None
        loop.call_later(5, task.cancel)  # the client leaves
        try:
            await asyncio.sleep(1000)
        except asyncio.CancelledError:
            second = wd.take_expiry()
            if second is None:
                task.uncancel()
        wd.stop()
        return first[0], second

    assert run(clock, main) == ("timeout_first_token", None)
