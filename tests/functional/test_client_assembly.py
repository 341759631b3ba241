"""A non-stream call is answered with the same body whichever side joined the stream: the gateway
in front of an upstream, or tailguard.client (sync and async) calling that upstream directly. Both
ask upstream for a stream and join it with `wire.join`, so reasoning, logprobs, the finish reason
and the system fingerprint reach the caller both ways. The upstream is a real server on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from openai import AsyncOpenAI

from tailguard.client import Timeouts
from tailguard.config import GatewayConfig
from tailguard.gateway.http.app import create_app
from tests.functional.client_calls import CHAT, KINDS, call
from tests.servers import running

HEAD = {"id": "c1", "object": "chat.completion.chunk", "created": 11, "model": "tailguard-sim", "system_fingerprint": "fp1"}
TOKEN = {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": [{"token": "Hi", "logprob": -0.1,
                                                                                "bytes": [72, 105]}]}


def _chunk(delta: dict[str, Any], logprobs: Any = None, finish_reason: str | None = None) -> dict[str, Any]:
    return {**HEAD, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]}


CHUNKS = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"reasoning_content": "Think "}),
    _chunk({"reasoning_content": "first."}),
    _chunk({"content": "Hi"}, logprobs={"content": [TOKEN]}),
    _chunk({}, finish_reason="length"),
    {**HEAD, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}},
]


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    assert body["stream"] is True and body["stream_options"]["include_usage"] is True  # both sides stream upstream
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for chunk in CHUNKS:
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _models(_: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": []})


@asynccontextmanager
async def upstream_and_gateway() -> AsyncIterator[tuple[str, str]]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    async with running(app) as up_url:
        cfg = GatewayConfig.model_validate(
            {"backends": [{"name": "up", "url": up_url, "kind": "openai", "max_concurrency": 4}]})
        async with running(create_app(cfg), handler_cancellation=True) as gw_url:
            yield up_url, gw_url


@pytest.mark.parametrize("kind", KINDS)
async def test_the_client_and_the_gateway_join_a_stream_into_the_same_body(kind: str) -> None:
    async with asyncio.timeout(20), upstream_and_gateway() as (up_url, gw_url):
        async with AsyncOpenAI(base_url=f"{gw_url}/v1", api_key="k", max_retries=0) as plain:
            via_gateway = await plain.chat.completions.create(model="tailguard-sim", messages=CHAT)  # type: ignore[arg-type]
        direct = await call(kind, f"{up_url}/v1", stream=False, timeouts=Timeouts(connect=5, first_token=5, idle=5))
    assert direct.error is None
    assert direct.answer.model_dump() == via_gateway.model_dump()
    [choice] = direct.answer.choices
    assert (choice.message.content, choice.message.reasoning_content) == ("Hi", "Think first.")
    assert choice.logprobs.model_dump(exclude_none=True) == {"content": [TOKEN]}
    assert choice.finish_reason == "length" and direct.answer.system_fingerprint == "fp1"
