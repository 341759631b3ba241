"""Every SSE framing an upstream may use reaches the real `openai` client through the gateway
at once and intact: LF, CRLF (sse-starlette's default) and CR line ends, `data:` without its
space, comments, `event:`/`id:` lines, JSON split over several `data:` lines, and a last event
that EOF cuts off before its blank line.

The upstream is a real server on loopback written here. It sends the role chunk and the first
content chunk, then holds the rest until the test's client has seen that first chunk (at most
5 s): a gateway that framed on LF only would hold the first chunk back with it, and the
client would see nothing before the upstream gave up waiting."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator

import pytest
from aiohttp import web
from openai import AsyncOpenAI

from tailguard.config import GatewayConfig
from tailguard.gateway.http.app import create_app
from tests.servers import running

HOLD_S = 5.0  # how long the upstream holds its second chunk for the client's first


@dataclass(frozen=True)
class Framing:
    end: bytes  # the line end
    sep: bytes = b": "  # between a field's name and its value
    split_json: bool = False  # each chunk's JSON over two `data:` lines
    extras: bool = False  # comments and `event:`/`id:` lines between the events
    cut_last: bool = False  # `data: [DONE]` with no blank line before EOF


FRAMINGS = {
    "lf": Framing(b"\n"),
    "crlf": Framing(b"\r\n"),
    "cr": Framing(b"\r"),
    "crlf-nospace-extras": Framing(b"\r\n", sep=b":", extras=True),
    "lf-multiline-cut": Framing(b"\n", split_json=True, cut_last=True),
    "cr-extras-cut": Framing(b"\r", extras=True, cut_last=True),
}


def _chunk(delta: str) -> bytes:
    return b'{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,' \
        b'"delta":' + delta.encode() + b',"logprobs":null,"finish_reason":null}]}'


ROLE = _chunk('{"role":"assistant","content":""}')
FIRST, SECOND = _chunk('{"content":"Hel"}'), _chunk('{"content":"lo"}')
USAGE = b'{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],' \
    b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'


def _event(f: Framing, data: bytes, n: int) -> bytes:
    e = f.end
    head = (b": comment " + str(n).encode() + e + b"event" + f.sep + b"message" + e + b"id" + f.sep
            + str(n).encode() + e) if f.extras else b""
    if f.split_json and data.startswith(b"{"):
        cut = data.index(b",") + 1
        lines = b"data" + f.sep + data[:cut] + e + b"data" + f.sep + data[cut:] + e
    else:
        lines = b"data" + f.sep + data + e
    return head + lines + e


@dataclass
class Upstream:
    framing: Framing
    client_saw_first: asyncio.Event = field(default_factory=asyncio.Event)
    held_until_seen: list[bool] = field(default_factory=list)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        f = self.framing
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_event(f, ROLE, 0) + _event(f, FIRST, 1))
        try:
            await asyncio.wait_for(self.client_saw_first.wait(), HOLD_S)
            self.held_until_seen.append(True)
        except TimeoutError:
            self.held_until_seen.append(False)
        done = b"data" + f.sep + b"[DONE]" + (b"" if f.cut_last else f.end + f.end)
        await resp.write(_event(f, SECOND, 2) + _event(f, USAGE, 3) + done)
        await resp.write_eof()
        return resp

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", _models)
        return app


async def _models(_: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": []})


@asynccontextmanager
async def through_gateway(framing: Framing) -> AsyncIterator[tuple[Upstream, AsyncOpenAI]]:
    up = Upstream(framing)
    async with running(up.app()) as up_url:
        cfg = GatewayConfig.model_validate(
            {"backends": [{"name": "up", "url": up_url, "kind": "openai", "max_concurrency": 4}]})
        async with running(create_app(cfg), handler_cancellation=True) as gw_url:
            async with AsyncOpenAI(base_url=f"{gw_url}/v1", api_key="k", max_retries=0) as client:
                yield up, client


@pytest.mark.parametrize("framing", FRAMINGS.values(), ids=FRAMINGS.keys())
async def test_stream_first_chunk_arrives_before_the_upstream_sends_the_next(framing: Framing) -> None:
    async with asyncio.timeout(20), through_gateway(framing) as (up, client):
        stream = await client.chat.completions.create(
            model="tailguard-sim", messages=[{"role": "user", "content": "hi"}], stream=True,
            stream_options={"include_usage": True})
        texts: list[str] = []
        usage = None
        async for ch in stream:
            if ch.choices and ch.choices[0].delta.content:
                texts.append(ch.choices[0].delta.content)
                up.client_saw_first.set()
            usage = ch.usage or usage
    assert up.held_until_seen == [True], "the first content chunk waited for the upstream's next one"
    assert texts == ["Hel", "lo"]
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (3, 2)


@pytest.mark.parametrize("framing", FRAMINGS.values(), ids=FRAMINGS.keys())
async def test_non_stream_answer_is_assembled_from_every_framing(framing: Framing) -> None:
    async with asyncio.timeout(20), through_gateway(framing) as (up, client):
        up.client_saw_first.set()  # nobody reads chunks: the upstream need not wait
        r = await client.chat.completions.create(model="tailguard-sim", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "Hello"
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 2)
