"""The conformance of the gateway's front and a replay: a real gateway records its front's events
while it retries a request a resetting backend dropped, takes that backend out in a live reload,
suspends a batch stream for a chat and resumes it, and loses two clients (one streaming, one
queued); a fresh front handed the recording decides exactly what the gateway's front decided."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tailguard.front.events import Arrive, Failed, Finished, Generated, Reconfigure, Retired, Start, StartMode, Suspend
from tailguard.recording.codec import Recording, read
from tailguard.recording.replay import conform
from tailguard.config import BackendConfig
from tailguard.gateway.http.app import reloader_of
from tailguard.gateway.http.keys import LIVE
from tailguard.types import Outcome
from tests.functional.gateways import Stack, gateway, health, sample, scrape, until
from tests.functional.raw_servers import raw_server, read_request
from tests.functional.test_gateway_preempt import BATCH, CHAT, PREEMPTIBLE

SCALE = 0.05  # a 3000-token batch stream runs for about 1 s of wall time


async def resets(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await read_request(r)
    w.transport.abort()  # RST, no answer


async def _gone(gw: Stack, cls: str, n: int) -> None:
    async def counted() -> bool:
        m = await scrape(gw.url)
        return sample(m, "tailguard_requests_total", **{"class": cls, "outcome": "client_gone"}) == n
    await until(counted)


async def _run(gw: Stack) -> int:
    """The scenario; returns how many requests it sent."""
    async with gw.client() as c:
        # A retry: the resetting backend comes first in the pool, so the chat fails there twice
        # (once more on a fresh connection) and is served by the simulator.
        r = await c.chat.completions.with_raw_response.create(model="tailguard-sim", messages=CHAT, max_tokens=4)
        assert r.headers["x-tailguard-backend"] == "sim0"

        # A live reload takes the resetting backend out.
        cfg = gw.app[LIVE].cfg
        reloader_of(gw.app).apply(cfg.model_copy(update={"backends": [b for b in cfg.backends if b.name != "bad"]}))

        # A preemption: the chat takes the batch stream's only slot, which resumes after it.
        stream = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3000, stream=True,
                                                 extra_headers=BATCH)
        chat: asyncio.Task[Any] | None = None
        tokens = 0
        async for ch in stream:
            tokens += sum(1 for choice in ch.choices if choice.delta.content)
            if tokens == 100 and chat is None:
                chat = asyncio.create_task(c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=8))
        assert chat is not None and (await chat).choices[0].message.content == " tok" * 8
        assert tokens == 3000

        # A client gone mid-stream.
        stream = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3000, stream=True,
                                                 extra_headers=BATCH)
        async for ch in stream:
            if ch.choices and ch.choices[0].delta.content:
                break
        await stream.close()
        await _gone(gw, "batch", 1)

        # A client gone while queued: a long chat holds the slot (chats are never suspended).
        held = asyncio.create_task(c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=1000))
        waiting = asyncio.create_task(c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4))

        async def queued() -> bool:
            return bool((await health(gw.url))["queued"] == 1)
        await until(queued)
        waiting.cancel()
        await _gone(gw, "interactive", 1)
        assert (await held).usage.completion_tokens == 1000  # type: ignore[union-attr]
    return 6


def _ingredients(rec: Recording) -> dict[str, int]:
    """How often each thing this test means to record happened in the recording."""
    events = [s.event for s in rec.steps]
    decisions = [d for s in rec.steps for d in s.decisions]
    retried = sum(1 for s in rec.steps if isinstance(s.event, Failed)
                  and any(isinstance(d, Start) and d.id == s.event.id and d.mode is StartMode.RETRY for d in s.decisions))
    return {
        "arrivals": sum(isinstance(e, Arrive) for e in events),
        "retries": retried,
        "reloads": sum(isinstance(e, Reconfigure) for e in events),
        "retired": sum(isinstance(d, Retired) for d in decisions),
        "suspensions": sum(isinstance(d, Suspend) for d in decisions),
        "resumptions": sum(isinstance(d, Start) and d.mode is StartMode.CONTINUE for d in decisions),
        "generated": sum(isinstance(e, Generated) for e in events),
        "clients gone": sum(isinstance(e, Finished) and e.outcome is Outcome.CLIENT_GONE for e in events),
    }


async def test_a_recorded_run_replays_to_the_same_decisions(tmp_path: Path) -> None:
    path = tmp_path / "front.jsonl"
    async with asyncio.timeout(60), raw_server(resets) as bad_url:
        # Said to serve the model: a backend whose models are not known is tried only after those known
        # to serve it, and the first request then met it only when it beat the simulator's /v1/models read.
        bad = BackendConfig(name="bad", url=bad_url, kind="openai", max_concurrency=4, models=["tailguard-sim"])
        async with gateway(max_concurrency=1, scale=SCALE, extra_backends=[bad], record=path,
                           classes=PREEMPTIBLE, scheduler={"min_run_s": 0.0}) as gw:
            sent = await _run(gw)
    rec = read(path.read_text().splitlines())
    seen = _ingredients(rec)
    assert seen["arrivals"] == sent and len(rec.requests) == sent
    assert all(n >= 1 for n in seen.values()), seen
    result = conform(rec)
    assert result.identical, str(result)
    assert result.events == len(rec.steps) and result.decisions > 0
