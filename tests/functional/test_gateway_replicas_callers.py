"""Two gateway replicas (real `tailguard serve` processes) sharing a real `redis-server`, seen by
a caller through the real `openai` package: its `max_parallel_requests` is one count over both
(and a replica killed with SIGKILL gives its places back within the lease), the
`x-ratelimit-*` headers of one replica count what the other let in, and `/admin/usage` on one
replica answers for both, and again, whole, after Redis restarted empty."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from tests.functional.gateway_processes import GatewayProcess, replicas
from tests.functional.redis_server import RedisServer, redis_server
from tests.functional.sim_processes import sim_process

CHAT = [{"role": "user", "content": "hi"}]
ADMIN_KEY = "adm-0123456789abcdef"
PARALLEL = 3
LEASE_S = 0.6


def config(sim_url: str, redis_url: str, access_log: bool = False) -> dict[str, Any]:
    return {
        "backends": [{"name": "sim", "url": sim_url, "max_concurrency": 16}],
        "auth": {"api_keys": {"sk-par": {"name": "par", "max_parallel_requests": PARALLEL},
                              "sk-rate": {"name": "rate", "rpm_limit": 6, "tpm_limit": 6000},
                              "sk-free": {"name": "free"}},
                 "admin_keys": [ADMIN_KEY]},
        "state": {"url": redis_url, "lease_s": LEASE_S},
        "access_log": access_log,
    }


async def two_replicas(stack: AsyncExitStack, tmp_path: Path, access_log: bool = False,
                       redis: RedisServer | None = None) -> list[GatewayProcess]:
    redis = redis or await stack.enter_async_context(redis_server(tmp_path))
    sim = await stack.enter_async_context(sim_process("--max-num-seqs", "32", time_scale=0.2))
    return await replicas(stack, tmp_path, config(sim.url, redis.url, access_log))


async def clients(stack: AsyncExitStack, gateways: list[GatewayProcess], key: str) -> list[AsyncOpenAI]:
    """An `openai` client of `key` for each replica."""
    return [await stack.enter_async_context(AsyncOpenAI(base_url=f"{g.url}/v1", api_key=key, max_retries=0))
            for g in gateways]


async def opened(c: AsyncOpenAI) -> Any:
    """A long stream, once its first chunk arrived: the request holds its place."""
    stream = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4000, stream=True)
    await stream.__anext__()
    return stream


async def short(c: AsyncOpenAI) -> Any:
    return await c.chat.completions.with_raw_response.create(model="tailguard-sim", messages=CHAT, max_tokens=5)


async def refused_at_once(c: AsyncOpenAI) -> openai.RateLimitError:
    with pytest.raises(openai.RateLimitError) as over:
        await short(c)
    assert over.value.response.headers["x-tailguard-reject-reason"] == "rate_limit_parallel"
    assert "over all replicas" in over.value.message
    return over.value


async def test_a_keys_parallel_limit_holds_across_replicas(tmp_path: Path) -> None:
    async with asyncio.timeout(60), AsyncExitStack() as stack:
        gateways = await two_replicas(stack, tmp_path)
        a, b = await clients(stack, gateways, "sk-par")
        streams = [await opened(a), await opened(a), await opened(b)]  # 3 in flight over the two
        await refused_at_once(a)
        await refused_at_once(b)
        await streams[0].close()  # one on the first replica ends: its place is free on the other too
        while True:  # its settlement is sent in the background: a moment
            try:
                r = await short(b)
                break
            except openai.RateLimitError:
                await asyncio.sleep(0.01)
        assert r.http_response.status_code == 200
        for s in streams[1:]:
            await s.close()


async def test_a_replica_killed_with_sigkill_gives_its_callers_places_back_within_the_lease(tmp_path: Path) -> None:
    async with asyncio.timeout(60), AsyncExitStack() as stack:
        gateways = await two_replicas(stack, tmp_path)
        a, b = await clients(stack, gateways, "sk-par")
        holder = gateways[0]
        held = [await opened(a) for _ in range(PARALLEL)]  # left open: the holder dies holding them
        await asyncio.sleep(LEASE_S)  # a lease on: the holder renews them, they are still held
        await refused_at_once(b)
        holder.kill()
        killed = time.monotonic()
        del held
        while True:
            try:
                r = await short(b)
                break
            except openai.RateLimitError:
                await asyncio.sleep(0.02)
        back_s = time.monotonic() - killed
    print(f"a SIGKILLed replica's places came back {back_s:.2f} s later (lease {LEASE_S} s)")
    assert r.http_response.status_code == 200
    assert back_s < LEASE_S + 1.0  # the lease, and the short request itself on a busy machine


async def test_the_ratelimit_headers_count_what_the_other_replica_let_in(tmp_path: Path) -> None:
    async with asyncio.timeout(60), AsyncExitStack() as stack:
        gateways = await two_replicas(stack, tmp_path)
        a, b = await clients(stack, gateways, "sk-rate")
        used, started = 0, time.monotonic()
        for _ in range(3):
            r = await short(a)
            completion = r.parse()
            assert completion.usage is not None
            used += completion.usage.total_tokens
        r = await short(b)
        h = r.headers
        assert h["x-ratelimit-limit-requests"] == "6"
        assert h["x-ratelimit-remaining-requests"] == "2"  # 6 less the 4 over both (its own alone: 5)
        # The tokens: what the first three used, and this one's reservation (its prompt estimate
        # and max_tokens) taken; refilled at 100 a second since the first.
        refill = 100 * (time.monotonic() - started)
        remaining = int(h["x-ratelimit-remaining-tokens"])
        assert 6000 - used - 200 <= remaining <= 6000 - used - 5 + refill
        over = [await short(b), await short(a)]
        assert [x.headers["x-ratelimit-remaining-requests"] for x in over] == ["1", "0"]
        with pytest.raises(openai.RateLimitError) as limited:
            await short(b)
        assert limited.value.response.headers["x-ratelimit-remaining-requests"] == "0"


async def usage(gw: GatewayProcess, caller: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{gw.url}/admin/usage", params={"caller": caller},
                                                     headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as r:
        assert r.status == 200
        body: dict[str, Any] = await r.json()
        return body


async def test_admin_usage_on_one_replica_answers_for_both(tmp_path: Path) -> None:
    async with asyncio.timeout(60), AsyncExitStack() as stack:
        gateways = await two_replicas(stack, tmp_path)
        a, b = await clients(stack, gateways, "sk-rate")
        one = gateways[0]
        tokens = 0
        for c in (a, b, b):
            completion = (await short(c)).parse()
            tokens += completion.usage.total_tokens
        started = time.monotonic()
        while True:
            # The other replica adds its rows into Redis as it writes them: every few seconds
            # (test_usage_is_whole_again_after_redis_restarted_empty waits for that), or first
            # thing when its own /admin/usage is asked, as here, so this test waits for no timer.
            await usage(gateways[1], "rate")
            body = await usage(one, "rate")
            rows = body["data"]
            if rows and rows[0]["requests"] == 3:
                break
            await asyncio.sleep(0.05)
        print(f"the other replica's usage reached this one's /admin/usage {time.monotonic() - started:.2f} s later")
        assert body["scope"] == "replicas"
        [row] = rows
        assert row["outcomes"] == {"success": 3}
        assert row["prompt_tokens"] + row["output_tokens"] == tokens


def _served(gateways: list[GatewayProcess], caller: str) -> int:
    """The requests of `caller` in the replicas' access logs."""
    return sum(1 for g in gateways for line in g.lines
               if '"event":"access"' in line and f'"caller":"{caller}"' in line)


async def test_usage_is_whole_again_after_redis_restarted_empty(tmp_path: Path) -> None:
    """Redis killed and started again without its data: each replica adds its own rows again, so
    `/admin/usage` on either equals what both replicas' access logs say (before, the rows written
    before the restart were lost: 105 requests counted of 135 served)."""
    async with asyncio.timeout(90), AsyncExitStack() as stack:
        redis = await stack.enter_async_context(redis_server(tmp_path))
        gateways = await two_replicas(stack, tmp_path, access_log=True, redis=redis)
        a, b = await clients(stack, gateways, "sk-free")
        for c in (a, a, a, b, b):
            await short(c)
        await redis.kill()
        await redis.start()  # empty
        for c in (a, b):
            await short(c)
        while _served(gateways, "free") < 7:  # the access lines, written every 0.2 s
            await asyncio.sleep(0.05)
        while True:  # each replica finds the new generation at its next write (every few seconds)
            rows = (await usage(gateways[0], "free"))["data"]
            if rows and rows[0]["requests"] >= 7:
                break
            await asyncio.sleep(0.2)
        for g in gateways:  # each writes again first (`/admin/usage` does): nothing is added twice
            body = await usage(g, "free")
            assert body["scope"] == "replicas" and body["data"][0]["requests"] == _served(gateways, "free"), body
