"""Hostile clients over real loopback sockets: a slowloris head, a socket that sends nothing,
idle keep-alive connections, more connections than the cap (idle ones and busy ones), and
requests aiohttp's parser refuses. Each is closed or refused as nginx would, counted, and the
gateway keeps answering `/health` and a normal chat."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import orjson
import pytest
import yaml

from tailguard.sim.server import running_sim
from tests.functional.gateways import SCALE, engine, gateway, sample, scrape

CHAT = orjson.dumps({"model": "tailguard-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
LONG = orjson.dumps({"model": "tailguard-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100_000,
                     "stream": True})
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


async def _open(url: str, source: str | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the gateway, from loopback address `source` when given (20,000 from one
    address would leave the kernel searching the ephemeral ports past the ones in TIME_WAIT)."""
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port), local_addr=(source, 0) if source else None)


async def _closed_after(reader: asyncio.StreamReader) -> float:
    """Seconds until the gateway closes the connection (what it sent meanwhile is ignored)."""
    t = time.perf_counter()
    while await reader.read(65536):
        pass
    return time.perf_counter() - t


def _post(body: bytes, extra: str = "") -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


async def _status(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
    return int(head.split(b" ")[1]), head, await reader.readexactly(length)


async def test_a_slowloris_head_and_a_silent_socket_are_closed_at_the_header_timeout() -> None:
    async with asyncio.timeout(10), gateway(limits={"header_timeout_s": 0.5}) as gw:
        silent, silent_w = await _open(gw.url)
        slow_r, slow_w = await _open(gw.url)

        async def trickle() -> None:
            for byte in _post(CHAT):  # one byte every 50 ms: 10 s for the whole request
                slow_w.write(bytes([byte]))
                await asyncio.sleep(0.05)

        dripping = asyncio.create_task(trickle())
        silent_s, slow_s = await asyncio.gather(_closed_after(silent), _closed_after(slow_r))
        dripping.cancel()
        slow_w.close()
        silent_w.close()
        assert 0.4 < silent_s < 1.5 and 0.4 < slow_s < 1.5
        assert sample(await scrape(gw.url), "tailguard_connections_closed_total", reason="header_timeout") == 2


async def test_the_header_clock_restarts_for_each_request_on_a_kept_alive_connection() -> None:
    async with asyncio.timeout(10), gateway(limits={"header_timeout_s": 0.5}) as gw:
        reader, writer = await _open(gw.url)
        for _ in range(3):  # each request well within its own header deadline, 1.2 s in all
            await asyncio.sleep(0.3)
            writer.write(_post(CHAT))
            assert (await _status(reader))[0] == 200
        writer.write(_post(CHAT)[:20])  # then a head that stops
        assert 0.4 < await _closed_after(reader) < 1.5
        writer.close()


async def test_an_idle_keep_alive_connection_is_closed_at_the_keepalive_timeout() -> None:
    async with asyncio.timeout(10), gateway(limits={"keepalive_timeout_s": 0.5, "header_timeout_s": 5}) as gw:
        reader, writer = await _open(gw.url)
        writer.write(_post(CHAT))
        assert (await _status(reader))[0] == 200
        assert 0.4 < await _closed_after(reader) < 1.5
        writer.close()


@pytest.mark.parametrize("raw, what", [
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"0\r\n\r\n", "length and chunked"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\nzz-secret\r\n", "chunk size"),
])
async def test_a_request_the_parser_refuses_is_an_openai_400_that_echoes_nothing(raw: bytes, what: str) -> None:
    async with asyncio.timeout(10), gateway() as gw:
        reader, writer = await _open(gw.url)
        writer.write(raw)
        status, head, body = await _status(reader)
        writer.close()
        assert status == 400 and b"application/json" in head.lower(), what
        err = orjson.loads(body)["error"]
        assert err["code"] == "malformed_request" and err["type"] == "invalid_request_error"
        assert b"secret" not in body and b"zz" not in body
        m = await scrape(gw.url)
        assert sample(m, "tailguard_unclassified_requests_total", status="400") == 1  # no class: by status


def _head(path: bytes, extra: bytes) -> bytes:
    method = b"POST" if path.startswith(b"/v1") else b"GET"
    body = CHAT if method == b"POST" else b""
    return (method + b" " + path + b" HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n" % len(body) + extra + b"\r\n" + body)


HEADS = {
    "one line of 9 KiB": b"X-Long: " + b"secret" * 1500 + b"\r\n",
    "one line of 64 KiB": b"X-Long: " + b"secret" * 11000 + b"\r\n",
    "200 headers": b"".join(b"X-%d: secret\r\n" % i for i in range(200)),
    "72 KiB in lines of 8 KB": b"".join(b"X-%d: %s\r\n" % (i, b"s" * 8000) for i in range(9)),
    "5,000 headers, 1 MB": b"".join(b"X-%d: %s\r\n" % (i, b"secret" * 33) for i in range(5000)),
}


@pytest.mark.parametrize("what", sorted(HEADS))
@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/health"])
@pytest.mark.parametrize("server", ["lean", "aiohttp"])
async def test_a_head_past_its_bounds_is_a_431_on_either_server(what: str, path: bytes, server: str) -> None:
    """8 KiB a line, 128 headers, 64 KiB in all: on a fresh connection (the lean server reads
    every head first) and on one aiohttp already holds (it answered a /health on it)."""
    async with asyncio.timeout(10), gateway() as gw:
        reader, writer = await _open(gw.url)
        if server == "aiohttp":
            writer.write(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
            assert (await _status(reader))[0] == 200
        writer.write(_head(path, HEADS[what]))
        status, head, body = await _status(reader)
        assert status == 431, what
        assert orjson.loads(body)["error"]["code"] == "request_header_fields_too_large" and b"secret" not in body
        try:  # then closed (reset, when the rest of the head was never read)
            assert await _closed_after(reader) < 5
        except ConnectionResetError:
            pass
        writer.close()
        m = await scrape(gw.url)
        assert sample(m, "tailguard_unclassified_requests_total", status="431") == 1


async def test_a_large_body_on_a_connection_aiohttp_holds_is_no_head() -> None:
    """A body of 300 KB sent in pieces after its head, on a kept-alive connection aiohttp serves:
    its bytes are the body's, not a head's (counted as one, it was a 431 half way)."""
    body = orjson.dumps({"model": "tailguard-sim", "input": "hello " * 50_000})
    async with asyncio.timeout(20), gateway() as gw:
        reader, writer = await _open(gw.url)
        for _ in range(2):
            writer.write(b"POST /v1/embeddings HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body))
            for i in range(0, len(body), 16384):
                writer.write(body[i:i + 16384])
                await writer.drain()
                await asyncio.sleep(0)
            status, _, answer = await _status(reader)
            assert status == 200, answer[:300]
        writer.close()


@pytest.mark.parametrize("server", ["lean", "aiohttp"])
async def test_a_head_that_never_ends_is_a_431_at_64_kib(server: str) -> None:
    """Header lines of 4 KB, never the blank one: answered 431 once 64 KiB are in (aiohttp alone
    would hold 128 lines of 8 KiB, then answer 400), and the connection closed."""
    async with asyncio.timeout(10), gateway() as gw:
        reader, writer = await _open(gw.url)
        if server == "aiohttp":
            writer.write(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
            assert (await _status(reader))[0] == 200
        writer.write(b"GET /health HTTP/1.1\r\nHost: gw\r\n")
        sent = 0

        async def flood() -> None:
            nonlocal sent
            try:
                while sent < 4 * 1024 * 1024:
                    writer.write(b"X-%d: %s\r\n" % (sent, b"s" * 4000))
                    await writer.drain()
                    sent += 4000
            except ConnectionError:
                pass  # closed by the gateway, as it should

        flooding = asyncio.create_task(flood())
        status, _, _ = await _status(reader)
        await asyncio.wait([flooding], timeout=5)  # the gateway closed it: the flood stops
        assert status == 431 and flooding.done() and sent < 4 * 1024 * 1024, sent
        writer.close()


async def test_at_the_cap_idle_connections_make_room_and_busy_ones_leave_only_health() -> None:
    """16 connections at most, 4 more for /health: idle ones are closed for newcomers; once all
    16 are busy (long streams), a newcomer gets /health and a 503 for a chat, and past the
    reserve a connection is closed at once."""
    limits = {"max_connections": 16, "reserved_connections": 4, "header_timeout_s": 30}
    async with asyncio.timeout(30), gateway(limits=limits, max_concurrency=32, engine_cfg=engine(max_num_seqs=32)) as gw:
        idle = [await _open(gw.url) for _ in range(40)]  # each newcomer closes the oldest idle one
        busy = []
        for _ in range(16):
            r, w = await _open(gw.url)
            w.write(_post(LONG))
            await r.readuntil(b"\r\n\r\n")  # its stream is open: a busy connection
            busy.append((r, w))
        for r, w in idle:
            assert await asyncio.wait_for(r.read(), 5) == b""  # all of them made room
            w.close()
        reserve = [await _open(gw.url) for _ in range(4)]
        r, w = reserve[0]
        w.write(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert (await _status(r))[0] == 200
        r, w = reserve[1]
        w.write(_post(CHAT))
        status, head, body = await _status(r)
        assert status == 503 and orjson.loads(body)["error"]["code"] == "too_many_connections"
        assert b"retry-after: 1" in head.lower()
        over = await _open(gw.url)
        assert await asyncio.wait_for(over[0].read(), 5) == b""  # past the reserve: closed at once
        for _, w in busy + reserve + [over]:
            w.close()
        m = await scrape(gw.url)
        assert sample(m, "tailguard_connections_closed_total", reason="evicted_idle") >= 40
        assert sample(m, "tailguard_connections_closed_total", reason="over_cap") >= 1


@asynccontextmanager
async def _served(tmp_path: Path, backend: str, limits: dict[str, object]) -> AsyncIterator[str]:
    """`tailguard serve` in a process of its own (its own file limit) in front of `backend`;
    yields the gateway's URL."""
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump({"port": 0, "access_log": False, "limits": limits,
                                    "backends": [{"name": "sim", "url": backend, "kind": "sim"}]}))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard", "serve", "--config", str(path), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=ROOT)
    try:
        assert proc.stderr is not None
        while True:
            line = (await proc.stderr.readline()).decode()
            assert line, "the gateway exited"
            if "listening on http://" in line:
                break
        yield "http://" + line.split("http://", 1)[1].split()[0]
    finally:
        proc.terminate()
        await proc.wait()


def _idle_sockets(url: str, n: int, source: str) -> list[socket.socket]:
    """`n` connections that send nothing, from loopback address `source` (20,000 from one
    address would leave the kernel searching the ephemeral ports past the ones in TIME_WAIT)."""
    host, port = url.removeprefix("http://").split(":")
    out = []
    for _ in range(n):
        sock = socket.socket()
        sock.bind((source, 0))
        sock.connect((host, int(port)))  # the kernel completes it from the listen backlog
        out.append(sock)
    return out


async def test_twenty_thousand_idle_connections_do_not_take_health_down(tmp_path: Path) -> None:
    """The issue's 20,000 idle sockets, held open at once by this process (as many as its file
    limit allows), against a gateway in a process of its own capped at 1,000: it closes the
    oldest idle ones as new ones come, so it never nears its file limit, and `/health` and a
    chat are answered throughout."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    n = min(20_000, hard - 200)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, n + 150)), hard))
    socks: list[socket.socket] = []
    try:
        async with asyncio.timeout(120), running_sim(engine(), time_scale=SCALE) as sim, \
                _served(tmp_path, sim.url, {"max_connections": 1000, "reserved_connections": 8}) as url, \
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            # (a connection per request: a kept-alive one is idle between requests, and the gateway
            # rightly evicts the oldest idle ones as the next 500 come: a POST on it would fail)
            slowest = 0.0
            for i in range(0, n, 500):  # 500 at a time: within the gateway's listen backlog of 1,024
                socks += _idle_sockets(url, min(500, n - i), f"127.0.{1 + i // 2000}.1")
                t = time.perf_counter()
                async with s.get(f"{url}/health") as r:
                    assert r.status == 200
                async with s.post(f"{url}/v1/chat/completions", data=CHAT,
                                  headers={"Content-Type": "application/json"}) as r:
                    assert r.status == 200
                slowest = max(slowest, time.perf_counter() - t)
            m = await scrape(url)
    finally:
        for sock in socks:
            sock.close()
    assert slowest < 1.0, slowest
    closed = (sample(m, "tailguard_connections_closed_total", reason="evicted_idle")
              + sample(m, "tailguard_connections_closed_total", reason="header_timeout"))
    assert closed >= n - 1000 - 8


async def test_queued_bodies_past_their_byte_budget_are_refused_with_retry_after() -> None:
    """One slot, held by a long stream; bodies of 600 KiB queue behind it until the next one
    would pass `max_queued_body_bytes` (1 MiB): that one gets 503 `queue_full`, before the
    queue's length is anywhere near its bound."""
    big = orjson.dumps({"model": "tailguard-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                        "user": "u" * 600 * 1024})
    async with asyncio.timeout(30), gateway(limits={"max_queued_body_bytes": 1024 * 1024}, max_concurrency=1) as gw:
        holder = await _open(gw.url)
        holder[1].write(_post(LONG))
        await holder[0].readuntil(b"\r\n\r\n")  # streaming: the one slot is taken
        queued = await _open(gw.url)
        queued[1].write(_post(big))
        async with asyncio.timeout(5):
            while (await _json(gw.url, "/health"))["queued"] == 0:
                await asyncio.sleep(0.01)
        refused = await _open(gw.url)
        refused[1].write(_post(big))
        status, head, body = await _status(refused[0])
        assert status == 503 and orjson.loads(body)["error"]["code"] == "queue_full"
        assert b"retry-after: 1" in head.lower() and b"x-tailguard-reject-reason: queue_full" in head.lower()
        for _, w in (holder, queued, refused):
            w.close()
        m = await scrape(gw.url)
        assert sample(m, "tailguard_rejected_total", **{"class": "interactive", "reason": "queue_full"}) == 1


async def _json(url: str, path: str) -> dict[str, object]:
    async with aiohttp.ClientSession() as s, s.get(url + path) as r:
        out: dict[str, object] = await r.json()
        return out
