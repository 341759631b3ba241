"""The backend kinds' load readers against the real servers' own pages, under a known load."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import pytest

from tailguard.gateway.upstream.kinds import EngineLoad, LoadSource, get_kind
from tests.real.processes import EngineProcess

pytestmark = pytest.mark.real

STEP_S = 60.0


async def read_load(session: aiohttp.ClientSession, proc: EngineProcess, source: LoadSource) -> EngineLoad | None:
    async with session.get(proc.base_url + source.path) as r:
        return source.parse(await r.read()) if r.status == 200 else None


def hold_streams(session: aiohttp.ClientSession, proc: EngineProcess, n: int) -> list[asyncio.Task[None]]:
    """Run `n` long streams straight to the engine, reading them as a client would, until cancelled.
    (llama-server sends a queued request's headers only when a slot takes it, so nothing here
    waits for headers.)"""
    body = {"model": proc.model, "prompt": "hold", "max_tokens": proc.long_request_tokens, "stream": True}

    async def one() -> None:
        async with session.post(proc.base_url + "/v1/completions", json=body) as r:
            async for _ in r.content.iter_any():
                pass

    return [asyncio.create_task(one()) for _ in range(n)]


async def release(streams: list[asyncio.Task[None]]) -> None:
    for t in streams:
        t.cancel()
    await asyncio.gather(*streams, return_exceptions=True)


async def until_load(session: aiohttp.ClientSession, proc: EngineProcess, source: LoadSource,
                     want: EngineLoad, timeout_s: float = STEP_S) -> None:
    seen: EngineLoad | None = None
    try:
        async with asyncio.timeout(timeout_s):
            while (seen := await read_load(session, proc, source)) != want:
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"{proc.kind} {source.path}: wanted {want}, last read {seen}") from None


async def test_llamacpp_metrics_and_slots_pages(start_llama: Callable[..., EngineProcess]) -> None:
    engine = start_llama("llama-one-slot", slots=1, slow=True)
    metrics, slots = get_kind("llamacpp").load_sources
    async with aiohttp.ClientSession() as s, asyncio.timeout(STEP_S * 3):
        assert await read_load(s, engine, metrics) == EngineLoad(0, 0)
        streams = hold_streams(s, engine, 2)  # one decodes, one waits for the only slot
        try:
            await until_load(s, engine, metrics, EngineLoad(running=1, waiting=1))
            await until_load(s, engine, slots, EngineLoad(running=1, waiting=0))  # /slots shows no queue
        finally:
            await release(streams)
        await until_load(s, engine, metrics, EngineLoad(0, 0))


async def test_llamacpp_without_metrics_falls_back_to_slots(start_llama: Callable[..., EngineProcess]) -> None:
    engine = start_llama("llama-no-metrics", slots=2, slow=True, metrics=False)
    metrics, slots = get_kind("llamacpp").load_sources
    async with aiohttp.ClientSession() as s, asyncio.timeout(STEP_S * 3):
        async with s.get(engine.base_url + metrics.path) as r:
            assert r.status == 501
            assert metrics.parse(await r.read()) is None  # an error page is "not understood", never "idle"
        streams = hold_streams(s, engine, 1)
        try:
            await until_load(s, engine, slots, EngineLoad(running=1, waiting=0))
        finally:
            await release(streams)
        await until_load(s, engine, slots, EngineLoad(0, 0))


async def test_vllm_metrics_page(vllm_server: EngineProcess) -> None:
    (metrics,) = get_kind("vllm").load_sources
    async with aiohttp.ClientSession() as s, asyncio.timeout(STEP_S * 3):
        await until_load(s, vllm_server, metrics, EngineLoad(0, 0))
        streams = hold_streams(s, vllm_server, 10)  # --max-num-seqs 8: two wait inside vLLM
        try:
            await until_load(s, vllm_server, metrics, EngineLoad(running=8, waiting=2))
        finally:
            await release(streams)
        await until_load(s, vllm_server, metrics, EngineLoad(0, 0))
