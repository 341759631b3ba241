"""`gateway.shared.usage`: each replica's usage rows added into a real `redis-server`, so either
replica's meter answers for both; while Redis is gone a meter answers for itself and keeps the
rows it could not add, which reach Redis with its next write once Redis is back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tailguard.config import StateConfig
from tailguard.gateway.ops.metering import Meter
from tailguard.gateway.request import Request
from tailguard.gateway.shared.link import Link
from tailguard.gateway.shared.usage import SharedUsage
from tailguard.types import Outcome
from tests.functional.redis_server import redis_server

NOW = 1_800_000_030.0


def ended(caller: str, *, prompt: int = 10, output: int = 5, outcome: Outcome = Outcome.SUCCESS,
          reason: str | None = None) -> Request:
    t = Request("r", arrived_at=100.0, cls="interactive", caller=caller, model="tailguard-sim", prompt_tokens=prompt,
                output_tokens=output)
    t.upstream_headers_at, t.first_content_at, t.finished_at = 100.1, 100.25, 101.0
    t.outcome, t.reason = outcome, reason
    return t


@asynccontextmanager
async def replica_meter(url: str) -> AsyncIterator[Meter]:
    """A replica's meter (in memory) whose writes are also added into Redis."""
    link = Link(StateConfig(url=url, lease_s=0.3, timeout_s=0.5), lambda up: None)
    link.start()
    meter = Meter(None, clock=lambda: NOW)
    meter.shared = SharedUsage(link)
    try:
        yield meter
    finally:
        await meter.close()
        await link.close()


def figures(rows: list[dict[str, object]]) -> dict[object, tuple[object, ...]]:
    return {r["caller"]: (r["requests"], r["prompt_tokens"], r["output_tokens"], r["outcomes"], r["rejections"])
            for r in rows}


async def test_either_replica_answers_for_both_and_for_itself_while_redis_is_gone(tmp_path: Path) -> None:
    async with asyncio.timeout(20), redis_server(tmp_path) as server, \
            replica_meter(server.url) as one, replica_meter(server.url) as two:
        one.record(ended("team-a"))
        two.record(ended("team-a", prompt=20, output=7))
        two.record(ended("team-b", outcome=Outcome.REJECTED, reason="rate_limit_tokens", output=0))
        await two.flush()  # the other replica's periodic write
        rows, scope = await one.usage(None, None, None)
        assert scope == "replicas"
        assert figures(rows) == {"team-a": (2, 30, 12, {"success": 2}, {}),
                                 "team-b": (1, 10, 0, {"rejected": 1}, {"rate_limit_tokens": 1})}
        a = rows[0]  # team-a
        assert a["mean_e2e_s"] == 1.0 and a["mean_ttft_s"] == 0.25
        assert [r["caller"] for r in (await one.usage(None, None, "team-b"))[0]] == ["team-b"]
        assert (await one.usage(NOW + 60, None, None))[0] == []  # a later minute: nothing

        await server.kill()
        two.record(ended("team-a"))
        await two.flush()  # Redis gone: kept for the next write
        rows, scope = await two.usage(None, None, "team-a")
        assert scope == "replica" and figures(rows)["team-a"][0] == 2  # its own file: its 1 + this one
        await server.start()  # back, empty
        while not all(m.shared is not None and m.shared.link.shared for m in (one, two)):
            await asyncio.sleep(0.02)  # each replica's heartbeat finds it
        await two.flush()  # the kept row reaches Redis with the next write, and two's rows again
        rows, scope = await one.usage(None, None, None)  # one's write finds Redis emptied: its rows again
        assert scope == "replicas"
        assert figures(rows) == {"team-a": (3, 40, 17, {"success": 3}, {}),
                                 "team-b": (1, 10, 0, {"rejected": 1}, {"rate_limit_tokens": 1})}
        await two.flush()
        assert figures((await one.usage(None, None, None))[0])["team-a"][0] == 3  # once, not again
