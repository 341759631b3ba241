"""tailguard.client against the real gateway in front of the real simulator on loopback: a 503
`queue_full` with Retry-After is honoured, the reject reason reaches the exception, and each try
of a retried call is counted once by the gateway."""

from __future__ import annotations

import asyncio
import time

import pytest
from openai import AsyncOpenAI

from tailguard.client import RetryPolicy, Timeouts, Unavailable, async_openai_client
from tests.functional.gateways import Stack, classes, gateway, health, sample, scrape, until

CHAT = [{"role": "user", "content": "y" * 40}]
CFG = {"classes": classes(interactive={"max_queue_len": 1})}


async def _fill(gw: Stack, plain: AsyncOpenAI) -> tuple[object, asyncio.Task[object]]:
    """Hold the only slot with a stream that would run for minutes, and fill the one queue place."""
    blocker = await plain.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=100_000, stream=True)
    async for ch in blocker:
        if ch.choices and ch.choices[0].delta.content:
            break
    queued = asyncio.create_task(plain.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2))

    async def one_queued() -> bool:
        return bool((await health(gw.url))["queued"] == 1)
    await until(one_queued)
    return blocker, queued


async def _rejected(gw: Stack) -> float:
    m = await scrape(gw.url)
    return sample(m, "tailguard_rejected_total", **{"class": "interactive", "reason": "queue_full"})


async def test_queue_full_retry_after_is_honoured_and_each_try_is_counted_once() -> None:
    async with asyncio.timeout(30), gateway(max_concurrency=1, **CFG) as gw, gw.client() as plain:
        blocker, queued = await _fill(gw, plain)
        client = async_openai_client(base_url=f"{gw.url}/v1", api_key="k", timeouts=Timeouts(first_token=10),
                                     retry=RetryPolicy(max_attempts=3, base_delay=0.05, max_delay=0.1))
        start = time.monotonic()
        call = asyncio.create_task(client.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2))

        async def refused_once() -> bool:
            return await _rejected(gw) == 1
        await until(refused_once)
        await blocker.close()  # type: ignore[attr-defined]
        await queued
        answer = await call
        took = time.monotonic() - start
        await client.close()
        m = await scrape(gw.url)
    assert answer.choices[0].message.content == " tok tok"
    assert took >= 1.0  # the gateway's Retry-After (whole seconds, at least 1) was waited out
    assert sample(m, "tailguard_rejected_total", **{"class": "interactive", "reason": "queue_full"}) == 1
    outcomes = {labels: v for (name, labels), v in m.items() if name == "tailguard_requests_total"}
    # the client's two tries: one rejection, one success (plus the queued call's success)
    assert outcomes[(("class", "interactive"), ("outcome", "rejected"))] == 1
    assert outcomes[(("class", "interactive"), ("outcome", "success"))] == 2


async def test_the_reject_reason_and_retry_after_reach_the_exception() -> None:
    async with asyncio.timeout(30), gateway(max_concurrency=1, **CFG) as gw, gw.client() as plain:
        blocker, queued = await _fill(gw, plain)
        async with async_openai_client(base_url=f"{gw.url}/v1", api_key="k",
                                       retry=RetryPolicy(max_attempts=1)) as client:
            with pytest.raises(Unavailable) as info:
                await client.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2, stream=True)
        await blocker.close()  # type: ignore[attr-defined]
        await queued
    err = info.value
    assert err.status_code == 503 and err.reason == "queue_full" and err.retry_after_s is not None
    assert err.retry_after_s >= 1 and err.attempts == 1 and err.gave_up == "attempts"
    assert "503 (queue_full)" in str(err)
