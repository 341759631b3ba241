"""The lean server of the hot routes over real loopback sockets: what it does itself (a head sent
byte by byte, a body that never ends, a huge `Content-Length`, chunked bodies, `100 Continue`,
keep-alive, pipelining refused, a broken chunk after the head was served) and what it hands to
aiohttp (another route on the same connection). Every answer is checked from its raw bytes."""

from __future__ import annotations

import asyncio
import time

import orjson

from tests.functional.gateways import gateway, sample, scrape
from tests.functional.test_gateway_hostile_client import _closed_after, _open, _post, _status

CHAT = orjson.dumps({"model": "tailguard-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
STREAM = orjson.dumps({"model": "tailguard-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                       "stream": True})


async def _chunked_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """A chunked response's head and its de-chunked body."""
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower(), head
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            return head, body
        body += data[:-2]


async def test_a_head_sent_byte_by_byte_is_served_lean() -> None:
    async with asyncio.timeout(20), gateway(limits={"header_timeout_s": 5}) as gw:
        reader, writer = await _open(gw.url)
        for byte in _post(STREAM):
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0)
        head, body = await _chunked_answer(reader)
        writer.close()
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"server: tailguard" in head.lower()
        assert b"text/event-stream" in head and b"x-request-id: " in head.lower() and b"x-tailguard-config: " in head.lower()
        assert body.endswith(b"data: [DONE]\n\n") and body.count(b'"content":" tok"') == 3


async def test_keep_alive_serves_request_after_request_on_one_connection() -> None:
    async with asyncio.timeout(20), gateway() as gw:
        reader, writer = await _open(gw.url)
        for _ in range(3):
            writer.write(_post(CHAT))
            status, head, body = await _status(reader)
            assert status == 200 and b"server: tailguard" in head.lower()
            assert orjson.loads(body)["choices"][0]["message"]["content"] == " tok tok"
        writer.write(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")  # another route: aiohttp answers it
        status, head, _ = await _status(reader)
        assert status == 200 and b"aiohttp" in head.lower()
        writer.write(_post(CHAT))  # and keeps the connection, hot routes included
        assert (await _status(reader))[0] == 200
        writer.close()


async def test_a_body_that_never_ends_is_a_408_at_the_body_timeout_and_the_connection_closes() -> None:
    async with asyncio.timeout(20), gateway(body_timeout_s=0.5) as gw:
        reader, writer = await _open(gw.url)
        writer.write(_post(CHAT)[:-5])  # five bytes short, for ever
        t = time.perf_counter()
        status, head, body = await _status(reader)
        took = time.perf_counter() - t
        assert status == 408 and orjson.loads(body)["error"]["code"] == "body_timeout" and 0.4 < took < 3
        assert b"connection: close" in head.lower()
        assert await _closed_after(reader) < 1
        writer.close()


async def test_a_huge_content_length_is_refused_before_its_body_and_the_connection_closes() -> None:
    async with asyncio.timeout(20), gateway(max_body_bytes=1 << 20) as gw:
        reader, writer = await _open(gw.url)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 999999999999999\r\n\r\n{\"model\":")
        status, head, body = await _status(reader)
        assert status == 413 and orjson.loads(body)["error"]["code"] == "body_too_large"
        assert b"connection: close" in head.lower()
        assert await _closed_after(reader) < 1
        writer.close()


def _chunked(body: bytes, pieces: int) -> list[bytes]:
    step = -(-len(body) // pieces)
    return [b"%x\r\n%b\r\n" % (len(body[i:i + step]), body[i:i + step]) for i in range(0, len(body), step)] + [
        b"0\r\n\r\n"]


async def test_a_chunked_body_sent_in_pieces_is_read_whole() -> None:
    async with asyncio.timeout(20), gateway() as gw:
        reader, writer = await _open(gw.url)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        for piece in _chunked(CHAT, 5):
            writer.write(piece)
            await asyncio.sleep(0.01)
        status, head, body = await _status(reader)
        assert status == 200 and b"server: tailguard" in head.lower()
        assert orjson.loads(body)["usage"]["completion_tokens"] == 2
        writer.close()


async def test_a_chunked_body_past_the_limit_is_a_413_and_not_kept() -> None:
    async with asyncio.timeout(20), gateway(max_body_bytes=4096) as gw:
        reader, writer = await _open(gw.url)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        for piece in _chunked(b"x" * 64 * 1024, 16):
            writer.write(piece)
        status, head, body = await _status(reader)
        assert status == 413 and orjson.loads(body)["error"]["code"] == "body_too_large"
        assert await _closed_after(reader) < 1
        writer.close()


async def test_a_chunk_broken_after_the_head_was_served_is_a_400() -> None:
    async with asyncio.timeout(20), gateway() as gw:
        reader, writer = await _open(gw.url)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n4\r\n{\"mo\r\n")
        await asyncio.sleep(0.1)  # the head is being served: the broken chunk reaches the lean parser
        writer.write(b"zz-secret\r\n")
        status, _, body = await _status(reader)
        assert status == 400 and orjson.loads(body)["error"]["code"] == "invalid_body" and b"secret" not in body
        writer.close()


async def test_expect_100_continue_is_answered_when_the_body_is_wanted() -> None:
    async with asyncio.timeout(20), gateway() as gw:
        reader, writer = await _open(gw.url)
        head = _post(CHAT, "Expect: 100-continue\r\n")[: -len(CHAT)]
        writer.write(head)
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(CHAT)
        assert (await _status(reader))[0] == 200
        writer.close()


async def test_a_refused_caller_gets_no_100_continue_and_its_body_is_never_read() -> None:
    async with asyncio.timeout(20), gateway(auth={"api_keys": {"sk-right": {}}}) as gw:
        reader, writer = await _open(gw.url)
        writer.write(_post(CHAT, "Expect: 100-continue\r\nAuthorization: Bearer sk-wrong\r\n")[: -len(CHAT)])
        status, head, _ = await _status(reader)
        assert status == 401 and b"connection: close" in head.lower()
        writer.close()


async def test_a_pipelined_request_is_not_read_and_the_answer_before_it_is_the_last() -> None:
    async with asyncio.timeout(20), gateway() as gw:
        reader, writer = await _open(gw.url)
        writer.write(_post(CHAT) + _post(CHAT))
        status, head, _ = await _status(reader)
        assert status == 200 and b"connection: close" in head.lower()
        assert await reader.read() == b""  # closed: the second was never answered
        writer.close()
        m = await scrape(gw.url)
        assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "success"}) == 1


async def test_a_client_that_leaves_mid_stream_cancels_its_upstream_request() -> None:
    long = orjson.dumps({"model": "tailguard-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100_000,
                         "stream": True})
    async with asyncio.timeout(20), gateway() as gw:
        reader, writer = await _open(gw.url)
        writer.write(_post(long))
        await reader.readuntil(b"\r\n\r\n")
        await reader.readuntil(b"tok")  # streaming
        writer.close()
        async with asyncio.timeout(5):
            while True:
                m = await scrape(gw.url)
                if sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "client_gone"}) == 1:
                    break
                await asyncio.sleep(0.05)
        async with asyncio.timeout(5):
            while sample(await scrape(gw.sims[0].url), "vllm:num_requests_running") != 0:
                await asyncio.sleep(0.05)
