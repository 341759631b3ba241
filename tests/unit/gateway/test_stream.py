"""The client side of a streamed request (`StreamRelay`), from the smallest real pieces: a real
`H1Connection` (over a socketpair) whose backend bytes the test hands to its `data_received`,
one call per read, so the read boundaries are the test's; and a `ChunkQueue` as the client.

What is checked: events reach the client whole however the reads cut them; the role-only
preamble waits for the first content (so the headers carry the TTFT, and a failure before
content can still be retried); content is recognised and counted; usage is read, and cut out
when the client did not ask for it; [DONE] ends the response; an upstream error event; a
backend that breaks before and after content; a client that reads slowly; and the tracked
path of a preemptible request, which keeps the text in `Transcript` and joins a resumed run
into the first one."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from tailguard.clock import monotonic
from tailguard.config import LimitsConfig
from tailguard.gateway.ops.histograms import ChunkHistogram
from tailguard.gateway.request import Request
from tailguard.gateway.sink import ChunkQueue
from tailguard.gateway.upstream.client import RelayError, Suspended
from tailguard.gateway.upstream.h1 import H1Connection, H1Response
from tailguard.gateway.upstream.resume import Transcript, continuation_body
from tailguard.gateway.upstream.stream import StreamRelay
from tailguard.gateway.upstream.tally import Tally
from tailguard.gateway.upstream.watchdog import DeadlineWatch
from tailguard.types import FailureKind
from tailguard.wire.openai import chat_chunk, usage_dict
from tailguard.wire.sse import DONE_EVENT, SSEDecoder, encode_event

pytestmark = pytest.mark.timeout(5)

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
REQUEST_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: backend\r\nContent-Length: 2\r\n\r\n"


def role(cid: str = "a") -> bytes:
    return encode_event(chat_chunk(cid, "m", 1, role="assistant"))


def tok(text: str, cid: str = "a", running: int | None = None) -> bytes:
    """A content event; `running`: the run's token count so far, as vLLM's continuous usage has it."""
    usage = None if running is None else usage_dict(5, running)
    return encode_event(chat_chunk(cid, "m", 1, content=text, usage=usage))


def finish(cid: str = "a") -> bytes:
    return encode_event(chat_chunk(cid, "m", 1, finish_reason="length"))


def usage(prompt: int, completion: int, cid: str = "a") -> bytes:
    return encode_event(chat_chunk(cid, "m", 1, usage=usage_dict(prompt, completion), empty_choices=True))


def _request() -> Request:
    """A request's record as the exchange makes it (the one place to adapt if it moves)."""
    return Request("r", arrived_at=0.0, bound_at=0.0)


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 1.0) -> None:
    """Wait until `cond()` holds, polling; fails naming `what` if it does not within `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            while not cond():
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {timeout_s} s") from None


class Backend:
    """One upstream response on a real `H1Connection`. `read(...)` hands the connection what one
    read from the backend's socket would bring (the bytes framed as one chunk of a chunked body);
    the socket's other end is the backend's, and closing it is the backend breaking off."""

    def __init__(self, conn: H1Connection, peer: socket.socket) -> None:
        self.conn, self.peer = conn, peer
        self.idle = False  # the connection went back to the pool (the response ended cleanly)

    async def open(self) -> H1Response:
        """Send the request; the backend answers with an SSE head."""
        self.conn.loop.call_soon(self.conn.data_received, SSE_HEAD)
        async with asyncio.timeout(1):
            return await self.conn.request(REQUEST_HEAD, b"{}")

    def read(self, *events: bytes) -> None:
        """One read from the backend's socket bringing `events` (any bytes, cut anywhere)."""
        self.conn.data_received(b"%x\r\n%b\r\n" % (len(b"".join(events)), b"".join(events)))

    def end(self) -> None:
        """The body's last chunk: the response ends and the connection may be reused."""
        self.conn.data_received(b"0\r\n\r\n")


Backends = Callable[[], Awaitable[Backend]]


@pytest.fixture
async def backends() -> AsyncIterator[Backends]:
    """Makes backends for one test; every connection and socket is closed after it."""
    loop = asyncio.get_running_loop()
    async with AsyncExitStack() as stack:
        async def make() -> Backend:
            ours, peer = socket.socketpair()
            stack.callback(peer.close)
            backend: Backend

            def idle(_: H1Connection) -> None:
                backend.idle = True

            _, conn = await loop.create_connection(lambda: H1Connection(loop, idle, lambda _: None), sock=ours)
            stack.callback(conn.abort)
            backend = Backend(conn, peer)
            return backend

        yield make


@pytest.fixture
async def watchdog() -> AsyncIterator[DeadlineWatch]:
    """A real watchdog whose deadlines are an hour away: never fired here."""
    wd = DeadlineWatch(asyncio.get_running_loop(), monotonic, total_at=monotonic() + 3600, idle_s=3600)
    wd.start_attempt(first_token_at=monotonic() + 3600)
    yield wd
    wd.stop()


def _relay(watchdog: DeadlineWatch, sink: ChunkQueue, *, client_usage: bool = False, transcript: Transcript | None = None,
           service_tier: bytes | None = None) -> StreamRelay:
    """The relay as the exchange builds it; its headers say when the first content was seen."""
    req = _request()
    return StreamRelay(sink, "chat", Tally(req, watchdog, ChunkHistogram((0.001, 1.0)), monotonic), client_usage,
                       lambda: {"x-first-content-at": str(req.first_content_at)}, LimitsConfig(), transcript=transcript,
                       service_tier=service_tier)


async def _parked(resp: H1Response, task: asyncio.Task[None]) -> None:
    """Until the relay has taken every byte fed so far and waits for more (or has ended): read
    from the response's own waiter, the one sign that its reader waits for bytes."""
    def parked() -> bool:
        w = resp._waiter
        return task.done() or (w is not None and not w.done() and not resp._chunks)
    await _until(parked, "the relay waits for the next read")


async def _output(sink: ChunkQueue) -> list[bytes]:
    """What the client got, chunk by chunk, up to the end of its response."""
    async with asyncio.timeout(1):
        return [c async for c in sink]


async def _finished(task: asyncio.Task[None]) -> None:
    async with asyncio.timeout(1):
        await task


def _events(chunks: list[bytes]) -> list[bytes]:
    """The events in what the client got, each chunk checked to hold whole events only."""
    out: list[bytes] = []
    for c in chunks:
        dec = SSEDecoder()
        out += [ev.raw for ev in dec.feed(c)]
        assert dec.flush_raw() == b"", f"a chunk that ends inside an event: {c!r}"
    return out


@dataclass
class Running:
    """A relay started on a fresh backend connection, its client a ChunkQueue."""

    backend: Any
    sink: ChunkQueue
    relay: StreamRelay
    resp: H1Response
    task: asyncio.Task[None]


async def _started(backends: Backends, watchdog: DeadlineWatch, sink: ChunkQueue | None = None, **relay_kw: Any) -> Running:
    """What every relay test starts with: a backend, a client, the relay running on the response."""
    backend = await backends()
    sink = sink if sink is not None else ChunkQueue()
    relay = _relay(watchdog, sink, **relay_kw)
    resp = await backend.open()
    return Running(backend, sink, relay, resp, asyncio.ensure_future(relay.run(resp)))


@pytest.mark.parametrize("end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
async def test_events_reach_the_client_whole_however_the_reads_cut_them(
        backends: Backends, watchdog: DeadlineWatch, end: bytes) -> None:
    """Reads that end inside an event, carry the start of the next, or hold several: the client
    gets whole events, in order, each once, on the pull path (before the first content) and on
    the push path (after it) alike."""
    evs = [e.replace(b"\n", end) for e in (role(), tok("Hel"), tok("lo"), tok(" wor"), tok("ld"), finish())]
    done = DONE_EVENT.replace(b"\n", end)
    stream = b"".join(evs) + done
    # Inside the role chunk, inside the first content one, past the start of the third, inside
    # the finish chunk, and between the two line ends that end [DONE].
    cuts = [5, len(evs[0]) + 3, len(evs[0]) + len(evs[1]) + 9, len(stream) - len(done) - 4, len(stream) - len(end)]
    run = await _started(backends, watchdog)
    backend, sink, relay, resp, task = run.backend, run.sink, run.relay, run.resp, run.task
    pos = 0
    for cut in [*cuts, len(stream)]:
        await _parked(resp, task)
        backend.read(stream[pos:cut])
        pos = cut
    backend.end()
    await _finished(task)
    out = await _output(sink)
    assert _events(out) == [*evs, done]
    assert b"".join(out) == stream  # the bytes themselves, unchanged
    assert relay.tally.request.content_chunks == 4 and relay.ended and not relay.upstream_error


async def test_the_role_only_preamble_waits_for_the_first_content(backends: Backends, watchdog: DeadlineWatch) -> None:
    """Nothing reaches the client before the first content: the role-only chunk is held and sent
    with it, and the headers are made then, so they carry the first content's instant (TTFT)."""
    run = await _started(backends, watchdog)
    backend, sink, relay, resp, task = run.backend, run.sink, run.relay, run.resp, run.task
    await _parked(resp, task)
    backend.read(role())
    await _parked(resp, task)
    assert not sink.started and relay.tally.request.first_content_at is None
    backend.read(tok("Hi"))
    await _parked(resp, task)
    assert sink.started
    first_at = relay.tally.request.first_content_at
    assert first_at is not None and sink.headers == {"x-first-content-at": str(first_at)}
    backend.read(tok("!"), DONE_EVENT)
    backend.end()
    await _finished(task)
    assert await _output(sink) == [role() + tok("Hi"), tok("!") + DONE_EVENT]


async def test_content_is_recognised_and_counted(backends: Backends, watchdog: DeadlineWatch) -> None:
    """Content is any non-empty text, reasoning or tool call; a role-only chunk, empty or null
    content, the finish chunk and usage are not. Each content chunk is counted once, the first
    as the first token and each later one as an ITL sample."""
    contents = [
        tok("a"),
        encode_event(b'{"id":"a","choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}'),
        encode_event(b'{"id":"a","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
                     b'{"arguments":"{}"}}]}}]}'),
        encode_event(b'{"id":"a","choices":[{"index":0, "delta": {"content": "spaced"}}]}'),
    ]
    others = [
        role(),
        encode_event(b'{"id":"a","choices":[{"index":0,"delta":{"content":""}}]}'),
        encode_event(b'{"id":"a","choices":[{"index":0,"delta":{"content":null}}]}'),
        finish(),
        usage(5, 4),
        b": a comment, as servers send to keep a connection alive\n\n",
    ]
    run = await _started(backends, watchdog, client_usage=True)
    backend, sink, relay, resp, task = run.backend, run.sink, run.relay, run.resp, run.task
    stream = [others[0], *contents[:2], *others[1:3], *contents[2:], *others[3:]]
    for ev in stream:  # one read each
        await _parked(resp, task)
        backend.read(ev)
    backend.read(DONE_EVENT)
    backend.end()
    await _finished(task)
    req = relay.tally.request
    assert req.content_chunks == 4
    assert sum(relay.tally.itl.counts) == 3
    assert (relay.tally.usage.prompt_tokens, relay.tally.usage.completion_tokens) == (5, 4)
    assert b"".join(await _output(sink)) == b"".join(stream) + DONE_EVENT  # all relayed, as they came


@pytest.mark.parametrize("client_usage", [False, True])
@pytest.mark.parametrize("alone", [True, False], ids=["own-read", "with-done"])
async def test_usage_is_read_and_reaches_the_client_only_when_asked(
        backends: Backends, watchdog: DeadlineWatch, client_usage: bool, alone: bool) -> None:
    """The gateway always asks the backend for usage (it meters every request): the usage-only
    chunk is read either way, and relayed only if the client asked for it, whether it comes in
    a read of its own (the push path hands it back) or with [DONE]."""
    run = await _started(backends, watchdog, client_usage=client_usage)
    backend, sink, relay, resp, task = run.backend, run.sink, run.relay, run.resp, run.task
    await _parked(resp, task)
    backend.read(role(), tok("x"))
    await _parked(resp, task)
    backend.read(tok("y"))
    if alone:
        await _parked(resp, task)
        backend.read(usage(7, 2))
        await _parked(resp, task)
        backend.read(DONE_EVENT)
    else:
        await _parked(resp, task)
        backend.read(usage(7, 2), DONE_EVENT)
    backend.end()
    await _finished(task)
    out = b"".join(await _output(sink))
    assert (relay.tally.usage.prompt_tokens, relay.tally.usage.completion_tokens) == (7, 2)
    expected = [role(), tok("x"), tok("y"), *([usage(7, 2)] if client_usage else []), DONE_EVENT]
    assert out == b"".join(expected)


async def test_done_ends_the_response_and_what_follows_is_drained(backends: Backends, watchdog: DeadlineWatch) -> None:
    """[DONE] ends the client's response in the same send; bytes the backend still sends are
    read (so the connection can be reused) but not relayed."""
    run = await _started(backends, watchdog)
    backend, sink, relay, resp, task = run.backend, run.sink, run.relay, run.resp, run.task
    await _parked(resp, task)
    backend.read(role(), tok("x"))
    await _parked(resp, task)
    backend.read(DONE_EVENT)
    await _parked(resp, task)
    assert relay.ended
    assert await _output(sink) == [role() + tok("x"), DONE_EVENT]  # ended: the queue has its end
    backend.read(tok("late"))
    backend.end()
    await _finished(task)
    resp.release()
    assert backend.idle  # read to its end: the connection went back to the pool
    assert relay.tally.request.content_chunks == 1


async def test_a_stream_without_done_ends_with_its_last_event(backends: Backends, watchdog: DeadlineWatch) -> None:
    """A backend that ends its body without [DONE], its last event cut off before the blank
    line: that event still reaches the client (ended with one), then the response ends."""
    run = await _started(backends, watchdog)
    backend, sink, relay, resp, task = run.backend, run.sink, run.relay, run.resp, run.task
    await _parked(resp, task)
    backend.read(role(), tok("x"))
    await _parked(resp, task)
    backend.read(tok("y")[:-1])  # one LF short
    backend.end()
    await _finished(task)
    assert b"".join(await _output(sink)) == role() + tok("x") + tok("y")
    assert relay.tally.request.content_chunks == 2 and relay.ended


async def test_an_upstream_error_event_is_relayed_and_marked(backends: Backends, watchdog: DeadlineWatch) -> None:
    """An engine that fails mid-generation sends an error object in place of a chunk: the client
    gets it as it came, and the relay marks the stream (the request ends as an upstream error)."""
    error = encode_event(b'{"error":{"message":"engine died","type":"internal_error","code":500}}')
    run = await _started(backends, watchdog)
    backend, sink, relay, resp, task = run.backend, run.sink, run.relay, run.resp, run.task
    await _parked(resp, task)
    backend.read(role(), tok("x"))
    await _parked(resp, task)
    assert not relay.upstream_error
    backend.read(error)
    await _parked(resp, task)
    backend.read(DONE_EVENT)
    backend.end()
    await _finished(task)
    assert relay.upstream_error
    assert b"".join(await _output(sink)) == role() + tok("x") + error + DONE_EVENT


async def test_a_backend_that_breaks_before_content_fails_the_attempt(backends: Backends, watchdog: DeadlineWatch) -> None:
    """The backend closes its connection after the role chunk: the client has seen nothing, so
    the attempt fails (the front may send it again) and the sink is untouched."""
    run = await _started(backends, watchdog)
    backend, sink, relay, resp, task = run.backend, run.sink, run.relay, run.resp, run.task
    await _parked(resp, task)
    backend.read(role())
    await _parked(resp, task)
    backend.peer.close()
    with pytest.raises(RelayError) as e:
        await _finished(task)
    assert e.value.kind is FailureKind.DISCONNECT
    assert not sink.started and relay.held == [role()]


async def test_a_backend_that_breaks_after_content_is_a_failure_the_front_decides_on(
        backends: Backends, watchdog: DeadlineWatch) -> None:
    """The relay reports the break (the front may continue the stream elsewhere) and leaves the
    client's stream open; ended, it gets one error event."""
    run = await _started(backends, watchdog)
    backend, sink, relay, resp, task = run.backend, run.sink, run.relay, run.resp, run.task
    await _parked(resp, task)
    backend.read(role(), tok("x"))
    await _parked(resp, task)
    backend.peer.close()
    with pytest.raises(RelayError) as broke:
        await _finished(task)
    assert broke.value.kind is FailureKind.DISCONNECT and sink.started and not relay.ended
    await relay.fail(broke.value.api_error())  # the front said no more: the exchange ends it
    out = await _output(sink)
    assert out[0] == role() + tok("x") and len(out) == 2
    err = orjson.loads(out[1].removeprefix(b"data: "))
    assert err["error"]["code"] == "disconnect" and "closed the stream early" in err["error"]["message"]
    assert relay.upstream_error and relay.ended


async def test_a_slow_client_pauses_the_backend_and_loses_nothing(backends: Backends, watchdog: DeadlineWatch) -> None:
    """A client whose queue holds two chunks and who does not read: the push relay stops at the
    full queue and the connection stops reading the backend; what still arrives waits in the
    response. Once the client reads, every chunk comes, in order, once."""
    run = await _started(backends, watchdog, sink=ChunkQueue(maxsize=2))
    backend, sink, relay, resp, task = run.backend, run.sink, run.relay, run.resp, run.task
    await _parked(resp, task)
    backend.read(role(), tok("0"))  # the queue's first chunk
    await _parked(resp, task)
    toks = [tok(str(i)) for i in range(1, 20)]
    transport = backend.conn.transport
    assert transport is not None and transport.is_reading()
    for t in toks:
        backend.read(t)  # pushed, one read each, until the queue is full
    assert not transport.is_reading()  # paused: the backend's socket is not read any more
    assert not task.done() and relay.tally.request.content_chunks < len(toks)
    backend.read(DONE_EVENT)
    backend.end()
    out = await _output(sink)  # the client reads now
    await _finished(task)
    assert out == [role() + tok("0"), *toks, DONE_EVENT]
    assert relay.tally.request.content_chunks == 20


async def test_a_named_service_tier_is_written_into_every_event(backends: Backends, watchdog: DeadlineWatch) -> None:
    """A request that named a service tier gets it reported in every chunk (the relay then takes
    the general path for every read)."""
    run = await _started(backends, watchdog, service_tier=b"flex")
    backend, sink, resp, task = run.backend, run.sink, run.resp, run.task
    await _parked(resp, task)
    backend.read(role(), tok("x"))
    await _parked(resp, task)
    backend.read(tok("y"))
    await _parked(resp, task)
    backend.read(DONE_EVENT)
    backend.end()
    await _finished(task)
    events = _events(await _output(sink))
    assert [orjson.loads(e.removeprefix(b"data: "))["service_tier"] for e in events[:-1]] == ["flex"] * 3
    assert events[-1] == DONE_EVENT


# -- the tracked path of a preemptible request ----------------------------------------------------------


async def test_the_tracked_path_keeps_the_text_and_relays_the_same_bytes(
        backends: Backends, watchdog: DeadlineWatch) -> None:
    """A preemptible request parses every event to keep the text so far (what a continuation
    needs) and its token count (the backend's running count where it sends one); the client
    gets the same bytes as on the zero-parse path."""
    stream = [role(), tok("Once", running=1), tok(" upon", running=3), tok(" a"), finish(), usage(5, 4), DONE_EVENT]
    transcript = Transcript()
    run = await _started(backends, watchdog, transcript=transcript)
    backend, sink, relay, resp, task = run.backend, run.sink, run.relay, run.resp, run.task
    for ev in stream:
        await _parked(resp, task)
        backend.read(ev)
    backend.end()
    await _finished(task)
    assert b"".join(await _output(sink)) == b"".join(stream[:5]) + DONE_EVENT  # usage: not asked for
    assert transcript.text() == "Once upon a" and transcript.tokens == 4  # 1, then 3 by the running count, then +1
    assert relay.stream_id == "a" and relay.tally.request.content_chunks == 3
    assert (relay.tally.usage.prompt_tokens, relay.tally.usage.completion_tokens) == (5, 4)


async def test_a_suspended_request_stops_between_reads(backends: Backends, watchdog: DeadlineWatch) -> None:
    """Once the dispatcher suspends the request, the next read ends the run with `Suspended`:
    what that read brought is neither relayed nor kept, so the continuation starts exactly
    where the client's text ends."""
    transcript = Transcript()
    run = await _started(backends, watchdog, transcript=transcript)
    backend, sink, relay, resp, task = run.backend, run.sink, run.relay, run.resp, run.task
    await _parked(resp, task)
    backend.read(role(), tok("Once"))
    await _parked(resp, task)
    transcript.suspended = True
    backend.read(tok(" upon"))
    with pytest.raises(Suspended):
        await _finished(task)
    assert transcript.text() == "Once" and transcript.tokens == 1
    assert sink.started and not relay.ended
    sink.close()


@pytest.mark.parametrize("client_usage", [True, False])
async def test_a_resumed_run_continues_the_first_runs_stream(
        backends: Backends, watchdog: DeadlineWatch, client_usage: bool) -> None:
    """The continuation's stream goes on in the same response: its role-only preamble is dropped
    (the client had one), its chunks get the first run's id back, and its usage chunk is
    rewritten once to count the client's own prompt and every token of both runs. The relay's
    tally then holds those counts too, whether the client asked for usage or not, as the
    assembler's does: the exchange meters the request (output tokens, the caller's token
    budget, the access log) from it. (It once kept the last run's raw counts: a preempted
    3000-token stream was metered as its second run's 2894 tokens, its prompt as 124.)"""
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 20}], "max_tokens": 5}
    sink = ChunkQueue()
    transcript = Transcript()
    relay = _relay(watchdog, sink, client_usage=client_usage, transcript=transcript)
    first = await backends()
    resp = await first.open()
    task = asyncio.ensure_future(relay.run(resp))
    await _parked(resp, task)
    first.read(role("a"), tok("Once", "a"), tok(" upon", "a"))
    await _parked(resp, task)
    transcript.suspended = True
    first.read(tok(" a", "a"))
    with pytest.raises(Suspended):
        await _finished(task)
    resp.close()  # as the exchange does: the engine aborts the first run

    transcript.suspended = False
    continuation_body(body, "chat", transcript)  # the resumed run starts after 2 tokens
    second = await backends()
    resp = await second.open()
    task = asyncio.ensure_future(relay.run(resp))
    await _parked(resp, task)
    cont_prompt = 9 + transcript.added_prompt_tokens  # the engine counts the text so far in the prompt
    second.read(role("b"), tok(" a", "b"), tok(" time", "b"))
    await _parked(resp, task)
    second.read(tok(".", "b"), finish("b"), usage(cont_prompt, 3, "b"), DONE_EVENT)
    second.end()
    await _finished(task)
    out = await _output(sink)
    assert out[0] == role("a") + tok("Once", "a") + tok(" upon", "a")
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in _events(out[1:])[:-1]]
    assert {e["id"] for e in events} == {"a"}
    assert [e["choices"][0]["delta"].get("content") for e in events[:3]] == [" a", " time", "."]
    assert [e["usage"] for e in events if "usage" in e] == ([usage_dict(9, 5)] if client_usage else [])
    assert transcript.text() == "Once upon a time." and transcript.tokens == 5
    assert relay.tally.request.content_chunks == 5
    assert (relay.tally.usage.prompt_tokens, relay.tally.usage.completion_tokens) == (9, 5)
