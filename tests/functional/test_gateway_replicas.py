"""Two gateway replicas (real `tailguard serve` processes) in front of one simulator, sharing a
real `redis-server` (`state: {url: ...}`): one caller's `tpm_limit` is one limit over both, as
a client sees it through the real `openai` package. Without Redis each replica gives the caller
its whole limit, so the same burst gets about twice as much through: the check can fail."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tests.functional.gateway_processes import GatewayProcess, gateway_process, replicas
from tests.functional.gateways import sample, scrape, until
from tests.functional.redis_server import redis_server
from tests.functional.sim_processes import sim_process

CHAT = [{"role": "user", "content": "hi"}]
TPM = 3000
MAX_TOKENS = 100
PER_REPLICA = 40  # 80 requests of about 100 tokens each: over twice the limit


def replica_config(sim_url: str, redis_url: str | None, **state: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "backends": [{"name": "sim", "url": sim_url, "max_concurrency": 8}],
        "auth": {"api_keys": {"sk-team": {"name": "team", "tpm_limit": TPM}}},
        "access_log": False,
    }
    if redis_url is not None:
        cfg["state"] = {"url": redis_url, **state}
    return cfg


async def burst(gateways: list[GatewayProcess], per_replica: int) -> tuple[int, int, int]:
    """`per_replica` requests at once to each replica: (tokens used by those served, served,
    refused with OpenAI's 429 for tokens)."""
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(AsyncOpenAI(base_url=f"{g.url}/v1", api_key="sk-team",
                                                               max_retries=0)) for g in gateways]

        async def one(c: AsyncOpenAI) -> int | None:
            try:
                r = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=MAX_TOKENS)
            except openai.RateLimitError as err:
                assert err.type == "tokens" and err.code == "rate_limit_exceeded"
                assert err.response.headers["x-tailguard-reject-reason"] == "rate_limit_tokens"
                return None
            assert r.usage is not None and r.usage.completion_tokens == MAX_TOKENS
            return r.usage.total_tokens

        used = await asyncio.gather(*(one(c) for c in clients for _ in range(per_replica)))
    served = [u for u in used if u is not None]
    return sum(served), len(served), len(used) - len(served)


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "alone"])
async def test_two_replicas_sharing_redis_enforce_one_tpm_limit(tmp_path: Path, shared: bool) -> None:
    async with asyncio.timeout(60), AsyncExitStack() as stack:
        redis = await stack.enter_async_context(redis_server(tmp_path))
        sim = await stack.enter_async_context(sim_process("--max-num-seqs", "16"))
        gateways = await replicas(stack, tmp_path, replica_config(sim.url, redis.url if shared else None))
        started = time.monotonic()
        used, served, refused = await burst(gateways, PER_REPLICA)
        elapsed = time.monotonic() - started
    one_reservation = MAX_TOKENS + 16  # its capped max_tokens and a prompt estimate of "hi" with room
    bound = TPM + one_reservation + TPM / 60 * elapsed  # the bucket refills while the burst runs
    print(f"shared={shared}: {served} served ({used} tokens), {refused} refused in {elapsed:.2f} s; bound {bound:.0f}")
    if shared:
        assert used <= bound and refused > 0
        assert used >= TPM - 2 * one_reservation  # the limit is used, not refused early
    else:  # each replica alone lets the caller have its whole limit
        assert used > 1.5 * TPM


async def shared_gauge(gw: GatewayProcess) -> float:
    return sample(await scrape(gw.url), "tailguard_state_shared")


@pytest.mark.parametrize("policy", ["local", "closed"])
async def test_redis_killed_mid_run_then_back_follows_the_policy_says_so_and_shares_again(
        tmp_path: Path, policy: str) -> None:
    async with asyncio.timeout(60), AsyncExitStack() as stack:
        redis = await stack.enter_async_context(redis_server(tmp_path))
        sim = await stack.enter_async_context(sim_process("--max-num-seqs", "16"))
        cfg = replica_config(sim.url, redis.url, on_unavailable=policy, replicas=2, lease_s=0.6, timeout_s=0.5)
        gw = await stack.enter_async_context(gateway_process(tmp_path, cfg))
        assert await shared_gauge(gw) == 1
        _, served, _ = await burst([gw], 4)
        assert served == 4
        await redis.kill()
        if policy == "closed":
            async with AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="sk-team", max_retries=0) as c:
                with pytest.raises(openai.InternalServerError) as gone:
                    await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=MAX_TOKENS)
            assert gone.value.status_code == 503 and gone.value.code == "shared_state_unavailable"
            assert "Redis" in gone.value.message
        else:  # this replica's half of the limit, fresh: about 1500 tokens, then 429s
            started = time.monotonic()
            used, served, refused = await burst([gw], 30)
            bound = TPM / 2 + MAX_TOKENS + 16 + TPM / 2 / 60 * (time.monotonic() - started)
            print(f"redis down, local half: {served} served ({used} tokens), {refused} refused; bound {bound:.0f}")
            assert TPM / 2 - 2 * (MAX_TOKENS + 16) <= used <= bound and refused > 0
        assert await shared_gauge(gw) == 0
        await redis.start()  # back, empty
        back = time.monotonic()

        async def shared_again() -> bool:
            return await shared_gauge(gw) == 1
        await until(shared_again, step_s=0.05)
        print(f"shared again {time.monotonic() - back:.2f} s after Redis restarted (lease 0.6 s)")
        _, served, _ = await burst([gw], 4)
        assert served == 4
        assert gw.logged("Redis is unavailable") == 1 and gw.logged("shared state is back") == 1


async def test_a_replica_killed_with_sigkill_stops_being_counted_within_its_lease(tmp_path: Path) -> None:
    from redis import asyncio as aioredis

    async def alive(r: aioredis.Redis) -> int:
        """Replicas whose heartbeat lease has not expired, by Redis's own clock."""
        sec, usec = await r.time()
        return int(await r.zcount("tailguard:replicas", f"({sec * 1000 + usec // 1000}", "+inf"))

    async with asyncio.timeout(60), AsyncExitStack() as stack:
        redis = await stack.enter_async_context(redis_server(tmp_path))
        r = await stack.enter_async_context(aioredis.Redis.from_url(redis.url))
        sim = await stack.enter_async_context(sim_process())
        gateways = await replicas(stack, tmp_path, replica_config(sim.url, redis.url, lease_s=0.6))
        while await alive(r) != 2:
            await asyncio.sleep(0.02)
        gateways[1].kill()
        killed = time.monotonic()
        while await alive(r) != 1:
            await asyncio.sleep(0.02)
        gone_s = time.monotonic() - killed
        print(f"a SIGKILLed replica stopped being counted {gone_s:.2f} s later (lease 0.6 s)")
        assert gone_s <= 0.6 + 0.2
