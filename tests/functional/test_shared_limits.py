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
from tailguard.config import StateConfig
from tailguard.gateway.shared.limits import SharedLimits
from tailguard.gateway.shared.link import Link, stop
from tests.functional.redis_server import RedisServer, redis_server


@asynccontextmanager
async def limits(url: str, *specs: CallerSpec, **state: object) -> AsyncIterator[tuple[SharedLimits, list[bool]]]:
    changes: list[bool] = []
    cfg = StateConfig.model_validate({"url": url, **state})
    link = Link(cfg, changes.append)
    shared = SharedLimits(link, list(specs))
    shared.start()
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
        await stop(two.link._task)  # its heartbeat stops as a killed replica's would, its entry left in Redis
        lapsed = asyncio.get_running_loop().time()
        while one.link.seen_replicas != 1:
            await asyncio.sleep(0.02)
        assert asyncio.get_running_loop().time() - lapsed < 0.3 + 0.1 + 0.1  # a lease, a beat and slack
        assert one.link.replicas == 1


async def test_a_callers_places_are_one_count_over_replicas_and_a_refusal_takes_nothing(tmp_path: Path) -> None:
    spec = CallerSpec("team", requests_per_minute=100, max_parallel=2)
    async with asyncio.timeout(20), redis_server(tmp_path) as server, \
            limits(server.url, spec) as (one, _), limits(server.url, spec) as (two, _):
        first, second = await one.reserve("team", 10), await two.reserve("team", 10)
        assert first is not None and first.place and second is not None and second.place
        with pytest.raises(RateLimited) as over:  # two in flight over the two replicas: no third anywhere
            await one.reserve("team", 10)
        assert over.value.status == 429 and over.value.type == "requests"
        assert "max_parallel_requests" in over.value.message and "over all replicas" in over.value.message
        assert over.value.headers["X-Tailguard-Reject-Reason"] == "rate_limit_parallel"
        assert (await bucket(server, "tailguard:{team}:rpm"))[0] == pytest.approx(98, abs=0.1)  # not 97
        two.settle(second, 5, admitted=True)  # its place back, on the other replica
        await two.close()
        third = await one.reserve("team", 10)
        assert third is not None


async def test_a_place_is_held_while_renewed_and_comes_back_a_lease_after_its_replica_died(tmp_path: Path) -> None:
    """A replica renews its places every third of a lease while they run; one that dies (its
    renewals stop, its settlement never comes) holds them one lease at most."""
    lease_s = 0.6
    spec = CallerSpec("team", max_parallel=1)
    async with asyncio.timeout(20), redis_server(tmp_path) as server, \
            limits(server.url, spec, lease_s=lease_s) as (alive, _), \
            limits(server.url, spec, lease_s=lease_s) as (other, _):
        held = await alive.reserve("team", 10)
        assert held is not None
        await asyncio.sleep(3 * lease_s)  # three leases: renewed, still held
        with pytest.raises(RateLimited):
            await other.reserve("team", 10)
        await stop(alive._task)  # its renewals stop as a killed replica's would; the place is left in Redis
        died = asyncio.get_running_loop().time()
        while True:
            try:
                back = await other.reserve("team", 10)
                break
            except RateLimited:
                await asyncio.sleep(0.02)
        waited = asyncio.get_running_loop().time() - died
        assert back is not None and waited < lease_s + 0.3  # at most a lease (and slack for a busy machine)


async def test_the_standing_is_the_shared_buckets_with_what_other_replicas_took(tmp_path: Path) -> None:
    spec = CallerSpec("team", requests_per_minute=60, tokens_per_minute=6000)
    async with asyncio.timeout(20), redis_server(tmp_path) as server, \
            limits(server.url, spec) as (one, _), limits(server.url, spec) as (two, _):
        assert two.standing("team") is None  # nothing seen here yet: the front's own buckets say it
        for _ in range(3):
            assert await one.reserve("team", 1000) is not None
        held = await two.reserve("team", 500)
        assert held is not None
        standing = two.standing("team")
        assert standing is not None
        requests, tokens = standing
        assert requests is not None and requests.limit == 60 and requests.remaining == 56
        assert tokens is not None and tokens.limit == 6000 and 2500 <= tokens.remaining <= 2510  # refilled a little
        assert tokens.reset_s == pytest.approx(35, abs=0.2)  # 3500 tokens at 100 a second
        two.settle(held, 100, admitted=True)  # 400 back, and the answer is seen too
        await two.close()
        _, after = two.standing("team") or (None, None)
        assert after is not None and 2900 <= after.remaining <= 2915


async def test_while_redis_is_gone_a_replica_holds_its_share_of_the_callers_places(tmp_path: Path) -> None:
    spec = CallerSpec("team", max_parallel=4)
    async with asyncio.timeout(20), redis_server(tmp_path) as server, \
            limits(server.url, spec, replicas=2, timeout_s=0.5) as (shared, changes):
        await server.kill()
        held = [await shared.reserve("team", 10) for _ in range(2)]  # half of 4 here
        assert changes == [False] and all(h is not None and not h.shared for h in held)
        with pytest.raises(RateLimited) as over:
            await shared.reserve("team", 10)
        assert over.value.headers["X-Tailguard-Reject-Reason"] == "rate_limit_parallel"
        first = held[0]
        assert first is not None
        shared.settle(first, 10, admitted=True)
        assert await shared.reserve("team", 10) is not None  # its place back
