"""Health that tells the truth from the first probe (issue 22, point 1): a dead or mistyped backend
is said at once, in the log and in /health, instead of looking healthy until enough probes have
failed to take it out; a backend whose kind cannot be detected says what protection that implies."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from aiohttp import web

from openai import AsyncOpenAI, InternalServerError

from tailguard.config import BackendConfig
from tailguard.sim.fault import Faults
from tailguard.sim.server import running_sim
from tests.functional.gateways import dead_url, engine, gateway, health, until
from tests.functional.raw_servers import never_answers, raw_server
from tests.servers import running

HC = {"interval_s": 0.2, "timeout_s": 0.5, "unhealthy_after": 3}


def _said(caplog: pytest.LogCaptureFixture, backend: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "tailguard.gateway" and r.getMessage().startswith(f"backend {backend} ")]


async def test_a_dead_backend_is_said_at_its_first_probe_and_health_is_degraded(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tailguard.gateway")
    dead = dead_url()
    async with asyncio.timeout(30), gateway(extra_backends=[BackendConfig(name="dead", url=dead)], health=HC) as gw:
        async def first_probes_in() -> bool:
            return bool(_said(caplog, "dead")) and bool(_said(caplog, "sim0"))
        await until(first_probes_in)
        h = await health(gw.url)
        # One probe failed: it still takes requests (a blip is not an outage), but it is not healthy.
        assert h["status"] == "degraded" and h["backends"]["dead"]["state"] == "failing"
        assert h["backends"]["sim0"]["state"] == "healthy"

        async def out() -> bool:
            return bool((await health(gw.url))["backends"]["dead"]["state"] == "unhealthy")
        await until(out)
        h = await health(gw.url)
        assert h["status"] == "degraded" and h["backends"]["dead"]["healthy"] is False
    [dead_line] = [line for line in _said(caplog, "dead") if f"({dead})" in line]  # said once, at its first probe
    assert "not reachable" in dead_line and "Connect" in dead_line
    assert "after 3 failed probes" in dead_line
    [sim_line] = _said(caplog, "sim0")
    assert "reachable, kind sim" in sim_line and "running" in sim_line  # the engine's own count


async def test_only_an_unreachable_gateway_is_unavailable() -> None:
    async with asyncio.timeout(30), gateway(sims=0, extra_backends=[BackendConfig(name="dead", url=dead_url())],
                                            health={**HC, "unhealthy_after": 1}) as gw:
        async def down() -> bool:
            return bool((await health(gw.url))["status"] == "unavailable")
        await until(down)


async def test_a_server_of_no_known_kind_says_what_protection_it_gets(caplog: pytest.LogCaptureFixture) -> None:
    """A plain OpenAI-style server (a proxy, a hosted API) answers, but no engine's page: the
    gateway says it treats it as `openai` and what that means, once."""
    caplog.set_level(logging.INFO, logger="tailguard.gateway")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    plain = web.Application()
    plain.router.add_get("/v1/models", models)
    async with asyncio.timeout(30), running(plain) as url, \
            gateway(sims=0, extra_backends=[BackendConfig(name="plain", url=url, max_concurrency=4)], health=HC) as gw:
        async def said() -> bool:
            return len(_said(caplog, "plain")) >= 2
        await until(said)
        await asyncio.sleep(3 * HC["interval_s"])  # more probes: nothing is said again
        assert (await health(gw.url))["backends"]["plain"]["state"] == "healthy"
    lines = _said(caplog, "plain")
    [kind] = [line for line in lines if "no engine kind detected" in line]
    assert "treated as a plain OpenAI server" in kind and "1 of its 4 slots" in kind and "kind: vllm" in kind
    assert len(lines) == 2 and any("reachable, kind openai (detected)" in line for line in lines)


async def test_a_backend_is_unknown_until_a_probe_answers() -> None:
    """The gateway does not claim health it has not seen: a backend whose probes never answer (a
    socket that accepts and says nothing) stays `unknown` while the first probe waits."""
    async with asyncio.timeout(30), raw_server(never_answers) as hung, \
            gateway(sims=0, extra_backends=[BackendConfig(name="hung", url=hung)],
                    health={"interval_s": 5.0, "timeout_s": 5.0}) as gw:
        h = await health(gw.url)
        assert h["backends"]["hung"]["state"] == "unknown" and h["status"] == "degraded"


async def test_a_gateway_whose_only_backend_is_ejected_is_unavailable() -> None:
    """The backend answers its probes but fails every request (a 500): after three in a row it is
    ejected. It takes no requests then, so `/health` says `healthy: false` beside `ejected: true`
    and the gateway is `unavailable` with a 503, as for a backend the probes took out; once the
    ejection is over it is `healthy` again and the gateway `ok`."""
    async with asyncio.timeout(30), running_sim(engine(), time_scale=0.02, faults=Faults(error_rate=1.0)) as sim, \
            gateway(sims=0, extra_backends=[BackendConfig(name="failing", url=sim.url, kind="sim")], health=HC,
                    retries={"max_attempts": 1}, ejection={"consecutive_failures": 3, "base_s": 1.0}) as gw:
        before = await health(gw.url)
        assert before["backends"]["failing"]["healthy"] is True
        async with AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="k", max_retries=0) as c:
            for _ in range(3):
                with pytest.raises(InternalServerError):
                    await c.chat.completions.create(model="tailguard-sim", messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=2)
        async with aiohttp.ClientSession() as s, s.get(f"{gw.url}/health") as r:
            body = await r.json()
            assert r.status == 503 and body["status"] == "unavailable", body
        b = body["backends"]["failing"]
        assert (b["state"], b["healthy"], b["ejected"]) == ("ejected", False, True)

        async def back() -> bool:
            return bool((await health(gw.url))["status"] == "ok")
        await until(back)  # its ejection (1 s) is over: it takes requests again
        assert (await health(gw.url))["backends"]["failing"]["healthy"] is True
