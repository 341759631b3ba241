"""Hedged requests for real: a simulator and a backend that answers its head at once and its first
token only after a long stall (a host slow but not failing); with hedging on, a chat stuck on the
stalling one is sent to the simulator too, the simulator's answer wins and the stalled attempt is
closed at once; without hedging it waits the stall out."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
from openai import AsyncOpenAI

from tailguard.config import GatewayConfig
from tailguard.gateway.http.app import create_app
from tests.functional.gateways import SCALE, engine
from tests.functional.raw_servers import SSE_HEAD, TOK_EVENT, DONE_END, chunk, raw_server, read_request
from tests.servers import running
from tailguard.sim.server import running_sim

STALL_S = 3.0
MODELS = b'{"object":"list","data":[{"id":"tailguard-sim","object":"model"}]}'


class _Staller:
    """Answers every completion's head at once, then its one token after `STALL_S`; counts the
    completions it finished and those whose client went away first."""

    def __init__(self) -> None:
        self.finished = 0
        self.abandoned = 0

    async def __call__(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            head = await read_request(r)
            if not head.startswith(b"POST"):
                body = MODELS if b" /v1/models " in head.split(b"\r\n", 1)[0] else b"{}"
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                        % (len(body), body))
                await w.drain()
                continue
            w.write(SSE_HEAD)
            await w.drain()
            try:
                await asyncio.wait_for(r.read(1), STALL_S)  # b"" when the gateway closes it
                self.abandoned += 1
                return
            except TimeoutError:
                pass
            w.write(chunk(TOK_EVENT) + DONE_END)
            await w.drain()
            self.finished += 1


async def _run(hedging: dict[str, Any], n: int) -> tuple[list[float], _Staller, str]:
    staller = _Staller()
    async with AsyncExitStack() as stack:
        sim = await stack.enter_async_context(running_sim(engine(), time_scale=SCALE))
        stall_url = await stack.enter_async_context(raw_server(staller))
        cfg = GatewayConfig.model_validate({
            "backends": [{"name": "sim", "url": sim.url, "kind": "sim", "max_concurrency": 8},
                         {"name": "stall", "url": stall_url, "kind": "openai", "max_concurrency": 8}],
            "hedging": hedging, "routing": {"policy": "round-robin"}})
        url = await stack.enter_async_context(running(create_app(cfg), handler_cancellation=True))
        client = await stack.enter_async_context(AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0))

        async def chat(stream: bool) -> float:
            t0 = time.perf_counter()
            if stream:
                s = await client.chat.completions.create(model="tailguard-sim", max_tokens=3, stream=True,
                                                         messages=[{"role": "user", "content": "hi"}])
                async for _ in s:
                    pass
            else:
                r = await client.chat.completions.create(model="tailguard-sim", max_tokens=3,
                                                         messages=[{"role": "user", "content": "hi"}])
                assert r.choices[0].message.content
            return time.perf_counter() - t0

        async with asyncio.timeout(60):
            times = [await chat(stream=i % 2 == 0) for i in range(n)]
            async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as resp:
                metrics = await resp.text()
    return times, staller, metrics


async def test_a_chat_stuck_on_a_stalling_backend_is_won_by_its_hedge() -> None:
    # Round-robin puts every other chat on the staller; a quantile of 0.5 over the first chats'
    # TTFTs (half of them the simulator's few milliseconds) makes the hedge delay short.
    times, staller, metrics = await _run({"enabled": True, "quantile": 0.4, "min_samples": 2, "max_share": 1.0}, 12)
    assert max(times[4:]) < STALL_S / 2, times  # once hedging is armed, none waits the stall out
    assert staller.abandoned >= 3  # the losing attempts were closed, not left to run
    assert 'tailguard_hedges_total{class="interactive",outcome="won"}' in metrics
    won = [line for line in metrics.splitlines() if line.startswith('tailguard_hedges_total{class="interactive",outcome="won"}')]
    assert float(won[0].split()[-1]) >= 3


async def test_without_hedging_a_chat_on_the_stalling_backend_waits_the_stall_out() -> None:
    times, staller, _ = await _run({"enabled": False}, 2)
    assert max(times) >= STALL_S * 0.9 and staller.finished >= 1
