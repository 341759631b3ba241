"""`gateway.shared`: callers' buckets in a real `redis-server`, reserved and settled by its Lua
scripts; what a replica does while Redis is gone (`state.on_unavailable`) and once it is back. A
reservation answers a verdict, never a refusal of its own: the front refuses what it refuses
(`Arrive.shared`), worded once (`gateway.rejection`), and while Redis is away under `local` the
front keeps 1/N of each limit itself (`LocalShare`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tailguard.clock import monotonic
from tailguard.config import StateConfig
from tailguard.errors import RateLimited
from tailguard.front.events import Arrive, Finished, LocalShare, Reject, SharedVerdict, Start
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, CallerSpec, FrontParams, default_classes
from tailguard.gateway.rejection import rejection
from tailguard.gateway.shared.limits import GRANTED, SharedLimits
from tailguard.gateway.shared.link import Link, stop
from tailguard.types import Outcome, RejectReason
from tests.functional.redis_server import RedisServer, redis_server


@asynccontextmanager
async def limits(url: str, *specs: CallerSpec, **state: object) -> AsyncIterator[tuple[SharedLimits, list[bool]]]:
    changes: list[bool] = []
    cfg = StateConfig.model_validate({"url": url, **state})
    link = Link(cfg, changes.append)
    shared = SharedLimits(link, list(specs), monotonic)
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


def refused_by_front(verdict: SharedVerdict | None, caller: str = "team") -> RateLimited:
    """What the gateway answers for a request that arrives with `verdict`: the front's Reject, worded."""
    front = Front(FrontParams(classes=default_classes(), backends=[BackendSpec("a", 4)]))
    [reject] = front.handle(Arrive("r", "interactive", 10, caller=caller, shared=verdict), 0.0)
    assert isinstance(reject, Reject) and reject.shared
    err = rejection(reject, caller=caller)
    assert isinstance(err, RateLimited)
    return err


async def test_a_reservation_takes_from_every_bucket_or_none_and_settles_to_real_use(tmp_path: Path) -> None:
    async with asyncio.timeout(20), redis_server(tmp_path) as server, \
            limits(server.url, CallerSpec("team", requests_per_minute=10, tokens_per_minute=1000)) as (shared, _):
        start = monotonic()
        verdict, held = await shared.reserve("team", 900)
        assert verdict == GRANTED and held is not None
        rpm, tpm = "tailguard:{team}:rpm", "tailguard:{team}:tpm"
        assert at(await bucket(server, tpm), 100, 1000, start)
        over, nothing = await shared.reserve("team", 300)  # 200 more than the bucket holds: neither bucket is touched
        assert nothing is None and over is not None and over.reason is RejectReason.RATE_LIMIT_TOKENS
        assert 11 - (monotonic() - start) < over.retry_after_s <= 12.1  # 200 tokens at 1000 a minute
        assert over.limit == 1000 and at((1000 - over.used, 0), 100, 1000, start)
        err = refused_by_front(over)
        assert err.status == 429 and err.type == "tokens"
        assert f"over all replicas: Limit 1000, Used {over.used}" in err.message
        assert at(await bucket(server, rpm), 9, 10, start, slack=0.01)  # only the first request taken
        shared.settle(held, 400, admitted=True)  # used 400 of its 900: 500 back
        await shared.close()
        assert at(await bucket(server, tpm), 600, 1000, start)
        _, again = await shared.reserve("team", 300)
        assert again is not None
        shared.settle(again, 0, admitted=False)  # never got in: its request and tokens go back
        await shared.close()
        assert at(await bucket(server, rpm), 9, 10, start, slack=0.01)  # not 8
        assert at(await bucket(server, tpm), 600, 1000, start)


def at(read: tuple[float, int], level: float, per_minute: float, since: float, slack: float = 1.0) -> bool:
    """Whether a bucket `read` holds `level`, give or take what refilled (at `per_minute`) since
    `since`: on a busy machine the steps of a test can be a second apart."""
    refilled = per_minute / 60 * (monotonic() - since)
    return level - slack <= read[0] <= level + refilled + slack


async def test_a_bucket_in_debt_is_kept_until_it_would_be_full_again(tmp_path: Path) -> None:
    async with asyncio.timeout(20), redis_server(tmp_path) as server, \
            limits(server.url, CallerSpec("team", tokens_per_minute=600)) as (shared, _):
        start = monotonic()
        _, held = await shared.reserve("team", 600)
        assert held is not None
        shared.settle(held, 1800, admitted=True)  # an estimate that fell 1200 short: debt
        await shared.close()
        read = await bucket(server, "tailguard:{team}:tpm")
        assert at(read, -1200, 600, start, slack=2)
        # 1800 tokens to refill at 10 a second, then a second more; counting down since it was set
        assert 180_000 - 1000 * (monotonic() - start) < read[1] <= 181_000
        verdict, _ = await shared.reserve("team", 1)
        assert verdict is not None and verdict.reason is RejectReason.RATE_LIMIT_TOKENS


@pytest.mark.parametrize("policy", ["local", "closed"])
async def test_while_redis_is_gone_a_replica_follows_its_policy_and_shares_again_when_it_returns(
        tmp_path: Path, policy: str) -> None:
    spec = CallerSpec("team", requests_per_minute=6)
    front = Front(FrontParams(classes=default_classes(), backends=[BackendSpec("a", 64)], callers=[spec]))
    n = 0

    async def arrive() -> object:
        """A request of `team` as the gateway sends it: its verdict from Redis, then the front."""
        nonlocal n
        n += 1
        verdict, _ = await shared.reserve("team", 10)
        [d] = front.handle(Arrive(f"r{n}", "interactive", 10, caller="team", shared=verdict), 0.01 * n)
        return d

    async with asyncio.timeout(30), redis_server(tmp_path) as server, \
            limits(server.url, spec, CallerSpec("free"), on_unavailable=policy, replicas=3, lease_s=0.3,
                   timeout_s=0.5) as (shared, changes):
        assert isinstance(await arrive(), Start)
        await server.kill()
        first = await shared.reserve("team", 10)
        assert changes == [False]
        front.handle(LocalShare(shared.local_share()), 0.01 * n)  # what the gateway tells its front on the change
        if policy == "closed":
            assert first == (SharedVerdict(RejectReason.SHARED_STATE_UNAVAILABLE, 1.0), None)
            gone = await arrive()
            assert isinstance(gone, Reject) and gone.reason is RejectReason.SHARED_STATE_UNAVAILABLE
            assert rejection(gone).status == 503
        else:  # a third of 6 a minute: the bucket shrinks to 2 here, then this replica's share is spent
            assert first == (None, None) and shared.local_share() == 3
            assert isinstance(await arrive(), Start) and isinstance(await arrive(), Start)
            over = await arrive()
            assert isinstance(over, Reject) and over.reason is RejectReason.RATE_LIMIT_REQUESTS and not over.shared
        assert await shared.reserve("free", 10) == (None, None)  # a caller without limits never asks Redis
        await server.start()  # back, empty: the heartbeat finds it within a third of a lease
        async with asyncio.timeout(5):
            while changes != [False, True]:
                await asyncio.sleep(0.02)
        assert shared.local_share() is None
        verdict, held_again = await shared.reserve("team", 10)
        assert verdict == GRANTED and held_again is not None


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
        start = monotonic()
        (_, first), (_, second) = await one.reserve("team", 10), await two.reserve("team", 10)
        assert first is not None and first.place and second is not None and second.place
        over, nothing = await one.reserve("team", 10)  # two in flight over the two replicas: no third anywhere
        assert over is not None and over.reason is RejectReason.RATE_LIMIT_PARALLEL and nothing is None
        err = refused_by_front(over)
        assert err.status == 429 and err.type == "requests"
        assert "max_parallel_requests" in err.message and "over all replicas" in err.message
        assert err.headers["X-Tailguard-Reject-Reason"] == "rate_limit_parallel"
        assert at(await bucket(server, "tailguard:{team}:rpm"), 98, 100, start, slack=0.01)  # not 97
        two.settle(second, 5, admitted=True)  # its place back, on the other replica
        await two.close()
        _, third = await one.reserve("team", 10)
        assert third is not None


async def test_a_place_is_held_while_renewed_and_comes_back_a_lease_after_its_replica_died(tmp_path: Path) -> None:
    """A replica renews its places every third of a lease while they run; one that dies (its
    renewals stop, its settlement never comes) holds them one lease at most."""
    lease_s = 0.6
    spec = CallerSpec("team", max_parallel=1)
    async with asyncio.timeout(20), redis_server(tmp_path) as server, \
            limits(server.url, spec, lease_s=lease_s) as (alive, _), \
            limits(server.url, spec, lease_s=lease_s) as (other, _):
        _, held = await alive.reserve("team", 10)
        assert held is not None
        await asyncio.sleep(3 * lease_s)  # three leases: renewed, still held
        assert (await other.reserve("team", 10))[1] is None
        await stop(alive._task)  # its renewals stop as a killed replica's would; the place is left in Redis
        died = asyncio.get_running_loop().time()
        while (await other.reserve("team", 10))[1] is None:
            await asyncio.sleep(0.02)
        waited = asyncio.get_running_loop().time() - died
        assert waited < lease_s + 0.3  # at most a lease (and slack for a busy machine)


async def test_the_standing_is_the_shared_buckets_with_what_other_replicas_took(tmp_path: Path) -> None:
    spec = CallerSpec("team", requests_per_minute=60, tokens_per_minute=6000)
    async with asyncio.timeout(20), redis_server(tmp_path) as server, \
            limits(server.url, spec) as (one, _), limits(server.url, spec) as (two, _):
        assert two.standing("team") is None  # nothing seen here yet: the front's own buckets say it
        start = monotonic()
        for _ in range(3):
            assert (await one.reserve("team", 1000))[1] is not None
        _, held = await two.reserve("team", 500)
        assert held is not None
        standing = two.standing("team")
        assert standing is not None
        requests, tokens = standing
        assert requests is not None and requests.limit == 60 and requests.remaining == 56
        assert tokens is not None and tokens.limit == 6000 and at((tokens.remaining, 0), 2500, 6000, start)
        assert tokens.reset_s == pytest.approx((6000 - tokens.remaining) / 100, abs=0.2)  # at 100 a second
        two.settle(held, 100, admitted=True)  # 400 back, and the answer is seen too
        await two.close()
        _, after = two.standing("team") or (None, None)
        assert after is not None and at((after.remaining, 0), 2900, 6000, start)


async def test_while_redis_is_gone_the_front_holds_this_replicas_share_of_the_callers_places(tmp_path: Path) -> None:
    spec = CallerSpec("team", max_parallel=4)
    front = Front(FrontParams(classes=default_classes(), backends=[BackendSpec("a", 64)], callers=[spec]))
    async with asyncio.timeout(20), redis_server(tmp_path) as server, \
            limits(server.url, spec, replicas=2, timeout_s=0.5) as (shared, changes):
        await server.kill()
        assert await shared.reserve("team", 10) == (None, None)
        assert changes == [False]
        front.handle(LocalShare(shared.local_share()), 0.0)
        decided = [front.handle(Arrive(f"r{i}", "interactive", 10, caller="team"), 0.0)[0] for i in range(3)]
        assert [type(d) for d in decided] == [Start, Start, Reject]  # half of 4 here
        refused = decided[2]
        assert isinstance(refused, Reject)
        assert rejection(refused, caller="team").headers["X-Tailguard-Reject-Reason"] == "rate_limit_parallel"
        front.handle(Finished("r0", Outcome.SUCCESS, 10), 0.1)
        assert isinstance(front.handle(Arrive("r3", "interactive", 10, caller="team"), 0.1)[0], Start)  # its place back
