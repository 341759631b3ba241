"""The gateway's queue seen from outside: priority and shortest-job-first order end to end,
clients that leave (queued or mid-stream) cancel their work, and overload answers 503 with
`Retry-After` and `X-Tailguard-Reject-Reason`."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tests.functional.gateways import Stack, classes, gateway, health, sample, scrape, sim_running, until

CHAT = [{"role": "user", "content": "y" * 40}]


async def _queued(gw: Stack, n: int) -> None:
    async def cond() -> bool:
        return bool((await health(gw.url))["queued"] == n)
    await until(cond)


async def _running_on_sim(gw: Stack, n: float) -> None:
    async def cond() -> bool:
        return await sim_running(gw.sims[0]) == n
    await until(cond)


async def _long_stream(c: AsyncOpenAI) -> Any:
    """A stream that holds the gateway's only slot until it is closed (100,000 tokens would take
    the simulator minutes); returns after its first token."""
    stream = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=100_000, stream=True)
    async for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            break
    return stream


@pytest.mark.parametrize("policy,expected", [
    ("ranked-sjf", ["chat", "batch-100", "batch-200", "batch-300"]),
    ("fcfs", ["batch-300", "batch-100", "batch-200", "chat"]),
])
async def test_chat_queued_behind_batch_goes_first(policy: str, expected: list[str]) -> None:
    order: list[str] = []

    async def call(c: AsyncOpenAI, name: str, cls: str, max_tokens: int) -> None:
        await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=max_tokens,
                                        extra_headers={"X-Tailguard-Class": cls})
        order.append(name)

    async with asyncio.timeout(30), gateway(max_concurrency=1, scheduler={"policy": policy, "sjf_size_ratio": 1.0}) as gw, \
            gw.client() as c:
        blocker = await _long_stream(c)
        tasks = []
        for i, n in enumerate((300, 100, 200)):
            tasks.append(asyncio.create_task(call(c, f"batch-{n}", "batch", n)))
            await _queued(gw, i + 1)
        tasks.append(asyncio.create_task(call(c, "chat", "interactive", 50)))
        await _queued(gw, 4)
        await blocker.close()  # frees the slot: the policy picks who goes next
        await asyncio.gather(*tasks)
        m = await scrape(gw.url)
    assert order == expected
    assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "client_gone"}) == 1
    assert sample(m, "tailguard_requests_total", **{"class": "batch", "outcome": "success"}) == 3


async def test_client_leaving_the_queue_is_removed_and_never_sent_upstream() -> None:
    async with asyncio.timeout(30), gateway(max_concurrency=1) as gw, gw.client() as c:
        blocker = await _long_stream(c)
        waiting = asyncio.create_task(c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=5))
        await _queued(gw, 1)
        waiting.cancel()
        await _queued(gw, 0)
        m = await scrape(gw.url)
        assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "client_gone"}) == 1
        assert sample(m, "tailguard_queue_length", **{"class": "interactive"}) == 0
        await blocker.close()
        await _running_on_sim(gw, 0)
        r = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3)
        m = await scrape(gw.url)
    assert r.choices[0].message.content == " tok" * 3
    # Bound to a backend: the blocker and the last request only.
    assert sample(m, "tailguard_queue_wait_seconds_count", **{"class": "interactive"}) == 2


async def test_client_leaving_mid_stream_aborts_the_engine_request() -> None:
    async with asyncio.timeout(30), gateway() as gw, gw.client() as c:
        stream = await _long_stream(c)
        assert await sim_running(gw.sims[0]) == 1
        await stream.close()
        await _running_on_sim(gw, 0)  # the engine dropped it long before its 100,000 tokens

        async def released() -> bool:
            m = await scrape(gw.url)
            return sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "client_gone"}) == 1
        await until(released)
        m = await scrape(gw.url)
    assert sample(m, "tailguard_inflight", backend="sim0") == 0


async def test_client_leaving_a_non_stream_request_aborts_the_engine_request() -> None:
    async with asyncio.timeout(30), gateway() as gw, gw.client() as c:
        task = asyncio.create_task(c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=100_000))
        await _running_on_sim(gw, 1)
        task.cancel()
        await _running_on_sim(gw, 0)

        async def released() -> bool:
            m = await scrape(gw.url)
            return sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "client_gone"}) == 1
        await until(released)


async def test_full_class_queue_is_a_503_with_retry_after_and_reason() -> None:
    cfg = {"classes": classes(interactive={"max_queue_len": 1})}
    async with asyncio.timeout(30), gateway(max_concurrency=1, **cfg) as gw, gw.client() as c:
        blocker = await _long_stream(c)
        queued = asyncio.create_task(c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2))
        await _queued(gw, 1)
        with pytest.raises(openai.InternalServerError) as info:
            await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2)
        batch_ok = asyncio.create_task(c.chat.completions.create(
            model="tailguard-sim", messages=CHAT, max_tokens=2, extra_headers={"X-Tailguard-Class": "batch"}))
        await _queued(gw, 2)  # another class's queue still has room
        await blocker.close()
        await asyncio.gather(queued, batch_ok)
        m = await scrape(gw.url)
    resp = info.value.response
    assert resp.status_code == 503
    assert resp.headers["x-tailguard-reject-reason"] == "queue_full"
    assert int(resp.headers["retry-after"]) >= 1
    body = resp.json()
    assert body["error"]["code"] == "queue_full" and body["error"]["type"] == "server_overloaded"
    assert sample(m, "tailguard_rejected_total", **{"class": "interactive", "reason": "queue_full"}) == 1
    assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "rejected"}) == 1


async def test_request_waiting_past_its_bound_leaves_with_503_queue_timeout() -> None:
    cfg = {"classes": classes(interactive={"max_queue_wait_s": 0.2})}
    async with asyncio.timeout(30), gateway(max_concurrency=1, **cfg) as gw, gw.client() as c:
        blocker = await _long_stream(c)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(openai.InternalServerError) as info:
            await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2)
        waited = loop.time() - t0
        assert (await health(gw.url))["queued"] == 0
        await blocker.close()
        m = await scrape(gw.url)
    assert waited >= 0.2
    resp = info.value.response
    assert resp.status_code == 503
    assert resp.headers["x-tailguard-reject-reason"] == "queue_timeout"
    assert int(resp.headers["retry-after"]) >= 1
    assert resp.json()["error"]["code"] == "queue_timeout"
    assert sample(m, "tailguard_rejected_total", **{"class": "interactive", "reason": "queue_timeout"}) == 1
