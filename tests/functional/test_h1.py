"""The gateway's HTTP/1.1 upstream client (`gateway.upstream.h1`, `gateway.upstream.pool`) against real sockets on
loopback: each server below writes exactly the bytes a backend might, well-formed or not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack

import httptools
import pytest

from tailguard.clock import monotonic
from tailguard.gateway.upstream.h1 import H1Response, UpstreamBroke
from tailguard.gateway.upstream.pool import Origin, Pool, origin_of
from tests.functional.raw_servers import SSE_HEAD, Handler, chunk, raw_server, read_request

pytestmark = pytest.mark.timeout(20)


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 2.0) -> None:
    """Wait until `cond()` holds, polling; fails naming `what` if it does not within `timeout_s`.
    Tests wait for the state they check instead of sleeping a guessed time."""
    try:
        async with asyncio.timeout(timeout_s):
            while not cond():
                await asyncio.sleep(0.002)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {timeout_s} s") from None


async def _hang() -> None:
    """A server that keeps its connection open until the test's servers are torn down."""
    await asyncio.Event().wait()


def answers(raw: bytes, *, then_close: bool = False) -> Handler:
    """A server that reads one request and writes `raw` (then closes, with `then_close`)."""
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(raw)
        await w.drain()
        if then_close:
            w.close()
    return handler


def _chunked(*parts: bytes) -> bytes:
    return b"".join(map(chunk, parts)) + b"0\r\n\r\n"


CONNECT_S = 2.0
EVENTS = [b'data: {"n":%d}\n\n' % i for i in range(5)]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[Origin]]]:
    """Start raw servers for one test; all are stopped after it."""
    async with AsyncExitStack() as stack:
        async def start(handler: Handler) -> Origin:
            return origin_of(await stack.enter_async_context(raw_server(handler)))

        yield start


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    p = Pool(asyncio.get_running_loop(), monotonic)
    yield p
    p.close()


async def _post(pool: Pool, origin: Origin, *, fresh: bool = False, keep: bool = True) -> H1Response:
    conn = await pool.connection(origin, CONNECT_S, fresh=fresh)
    head = origin.head("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, 2)
    return await conn.request(head, b"{}", keep=keep)


async def _body(resp: H1Response) -> bytes:
    out = b""
    while data := await resp.readany():
        out += data
    return out


def test_origin_parses_the_url_once() -> None:
    o = origin_of("https://127.0.0.1/base/")
    assert (o.scheme, o.host, o.port, o.base_path, o.host_header) == ("https", "127.0.0.1", 443, "/base",
                                                                      "127.0.0.1")
    assert origin_of("http://127.0.0.1:8000").host_header == "127.0.0.1:8000"
    head = o.head("POST", "/v1/x", {"A": "b"}, 7).decode()
    assert head == "POST /base/v1/x HTTP/1.1\r\nHost: 127.0.0.1\r\nA: b\r\nContent-Length: 7\r\n\r\n"
    with pytest.raises(ValueError):
        origin_of("ftp://host")


async def test_a_chunked_stream_is_pushed_then_the_connection_is_reused(serve, pool) -> None:
    seen: list[bytes] = []
    # The server writes the next event only once the reader has had the last one (lockstep),
    # so the body arrives in several reads and push is called back once per event.
    taken = asyncio.Event()
    got: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            try:
                seen.append(await read_request(r))
            except asyncio.IncompleteReadError:
                return
            w.write(SSE_HEAD)
            for ev in EVENTS:
                w.write(chunk(ev))
                await w.drain()
                await taken.wait()
                taken.clear()
            w.write(b"0\r\n\r\n")

    def took(data: bytes) -> bool:
        got.append(data)
        taken.set()
        return True

    origin = await serve(handler)
    resp = await _post(pool, origin)
    assert resp.status == 200 and resp.headers["content-type"] == "text/event-stream"
    assert await resp.push(took) is True
    assert b"".join(got) == b"".join(EVENTS) and len(got) >= len(EVENTS)  # one call (at least) per read
    conn = resp.conn
    resp.release()
    resp.close()  # after release: must not close the pooled connection
    again = await _post(pool, origin)
    assert again.conn is conn  # the same keep-alive connection
    got.clear()
    while data := await again.readany():  # pulled this time
        took(data)
    assert b"".join(got) == b"".join(EVENTS)
    again.release()
    assert seen[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:")


async def test_push_stops_when_asked_and_the_rest_is_read_after(serve, pool) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(SSE_HEAD + _chunked(*EVENTS))  # all at once: several chunks in one read
        await w.drain()

    resp = await _post(pool, await serve(handler))
    got: list[bytes] = []

    def two(data: bytes) -> bool:
        got.append(data)
        return len(got) < 2

    await resp.push(two)
    assert got == EVENTS[:2]
    assert await _body(resp) == b"".join(EVENTS[2:])
    resp.release()


async def test_content_length_and_close_delimited_bodies(serve, pool) -> None:
    resp = await _post(pool, await serve(answers(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")))
    assert await _body(resp) == b"hello"
    resp.release()
    until_close = answers(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + EVENTS[0], then_close=True)
    resp = await _post(pool, await serve(until_close))
    assert await _body(resp) == EVENTS[0]  # the close ends it, as HTTP/1.1 says
    resp.release()
    assert resp.conn.closed


async def test_a_100_continue_is_skipped(serve, pool) -> None:
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"
    resp = await _post(pool, await serve(answers(raw)))
    assert resp.status == 201 and await _body(resp) == b"ok"


async def test_a_close_before_the_answer_and_in_the_body(serve, pool) -> None:
    async def no_answer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.close()

    async def cut(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(SSE_HEAD + chunk(EVENTS[0]))
        await w.drain()
        w.transport.abort()  # a reset in the middle of the body

    with pytest.raises(UpstreamBroke) as e:
        await _post(pool, await serve(no_answer))
    assert not e.value.answered
    resp = await _post(pool, await serve(cut))
    with pytest.raises(UpstreamBroke) as e:
        await _body(resp)
    assert e.value.answered


async def test_a_malformed_answer(serve, pool) -> None:
    garbage = answers(b"SPDY/9 banana\r\n\r\n")
    bad_chunk = answers(SSE_HEAD + b"zz\r\nnot hex\r\n")
    with pytest.raises(httptools.HttpParserError):
        await _post(pool, await serve(garbage))
    resp = await _post(pool, await serve(bad_chunk))
    with pytest.raises(UpstreamBroke, match="Malformed"):
        await _body(resp)


async def test_close_wakes_a_waiting_reader(serve, pool) -> None:
    async def slow(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(SSE_HEAD)
        await w.drain()
        await _hang()

    resp = await _post(pool, await serve(slow))
    reader = asyncio.ensure_future(resp.readany())
    await _until(lambda: resp._waiter is not None, "the reader waits for the body")
    resp.close()  # as a suspension does
    with pytest.raises(UpstreamBroke):
        await reader
    assert resp.conn.closed


async def test_a_reader_that_falls_behind_pauses_the_socket(serve, pool) -> None:
    big = b"x" * 65536

    async def flood(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(SSE_HEAD)
        for _ in range(32):  # 2 MiB
            w.write(chunk(big))
            await w.drain()
        w.write(b"0\r\n\r\n")
        await w.drain()

    resp = await _post(pool, await serve(flood))
    # nobody reads: the socket stops being read past the high water
    await _until(lambda: resp.conn._paused, "the connection pauses reading")
    assert len(await _body(resp)) == 32 * len(big)


OK_2 = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def answers_then(later: bytes | None, idle: asyncio.Event) -> Handler:
    """Answers one request, then, once the test says the connection idles in the pool (`idle`),
    writes `later` (None: closes it, as a backend's idle timeout does)."""
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(OK_2)
        await w.drain()
        await idle.wait()
        if later is None:
            return  # closed on the way out
        w.write(later)
        await w.drain()
        await _hang()
    return handler


@pytest.mark.parametrize("later", [None, b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n"],
                         ids=["closed", "408"])
async def test_a_connection_the_backend_closes_or_writes_to_while_idle_leaves_the_pool(
        serve, pool, later: bytes | None) -> None:
    idle = asyncio.Event()
    origin = await serve(answers_then(later, idle))
    resp = await _post(pool, origin)
    await _body(resp)
    first = resp.conn
    resp.release()
    idle.set()
    await _until(lambda: first.closed, "the idle connection closes")
    again = await _post(pool, origin)
    assert again.conn is not first and again.status == 200


async def test_the_pool_closes_idle_and_asked_to_close_connections(serve, pool) -> None:
    origin = await serve(answers_then(None, asyncio.Event()))  # never closed by the server: only the pool
    pool.keepalive_s = 0.0
    resp = await _post(pool, origin)
    await _body(resp)
    resp.release()
    second = await _post(pool, origin)
    assert second.conn is not resp.conn and resp.conn.closed  # idle past keep-alive: closed, not reused
    await _body(second)
    resp = await _post(pool, origin, keep=False)
    await _body(resp)
    resp.release()
    assert resp.conn.closed  # asked for `Connection: close`: never pooled


async def test_connect_failures(pool) -> None:
    with pytest.raises(OSError):
        await pool.connection(origin_of("http://127.0.0.1:9"), CONNECT_S)  # discard port: refused


async def test_a_runaway_head_is_refused(serve, pool) -> None:
    huge = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"y" * 1000) for i in range(100))  # about 100 KiB
    with pytest.raises(httptools.HttpParserError):
        await _post(pool, await serve(answers(b"HTTP/1.1 200 OK\r\n" + huge + b"\r\n")))


async def test_a_second_answer_in_the_same_read_changes_nothing_and_is_not_reused(serve, pool) -> None:
    stray = b"HTTP/1.1 408 Request Timeout\r\nX-Stray: 1\r\nContent-Length: 4\r\n\r\nnope"
    origin = await serve(answers(OK_2 + stray))
    resp = await _post(pool, origin)
    assert await _body(resp) == b"ok"
    assert resp.status == 200 and "x-stray" not in resp.headers
    resp.release()
    assert resp.conn.closed
