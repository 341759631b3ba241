"""`gateway.shared.slots`: the allotment script against a real `redis-server`, renewal by
renewal: what two replicas hold never adds up to more than the cap, a replica that runs more
than its part comes down to it, a replica that stops renewing gives its slots back a lease later,
and a renewal is one round trip whatever the number of backends."""

from __future__ import annotations

import asyncio
from pathlib import Path

from redis import asyncio as aioredis

from tailguard.clock import monotonic
from tailguard.config import StateConfig
from tailguard.gateway.shared.link import Link
from tailguard.gateway.shared.slots import SlotLeases
from tests.functional.redis_server import redis_server

CAP = 4


class Replica:
    """A replica's leases with its counts set by hand: (running, waiting) per backend."""

    def __init__(self, url: str, backends: tuple[str, ...] = ("gpu",)) -> None:
        self.link = Link(StateConfig(url=url, lease_s=0.3), lambda up: None)
        self.counts = {b: (0, 0) for b in backends}
        self.caps: dict[str, int | None] = {}
        self.leases = SlotLeases(self.link, lambda: {b: CAP for b in backends}, self.counts.__getitem__,
                                 self.caps.__setitem__, monotonic)

    async def renew(self, running: int, waiting: int, backend: str = "gpu") -> int | None:
        self.counts[backend] = (running, waiting)
        await self.leases.renew()
        return self.caps[backend]

    async def close(self) -> None:
        await self.leases.close()
        await self.link.close()


async def test_two_replicas_hold_the_cap_between_them_fairly_and_a_silent_one_gives_it_back(tmp_path: Path) -> None:
    async with asyncio.timeout(20), redis_server(tmp_path) as server:
        a, b = Replica(server.url), Replica(server.url)
        try:
            assert await a.renew(0, 8) == CAP  # alone: the whole cap
            assert await b.renew(0, 8) == 0  # a wants 8 too and holds all 4: nothing is free
            assert await a.renew(4, 4) == 2  # its part is 2: it starts nothing until it runs 2
            assert a.leases.held["gpu"] == 4  # what it runs is still counted as its
            assert await b.renew(0, 8) == 0
            assert await a.renew(2, 4) == 2  # down to its part: it holds 2
            assert await b.renew(0, 8) == 2  # the 2 freed are b's
            assert a.leases.held["gpu"] + b.leases.held["gpu"] == CAP
            assert await a.renew(0, 0) == 0  # a has nothing to do: it holds nothing
            assert await b.renew(2, 6) == CAP
            # a renews no more (killed): its lease runs out, and what it held is free again
            assert await a.renew(0, 8) == 0
            await asyncio.sleep(0.35)
            assert await b.renew(4, 4) == CAP and b.leases.held["gpu"] == CAP
        finally:
            await a.close()
            await b.close()


async def test_a_renewal_is_one_round_trip_for_every_backend(tmp_path: Path) -> None:
    async with asyncio.timeout(20), redis_server(tmp_path) as server, aioredis.Redis.from_url(server.url) as r:
        replica = Replica(server.url, ("gpu-a", "gpu-b", "gpu-c"))
        try:
            await replica.leases.renew()  # Redis learns the script (NOSCRIPT, then SCRIPT LOAD)
            before = await r.info("commandstats")
            for _ in range(5):
                await replica.leases.renew()
            after = await r.info("commandstats")
            assert replica.caps == {"gpu-a": 0, "gpu-b": 0, "gpu-c": 0}  # nothing asked, nothing held
        finally:
            await replica.close()
    calls = {k: int(after[k]["calls"]) - int(before.get(k, {"calls": 0})["calls"]) for k in after}
    assert calls["cmdstat_evalsha"] == 5 * 3  # one script call per backend per renewal
    assert not calls.get("cmdstat_script") and not calls.get("cmdstat_ping")  # nothing else asked first


async def test_the_des_model_of_the_allotment_answers_as_the_script_does(tmp_path: Path) -> None:
    """`front.leases.SlotStore` (the rule; the DES runs it) and the Lua script, given the same renewals
    of three replicas (random demands and running counts), answer alike every time."""
    import random

    from tailguard.front.leases import SlotStore

    rng = random.Random(7)
    store = SlotStore(CAP)
    async with asyncio.timeout(30), redis_server(tmp_path) as server:
        replicas = [Replica(server.url) for _ in range(3)]
        try:
            for r in replicas:
                r.link.cfg = r.link.cfg.model_copy(update={"lease_s": 60.0})  # no lease runs out here
            for _ in range(150):
                i = rng.randrange(3)
                running, waiting = rng.randint(0, CAP), rng.randint(0, 6)
                cap = await replicas[i].renew(running, waiting)
                expected = store.renew(i, running + waiting, running, 0.0, 60.0)
                assert (replicas[i].leases.held["gpu"], cap) == expected
        finally:
            for r in replicas:
                await r.close()
