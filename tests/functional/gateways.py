"""A real gateway in front of real simulators on 127.0.0.1, for the gateway's functional tests."""

from __future__ import annotations

import asyncio
import socket
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from tailguard.config import BackendConfig, ClassConfig, GatewayConfig
from tailguard.gateway.http.app import create_app, gateway_runner
from tailguard.sim.cost import EngineConfig
from tailguard.sim.server import RunningSim, running_sim
from tests.servers import running

SCALE = 0.02  # simulator runs 50x faster than real time


def engine(**kw: Any) -> EngineConfig:
    # A long context so a test's blocking request can run for far longer than any test needs.
    base: dict[str, Any] = {"max_num_seqs": 8, "max_model_len": 131072, "kv_cache_tokens": 262144}
    base.update(kw)
    return EngineConfig.from_preset("h100-llama8b", **base)


@dataclass
class Stack:
    url: str  # the gateway's base URL
    app: web.Application
    sims: list[RunningSim]

    def client(self, **kw: Any) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=f"{self.url}/v1", api_key="k", max_retries=0, **kw)


def dead_url() -> str:
    """A loopback URL where nothing listens (the port was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@asynccontextmanager
async def gateway(
    *, sims: int = 1, max_concurrency: int = 8, engine_cfg: EngineConfig | None = None, scale: float = SCALE,
    extra_backends: list[BackendConfig] | None = None, kind: str = "sim", record: Path | None = None,
    sock: socket.socket | None = None, **cfg: Any,
) -> AsyncIterator[Stack]:
    """`sims` simulators, each a backend (`sim0`, `sim1`, ...) of `kind` after `extra_backends`,
    behind one gateway (recording its front's events to `record`, given; listening on `sock`, given)."""
    async with AsyncExitStack() as stack:
        started = [await stack.enter_async_context(running_sim(engine_cfg or engine(), time_scale=scale))
                   for _ in range(sims)]
        backends = list(extra_backends or []) + [
            BackendConfig(name=f"sim{i}", url=s.url, kind=kind, max_concurrency=max_concurrency)  # type: ignore[arg-type]
            for i, s in enumerate(started)
        ]
        gw_cfg = GatewayConfig.model_validate({"backends": [b.model_dump() for b in backends], **cfg})
        app = create_app(gw_cfg, record=record)
        url = await stack.enter_async_context(running(app, runner=gateway_runner(app), sock=sock))
        yield Stack(url, app, started)


def classes(**overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """The default classes with per-class field overrides, as config dicts."""
    out = []
    for c in (ClassConfig(name="interactive", rank=0), ClassConfig(name="batch", rank=1, max_share=0.875)):
        d = c.model_dump()
        d.update(overrides.get(c.name, {}))
        out.append(d)
    return out


async def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics page, keyed by (name, sorted labels)."""
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        assert r.status == 200
        text = await r.text()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def sample(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def health(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/health") as r:
        data: dict[str, Any] = await r.json()
        return data


async def until(cond: Callable[[], Awaitable[bool]], step_s: float = 0.005) -> None:
    """Poll an async condition; the caller bounds the wait with asyncio.timeout."""
    while not await cond():
        await asyncio.sleep(step_s)


async def sim_running(sim: RunningSim) -> float:
    async with aiohttp.ClientSession() as s, s.get(f"{sim.url}/metrics") as r:
        text = await r.text()
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == "vllm:num_requests_running":
                total += smp.value
    return total
