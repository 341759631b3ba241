"""Hostile backends over real loopback sockets: a raw server that answers endlessly (content
that never ends, a preamble of comments, a header value or one SSE event without an end, a
probe or model list of gigabytes) while the gateway keeps its memory within a budget, ends the
attack's request with a clear error once a bound is hit, and answers `/health` and a normal
chat on its other backend quickly throughout."""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from tests.functional.gateways import Stack, gateway, health, sample, scrape
from tests.functional.hostile_backend import hostile, rss
from tests.functional.raw_servers import TOK_EVENT
from tailguard.config import BackendConfig

MiB = 1024 * 1024
BUDGET = 64 * MiB  # what a hostile backend may add to the gateway's RSS
# /health and a normal chat answer within QUICK_S during an attack (the median), every one within
# SLOWEST_S. On an idle machine both are under 0.05 s; a CI machine at load 9 gave a median of
# 0.13 s. A gateway whose loop reads or parses the attack's gigabytes stalls for seconds.
QUICK_S = 0.3
SLOWEST_S = 1.5
CHAT = {"model": "tailguard-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
EVIL = {**CHAT, "model": "evil"}  # the model only the hostile backend serves


@dataclass
class Attack:
    status: int
    body: bytes
    seconds: float
    rss_growth: int
    health_s: list[float]  # each /health's time during the attack
    chat_s: list[float]  # each normal chat's


@asynccontextmanager
async def _evil_gateway(case: str, **cfg: Any) -> AsyncIterator[Stack]:
    """A gateway whose first backend is the hostile one, serving model `evil` (the attack asks
    for it; normal chats for the simulator's), with no retries, so the attack ends with its own
    error."""
    async with hostile(case) as url:
        evil = BackendConfig(name="evil", url=url, kind="openai", max_concurrency=1, models=["evil"])
        async with gateway(extra_backends=[evil], retries={"max_attempts": 1}, **cfg) as gw:
            yield gw


async def _attack(gw: Stack, body: dict[str, Any]) -> Attack:
    """Send one request to the hostile backend and, while it runs, watch the gateway: its RSS
    (this process's: the gateway runs in it; the hostile backend runs in its own), and the time
    `/health` and a normal chat take."""
    async with aiohttp.ClientSession() as s:
        await _timed(s.get(f"{gw.url}/health"))  # warm (a chat now would go to the hostile backend)
        gc.collect()
        base = peak = rss()
        started = time.perf_counter()
        attack = asyncio.create_task(_fetch(s.post(f"{gw.url}/v1/chat/completions", json=body)))
        while (await health(gw.url))["backends"]["evil"]["in_flight"] == 0 and not attack.done():
            await asyncio.sleep(0.002)  # the attack holds the hostile backend's one slot: chats go to the other
        health_s: list[float] = []
        chat_s: list[float] = []
        while not attack.done():
            health_s.append(await _timed(s.get(f"{gw.url}/health")))
            took = await _chat_timed(s, gw.url, attack)
            if took is not None:
                chat_s.append(took)
            peak = max(peak, rss())
            await asyncio.sleep(0.01)
        status, out = await attack
        return Attack(status, out, time.perf_counter() - started, peak - base, health_s, chat_s)


async def _fetch(req: Any) -> tuple[int, bytes]:
    async with req as r:
        return r.status, await r.read()


async def _timed(req: Any) -> float:
    """How long `req` took to answer 200."""
    t = time.perf_counter()
    async with req as r:
        await r.read()
        assert r.status == 200, r.status
    return time.perf_counter() - t


async def _chat_timed(s: aiohttp.ClientSession, url: str, attack: asyncio.Task[Any]) -> float | None:
    """How long a normal chat took; None for one sent as the attack ended, which went to the
    hostile backend, freed just then (an attack of its own)."""
    t = time.perf_counter()
    async with s.post(f"{url}/v1/chat/completions", json=CHAT) as r:
        await r.read()
        if r.headers.get("x-tailguard-backend") == "evil":
            assert attack.done()
            return None
        assert r.status == 200, r.status
    return time.perf_counter() - t


def _assert_bounded(a: Attack) -> None:
    """RSS within the budget; `/health` and chats answered in under QUICK_S as a rule, and
    never stalled (the longest is allowed a loaded machine's scheduling hiccup)."""
    assert a.rss_growth < BUDGET, f"RSS grew {a.rss_growth / MiB:.0f} MiB"
    for times in (a.health_s, a.chat_s):
        if times:
            assert statistics.median(times) < QUICK_S and max(times) < SLOWEST_S, a


async def _protocol_errors(gw: Stack) -> float:
    return sample(await scrape(gw.url), "tailguard_upstream_errors_total", backend="evil", kind="protocol")


async def test_a_non_stream_answer_that_never_ends_is_cut_at_max_answer_bytes() -> None:
    """Events of half a MiB each for `max_tokens: 100000`: what that many tokens may carry is far
    past `limits.max_answer_bytes` (16 MiB here: the text is held until the answer ends), which a
    non-stream answer is cut at."""
    async with asyncio.timeout(60), _evil_gateway("post-big-events", limits={"max_answer_bytes": 16 * MiB}) as gw:
        a = await _attack(gw, {**EVIL, "max_tokens": 100_000})
        assert a.status == 502 and b"max_answer_bytes" in a.body
        _assert_bounded(a)
        assert await _protocol_errors(gw) == 1


@pytest.mark.parametrize("stream", [True, False])
async def test_a_preamble_of_comments_is_cut_at_max_preamble_bytes(stream: bool) -> None:
    async with asyncio.timeout(30), _evil_gateway("post-comments") as gw:
        a = await _attack(gw, {**EVIL, "stream": stream})
        # A stream holds its preamble; a non-stream answer holds nothing of comments but counts them
        # against the bytes its `max_tokens` allows.
        assert a.status == 502 and (b"max_preamble_bytes" if stream else b"answer_bytes_per_token") in a.body
        _assert_bounded(a)


async def test_a_header_value_that_never_ends_is_refused_at_max_response_head_bytes() -> None:
    async with asyncio.timeout(30), _evil_gateway("post-header") as gw:
        a = await _attack(gw, {**EVIL, "stream": True})
        assert a.status == 502 and b"response head over 65536 bytes" in a.body
        _assert_bounded(a)


@pytest.mark.parametrize("stream", [True, False])
async def test_one_sse_event_that_never_ends_is_cut_at_max_event_bytes(stream: bool) -> None:
    async with asyncio.timeout(30), _evil_gateway("post-event") as gw:
        a = await _attack(gw, {**EVIL, "stream": stream})
        assert a.status == 502 and b"max_event_bytes" in a.body
        _assert_bounded(a)
        assert a.seconds < 5  # 1 MiB at loopback speed, scanned once


async def test_an_endless_event_after_content_ends_the_stream_with_an_error_event() -> None:
    async with asyncio.timeout(30), _evil_gateway("post-event-after-content") as gw:
        a = await _attack(gw, {**EVIL, "stream": True})
        assert a.status == 200 and a.body.startswith(TOK_EVENT)
        last = orjson.loads(a.body.rstrip().rsplit(b"\n\n", 1)[-1].removeprefix(b"data: "))
        assert last["error"]["code"] == "protocol" and "max_event_bytes" in last["error"]["message"]
        _assert_bounded(a)


async def test_probes_and_the_model_list_read_at_most_max_probe_bytes() -> None:
    """Every GET of the hostile backend (its health probe every 50 ms, its `/v1/models` read by
    the probes) answers an endless body: each read stops at the bound, the probe fails, and the
    gateway's `/v1/models` answers at once."""
    health = {"interval_s": 0.05, "timeout_s": 2.0}
    async with asyncio.timeout(30), _evil_gateway("get-body", health=health) as gw, \
            aiohttp.ClientSession() as s:
        gc.collect()
        base = peak = rss()
        for _ in range(10):
            t = time.perf_counter()
            async with s.get(f"{gw.url}/v1/models") as r:
                models = await r.json()
            assert time.perf_counter() - t < 1.0
            assert r.status == 200 and "data" in models
            peak = max(peak, rss())
            await asyncio.sleep(0.1)
        async with s.get(f"{gw.url}/health") as r:
            h = await r.json()
        assert h["backends"]["evil"]["state"] in ("failing", "unhealthy")
        assert "over the limit of 4194304 bytes" in str(h["backends"]["evil"]["probe_error"])
        assert peak - base < BUDGET
