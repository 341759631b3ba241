"""A live reload reaches the deadlines, the health probes and a backend's address: a real
`tailguard serve --config` in front of a real simulator, the file rewritten and SIGHUP sent as an
operator does. What starts after the reload runs by the new settings, and a request in flight
keeps the ones it started with."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml
from aiohttp import web
from openai import AsyncOpenAI

from tailguard.sim.server import running_sim
from tests.functional.gateways import engine, until
from tests.functional.test_gateway_rollback import CHAT, SCALE, gateway_yaml, health, serving
from tests.servers import running

TOKENS = 2000  # about 3 s of wall time at SCALE: in flight across both reloads
DRAINED_TOKENS = 4000  # about 6 s: still running on the removed backend while the test looks
PROBES = {"interval_s": 0.1}
SLOW_PROBES = {"interval_s": 600.0}  # after the first probe, none for the test's length unless a reload wakes them


async def reload(proc: asyncio.subprocess.Process, url: str, path: Path, text: str) -> None:
    """Rewrite the config file, send SIGHUP, and wait until the gateway runs the new config."""
    before = (await health(url))["config"]["hash"]  # type: ignore[index]
    path.write_text(text)
    proc.send_signal(signal.SIGHUP)

    async def applied() -> bool:
        return bool((await health(url))["config"]["hash"] != before)  # type: ignore[index]
    try:
        async with asyncio.timeout(10):
            await until(applied, step_s=0.02)
    except TimeoutError:
        raise AssertionError("the gateway did not apply the reloaded config (refused it?)") from None


async def test_a_reload_changes_deadlines_and_probes_for_what_starts_next(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    async with asyncio.timeout(60), running_sim(engine(), time_scale=SCALE) as sim:
        path.write_text(gateway_yaml(sim.url, 4, 4096, health=SLOW_PROBES))
        async with serving(path) as (proc, url), AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
            def long() -> Any:
                return c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=TOKENS)

            started_before = asyncio.create_task(long())

            async def running() -> bool:
                return bool((await health(url))["backends"]["sim"]["in_flight"] == 1)  # type: ignore[index]
            await until(running, step_s=0.02)

            await reload(proc, url, path, gateway_yaml(sim.url, 4, 4096, health=SLOW_PROBES, timeouts={"total_s": 0.5}))
            with pytest.raises(openai.InternalServerError) as cut:
                await long()
            assert cut.value.status_code == 504 and "total deadline" in str(cut.value)

            # The loop is sleeping out 600 s: the reload wakes it, and the new path takes the backend out.
            await reload(proc, url, path, gateway_yaml(sim.url, 4, 4096, timeouts={"total_s": 0.5},
                                                       health={**SLOW_PROBES, "path": "/no-such-page", "unhealthy_after": 1}))

            async def taken_out() -> bool:
                return (await health(url))["backends"]["sim"]["healthy"] is False  # type: ignore[index]
            await until(taken_out, step_s=0.02)
            assert (await health(url))["backends"]["sim"]["probe_error"] == "status 404"  # type: ignore[index]

            done = await started_before  # dispatched under the first config: its deadline was 600 s
            assert done.usage is not None and done.usage.completion_tokens == TOKENS


# A plain OpenAI-compatible server: no /health, no /version, so the gateway detects it as `openai`.
PLAIN_ANSWER = (b'data: {"id":"p1","object":"chat.completion.chunk","created":1,"model":"plain","choices":[{"index":0,'
                b'"delta":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')


@asynccontextmanager
async def plain_server(keys: list[str | None]) -> AsyncIterator[str]:
    """Serves `/v1/models` and a one-chunk chat stream; `keys` gets each chat's Authorization."""
    async def chat(request: web.Request) -> web.Response:
        keys.append(request.headers.get("Authorization"))
        await request.read()
        return web.Response(body=PLAIN_ANSWER, content_type="text/event-stream")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "plain", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    async with running(app) as url:
        yield url


async def test_a_reload_moves_a_backend_to_another_server(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    keys: list[str | None] = []
    async with asyncio.timeout(60), running_sim(engine(), time_scale=SCALE, model_name="sim-a") as sim, \
            plain_server(keys) as plain:
        doc = yaml.safe_load(gateway_yaml(sim.url, 4, 4096, health=PROBES))
        doc["backends"][0].update(kind="auto", models=["m"])  # the name clients use, wherever it moves
        path.write_text(yaml.safe_dump(doc))
        async with serving(path) as (proc, url), AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
            async def kind_is(kind: str) -> bool:
                return bool((await health(url))["backends"]["sim"]["kind"] == kind)  # type: ignore[index]

            async def running_one() -> bool:
                return bool((await health(url))["backends"]["sim"]["in_flight"] == 1)  # type: ignore[index]

            await until(lambda: kind_is("sim"), step_s=0.02)
            started_before = asyncio.create_task(c.chat.completions.create(model="m", messages=CHAT, max_tokens=TOKENS))
            await until(running_one, step_s=0.02)

            doc["backends"][0].update(url=plain, api_key="sk-new")
            await reload(proc, url, path, yaml.safe_dump(doc))
            moved = await c.chat.completions.create(model="m", messages=CHAT, max_tokens=3)
            assert moved.model == "plain" and keys == ["Bearer sk-new"]  # the new address, with the new key
            await until(lambda: kind_is("openai"), step_s=0.02)  # asked again what it is

            done = await started_before  # sent before the move: it ends on the simulator
            assert done.model == "sim-a" and done.usage is not None and done.usage.completion_tokens == TOKENS


async def test_a_reload_adds_a_backend_and_drains_the_one_it_removes(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    async with asyncio.timeout(60), running_sim(engine(), time_scale=SCALE, model_name="sim-a") as a, \
            running_sim(engine(), time_scale=SCALE, model_name="sim-b") as b:
        doc = yaml.safe_load(gateway_yaml(a.url, 1, 4096, health=PROBES))  # backend "sim", one slot
        doc["backends"][0]["models"] = ["m"]  # the name clients use, on both engines
        path.write_text(yaml.safe_dump(doc))
        async with serving(path) as (proc, url), AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
            def chat(tokens: int) -> Any:
                return asyncio.create_task(c.chat.completions.create(model="m", messages=CHAT, max_tokens=tokens))

            async def queued_one() -> bool:
                return bool((await health(url))["queued"] == 1)

            async def holding() -> bool:
                return bool((await health(url))["backends"]["sim"]["in_flight"] == 1)  # type: ignore[index]

            held = chat(DRAINED_TOKENS)  # takes the only slot
            await until(holding, step_s=0.02)  # before the next is sent: it must not take the slot first
            waiting = chat(3)
            await until(queued_one, step_s=0.02)

            doc["backends"] = [{"name": "b", "url": b.url, "kind": "sim", "max_concurrency": 2, "models": ["m"]}]
            await reload(proc, url, path, yaml.safe_dump(doc))
            assert (await waiting).model == "sim-b"  # the queued request went to the new backend at once
            during = (await health(url))["backends"]
            assert during["sim"]["retiring"] is True and during["sim"]["in_flight"] == 1  # type: ignore[index]
            assert during["b"]["retiring"] is False and during["b"]["healthy"] is True  # type: ignore[index]
            assert (await chat(3)).model == "sim-b"  # the removed backend takes nothing new

            done = await held  # sent before the reload: it ends where it ran
            assert done.model == "sim-a" and done.usage is not None and done.usage.completion_tokens == DRAINED_TOKENS

            async def retired() -> bool:
                return "sim" not in (await health(url))["backends"]  # type: ignore[operator]
            await until(retired, step_s=0.02)
            async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
                page = await r.text()
            assert 'tailguard_backend_healthy{backend="b"} 1.0' in page and 'backend_healthy{backend="sim"}' not in page
