"""An exchange runs apart from HTTP: code inside the gateway's process submits a request, reads
its chunks from a `ChunkQueue` as they come, and the request is queued, counted and metered like
any client's. Leaving early ends it at once (the engine's request is aborted)."""

from __future__ import annotations

import asyncio

import orjson

from tailguard.gateway.http.keys import LIFECYCLE
from tailguard.gateway.sink import ChunkQueue
from tailguard.types import Outcome
from tailguard.wire.sse import SSEDecoder
from tests.functional.gateways import gateway, sample, scrape, sim_running, until

BODY = {"model": "tailguard-sim", "messages": [{"role": "user", "content": "hello"}], "stream": True}


def contents(chunks: list[bytes]) -> str:
    dec = SSEDecoder()
    out = []
    for c in chunks:
        for ev in dec.feed(c):
            if ev.data.startswith(b"{"):
                for ch in orjson.loads(ev.data)["choices"]:
                    out.append(ch["delta"].get("content") or "")
    return "".join(out)


async def test_a_request_from_inside_the_process_streams_into_a_queue() -> None:
    async with asyncio.timeout(30), gateway() as gw:
        queue = ChunkQueue()
        run = asyncio.create_task(gw.app[LIFECYCLE].run(orjson.dumps({**BODY, "max_tokens": 5}), "chat", queue,
                                                    {"X-Tailguard-Class": "batch"}))
        chunks = [c async for c in queue]
        ending = await run
        m = await scrape(gw.url)
    assert ending.outcome is Outcome.SUCCESS
    assert contents(chunks) == " tok" * 5
    assert queue.headers["X-Tailguard-Class"] == "batch" and queue.headers["X-Tailguard-Backend"] == "sim0"
    assert sample(m, "tailguard_requests_total", **{"class": "batch", "outcome": "success"}) == 1
    assert sample(m, "tailguard_output_tokens_total", **{"class": "batch"}) == 5


async def test_a_consumer_that_leaves_ends_it_and_the_engine_stops() -> None:
    async with asyncio.timeout(30), gateway(scale=0.05) as gw:
        queue = ChunkQueue()
        run = asyncio.create_task(gw.app[LIFECYCLE].run(orjson.dumps({**BODY, "max_tokens": 5000}), "chat", queue))
        seen = 0
        async for _ in queue:
            seen += 1
            if seen == 20:
                queue.close()
                break
        ending = await run

        async def idle() -> bool:
            return await sim_running(gw.sims[0]) == 0
        await until(idle)
    assert ending.outcome is Outcome.CLIENT_GONE


async def test_a_bad_body_from_inside_is_refused_like_any_other() -> None:
    async with asyncio.timeout(30), gateway() as gw:
        ending = await gw.app[LIFECYCLE].run(b'{"model": "tailguard-sim"}', "chat", ChunkQueue())
    assert ending.outcome is Outcome.CLIENT_ERROR and ending.status == 400
    assert ending.error is not None and ending.error.param == "messages"
