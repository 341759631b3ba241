"""What a newcomer meets first, as real processes on loopback: a target the bench cannot measure
is one line and no load; a short run against the simulator is valid; a busy port is one line."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from tailguard.sim.cost import EngineConfig
from tailguard.sim.server import running_sim
from tests.cli import run
from tests.functional.gateways import dead_url, gateway
from tests.functional.test_bench_interrupt import ended_total, scrape
from tests.servers import running

SCALE = 0.02
POSTS = web.AppKey("posts", list)


def one_line(out: str) -> str:
    lines = out.splitlines()
    assert len(lines) == 1, out
    return lines[0]


def keyed_app() -> web.Application:
    """An OpenAI-style server that wants `Authorization: Bearer right` everywhere, as vLLM started
    with --api-key does, and keeps every completion request it is sent."""
    posts: list[Any] = []

    async def models(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer right":
            return web.json_response({"error": {"message": "Unauthorized"}}, status=401)
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def chat(request: web.Request) -> web.Response:
        posts.append(await request.read())
        return web.json_response({"error": {"message": "Unauthorized"}}, status=401)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    app[POSTS] = posts
    return app


async def test_a_target_that_cannot_be_measured_is_one_line_and_no_load(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    bench = ("bench", "--workload", "chat-only", "--concurrency", "2", "--requests", "10", "--out", str(out_dir))
    dead = dead_url()
    code, out = await run(*bench, "--url", dead, "--model", "m")
    assert code == 1 and one_line(out).startswith(f"error: cannot connect to {dead[7:]} (from --url {dead})")
    assert "connection refused" in out
    async with running_sim(EngineConfig.from_preset("cpu-tiny"), time_scale=SCALE) as sim:
        code, out = await run(*bench, "--url", sim.url + "/api")
        assert code == 1 and one_line(out) == (f"error: GET {sim.url}/api/v1/models answered 404 Not Found: is "
                                               f"{sim.url}/api the base URL of an OpenAI-compatible server?")
        assert ended_total(await scrape(sim)) == 0
        code, out = await run(*bench, "--url", sim.url, "--time-scale", "0.5")  # contradicts the simulator
        assert code == 1 and one_line(out) == f"error: --time-scale 0.5, but {sim.url} says its time scale is {SCALE:g}"
        assert ended_total(await scrape(sim)) == 0
    async with gateway(scale=SCALE) as gw:  # the gateway lists its simulator's time scale as its own
        ran = tmp_path / "ran"
        code, out = await run(*bench[:-1], str(ran), "--url", gw.url, "--quiet")  # taken at its word, and said
        assert code == 0 and (f"times in simulated seconds: {gw.url} announced time scale {SCALE:g} "
                              "(--time-scale 1 reports wall seconds)") in out, out
        assert orjson.loads((ran / "run.json").read_bytes())["time_scale"] == SCALE
    app = keyed_app()
    async with running(app) as url:
        code, out = await run(*bench, "--url", url)
        assert code == 1 and one_line(out) == (f"error: GET {url}/v1/models answered 401 Unauthorized: pass "
                                               "--api-key KEY (or set TAILGUARD_API_KEY)")
        code, out = await run(*bench, "--url", url, "--api-key", "wrong")
        assert code == 1 and one_line(out).endswith("answered 401 Unauthorized: the key was refused")
    assert app[POSTS] == [] and not out_dir.exists()


async def test_forty_requests_at_concurrency_four_are_a_valid_run(tmp_path: Path) -> None:
    async with running_sim(EngineConfig.from_preset("h100-llama8b"), time_scale=SCALE) as sim:
        code, out = await run("bench", "--url", sim.url, "--workload", "chat-only", "--concurrency", "4",
                              "--requests", "40", "--out", str(tmp_path), "--quiet", "--time-scale", str(SCALE))
    assert code == 0, out
    v = orjson.loads((tmp_path / "summary.json").read_bytes())["validity"]
    assert v["valid"] is True, v
    assert v["late"]["of"] == 40 and "VALID run" in out


async def test_serve_on_a_busy_port_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = await run("serve", "--sim", "--port", str(port), "--sim-time-scale", "0.05")
        busy = f"error: cannot listen on 127.0.0.1:{port}: address already in use; choose another with"
        assert code == 1 and one_line(out) == f"{busy} --port (0 picks a free one)"
        code, out = await run("serve", "--sim", "--port", "0", "--sim-port", str(port))
        assert code == 1 and one_line(out) == f"{busy} --sim-port (0 picks a free one)"
        code, out = await run("sim", "--port", str(port))
        assert code == 1 and one_line(out) == f"{busy} --port (0 picks a free one)"
