"""A stream's preamble bounded in time (issue 18, point 1): a backend that keeps sending bytes
without content (keep-alive comments forever) fails its attempt at `limits.max_preamble_s`, long
before the first-token deadline; one that sends its role chunk and then takes its time to its
first token (a long prefill) is not cut."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from tailguard.config import BackendConfig
from tests.functional.gateways import gateway
from tests.functional.raw_servers import DONE_END, SSE_HEAD, TOK_EVENT, chunk, raw_server, read_request

ROLE = (b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
        b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n')
CHAT = [{"role": "user", "content": "hi"}]


async def pings_forever(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await read_request(r)
    w.write(SSE_HEAD + chunk(ROLE))
    while True:
        await asyncio.sleep(0.05)
        w.write(chunk(b": ping\n\n"))
        await w.drain()


async def slow_prefill(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await read_request(r)
    w.write(SSE_HEAD + chunk(ROLE))
    await w.drain()
    await asyncio.sleep(1.2)  # the prompt's prefill: nothing comes meanwhile
    w.write(chunk(TOK_EVENT) + DONE_END)
    await w.drain()


@pytest.mark.parametrize("stream", [True, False])
async def test_bytes_that_keep_coming_without_content_fail_at_the_preamble_bound(stream: bool) -> None:
    async with raw_server(pings_forever) as url, asyncio.timeout(20), gateway(
            sims=0, extra_backends=[BackendConfig(name="pinger", url=url, kind="openai")],
            limits={"max_preamble_s": 0.5}, retries={"max_attempts": 1}) as gw, gw.client() as c:
        t0 = time.perf_counter()
        with pytest.raises(openai.APIStatusError) as info:
            if stream:
                s = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3, stream=True)
                async for _ in s:
                    pass
            else:
                await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3)
        took = time.perf_counter() - t0
    assert info.value.status_code == 502 and "without content" in info.value.message
    assert took < 3.0  # the first-token deadline is 120 s


async def test_a_role_chunk_then_a_long_wait_for_the_first_token_is_not_cut() -> None:
    async with raw_server(slow_prefill) as url, asyncio.timeout(20), gateway(
            sims=0, extra_backends=[BackendConfig(name="prefill", url=url, kind="openai")],
            limits={"max_preamble_s": 0.5}) as gw, gw.client() as c:
        r = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3)
    assert r.choices[0].message.content == " tok"
