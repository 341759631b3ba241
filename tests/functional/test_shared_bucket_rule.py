"""One bucket rule: the front's `CallerLimits` (the rule, in Python) and the Lua scripts that keep the
same buckets in a real `redis-server` for replicas (`gateway.shared.scripts`, the one other copy),
given the same reservations and settlements of one caller, let in and refuse the same requests,
for the same limit, and leave the same levels (to within what refills between the two clocks:
the Lua reads Redis's `TIME`, the Python the time this test tells it)."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from tailguard.clock import monotonic
from tailguard.config import StateConfig
from tailguard.front.limits import CallerLimits
from tailguard.front.params import CallerSpec
from tailguard.gateway.shared.limits import GRANTED, Held, SharedLimits
from tailguard.gateway.shared.link import Link
from tests.functional.redis_server import redis_server

# 120 requests and 6,000 tokens a minute: 2 requests and 100 tokens refill a second, so the few
# milliseconds between the two copies' reads move no decision (needs are whole numbers).
SPEC = CallerSpec("team", requests_per_minute=120, tokens_per_minute=6000, max_parallel=5)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_lua_scripts_decide_as_the_front_s_buckets_do(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    rule = CallerLimits([SPEC])
    held: list[tuple[Held, int]] = []  # in Redis, and what the rule holds for the same request
    agreed = refused = 0
    async with asyncio.timeout(60), redis_server(tmp_path) as server:
        link = Link(StateConfig(url=server.url, lease_s=60.0), lambda up: None)
        shared = SharedLimits(link, [SPEC], monotonic)
        t0 = time.monotonic()
        try:
            for _ in range(150):
                if held and rng.random() < 0.4:  # one in flight ends, having used some of it
                    h, mine = held.pop(rng.randrange(len(held)))
                    used = rng.randint(0, 2 * h.tokens)
                    shared.settle(h, used, admitted=True)
                    await shared.close()  # the settlement reached Redis
                    rule.settle("team", mine, used, time.monotonic() - t0)
                    continue
                need = rng.randint(1, 1500)
                before = time.monotonic() - t0
                verdict, h = await shared.reserve("team", need)
                now = time.monotonic() - t0
                # Redis decided at an instant between `before` and `now`: on a loaded machine the
                # two can be far apart, and what refills in between is the only difference allowed.
                late = now - before
                refusal = rule.refusal("team", need, now)
                if verdict != GRANTED and refusal is None:  # a refill came due while Redis answered
                    refusal = rule.refusal("team", need, before)
                assert (verdict == GRANTED) == (refusal is None), (verdict, refusal)
                if refusal is None:
                    assert h is not None
                    held.append((h, rule.take("team", need, now)))
                else:
                    assert verdict is not None and verdict.reason is refusal.reason
                    assert verdict.retry_after_s == pytest.approx(refusal.retry_after_s, abs=0.1 + late)
                    refused += 1
                agreed += 1
                requests, tokens = rule.standing("team", now)
                seen = shared.standing("team")
                assert seen is not None and requests is not None and tokens is not None
                assert abs(seen[0].remaining - requests.remaining) <= 1 + 2 * late  # type: ignore[union-attr]
                assert abs(seen[1].remaining - tokens.remaining) <= 2 + 100 * late  # type: ignore[union-attr]
        finally:
            await shared.close()
            await link.close()
    assert agreed > 50 and refused > 5  # both ways were met
