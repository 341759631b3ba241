"""Adaptive caps over HTTP (issue 16, point 7): a real simulator that runs 8 sequences at once
behind a gateway whose cap on it is `adaptive`; the cap it learns from the requests' latency is
what /health and /metrics say, started above what the engine runs (it falls) and below (it rises)."""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

import aiohttp
import pytest

from tailguard.config import BackendConfig
from tailguard.sim.server import running_sim
from tests.functional.gateways import SCALE, engine, gateway, health, sample, scrape

HC = {"interval_s": 0.5}


async def chats(url: str, n: int, concurrency: int, every: int = 25) -> list[int]:
    """`n` streamed chats of 32 tokens, `concurrency` at a time; each must succeed. Returns the
    cap /health says after each `every` of them has ended (read by the request that completes
    the count, so the readings follow the load, not a timer)."""
    sem = asyncio.Semaphore(concurrency)
    body: dict[str, Any] = {"model": "tailguard-sim", "messages": [{"role": "user", "content": "x " * 200}], "max_tokens": 32,
                            "stream": True}
    done = 0
    caps: list[int] = []

    async def one(s: aiohttp.ClientSession) -> None:
        nonlocal done
        async with sem, s.post(f"{url}/v1/chat/completions", json=body) as r:
            assert r.status == 200
            await r.read()
        done += 1
        if done % every == 0:
            caps.append((await health(url))["backends"]["sim"]["cap"])

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(one(s) for _ in range(n)))
    return caps


@pytest.mark.parametrize(("start", "moves"), [(32, "falls"), (2, "rises")])
async def test_the_cap_learns_from_latency_and_is_said_in_health_and_metrics(start: int, moves: str) -> None:
    """Where the cap stands over the load (the median of its readings), not its last value: the
    cap keeps moving about the engine's level (on a 2-core machine, 12-47 for an engine of 8
    started at 32), and where it stops as the load drains is a matter of phase. Ten chats one at a
    time come first, as a gateway serves before a load arrives: they teach the cap the engine's
    latency alone. Without them, a cap started at 32 under the load takes its first samples, the
    long-term average's plain mean, from a congested engine, reads the congestion as normal and
    rises before it falls (a median of 43 was seen)."""
    async with asyncio.timeout(60), running_sim(engine(max_num_seqs=8), time_scale=SCALE) as sim:
        backend = BackendConfig.model_validate({"name": "sim", "url": sim.url, "kind": "sim", "max_concurrency": start,
                                                "adaptive": {"min": 2, "max": 64}})
        async with gateway(sims=0, extra_backends=[backend], health=HC) as gw:
            assert (await health(gw.url))["backends"]["sim"]["cap"] == start
            await chats(gw.url, 10, 1)
            level = statistics.median(await chats(gw.url, 300, 48))
            assert (level < start) if moves == "falls" else (level > start), level
            cap = (await health(gw.url))["backends"]["sim"]["cap"]
            assert sample(await scrape(gw.url), "tailguard_backend_concurrency_limit", backend="sim") == cap
