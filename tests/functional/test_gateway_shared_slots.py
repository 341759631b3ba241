"""Two gateway replicas (real `tailguard serve` processes) sharing one backend's
`max_concurrency` through a real `redis-server`: the engine (the simulator, read from its own
`vllm:num_requests_running` gauge) never runs more than the cap, however the requests are spread
over the replicas; without Redis it runs twice the cap, so the check can fail. A replica killed
with SIGKILL gives its slots back within its lease."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from tests.functional.gateway_processes import GatewayProcess, replicas
from tests.functional.redis_server import redis_server
from tests.functional.sim_processes import sim_process

CHAT = [{"role": "user", "content": "hi"}]
CAP = 4
SCALE = 0.2  # slow enough that a request runs long enough to be seen running


def config(sim_url: str, redis_url: str | None, lease_s: float = 5.0) -> dict[str, Any]:
    cfg: dict[str, Any] = {"backends": [{"name": "sim", "url": sim_url, "max_concurrency": CAP}], "access_log": False}
    if redis_url is not None:
        cfg["state"] = {"url": redis_url, "lease_s": lease_s}
    return cfg


class Running:
    """The engine's own count of running requests, polled every 5 ms: its highest and its history."""

    def __init__(self, sim_url: str) -> None:
        self.url = f"{sim_url}/metrics"
        self.seen: list[tuple[float, int]] = []

    @property
    def most(self) -> int:
        return max((n for _, n in self.seen), default=0)

    async def poll(self) -> None:
        async with aiohttp.ClientSession() as s:
            while True:
                async with s.get(self.url) as r:
                    text = await r.text()
                n = next(int(float(line.split()[-1])) for line in text.splitlines()
                         if line.startswith("vllm:num_requests_running"))
                self.seen.append((time.monotonic(), n))
                await asyncio.sleep(0.005)


async def requests(gw: GatewayProcess, n: int, max_tokens: int) -> list[int]:
    """`n` requests at once to `gw`; each one's completion tokens."""
    async with AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="k", max_retries=0, timeout=60) as c:
        async def one() -> int:
            r = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=max_tokens)
            assert r.usage is not None
            return r.usage.completion_tokens
        return await asyncio.gather(*(one() for _ in range(n)))


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "alone"])
async def test_two_replicas_never_run_more_than_the_backends_cap_on_the_engine(tmp_path: Path, shared: bool) -> None:
    async with asyncio.timeout(60), AsyncExitStack() as stack:
        redis = await stack.enter_async_context(redis_server(tmp_path))
        sim = await stack.enter_async_context(sim_process("--max-num-seqs", "16", time_scale=SCALE))
        gateways = await replicas(stack, tmp_path, config(sim.url, redis.url if shared else None))
        running = Running(sim.url)
        poller = asyncio.create_task(running.poll())
        try:
            started = time.monotonic()
            done = await asyncio.gather(*(requests(g, 12, 40) for g in gateways))
            elapsed = time.monotonic() - started
        finally:
            poller.cancel()
    print(f"shared={shared}: the engine ran at most {running.most} at once (cap {CAP}); 24 requests in {elapsed:.2f} s")
    assert all(t == 40 for ts in done for t in ts)  # every request served
    if shared:
        assert running.most == CAP  # the cap is used, never passed
    else:  # each replica alone lets its whole cap in
        assert running.most > CAP


async def test_a_replica_killed_with_sigkill_gives_its_slots_back_within_its_lease(tmp_path: Path) -> None:
    lease_s = 0.6
    async with asyncio.timeout(60), AsyncExitStack() as stack:
        redis = await stack.enter_async_context(redis_server(tmp_path))
        sim = await stack.enter_async_context(sim_process("--max-num-seqs", "16", time_scale=SCALE))
        gateways = await replicas(stack, tmp_path, config(sim.url, redis.url, lease_s))
        holder, waiter = gateways
        running = Running(sim.url)
        poller = asyncio.create_task(running.poll())
        try:
            long = asyncio.create_task(requests(holder, CAP, 4000))  # holds every slot for seconds
            while running.most < CAP:
                await asyncio.sleep(0.01)
            short = asyncio.create_task(requests(waiter, CAP, 20))
            await asyncio.sleep(0.3)
            assert not short.done()  # no slot free for the other replica
            holder.kill()
            killed = time.monotonic()
            assert await short == [20] * CAP
            served_s = time.monotonic() - killed
            with pytest.raises(Exception):
                await long  # its gateway died
        finally:
            poller.cancel()
    print(f"the killed replica's slots served the other's requests {served_s:.2f} s later (lease {lease_s} s); "
          f"the engine ran at most {running.most}")
    assert running.most <= CAP
    assert served_s < lease_s + 1.0  # the lease, a renewal, and the short requests themselves
