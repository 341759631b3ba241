"""`gateway.shared.fair`: two replicas' fair-share counters kept as one set in a real
`redis-server`. Each replica's `VirtualCounters` (the front's own object) gives its service and
absorbs the other's; service given while Redis is gone reaches the other once Redis is back,
and a Redis restarted empty costs no counter what it had."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from redis import asyncio as aioredis

from tailguard.front.fairshare import VirtualCounters
from tailguard.config import StateConfig
from tailguard.gateway.shared.fair import SharedFairShare
from tailguard.gateway.shared.link import Link
from tests.functional.redis_server import redis_server


@asynccontextmanager
async def replica(url: str) -> AsyncIterator[tuple[VirtualCounters, SharedFairShare]]:
    link = Link(StateConfig(url=url, lease_s=0.3, timeout_s=0.5), lambda up: None)
    link.start()
    vtc = VirtualCounters(credit=0.0)
    fair = SharedFairShare(link, vtc.take_served, vtc.absorb, lambda: True)
    try:
        yield vtc, fair
    finally:
        await fair.close()
        await link.close()


async def test_each_replica_counts_the_others_service_and_keeps_it_across_a_redis_restart(tmp_path: Path) -> None:
    async with asyncio.timeout(30), redis_server(tmp_path) as server, \
            replica(server.url) as (one, one_fair), replica(server.url) as (two, two_fair):
        one.dispatched("r1", "flood", prompt_tokens=200, output_tokens=100)  # 400
        two.dispatched("r2", "quiet", prompt_tokens=10, output_tokens=5)  # 20
        await one_fair.exchange()
        await two_fair.exchange()
        await one_fair.exchange()
        assert (one.counter("flood"), one.counter("quiet")) == (400.0, 20.0)
        assert (two.counter("flood"), two.counter("quiet")) == (400.0, 20.0)

        one.ended("r1", used_tokens=250)  # 200 + 2 x 50 = 300: a correction of -100
        await one_fair.exchange()
        await two_fair.exchange()
        assert two.counter("flood") == 300.0

        await server.kill()
        one.dispatched("r3", "flood", prompt_tokens=50, output_tokens=0)  # given while Redis is gone
        await one_fair.exchange()
        assert not one_fair.link.shared and one.counter("flood") == 350.0
        await server.start()  # back, empty
        async with asyncio.timeout(5):  # each heartbeat finds it within a third of a lease
            while not (one_fair.link.shared and two_fair.link.shared):
                await asyncio.sleep(0.02)
        await one_fair.exchange()  # the kept 50 reach the new hash
        await two_fair.exchange()
        await one_fair.exchange()
        assert (one.counter("flood"), one.counter("quiet")) == (350.0, 20.0)
        assert (two.counter("flood"), two.counter("quiet")) == (350.0, 20.0)


async def test_without_fair_share_an_exchange_with_nothing_to_add_asks_redis_nothing(tmp_path: Path) -> None:
    async with asyncio.timeout(20), redis_server(tmp_path) as server, \
            aioredis.Redis.from_url(server.url) as r:
        link = Link(StateConfig(url=server.url, lease_s=30.0, timeout_s=0.5), lambda up: None)
        vtc = VirtualCounters()
        fair = SharedFairShare(link, vtc.take_served, vtc.absorb, lambda: False)
        try:
            before = await r.info("commandstats")
            for _ in range(3):
                await fair.exchange()
            idle = await r.info("commandstats")
            vtc.dispatched("r1", "a", prompt_tokens=10, output_tokens=0)  # service left from before a reload
            await fair.exchange()
            after = await r.info("commandstats")
        finally:
            await fair.close()
            await link.close()
    assert _calls(idle) == _calls(before)  # not one command but our own INFO
    assert _calls(after) > _calls(idle)


def _calls(stats: dict[str, dict[str, int]]) -> int:
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
