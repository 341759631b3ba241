"""`gateway.shared`: callers' buckets in a real `redis-server`, reserved and settled by its Lua
scripts, and what a replica does while Redis is gone (`state.on_unavailable`) and once it is back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tailguard.errors import Overloaded, RateLimited
from tailguard.front.params import CallerSpec
from tailguard.gateway.config import StateConfig
from tailguard.gateway.shared.limits import SharedLimits
from tailguard.gateway.shared.link import Link
from tests.functional.redis_server import RedisServer, redis_server


@asynccontextmanager
async def limits(url: str, *specs: CallerSpec, **state: object) -> AsyncIterator[tuple[SharedLimits, list[bool]]]:
    changes: list[bool] = []
    cfg = StateConfig.model_validate({"url": url, **state})
    link = Link(cfg, changes.append)
    shared = SharedLimits(link, list(specs))
    link.start()
    try:
        yield shared, changes
    finally:
        await shared.close()
        await link.close()


async def bucket(server: RedisServer, key: str) -> tuple[float, int]:
    """A bucket's level and its key's time to live in ms, read from Redis itself."""
    from redis import asyncio as aioredis
    async with aioredis.Redis.from_url(server.url) as r:
        return float(await r.hget(key, "level") or "nan"), int(await r.pttl(key))


async def test_a_reservation_takes_from_every_bucket_or_none_and_settles_to_real_use(tmp_path: Path) -> None:
    async with asyncio.timeout(20), redis_server(tmp_path) as server, \
            limits(server.url, CallerSpec("team", requests_per_minute=10, tokens_per_minute=1000)) as (shared, _):
        held = await shared.reserve("team", 900)
        assert held is not None and held.shared
        rpm, tpm = "tailguard:{team}:rpm", "tailguard:{team}:tpm"
        assert (await bucket(server, tpm))[0] == pytest.approx(100, abs=1)
        with pytest.raises(RateLimited) as over:  # 200 more than the bucket holds: neither bucket is touched
            await shared.reserve("team", 300)
        assert over.value.status == 429 and over.value.type == "tokens"
        assert 11 < over.value.retry_after_s <= 12.1  # 200 tokens at 1000 a minute
        assert (await bucket(server, rpm))[0] == pytest.approx(9, abs=0.1)  # only the first request taken
        shared.settle(held, 400, admitted=True)  # used 400 of its 900: 500 back
        await shared.close()
        assert (await bucket(server, tpm))[0] == pytest.approx(600, abs=1)
        again = await shared.reserve("team", 300)
        assert again is not None
        shared.settle(again, 0, admitted=False)  # never got in: its request and tokens go back
        await shared.close()
        assert (await bucket(server, rpm))[0] == pytest.approx(9, abs=0.1)  # not 8
        assert (await bucket(server, tpm))[0] == pytest.approx(600, abs=1)


async def test_a_bucket_in_debt_is_kept_until_it_would_be_full_again(tmp_path: Path) -> None:
    async with asyncio.timeout(20), redis_server(tmp_path) as server, \
            limits(server.url, CallerSpec("team", tokens_per_minute=600)) as (shared, _):
        held = await shared.reserve("team", 600)
        assert held is not None
        shared.settle(held, 1800, admitted=True)  # an estimate that fell 1200 short: debt
        await shared.close()
        level, ttl_ms = await bucket(server, "tailguard:{team}:tpm")
        assert level == pytest.approx(-1200, abs=2)
        assert 179_000 < ttl_ms <= 181_000  # 1800 tokens to refill at 10 a second, then a second more
        with pytest.raises(RateLimited):
            await shared.reserve("team", 1)


@pytest.mark.parametrize("policy", ["local", "closed"])
async def test_while_redis_is_gone_a_replica_follows_its_policy_and_shares_again_when_it_returns(
        tmp_path: Path, policy: str) -> None:
    spec = CallerSpec("team", requests_per_minute=6)
    async with asyncio.timeout(30), redis_server(tmp_path) as server, \
            limits(server.url, spec, CallerSpec("free"), on_unavailable=policy, replicas=3, lease_s=0.3,
                   timeout_s=0.5) as (shared, changes):
        assert await shared.reserve("team", 10) is not None
        await server.kill()
        if policy == "closed":
            with pytest.raises(Overloaded) as gone:
                await shared.reserve("team", 10)
            assert gone.value.status == 503 and gone.value.code == "shared_state_unavailable"
        else:  # a third of 6 a minute: 2 here, then this replica's share is spent
            held = [await shared.reserve("team", 10) for _ in range(2)]
            assert all(h is not None and not h.shared for h in held)
            with pytest.raises(RateLimited):
                await shared.reserve("team", 10)
        assert await shared.reserve("free", 10) is None  # a caller without limits never asks Redis
        assert changes == [False]
        await server.start()  # back, empty: the heartbeat finds it within a third of a lease
        async with asyncio.timeout(5):
            while changes != [False, True]:
                await asyncio.sleep(0.02)
        held_again = await shared.reserve("team", 10)
        assert held_again is not None and held_again.shared


async def test_replicas_are_counted_by_heartbeat_and_a_dead_ones_lease_lapses(tmp_path: Path) -> None:
    """N for the local share is the replicas whose heartbeat Redis holds: one that stops beating
    (killed) is no longer counted a lease later."""
    spec = CallerSpec("team", requests_per_minute=4)
    async with asyncio.timeout(20), redis_server(tmp_path) as server, \
            limits(server.url, spec, lease_s=0.3) as (one, _), limits(server.url, spec, lease_s=0.3) as (two, _):
        async with asyncio.timeout(5):
            while one.link.seen_replicas != 2:
                await asyncio.sleep(0.02)
        assert one.link.replicas == 2
        dead = two.link._task
        assert dead is not None
        dead.cancel()  # its heartbeat stops as a killed replica's would, its entry left in Redis
        lapsed = asyncio.get_running_loop().time()
        while one.link.seen_replicas != 1:
            await asyncio.sleep(0.02)
        assert asyncio.get_running_loop().time() - lapsed < 0.3 + 0.1 + 0.1  # a lease, a beat and slack
        assert one.link.replicas == 1
