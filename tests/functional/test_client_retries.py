"""Retries against a real fault server on loopback: Retry-After in seconds, as a date and absurdly
long; 503 then 200; a reset connection; a 400 tried once; backoff, the budget, several base URLs."""

from __future__ import annotations

import asyncio
import math

import openai
import pytest

from tailguard.client import ConnectionFailed, RateLimited, RetryBudget, RetryPolicy, StreamBroken, Unavailable
from tests.functional.client_calls import KINDS, against, call
from tests.functional.client_faults import fault_server
from tests.functional.gateways import dead_url

FAST = RetryPolicy(max_attempts=4, base_delay=0.02, max_delay=0.05)
LATE = 0.5


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


@pytest.mark.parametrize("kind", KINDS)
async def test_429_waits_its_retry_after_in_seconds(kind: str) -> None:
    out, hits = await against(kind, "429_seconds", retry=FAST)
    assert out.error is None and out.texts == ["one", " two", " three"]
    [gap] = _gaps(hits)
    # Retry-After 0.2 is a floor; the 429 jitter window is base 0.02 x overload factor 2
    assert 0.2 <= gap < 0.2 + 0.04 + LATE


@pytest.mark.parametrize("kind", KINDS)
async def test_429_waits_for_its_retry_after_date(kind: str) -> None:
    async with asyncio.timeout(5), fault_server() as f:
        out = await call(kind, f.base("429_date"), retry=FAST)
    assert out.error is None
    first, second = f.walls["429_date"]
    assert second >= math.ceil(first) - 0.01  # not before the date the server named


@pytest.mark.parametrize("kind", KINDS)
async def test_an_absurd_retry_after_raises_at_once(kind: str) -> None:
    out, hits = await against(kind, "429_absurd", retry=RetryPolicy(max_attempts=4, max_retry_after=60))
    err = out.error
    assert isinstance(err, RateLimited) and isinstance(err, openai.RateLimitError)
    assert err.gave_up == "retry_after_too_long" and err.retry_after_s == 198300 and err.attempts == 1
    assert err.reason == "queue_full" and "(queue_full)" in str(err)
    assert "gave up after 1 try (the server asked for a longer wait than max_retry_after): try 1 to http" in str(err)
    assert len(hits) == 1 and out.elapsed_s < LATE


@pytest.mark.parametrize("kind", KINDS)
async def test_503_then_200(kind: str) -> None:
    out, hits = await against(kind, "503_then_200", retry=FAST)
    assert out.error is None and out.texts == ["one", " two", " three"]
    [gap] = _gaps(hits)
    assert 0.05 <= gap < 0.05 + 0.02 + LATE  # Retry-After 0.05 plus a 503 window of 0.02


@pytest.mark.parametrize("kind", KINDS)
async def test_a_reset_connection_is_retried(kind: str) -> None:
    out, hits = await against(kind, "reset_once", retry=FAST)
    assert out.error is None and out.texts == ["one", " two", " three"]
    assert len(hits) == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_a_reset_after_content_reached_the_caller_is_not_retried(kind: str) -> None:
    out, hits = await against(kind, "content_then_reset", retry=FAST)
    assert isinstance(out.error, openai.APIConnectionError) and isinstance(out.error, StreamBroken)
    assert "/content_then_reset/v1/chat/completions broke off after 1 content chunks" in str(out.error)
    assert out.texts == ["one"]
    assert len(hits) == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_a_400_is_tried_once(kind: str) -> None:
    out, hits = await against(kind, "400", retry=FAST)
    assert isinstance(out.error, openai.BadRequestError)
    assert out.error.body == {"message": "messages is required", "type": "invalid_request_error",
                              "param": "messages", "code": "missing_required_parameter"}
    assert len(hits) == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_retries_stop_after_max_attempts_and_follow_the_backoff(kind: str) -> None:
    policy = RetryPolicy(max_attempts=4, base_delay=0.05, max_delay=0.1)
    out, hits = await against(kind, "503_always", retry=policy, budget=False)
    err = out.error
    assert isinstance(err, Unavailable) and isinstance(err, openai.InternalServerError)
    assert err.attempts == 4 and err.gave_up == "attempts" and err.reason == "queue_full"
    said = str(err)
    assert said.startswith("503 (queue_full): ") and "; gave up after 4 tries (no tries left): try 1 to http" in said
    assert [t.split(":", 1)[0].split(" to ")[0] for t in err.tries] == ["try 1", "try 2", "try 3", "try 4"]
    assert all("/503_always/v1/chat/completions: 503 (queue_full)" in t for t in err.tries), err.tries
    gaps = _gaps(hits)
    assert len(gaps) == 3
    for gap, window in zip(gaps, (0.05, 0.1, 0.1)):  # Retry-After 0 + full jitter in [0, window]
        assert gap < window + LATE


async def test_the_budget_is_shared_by_a_clients_calls() -> None:
    budget = RetryBudget(ratio=0.0, min_per_s=0.1, ttl_s=10.0)  # one retry per 10 s for the client
    async with asyncio.timeout(5), fault_server() as f:
        first = await call("async", f.base("503_always"), retry=FAST, budget=budget)
        second = await call("async", f.base("503_always"), retry=FAST, budget=budget)
    assert isinstance(first.error, Unavailable) and first.error.attempts == 2 and first.error.gave_up == "budget"
    assert isinstance(second.error, Unavailable) and second.error.attempts == 1
    assert second.error.gave_up == "budget"
    assert len(f.hits["503_always"]) == 3


@pytest.mark.parametrize("kind", KINDS)
async def test_a_failed_try_goes_to_the_next_base_url(kind: str) -> None:
    async with asyncio.timeout(5), fault_server() as f:
        out = await call(kind, [f"{dead_url()}/ok/v1", f.base("ok")], retry=FAST)
    assert out.error is None and out.texts == ["one", " two", " three"]
    assert len(f.hits["ok"]) == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_a_connection_refused_everywhere_is_an_api_connection_error(kind: str) -> None:
    async with asyncio.timeout(5):
        dead = dead_url()
        out = await call(kind, f"{dead}/v1", retry=RetryPolicy(max_attempts=2, base_delay=0.01))
    err = out.error
    assert isinstance(err, openai.APIConnectionError) and isinstance(err, ConnectionFailed)
    assert not isinstance(err, openai.APITimeoutError)
    # not the SDK's bare "Connection error.": where, how many tries, and why each failed
    assert str(err).startswith(f"could not reach {dead}/v1/chat/completions: gave up after 2 tries (no tries left): ")
    assert len(err.tries) == 2 and err.attempts == 2
    for n, t in enumerate(err.tries, 1):
        assert t.startswith(f"try {n} to {dead}/v1/chat/completions: cannot connect ("), t
