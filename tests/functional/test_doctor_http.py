"""Doctor's findings that need HTTP-level evidence, from real runs against the real simulator over
loopback: client timeouts on streams the server was still sending, prefix-cache misses read from
the engine's /metrics scraped during the run, a generator that could not keep its schedule; and a
healthy run through the real gateway, scraped, with no finding. One run goes through the CLI:
`tailguard bench --scrape` then `tailguard doctor --json`."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from tailguard.bench.load import BenchConfig, Timeouts

from tailguard.bench.run import run_bench
from tailguard.bench.report import write_outputs
from tailguard.bench.scrape import SCRAPE_FILE, scraping, write_scrapes
from tailguard.bench.workload import parse_workload
from tailguard.cli.doctor import snapshots
from tailguard.doctor.diagnosis import diagnose
from tailguard.doctor.evidence import engine_evidence, gateway_evidence
from tailguard.doctor.pages import evidence
from tailguard.doctor.finding import Finding
from tailguard.sim.cost import EngineConfig
from tailguard.sim.server import running_sim
from tests.functional.gateways import gateway
from tests.servers import running

SCALE = 0.05
TAILGUARD = str(Path(sys.executable).with_name("tailguard"))


def engine(**kw: Any) -> EngineConfig:
    return EngineConfig.from_preset("h100-llama8b", **{"max_num_seqs": 8, "max_model_len": 8192,
                                                       "kv_cache_tokens": 262144, **kw})


async def diagnosed(url: str, cfg: BenchConfig, out: Path, scrape: list[str]) -> list[Finding]:
    """Run, scrape, write the folder, then diagnose it as `tailguard doctor` does. The folder has
    no report.html (doctor never reads it; the CLI test below checks the page shows the findings):
    drawing its plots was most of each run's time."""
    async with scraping(scrape, 0.05) as snaps:
        result = await run_bench(cfg)
    write_outputs(result, out, html=False)
    write_scrapes(snaps, out)
    return diagnose(result.records, result.meta, evidence=evidence(snapshots(out)))


async def test_client_timeouts_on_streams_still_running_through_the_cli(tmp_path: Path) -> None:
    async with running_sim(engine(), time_scale=SCALE) as sim, asyncio.timeout(60):
        bench = await asyncio.create_subprocess_exec(
            TAILGUARD, "bench", "--url", sim.url, "--workload", "seed-mixed", "--concurrency", "4",
            "--requests", "40", "--seed", "3", "--timeout", "0.3", "--time-scale", str(SCALE), "--quiet",
            "--scrape", sim.url, "--scrape-interval", "0.05", "--out", str(tmp_path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        said, _ = await asyncio.wait_for(bench.communicate(), 50)  # a summary takes 0.6 s wall, a chat 10 ms
        assert bench.returncode == 0, said.decode()
    assert (tmp_path / SCRAPE_FILE).is_file()
    doctor = await asyncio.create_subprocess_exec(TAILGUARD, "doctor", str(tmp_path), "--json",
                                                  stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(doctor.communicate(), 30)
    found = orjson.loads(out)["findings"]
    kinds = [f["kind"] for f in found]
    assert "client_timeouts" in kinds, found
    assert "still receiving tokens" in found[kinds.index("client_timeouts")]["evidence"]["for"][0]
    assert "Doctor" in (tmp_path / "report.html").read_text()


SHARED = parse_workload({"name": "shared-prefix", "classes": [
    {"name": "chat", "prompt_tokens": 1200, "max_tokens": 64, "system_prompt": {"tokens": 1000, "shared": True}}]})


async def test_prefix_misses_only_without_the_prefix_cache(tmp_path: Path) -> None:
    kinds = {}
    for caching in (False, True):
        async with running_sim(engine(enable_prefix_caching=caching), time_scale=SCALE) as sim, asyncio.timeout(60):
            cfg = BenchConfig(url=sim.url, workload=SHARED, concurrency=4, requests=40, seed=1, time_scale=SCALE)
            out = tmp_path / str(caching)
            kinds[caching] = [f.kind for f in await diagnosed(sim.url, cfg, out, [sim.url])]
            # without the saved pages, --engine-metrics URL fetches one now: counters since the start, the run's
            (out / SCRAPE_FILE).unlink()
            fetched = (await asyncio.to_thread(snapshots, out, None, sim.url)).engine
            assert len(fetched) == 1
            ev = engine_evidence(fetched)
            assert ev is not None and ev.successes == 40
            assert (ev.prefix_queried_tokens or 0) > 0 if caching else ev.prefix_queried_tokens == 0
    assert "prefix_misses" in kinds[False] and "prefix_misses" not in kinds[True], kinds


async def test_a_generator_that_cannot_keep_its_schedule(tmp_path: Path) -> None:
    async with running_sim(engine(), time_scale=SCALE) as sim, asyncio.timeout(60):
        cfg = BenchConfig(url=sim.url, workload="chat-only", rate=400.0, requests=40, seed=1, time_scale=SCALE,
                          max_dispatch_lag_s=1e-9)  # nobody sends within a nanosecond of schedule
        found = await diagnosed(sim.url, cfg, tmp_path, [])
    assert "generator_bound" in [f.kind for f in found]


LONGER_CHATS = parse_workload({"name": "chats", "classes": [{"name": "chat", "prompt_tokens": 200, "max_tokens": 128}]})


async def test_a_healthy_run_through_the_gateway_has_no_finding(tmp_path: Path) -> None:
    async with gateway(max_concurrency=8, engine_cfg=engine(), scale=SCALE) as gw, asyncio.timeout(60):
        # the servers share the test's event loop with the generator: allow it 50 ms (wall) of lag
        cfg = BenchConfig(url=gw.url, workload=LONGER_CHATS, concurrency=4, requests=40, seed=1, time_scale=SCALE,
                          timeouts=Timeouts(total_s=30.0), max_dispatch_lag_s=0.05)
        found = await diagnosed(gw.url, cfg, tmp_path, [gw.url, gw.sims[0].url])
    assert found == []
    pages = snapshots(tmp_path)
    gw_snaps, eng_snaps = pages.gateway, pages.engine
    assert gw_snaps and eng_snaps  # both pages were told apart and read
    assert sum(gateway_evidence(gw_snaps).outcomes.values()) == 40  # type: ignore[union-attr]
    engine_ev = engine_evidence(eng_snaps)
    assert engine_ev is not None and engine_ev.successes == 40
    # vLLM's phase histograms, in simulated seconds: a 200-token prompt prefills in one step, 128 tokens decode in ~127
    assert engine_ev.prefill_time_mean_s is not None and 0 < engine_ev.prefill_time_mean_s < 0.05
    assert engine_ev.queue_time_mean_s is not None and engine_ev.queue_time_mean_s < 0.05


async def test_cap_above_engine_from_the_gateways_page_alone(tmp_path: Path) -> None:
    """Only the gateway is scraped: its health probes read the engine's own queue
    (`tailguard_backend_engine_requests`), which a cap of 16 over 2 slots keeps full."""
    async with gateway(max_concurrency=16, engine_cfg=engine(max_num_seqs=2), scale=SCALE,
                       health={"interval_s": 0.05}) as gw, asyncio.timeout(60):
        cfg = BenchConfig(url=gw.url, workload="seed-mixed", concurrency=12, requests=40, seed=2, time_scale=SCALE,
                          max_dispatch_lag_s=0.05)
        found = await diagnosed(gw.url, cfg, tmp_path, [gw.url])
    kinds = [f.kind for f in found]
    assert "cap_above_engine" in kinds, kinds
    assert "tailguard_backend_engine_requests" in found[kinds.index("cap_above_engine")].evidence_for[0]


CHATS = parse_workload({"name": "chats", "classes": [{"name": "chat", "prompt_tokens": 64, "max_tokens": 48}]})
Chat = Callable[[aiohttp.ClientSession, str, web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def in_front(sim_url: str, chat: Chat) -> AsyncIterator[str]:
    """A real proxy on loopback before the simulator: `chat(upstream session, sim URL, request)`
    answers the chat route its own way; the model list is passed on as it is."""
    async with aiohttp.ClientSession() as up:
        async def chat_route(request: web.Request) -> web.StreamResponse:
            return await chat(up, sim_url, request)

        async def models(request: web.Request) -> web.Response:
            async with up.get(sim_url + "/v1/models") as r:
                return web.Response(body=await r.read(), content_type="application/json")

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat_route)
        app.router.add_get("/v1/models", models)
        async with running(app) as url:
            yield url


async def buffering(up: aiohttp.ClientSession, sim_url: str, request: web.Request) -> web.StreamResponse:
    """The whole upstream stream read first, then all of it at once."""
    async with up.post(sim_url + request.path, data=await request.read(),
                       headers={"Content-Type": "application/json"}) as r:
        return web.Response(body=await r.read(), status=r.status, content_type=r.content_type)


def one_at_a_time(lock: asyncio.Lock) -> Chat:
    """Streams relayed as they come, but only one at a time (a lock around each)."""
    async def chat(up: aiohttp.ClientSession, sim_url: str, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with lock, up.post(sim_url + request.path, data=body, headers={"Content-Type": "application/json"}) as r:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            async for chunk in r.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp
    return chat


async def test_a_proxy_that_buffers_sse_is_found_and_a_direct_run_is_not(tmp_path: Path) -> None:
    """The article's table 10 row "more errors with streaming on: a proxy buffering SSE": a proxy
    that reads each upstream stream whole before answering (what nginx does with
    `proxy_buffering on` for a small answer), between the bench and the simulator."""
    async with running_sim(engine(), time_scale=SCALE) as sim, asyncio.timeout(60), \
            in_front(sim.url, buffering) as proxy:
        kinds = {}
        for label, url in (("proxied", proxy), ("direct", sim.url)):
            cfg = BenchConfig(url=url, workload=CHATS, concurrency=2, requests=12, seed=1, time_scale=SCALE)
            kinds[label] = {f.kind: f for f in await diagnosed(url, cfg, tmp_path / label, [])}
    assert "buffered_stream" in kinds["proxied"], kinds["proxied"]
    assert "one burst" in kinds["proxied"]["buffered_stream"].symptom
    assert "buffered_stream" not in kinds["direct"]


async def test_an_overloaded_simulator_straight_is_queueing_not_buffering(tmp_path: Path) -> None:
    """Straight to `tailguard sim` (which sends each token as it makes it) at several times what
    its 4 slots serve: each chat queues for most of its time and then decodes at once, the shape a
    buffering proxy gives; the run knows its target named itself the simulator, so doctor says
    overload and not buffered_stream."""
    async with running_sim(engine(max_num_seqs=4), time_scale=SCALE) as sim, asyncio.timeout(60):
        cfg = BenchConfig(url=sim.url, workload=CHATS, rate=1000.0, requests=300, seed=1, time_scale=SCALE)
        found = {f.kind: f for f in await diagnosed(sim.url, cfg, tmp_path, [])}
    assert "overload" in found and "buffered_stream" not in found, list(found)


async def test_a_server_that_serializes_requests_is_found_by_the_engines_own_queue_time(tmp_path: Path) -> None:
    """The article's table 10 row "stuck at high concurrency: a thread pool or a lock": a proxy
    that lets one stream through at a time, before the simulator. The client sees long waits for
    the first token; the engine, scraped, queued nothing."""
    async with running_sim(engine(), time_scale=SCALE) as sim, asyncio.timeout(60), \
            in_front(sim.url, one_at_a_time(asyncio.Lock())) as proxy:
        kinds = {}
        for label, url in (("locked", proxy), ("direct", sim.url)):
            cfg = BenchConfig(url=url, workload=CHATS, concurrency=8, requests=40, seed=1, time_scale=SCALE)
            kinds[label] = {f.kind: f for f in await diagnosed(url, cfg, tmp_path / label, [sim.url])}
    assert "hidden_queue" in kinds["locked"], kinds["locked"]
    assert "engine reports a mean queue time" in kinds["locked"]["hidden_queue"].symptom
    assert "hidden_queue" not in kinds["direct"]
