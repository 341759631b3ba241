"""Faults that must cost no request another attempt could serve, each made for real on a socket:
a server that drops every reused keep-alive connection (as llama-server does while advertising
keep-alive), one that resets every connection, one that accepts and never answers. The real
`openai` package is the client; every wait is bounded."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tailguard.config import BackendConfig
from tests.functional.gateways import gateway, sample, scrape
from tests.functional.raw_servers import SSE_HEAD, Handler, chunk, never_answers, raw_server, read_request

CHAT = [{"role": "user", "content": "hello"}]
_EVENTS = (
    b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
    b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"content":" ok"},"finish_reason":"stop"}]}\n\n'
    b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}\n\n'
    b"data: [DONE]\n\n"
)
_RESPONSE = SSE_HEAD + chunk(_EVENTS) + b"0\r\n\r\n"

async def drops_reused_connections(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    """Answers the first request of a connection and keeps it open (HTTP/1.1 keep-alive, no
    `Connection: close`); the next request on it finds the connection closed, unanswered."""
    await read_request(r)
    w.write(_RESPONSE)
    await w.drain()
    await read_request(r)


async def resets(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await read_request(r)
    w.transport.abort()  # RST, no answer


def backend(name: str, url: str) -> BackendConfig:
    return BackendConfig(name=name, url=url, kind="openai", max_concurrency=4, models=["tailguard-sim"])


@pytest.mark.parametrize("stream", [True, False])
async def test_a_dropped_keep_alive_connection_is_retried_on_a_fresh_one(stream: bool) -> None:
    async with asyncio.timeout(30), raw_server(drops_reused_connections) as url, \
            gateway(sims=0, extra_backends=[backend("flaky", url)]) as gw, gw.client() as c:
        for _ in range(12):
            if stream:
                s = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=1, stream=True)
                text = "".join([ch.choices[0].delta.content or "" async for ch in s if ch.choices])
            else:
                text = (await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=1)).choices[0].message.content or ""
            assert text == " ok"
        m = await scrape(gw.url)
    assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "success"}) == 12
    assert sample(m, "tailguard_upstream_errors_total", backend="flaky", kind="reset") >= 1


async def test_without_retries_the_same_server_costs_requests() -> None:
    """The check above can fail: with one attempt the dropped connections are lost requests."""
    async with asyncio.timeout(30), raw_server(drops_reused_connections) as url, \
            gateway(sims=0, extra_backends=[backend("flaky", url)], retries={"max_attempts": 1}) as gw, \
            gw.client() as c:
        failed = 0
        for _ in range(12):
            try:
                await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=1)
            except openai.APIStatusError as e:
                assert e.status_code == 502
                failed += 1
    assert failed >= 1


@pytest.mark.parametrize("fault", [resets, never_answers], ids=["resets", "never_answers"])
async def test_a_backend_that_resets_or_hangs_costs_nothing_another_can_serve(fault: Handler) -> None:
    """The hang is caught by the response-head deadline, which a simulator meets at once even on a
    starved machine (a first-token deadline this short failed the healthy backend in CI)."""
    async with asyncio.timeout(30), raw_server(fault) as url, \
            gateway(extra_backends=[backend("bad", url)], timeouts={"header_s": 1.0}) as gw, \
            gw.client() as c:
        results = await asyncio.gather(*(
            c.chat.completions.with_raw_response.create(model="tailguard-sim", messages=CHAT, max_tokens=2)
            for _ in range(6)))
        m = await scrape(gw.url)
    assert [r.parse().choices[0].message.content for r in results] == [" tok" * 2] * 6
    assert all(r.headers["x-tailguard-backend"] == "sim0" for r in results)
    kind = "reset" if fault is resets else "timeout_header"
    assert sample(m, "tailguard_upstream_errors_total", backend="bad", kind=kind) >= 1
    assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "success"}) == 6


async def redirects(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await read_request(r)
    w.write(b"HTTP/1.1 301 Moved Permanently\r\nLocation: https://127.0.0.1:9/v1/chat/completions\r\n"
            b"Content-Length: 0\r\n\r\n")
    await w.drain()


async def test_a_redirecting_backend_is_a_failed_attempt_never_a_relayed_body() -> None:
    """A backend URL that answers 3xx (http:// in front of an https-only server, a missing
    prefix) fails like a 5xx: the request goes to a backend that answers, and alone it gets a
    502 that names where the redirect pointed."""
    async with asyncio.timeout(30), raw_server(redirects) as url:
        async with gateway(extra_backends=[backend("moved", url)]) as gw, gw.client() as c:
            r = await c.chat.completions.with_raw_response.create(model="tailguard-sim", messages=CHAT, max_tokens=2)
            assert r.headers["x-tailguard-backend"] == "sim0"
        async with gateway(sims=0, extra_backends=[backend("moved", url)]) as gw, gw.client() as c:
            with pytest.raises(openai.APIStatusError) as e:
                await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2)
    assert e.value.status_code == 502 and "https://127.0.0.1:9/v1/chat/completions" in e.value.message
