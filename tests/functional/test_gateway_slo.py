"""TTFT targets end to end (issue 30): a request's own target (`x-tailguard-ttft-slo-ms`) in its
access-log line and `tailguard_slo_total`, a malformed one refused with a 400 in the route's shape,
and a burst past what one slot can start in time refused at once with `deadline` and a
`Retry-After` from the gateway's latency model, through a real gateway in front of a simulator."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp
import openai
import pytest

from tests.functional.gateways import engine, gateway, sample, scrape

CHAT = [{"role": "user", "content": "y" * 40}]


def _classes(**slo: float) -> list[dict[str, object]]:
    return [{"name": "interactive", "rank": 0, "slo": slo},
            {"name": "batch", "rank": 1, "preemptible": True, "max_tokens_cap": 4096}]


async def test_a_tighter_target_asked_for_is_judged_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tailguard.access")
    async with asyncio.timeout(30), gateway(classes=_classes(ttft_s=5.0, min_ttft_s=0.05)) as gw, gw.client() as c:
        await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3,
                                        extra_headers={"x-tailguard-ttft-slo-ms": "250"})
        await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3,
                                        extra_headers={"x-tailguard-ttft-slo-ms": "1"})  # raised to the 50 ms floor
        await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3)
        m = await scrape(gw.url)
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "tailguard.access"]
    assert [line["ttft_slo_ms"] for line in lines] == [250.0, 50.0, 5000.0]
    assert all(set(line["slo"]) == {"ttft"} for line in lines)
    met = sample(m, "tailguard_slo_total", **{"class": "interactive", "slo": "ttft", "result": "met"})
    missed = sample(m, "tailguard_slo_total", **{"class": "interactive", "slo": "ttft", "result": "missed"})
    assert met + missed == 3 and met == sum(line["slo"]["ttft"] for line in lines)


@pytest.mark.parametrize("value", ["soon", "-5", "0", "nan"])
async def test_a_malformed_target_is_a_400_in_the_routes_shape(value: str) -> None:
    async with asyncio.timeout(30), gateway(classes=_classes(ttft_s=2.0, min_ttft_s=0.1)) as gw, gw.client() as c:
        with pytest.raises(openai.BadRequestError) as e:
            await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3,
                                            extra_headers={"x-tailguard-ttft-slo-ms": value})
        m = await scrape(gw.url)
    body = e.value.body
    assert isinstance(body, dict) and body["param"] == "x-tailguard-ttft-slo-ms" and body["code"] == "invalid_ttft_slo"
    assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "client_error"}) == 1


async def _send(session: aiohttp.ClientSession, url: str) -> tuple[int, str | None, str | None, float]:
    """One streamed chat of 40 tokens: its status, reject reason, Retry-After and how long the answer took."""
    start = time.perf_counter()
    body = {"model": "tailguard-sim", "messages": CHAT, "max_tokens": 40, "stream": True}
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        await r.read()
        return (r.status, r.headers.get("X-Tailguard-Reject-Reason"), r.headers.get("Retry-After"),
                time.perf_counter() - start)


async def test_a_burst_that_cannot_start_in_time_is_refused_at_once_with_retry_after() -> None:
    """One slot; each chat takes about 0.2 s there. Twelve chats at once teach the gateway's latency
    fit and drain rate; of twelve more at once, the few that can start within 0.8 x 1 s are
    served, and the rest are refused at once (not after waiting) with `deadline` and a Retry-After."""
    async with asyncio.timeout(60), gateway(max_concurrency=1, engine_cfg=engine(), scale=0.5,
                                            classes=_classes(ttft_s=1.0)) as gw:
        async with aiohttp.ClientSession() as s:
            first = await asyncio.gather(*(_send(s, gw.url) for _ in range(12)))
            assert all(status == 200 for status, *_ in first)
            second = await asyncio.gather(*(_send(s, gw.url) for _ in range(12)))
        m = await scrape(gw.url)
    served = [r for r in second if r[0] == 200]
    refused = [r for r in second if r[0] == 503]
    assert len(served) + len(refused) == 12 and served and refused
    for _, reason, retry_after, took_s in refused:
        assert reason == "deadline" and retry_after is not None and float(retry_after) >= 1
        assert took_s < 0.5  # refused on arrival, not after a wait
    assert sample(m, "tailguard_rejected_total", **{"class": "interactive", "reason": "deadline"}) == len(refused)
    assert sample(m, "tailguard_slo_total", **{"class": "interactive", "slo": "ttft", "result": "missed"}) >= len(refused)
