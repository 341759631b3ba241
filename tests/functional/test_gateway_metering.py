"""What a request is charged and what its response says about where it ran: output tokens are
counted for every outcome (a client that leaves mid-stream included), and a request that named a
`service_tier` is told the tier it was served in."""

from __future__ import annotations

import asyncio

import pytest

from tests.functional.gateways import gateway, sample, scrape, until

CHAT = [{"role": "user", "content": "hello"}]


async def test_a_client_that_leaves_mid_stream_is_charged_what_it_was_sent() -> None:
    async with asyncio.timeout(30), gateway(scale=0.05) as gw, gw.client() as c:
        stream = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2000, stream=True)
        got = 0
        async for ch in stream:
            got += sum(1 for choice in ch.choices if choice.delta.content)
            if got >= 60:
                break
        await stream.close()

        async def ended() -> bool:
            m = await scrape(gw.url)
            return sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "client_gone"}) == 1
        await until(ended)
        m = await scrape(gw.url)
    charged = sample(m, "tailguard_output_tokens_total", **{"class": "interactive"})
    assert got <= charged < 2000  # at least what reached the client, far from what was asked


@pytest.mark.parametrize("asked,served", [("flex", "flex"), ("priority", "priority"), ("default", "default"),
                                          ("auto", "default"), (None, None)])
async def test_the_response_names_the_tier_it_was_served_in(asked: str | None, served: str | None) -> None:
    extra = {} if asked is None else {"service_tier": asked}
    async with asyncio.timeout(30), gateway() as gw, gw.client() as c:
        whole = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3, **extra)  # type: ignore[arg-type]
        stream = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3, stream=True, **extra)  # type: ignore[arg-type]
        tiers = {ch.service_tier async for ch in stream}
    assert whole.service_tier == served
    assert tiers == {served}
