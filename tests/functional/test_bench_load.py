"""The load generator against loopback servers with known behaviour: queueing measured from the
schedule, a late generator marked invalid, staged timeouts, errors and disconnects in the tail."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp import web

from tailguard.bench.load import BenchConfig, Timeouts

from tailguard.bench.run import run_bench
from tailguard.bench.stats import summarize
from tailguard.bench.workload import parse_workload
from tailguard.errors import TargetError
from tailguard.wire.openai import chat_chunk, parse_request, usage_dict
from tailguard.wire.sse import DONE_EVENT, encode_event
from tests.servers import running

SERVICE_S = 0.05
TOKENS = 5
SEEN = web.AppKey("seen", list)


def chat_workload(max_tokens: int = TOKENS, stream: bool = True) -> Any:
    return parse_workload({"name": "t", "classes": [
        {"name": "chat", "prompt_tokens": 20, "max_tokens": max_tokens, "stream": stream,
         "headers": {"X-Tailguard-Class": "interactive"}},
    ]})


def one_at_a_time_app(service_s: float = SERVICE_S, block_first_s: float = 0.0) -> web.Application:
    """Serves one request at a time, each taking `service_s`, so a queue builds in front of it.
    With `block_first_s`, the first request blocks the whole event loop (the bench's too)."""
    lock = asyncio.Lock()
    seen: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        p = parse_request(await request.read(), "chat")
        seen.append({"class": request.headers.get("X-Tailguard-Class"), "tokens": p.prompt_tokens})
        async with lock:
            if block_first_s and len(seen) == 1:
                time.sleep(block_first_s)  # deliberately stalls the shared loop: the generator falls behind
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Tailguard-Queue-Ms": "12.5",
                                               "X-Tailguard-Backend": "solo"})
            await resp.prepare(request)
            await resp.write(encode_event(chat_chunk("c", "m", 0, role="assistant")))
            n = p.max_tokens or 1
            for _ in range(n):
                await asyncio.sleep(service_s / n)
                await resp.write(encode_event(chat_chunk("c", "m", 0, content="tok ")))
            await resp.write(encode_event(chat_chunk("c", "m", 0, usage=usage_dict(p.prompt_tokens, n), empty_choices=True)))
            await resp.write(DONE_EVENT)
            return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "solo-model", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app[SEEN] = seen
    return app


async def test_open_loop_latency_includes_queueing_from_the_schedule() -> None:
    rate, n = 50.0, 10  # arrivals every 20 ms, service 50 ms one at a time: the queue grows
    app = one_at_a_time_app()
    async with running(app) as url, asyncio.timeout(30):
        result = await run_bench(BenchConfig(url=url + "/v1", workload=chat_workload(), rate=rate,
                                             arrival="constant", requests=n))
    recs = result.records
    assert [r.index for r in recs] == list(range(n)) and all(r.ok for r in recs)
    assert [r.scheduled_at for r in recs] == pytest.approx([i / rate for i in range(n)])
    for i, r in enumerate(recs):
        # the server cannot finish request i before (i + 1) services have run since t=0
        assert r.e2e_s >= (i + 1) * SERVICE_S - i / rate - 0.002
        assert r.ttft_s is not None and r.ttft_s >= i * SERVICE_S - i / rate
        assert len(r.chunk_at) == TOKENS and r.output_tokens == TOKENS and r.usage_prompt_tokens == 20
        assert r.queue_ms == 12.5 and r.backend == "solo" and r.status == 200
    assert recs[-1].e2e_s > 5 * recs[0].e2e_s  # queueing, not service time, dominates the tail
    assert result.meta["model"] == "solo-model" and result.meta["mode"] == "open"
    assert {s["class"] for s in app[SEEN]} == {"interactive"}
    s = summarize(recs, result.meta)
    assert s["overall"]["queue_s"]["p50"] == pytest.approx(0.0125)
    assert s["overall"]["e2e_s"]["max"] == pytest.approx(max(r.e2e_s for r in recs), abs=1e-6)


async def test_closed_loop_clients_wait_their_turn() -> None:
    async with running(one_at_a_time_app()) as url, asyncio.timeout(30):
        result = await run_bench(BenchConfig(url=url, workload=chat_workload(), concurrency=3, requests=9,
                                             warmup_requests=3, model="tailguard-sim"))
    recs = result.records
    assert len(recs) == 12 and sum(r.warmup for r in recs) == 3
    assert all(r.ok for r in recs)
    # three clients, one server slot: after the start, each request waits for two others
    later = [r for r in recs if r.index >= 3]
    assert all(r.e2e_s >= 2 * SERVICE_S for r in later)
    # in a closed loop a client is due when its previous request ended
    ends = sorted(r.ended_at for r in recs)
    for r in later:
        assert any(abs(r.scheduled_at - e) < 0.01 for e in ends)


async def test_a_generator_that_falls_behind_is_invalid_and_latency_counts_the_lag() -> None:
    block = 0.3
    async with running(one_at_a_time_app(service_s=0.01, block_first_s=block)) as url, asyncio.timeout(30):
        result = await run_bench(BenchConfig(url=url, workload=chat_workload(max_tokens=1), rate=100.0,
                                             arrival="constant", requests=30, model="tailguard-sim"))
    late = [r for r in result.records if 0.05 <= r.scheduled_at <= 0.2]
    assert late
    for r in late:
        # due during the stall, sent after it; the lag is part of the measured latency
        assert r.dispatch_lag_s >= block - r.scheduled_at - 0.01
        assert r.e2e_s >= r.dispatch_lag_s + (r.ended_at - r.sent_at) - 1e-9
    v = summarize(result.records, result.meta)["validity"]
    assert v["valid"] is False and v["dispatch_lag_p99_s"] > 0.1
    assert result.meta["loop_lag_s"]["max"] >= 0.2


async def until_client_leaves(request: web.Request, limit_s: float = 5.0) -> None:
    """Hold a response open without sending, until the client gives up (ends fast at teardown)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and request.transport is not None and not request.transport.is_closing():
        await asyncio.sleep(0.01)


def misbehaving_app() -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            return await respond(request)
        except ConnectionResetError:
            return web.Response()  # the client left; nothing more to send

    async def respond(request: web.Request) -> web.StreamResponse:
        body = parse_request(await request.read(), "chat").body
        mode = body.get("user")
        if mode == "overloaded":
            return web.json_response({"error": {"message": "full", "type": "server_overloaded", "param": None,
                                                "code": None}}, status=503, headers={"Retry-After": "1"})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(encode_event(chat_chunk("c", "m", 0, role="assistant")))
        if mode == "silent":
            await until_client_leaves(request)  # never a content token
        await resp.write(encode_event(chat_chunk("c", "m", 0, content="a")))
        if mode == "stall":
            await until_client_leaves(request)
        if mode == "cut":
            assert request.transport is not None
            request.transport.close()
            return resp
        if mode == "no-done":
            return resp
        await resp.write(encode_event(chat_chunk("c", "m", 0, content="b")))
        await resp.write(DONE_EVENT)  # no usage: tokens fall back to counted chunks
        return resp

    async def plain(request: web.Request) -> web.Response:
        p = parse_request(await request.read(), "chat")
        if p.body.get("user") == "garbage":
            return web.Response(text="<html>bad gateway page</html>")
        await asyncio.sleep(0.02)
        return web.json_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * 12}}],
                                  "usage": usage_dict(p.prompt_tokens, 3)})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/plain/v1/chat/completions", plain)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/plain/v1/models", models)
    return app


async def test_errors_timeouts_and_disconnects_are_recorded_by_phase() -> None:
    modes = ["ok", "overloaded", "silent", "stall", "cut", "no-done"]
    w = parse_workload({"name": "faults", "classes": [
        {"name": m, "weight": 1, "prompt_tokens": 10, "max_tokens": 2, "body": {"user": m}} for m in modes
    ]})
    cfg = BenchConfig(url="", workload=w, concurrency=6, requests=36, model="tailguard-sim",
                      timeouts=Timeouts(connect_s=1.0, first_token_s=0.2, total_s=0.4))
    async with running(misbehaving_app()) as url, asyncio.timeout(30):
        result = await run_bench(BenchConfig(**{**cfg.__dict__, "url": url}))
    by = {m: [r for r in result.records if r.cls == m] for m in modes}
    assert all(by[m] for m in modes)
    for r in by["ok"]:
        assert r.ok and r.output_tokens == 2 and r.usage_output_tokens is None and len(r.chunk_at) == 2
    for r in by["overloaded"]:
        assert not r.ok and r.status == 503 and r.error_kind == "http" and "full" in (r.error or "")
    for r in by["silent"]:
        assert r.error_kind == "timeout" and r.timeout_phase == "first_token" and r.ttft_s is None
        assert 0.2 <= r.ended_at - r.sent_at < 1.0
    for r in by["stall"]:
        assert r.error_kind == "timeout" and r.timeout_phase == "total" and len(r.chunk_at) == 1
        assert 0.4 <= r.ended_at - r.sent_at < 1.2
    for r in by["cut"]:
        assert r.error_kind in ("disconnect", "truncated") and not r.ok and len(r.chunk_at) == 1
    for r in by["no-done"]:
        assert r.error_kind == "truncated"
    s = summarize(result.records, result.meta)
    o = s["overall"]
    assert o["count"] == 36 and o["ok"] == len(by["ok"])
    assert o["timeouts"] == len(by["silent"]) + len(by["stall"])
    assert o["errors"] == 36 - o["ok"] - o["timeouts"]
    assert o["e2e_s"]["p99"] is None  # failures rank as worst: the tail is a failure
    assert s["classes"]["ok"]["e2e_s"]["p99"] is not None


async def test_non_stream_requests_and_connection_refused() -> None:
    async with running(misbehaving_app()) as url, asyncio.timeout(30):
        result = await run_bench(BenchConfig(url=url + "/plain", workload=chat_workload(stream=False), concurrency=2,
                                             requests=4, model="tailguard-sim"))
    for r in result.records:
        assert r.ok and r.output_tokens == 3 and r.ttft_s == pytest.approx(r.e2e_s, abs=1e-3) and not r.chunk_at
    garbage = parse_workload({"name": "g", "classes": [{"name": "g", "prompt_tokens": 9, "max_tokens": 2,
                                                         "stream": False, "body": {"user": "garbage"}}]})
    async with running(misbehaving_app()) as url, asyncio.timeout(30):
        result = await run_bench(BenchConfig(url=url + "/plain", workload=garbage, concurrency=1, requests=2, model="tailguard-sim"))
    assert [(r.ok, r.error_kind, r.ttft_s) for r in result.records] == [(False, "protocol", None)] * 2
    async with running(web.Application()) as url:
        pass  # the port is closed again: nothing listens there now
    # Refused before any load: one line that names the address, even with --model given.
    with pytest.raises(TargetError, match=r"^cannot connect to 127\.0\.0\.1:\d+ .*connection refused"):
        async with asyncio.timeout(30):
            await run_bench(BenchConfig(url=url, workload=chat_workload(), concurrency=1, requests=2, model="tailguard-sim",
                                        timeouts=Timeouts(connect_s=1.0)))
