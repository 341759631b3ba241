"""x-request-id on every response: the client's own (bounded, sanitized) when it sent one, else
the gateway's; the same id in the access line (which every answered status gets, 404 included,
each with an RFC 3339 timestamp, a level and an event name) and in the upstream request."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any

import aiohttp
import orjson
import pytest

from tailguard.config import BackendConfig
from tailguard.gateway.ops.access import ACCESS_LOGGER
from tests.functional.gateways import gateway
from tests.functional.raw_servers import raw_server, read_request

BODY = {"model": "tailguard-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def test_request_ids_come_back_go_upstream_and_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    heads: list[bytes] = []

    async def drops(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head = await read_request(r)
        if head.startswith(b"POST"):
            heads.append(head)  # closed unanswered: the request is retried on the simulator

    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    got: dict[str, Any] = {}
    async with asyncio.timeout(30), raw_server(drops) as url:
        flaky = BackendConfig(name="flaky", url=url, max_concurrency=1)
        async with gateway(extra_backends=[flaky], retries={"max_attempts": 3}, routing={"policy": "round-robin"}) \
                as gw, aiohttp.ClientSession() as s:
            chat = f"{gw.url}/v1/chat/completions"
            for _ in range(2):  # round robin: one of the two meets the flaky backend first
                async with s.post(chat, json=BODY, headers={"X-Request-Id": "req-abc_123"}) as r:
                    assert r.status == 200
                    got["own"] = r.headers["x-request-id"]
            async with s.post(chat, json=BODY) as r:
                got["made"] = r.headers["x-request-id"]
            async with s.post(chat, json=BODY, headers={"X-Request-Id": "bad id<script>" + "x" * 500}) as r:
                got["sanitized"] = r.headers["x-request-id"]
            async with s.get(f"{gw.url}/nope", headers={"User-Agent": "probe/1"}) as r:
                assert r.status == 404
                got["404"] = r.headers["x-request-id"]
            async with s.get(f"{gw.url}/health") as r:
                got["health"] = r.headers["x-request-id"]
            await asyncio.sleep(0.05)  # the last handler's access line follows its answer
    assert got["own"] == "req-abc_123"
    assert got["made"].startswith("tg-") and got["404"].startswith("tg-") and got["health"].startswith("tg-")
    assert got["sanitized"] == "badidscript" + "x" * 117 and len(got["sanitized"]) == 128
    assert any(b"x-request-id: req-abc_123" in h.lower() for h in heads), "sent upstream"

    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == ACCESS_LOGGER]
    for line in lines:
        assert datetime.fromisoformat(line["ts"]).tzinfo is not None
        assert line["level"] == "info" and line["event"] == "access"
    by_id = {line["request_id"]: line for line in lines}
    own = by_id["req-abc_123"]
    assert own["status"] == 200 and own["model"] == "tailguard-sim" and own["class"] == "interactive"
    assert own["client"] == "127.0.0.1" and own["user_agent"].startswith("Python")
    assert by_id[got["made"]]["status"] == 200
    missing = by_id[got["404"]]
    assert (missing["status"], missing["path"], missing["user_agent"]) == (404, "/nope", "probe/1")
