"""A fault server for the client's tests: a real aiohttp app on 127.0.0.1 whose behaviour is
chosen by the first path segment (`{url}/<fault>/v1/chat/completions`), recording when each
request arrived. It plays an engine or gateway that hangs, stalls behind keep-alives, rejects
with Retry-After, resets the connection or refuses a bad request.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import defaultdict
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import AsyncIterator, Awaitable, Callable

from aiohttp import web

from tests.servers import running

KEEPALIVE_S = 0.01  # a keep-alive comment this often: far more often than any deadline in the tests
HOLD_S = 5.0  # how long a stalled response stays open; every test ends long before


def chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "tailguard-sim",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


ROLE = chunk({"role": "assistant", "content": ""})


@dataclass
class Faults:
    url: str
    hits: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # monotonic arrivals
    walls: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # the same, as epoch


    def base(self, fault: str) -> str:
        return f"{self.url}/{fault}/v1"


async def _sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp


async def _keepalive_forever(resp: web.StreamResponse) -> web.StreamResponse:
    end = time.monotonic() + HOLD_S
    while time.monotonic() < end:
        await resp.write(b": keep-alive\n\n")
        await asyncio.sleep(KEEPALIVE_S)
    return resp


async def hang(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(HOLD_S)  # never sends the status line
    return web.Response(status=500)


async def role_then_keepalive(request: web.Request) -> web.StreamResponse:
    resp = await _sse(request)
    await resp.write(ROLE)
    return await _keepalive_forever(resp)


async def _three_words(request: web.Request) -> web.StreamResponse:
    resp = await _sse(request)
    await resp.write(ROLE)
    for word in ("one", " two", " three"):
        await resp.write(chunk({"content": word}))
    return resp


async def three_then_keepalive(request: web.Request) -> web.StreamResponse:
    return await _keepalive_forever(await _three_words(request))


async def ok(request: web.Request) -> web.StreamResponse:
    """A whole stream of three content chunks and usage."""
    resp = await _three_words(request)
    await resp.write(chunk({}, finish="stop"))
    await resp.write(b'data: {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "tailguard-sim", '
                     b'"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}}\n\n')
    await resp.write(b"data: [DONE]\n\n")
    return resp


def _error(status: int, code: str, headers: dict[str, str]) -> web.Response:
    body = {"error": {"message": f"refused: {code}", "type": "server_overloaded", "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def reject(status: int, retry_after: Callable[[], str] | None, times: int) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Refuse the first `times` requests of this fault with `status`, then stream normally."""
    async def handler(request: web.Request) -> web.StreamResponse:
        seen = len(request.app[HITS][request.match_info["fault"]])
        if seen <= times:
            headers = {"X-Tailguard-Reject-Reason": "queue_full"}
            if retry_after is not None:
                headers["Retry-After"] = retry_after()
            return _error(status, "queue_full", headers)
        return await ok(request)
    return handler


async def reset_once(request: web.Request) -> web.StreamResponse:
    """The first request's connection is cut before any response; later ones stream."""
    if len(request.app[HITS][request.match_info["fault"]]) == 1:
        assert request.transport is not None
        request.transport.abort()
        await asyncio.sleep(HOLD_S)
    return await ok(request)


async def content_then_reset(request: web.Request) -> web.StreamResponse:
    resp = await _sse(request)
    await resp.write(ROLE + chunk({"content": "one"}))
    await asyncio.sleep(0.02)
    assert request.transport is not None
    request.transport.abort()
    return resp


async def bad_request(request: web.Request) -> web.StreamResponse:
    body = {"error": {"message": "messages is required", "type": "invalid_request_error",
                      "param": "messages", "code": "missing_required_parameter"}}
    return web.json_response(body, status=400)


def _next_whole_second() -> str:
    """An HTTP date (whole seconds) that is up to a second away: the wait is ceil(now) - now."""
    return formatdate(math.ceil(time.time()), usegmt=True)


FAULTS: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] = {
    "hang": hang,
    "role_then_keepalive": role_then_keepalive,
    "three_then_keepalive": three_then_keepalive,
    "ok": ok,
    "429_seconds": reject(429, lambda: "0.2", times=1),
    "429_date": reject(429, _next_whole_second, times=1),
    "429_absurd": reject(429, lambda: "198300", times=1),
    "503_then_200": reject(503, lambda: "0.05", times=1),
    "503_always": reject(503, lambda: "0", times=1000),
    "reset_once": reset_once,
    "content_then_reset": content_then_reset,
    "400": bad_request,
}
HITS = web.AppKey("hits", dict)
WALLS = web.AppKey("walls", dict)


async def _route(request: web.Request) -> web.StreamResponse:
    fault = request.match_info["fault"]
    request.app[WALLS][fault].append(time.time())
    request.app[HITS][fault].append(time.monotonic())
    return await FAULTS[fault](request)


@asynccontextmanager
async def fault_server() -> AsyncIterator[Faults]:
    app = web.Application()
    faults = Faults("")
    app[HITS] = faults.hits
    app[WALLS] = faults.walls
    app.router.add_post("/{fault}/v1/chat/completions", _route)
    app.router.add_get("/{fault}/v1/models", _route)
    async with running(app, handler_cancellation=True) as url:
        faults.url = url
        yield faults
