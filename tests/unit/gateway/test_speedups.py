"""The C extension (`tailguard._speedups`) against the Python it stands in for, on the same input.

`has_content` against `wire.chunks.has_content_py` on every event of OpenAI's streams, cut at any
bounds. The relay's per-chunk step (`ChunkStep`) against `StreamRelay._chunk`: the same stream,
cut into the same reads (one event a read, the usual case, mixed with cuts inside events and reads
of several), with LF, CRLF or CR line ends, through one relay that runs the C step and one that
runs only Python, each on its own real backend connection and with the same instants (a seeded
clock): what the client got, every count of the tally and of the ITL histogram, the watchdog's last
read, the usage, how it ended (an event over `max_event_bytes` fails both the same way) must be
equal. The clients are a `ChunkQueue` (the step hands chunks to `write_nowait`) and a real
`LeanProtocol` on a loopback TCP connection (the step writes the chunked frame to its transport
itself). Without the extension (`TAILGUARD_NO_EXTENSIONS=1`) the C half is skipped and the
selection is checked instead."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import re
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import orjson
import pytest

from tailguard.clock import monotonic
from tailguard.config import LimitsConfig
from tailguard.gateway.http.lean import LeanProtocol
from tailguard.gateway.http.lean_sink import LeanSink
from tailguard.gateway.ops.histograms import ChunkHistogram
from tailguard.gateway.sink import ChunkQueue, Sink
from tailguard.gateway.upstream import stream as stream_module
from tailguard.gateway.upstream.bound import AnswerBound
from tailguard.gateway.upstream.stream import StreamRelay
from tailguard.gateway.upstream.tally import Tally
from tailguard.gateway.upstream.watchdog import DeadlineWatch
from tailguard.speedups import speedups
from tailguard.wire import chunks
from tailguard.wire.chunks import has_content_py
from tailguard.wire.framing import OPENAI
from tailguard.wire.sse import DONE_EVENT, encode_event
from tests.unit.gateway.test_stream import Backend, Backends, _parked, _request, backends

__all__ = ["backends"]  # the fixture, shared with test_stream.py

pytestmark = pytest.mark.timeout(30)
needs_c = pytest.mark.skipif(speedups is None, reason="the C extension is not built, or TAILGUARD_NO_EXTENSIONS is set")

CHAT = {"id": "chatcmpl-AZ1tq", "object": "chat.completion.chunk", "created": 1733143440,
        "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_0705bf87c0"}
WORDS = ["Hello", " world", "!", " \u00e9t\u00e9", ' he said "content":"x"', "\\n", " {\"a\": [1]}", " ", "\u4f60\u597d"]
ARGS = ['{"lo', 'cation', '":"Par', 'is"}']


def _ev(obj: dict[str, Any], spaced: bool) -> bytes:
    """An event as OpenAI sends it (compact JSON), or with the spaces of Python's `json.dumps`."""
    return encode_event(json.dumps(obj).encode() if spaced else orjson.dumps(obj))


def _chat(choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**CHAT, "choices": [{"index": 0, "logprobs": None, "finish_reason": None, **choice}], **extra}


def chat_stream(rng: random.Random, n: int, *, spaced: bool = False) -> list[bytes]:
    """A chat answer as OpenAI streams it: the role chunk, content (and now and then reasoning, or
    a tool call in pieces), the finish chunk, the usage chunk, `[DONE]`."""
    evs = [_ev(_chat({"delta": {"role": "assistant", "content": "", "refusal": None}}, usage=None), spaced)]
    for _ in range(n):
        kind = rng.random()
        if kind < 0.1:
            delta: dict[str, Any] = {"reasoning_content": rng.choice(WORDS), "content": None}
        elif kind < 0.2:
            evs.append(_ev(_chat({"delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                            "function": {"name": "get_weather", "arguments": ""}}]}}),
                           spaced))
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": rng.choice(ARGS)}}]}
        elif kind < 0.25:
            delta = {"content": ""}  # empty: not content
        else:
            delta = {"content": rng.choice(WORDS)}
        evs.append(_ev(_chat({"delta": delta}, usage=None), spaced))
    evs.append(_ev(_chat({"delta": {}, "finish_reason": "stop"}, usage=None), spaced))
    usage = {"prompt_tokens": 19, "completion_tokens": n, "total_tokens": 19 + n}
    evs.append(_ev({**CHAT, "choices": [], "usage": usage}, spaced))
    return [*evs, DONE_EVENT]


def completions_stream(rng: random.Random, n: int) -> list[bytes]:
    """A legacy completions answer (`text_completion` objects, content in `text`)."""
    def ev(text: str, finish: str | None = None) -> bytes:
        return encode_event(orjson.dumps({"id": "cmpl-8", "object": "text_completion", "created": 1733143440,
                                          "choices": [{"text": text, "index": 0, "logprobs": None,
                                                       "finish_reason": finish}], "model": "gpt-3.5-turbo-instruct"}))
    return [*(ev(rng.choice(WORDS)) for _ in range(n)), ev("", "length"), DONE_EVENT]


# -- has_content --------------------------------------------------------------------------------


@needs_c
def test_has_content_is_the_same_in_c_on_every_event_and_bounds() -> None:
    """Every event of the streams, with LF, CRLF and CR line ends, whole and cut at random bounds
    (negative ones and ones past the end included, as a slice takes them)."""
    rng = random.Random(7)
    events = [*chat_stream(rng, 200), *chat_stream(rng, 50, spaced=True), *completions_stream(rng, 50),
              b'data: {"choices":[{"delta":{"content":"x"}}]}', b'"content":', b'"tool_calls": []', b'"text":"', b""]
    c_has_content = speedups.has_content  # type: ignore[union-attr]
    for raw in events:
        for end in (b"\n", b"\r\n", b"\r"):
            ev = raw.replace(b"\n", end)
            assert c_has_content(ev) is has_content_py(ev), ev
            for _ in range(20):
                a, b = rng.randint(-len(ev) - 3, len(ev) + 3), rng.choice([None, rng.randint(-len(ev) - 3, len(ev) + 3)])
                assert c_has_content(ev, a, b) is has_content_py(ev, a, b), (ev, a, b)


@needs_c
def test_has_content_is_the_same_in_c_on_random_bytes() -> None:
    """Bytes drawn from the keys' own pieces, so every branch (spaces, lists, empty strings, keys
    at the very end) is met many times."""
    rng = random.Random(11)
    pieces = [b'"content":', b'"text":', b'"reasoning_content":', b'"reasoning":', b'"tool_calls":', b'"', b"[",
              b"]", b" ", b"x", b"null", b'"content":"', b"{", b"\\"]
    for _ in range(20000):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        assert speedups.has_content(data) is has_content_py(data), data  # type: ignore[union-attr]


def test_the_selection_follows_tailguard_no_extensions() -> None:
    """`TAILGUARD_NO_EXTENSIONS=1` runs the Python twins whether the extension is built or not."""
    code = ("from tailguard.speedups import speedups; from tailguard.wire import chunks; "
            "print(speedups is None, chunks.has_content is chunks.has_content_py)")
    env = {**os.environ, "TAILGUARD_NO_EXTENSIONS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True"], out.stderr
    assert (chunks.has_content is has_content_py) == (speedups is None)


def test_an_extension_built_from_another_version_is_not_used() -> None:
    """The built extension says the version of `_speedups.c` it was built from, the one this code
    expects; one built from another (or from before the version was said) is refused, warned of."""
    from types import ModuleType

    from tailguard.speedups import ABI, matching

    if speedups is not None:
        assert speedups.ABI == ABI and matching(speedups) is speedups
    stale = ModuleType("tailguard._speedups")
    stale.ABI = ABI - 1  # type: ignore[attr-defined]
    with pytest.warns(RuntimeWarning, match="another version"):
        assert matching(stale) is None
    with pytest.warns(RuntimeWarning, match="ABI None"):
        assert matching(ModuleType("tailguard._speedups")) is None


# -- the relay's step -----------------------------------------------------------------------------


class SeededClock:
    """The relay's clock, moving by a seeded step at each read: two relays that read it as often
    see the same instants, and the gaps fall in every bucket of the histogram."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._t = 1e7  # past the real clock's now: the watchdog's idle deadline never comes

    def __call__(self) -> float:
        self._t += self._rng.choice((0.0004, 0.0004, 0.0004, 0.003, 0.03, 0.4, 2.0))
        return self._t


def reads_of(rng: random.Random, events: list[bytes]) -> list[bytes]:
    """The stream cut into reads: mostly one event each (the step's own case), else cut inside an
    event or several at once."""
    stream = b"".join(events)
    bounds, pos = [], 0
    for ev in events:
        pos += len(ev)
        bounds.append(pos)
    cuts = sorted({b for b in bounds if rng.random() < 0.7} | {rng.randint(1, len(stream)) for _ in range(len(events) // 4)}
                  | {len(stream)})
    out, last = [], 0
    for c in cuts:
        out.append(stream[last:c])
        last = c
    return out


def steps_taken(reads: list[bytes]) -> int:
    """The reads the C step relays without `_chunk`: after the read that ends the first content
    event (the client's stream has begun), each that is one whole LF event with content, read with
    nothing of an earlier event kept."""
    stream = b"".join(reads)
    ends, i = set(), stream.find(b"\n\n")
    while i >= 0:
        ends.add(i + 2)
        i = stream.find(b"\n\n", i + 2)
    first = min((e for e in ends if has_content_py(stream[max((x for x in ends if x < e), default=0):e])),
                default=len(stream))
    n = pos = 0
    for r in reads:
        lone = (pos == 0 or pos in ends) and r.endswith(b"\n\n") and b"\n" not in r[:-2] and b"\r" not in r
        if pos >= first and lone and has_content_py(r):
            n += 1
        pos += len(r)
    return n


class Collector(asyncio.Protocol):
    """The client's end of a lean connection: every byte it gets, until the connection closes."""

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.data = bytearray()
        self._done = done

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        self._done.set_result(None)


class Host:
    """The server a `LeanProtocol` belongs to, as far as a connection that only answers needs one."""

    proxy = None
    max_body_bytes = 1 << 20
    config_hash = ""

    def admit(self, conn: LeanProtocol) -> bool:
        return True

    def forget(self, conn: LeanProtocol) -> None:
        pass

    def closed(self, reason: str) -> None:
        pass

    def hand_off(self, transport: asyncio.Transport, data: bytes, reserve_only: bool) -> None:
        raise AssertionError("no request is sent on it")

    def timeouts(self) -> tuple[float, float]:
        return 3600.0, 3600.0


Client = Callable[[], Awaitable[bytes]]  # what the client got, once its stream has ended
MakeClient = Callable[[AsyncExitStack], Awaitable[tuple[Sink, Client]]]


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Both ends of one TCP connection on loopback (the lean server sets TCP options)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        peer = socket.create_connection(server.getsockname())
        ours, _ = server.accept()
    return ours, peer


async def lean_client(stack: AsyncExitStack) -> tuple[LeanSink, Client]:
    """A `LeanSink` on a real `LeanProtocol` whose peer collects the bytes."""
    loop = asyncio.get_running_loop()
    ours, peer = tcp_pair()
    done: asyncio.Future[None] = loop.create_future()
    _, conn = await loop.create_connection(lambda: LeanProtocol(Host(), loop), sock=ours)  # type: ignore[arg-type]
    _, collector = await loop.create_connection(lambda: Collector(done), sock=peer)
    stack.callback(conn.force_close)

    async def got() -> bytes:
        conn.force_close()  # flushes what is buffered, then the peer sees the end
        async with asyncio.timeout(5):
            await done
        return re.sub(rb"Date: [^\r]*\r\n", b"", bytes(collector.data))  # (a second may pass between runs)
    return LeanSink(conn, {}), got


async def queue_client(stack: AsyncExitStack) -> tuple[ChunkQueue, Client]:
    """A `ChunkQueue` of two (a client that reads while the relay writes, and holds it up)."""
    sink = ChunkQueue(maxsize=2)
    out = bytearray()

    async def read() -> None:
        async for c in sink:
            out.extend(c)
    reader = asyncio.ensure_future(read())
    stack.callback(reader.cancel)

    async def got() -> bytes:
        async with asyncio.timeout(5):
            await reader  # to the stream's end
        return bytes(out)
    return sink, got


async def relay_once(backends: Backends, make_client: MakeClient, reads: list[bytes],
                     seed: int, limits: LimitsConfig, native: bool, monkeypatch: pytest.MonkeyPatch,
                     bound: AnswerBound | None = None) -> dict[str, Any]:
    """One relay over `reads`, with the C step (`native`) or Python alone; its outcome and state."""
    monkeypatch.setattr(stream_module, "speedups", speedups if native else None)
    framing = OPENAI if native else dataclasses.replace(OPENAI, has_content=has_content_py)
    loop = asyncio.get_running_loop()
    calls = 0
    python_chunk = StreamRelay._chunk

    def counted(self: StreamRelay, data: bytes) -> bool:
        nonlocal calls
        calls += 1
        return python_chunk(self, data)
    monkeypatch.setattr(StreamRelay, "_chunk", counted)
    async with AsyncExitStack() as stack:
        sink, client = await make_client(stack)
        wd = DeadlineWatch(loop, monotonic, total_at=monotonic() + 3600, idle_s=3600)
        wd.start_attempt(first_token_at=monotonic() + 3600)
        stack.callback(wd.stop)
        req = _request()
        tally = Tally(req, wd, ChunkHistogram((0.001, 0.01, 0.1, 1.0)), SeededClock(seed),  # the relay's clock
                      bound=bound or AnswerBound())
        relay = StreamRelay(sink, "chat", tally, True, lambda: {}, limits, framing=framing)
        backend: Backend = await backends()
        resp = await backend.open()
        task = asyncio.ensure_future(relay.run(resp))
        for data in reads:
            await _parked(resp, task)
            if task.done():
                break
            backend.read(data)
        backend.end()
        async with asyncio.timeout(5):
            raised = await asyncio.gather(task, return_exceptions=True)
        if not relay.ended:
            await sink.end(b"")  # (the exchange would end it with an error event)
        h, u = relay.tally.itl, relay.tally.usage
        return {"client": await client(), "raised": repr(raised[0]), "content_chunks": req.content_chunks,
                "first_content_at": req.first_content_at, "last_content_at": req.last_content_at,
                "itl": (list(h.counts), h.sum, h._i, h._lo, h._hi), "usage": (u.prompt_tokens, u.completion_tokens),
                "ended": relay.ended, "upstream_error": relay.upstream_error, "last_at": wd.last_at,
                "python_calls": calls, "reads": len(reads), "cut": tally.cut, "overrun": req.overrun_tokens,
                "body_bytes": tally.body_bytes}


CLIENTS: dict[str, MakeClient] = {"lean": lean_client, "queue": queue_client}


@needs_c
@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_c_step_relays_a_stream_as_python_does(backends: Backends, monkeypatch: pytest.MonkeyPatch,
                                                         client: str, end: bytes, seed: int) -> None:
    """A chat or completions answer, cut at random, relayed the same by both; with LF line ends
    most reads are the step's own (it calls `_chunk` for fewer of them)."""
    rng = random.Random(seed)
    events = chat_stream(rng, 60, spaced=seed == 3) if seed != 2 else completions_stream(rng, 60)
    reads = reads_of(rng, [e.replace(b"\n", end) for e in events])
    c = await relay_once(backends, CLIENTS[client], reads, seed, LimitsConfig(), True, monkeypatch)
    py = await relay_once(backends, CLIENTS[client], reads, seed, LimitsConfig(), False, monkeypatch)
    assert c["content_chunks"] > 40 and c["raised"] == "None" and c["ended"]
    c_calls, py_calls = c.pop("python_calls"), py.pop("python_calls")
    assert c == py
    taken = steps_taken(reads)
    assert c_calls == py_calls - taken and (taken > 10 if end == b"\n" else taken == 0)


@needs_c
@pytest.mark.parametrize("client", sorted(CLIENTS))
async def test_an_event_over_the_bound_fails_both_the_same(backends: Backends, monkeypatch: pytest.MonkeyPatch,
                                                          client: str) -> None:
    """An event past `limits.max_event_bytes`, in pieces, after content has gone out: both relays
    end the client's stream with the same error."""
    rng = random.Random(5)
    events = chat_stream(rng, 20)
    huge = _ev(_chat({"delta": {"content": "x" * 6000}}), False)
    events.insert(10, huge)
    reads = [*events[:10], huge[:3000], huge[3000:5000], huge[5000:], *events[11:]]
    limits = LimitsConfig(max_event_bytes=4096)
    c = await relay_once(backends, CLIENTS[client], reads, 5, limits, True, monkeypatch)
    py = await relay_once(backends, CLIENTS[client], reads, 5, limits, False, monkeypatch)
    assert "RelayError" in c["raised"] or "Event" in c["raised"], c["raised"]
    c.pop("python_calls"), py.pop("python_calls")
    assert c == py


@needs_c
@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("seed", [1, 2])
async def test_an_answer_past_its_max_tokens_is_cut_the_same_by_both(
        backends: Backends, monkeypatch: pytest.MonkeyPatch, client: str, seed: int) -> None:
    """A stream of 60 content events for `max_tokens: 20` (and a margin of 4): both relays pass
    24 of them, the C step handing the 25th to `_chunk`, which cuts the answer there; the caller
    is charged 20."""
    rng = random.Random(seed)
    events = chat_stream(rng, 60) if seed == 1 else completions_stream(rng, 60)
    reads = reads_of(rng, events)
    limits = LimitsConfig(max_tokens_margin=4)
    bound = AnswerBound.of(20, 1, 100, limits)
    c = await relay_once(backends, CLIENTS[client], reads, seed, limits, True, monkeypatch, bound)
    py = await relay_once(backends, CLIENTS[client], reads, seed, limits, False, monkeypatch, bound)
    assert "RelayError" in c["raised"] and "max_tokens 20" in c["raised"], c["raised"]
    assert c["content_chunks"] == 24 and c["cut"] and c["usage"][1] == 20 and c["overrun"] >= 5
    c.pop("python_calls"), py.pop("python_calls")
    assert c == py


@needs_c
@pytest.mark.parametrize("client", sorted(CLIENTS))
async def test_an_answer_past_the_bytes_its_max_tokens_allows_is_cut_the_same_by_both(
        backends: Backends, monkeypatch: pytest.MonkeyPatch, client: str) -> None:
    """Content events of 6,000 bytes, each over `answer_bytes_per_token` (4 KiB): neither path
    passes them uncounted, so both count every byte and cut the answer where its bytes run out
    (4 KiB of preamble allowance and 4 KiB a token for 24 events), long before 24 events."""
    rng = random.Random(9)
    events = chat_stream(rng, 5)
    big = [_ev(_chat({"delta": {"content": "x" * 6000}}), False) for _ in range(40)]
    events[3:3] = big
    reads = reads_of(rng, events)
    limits = LimitsConfig(max_tokens_margin=4, max_preamble_bytes=4096, answer_bytes_per_token=4096)
    bound = AnswerBound.of(20, 1, 100, limits)
    c = await relay_once(backends, CLIENTS[client], reads, 9, limits, True, monkeypatch, bound)
    py = await relay_once(backends, CLIENTS[client], reads, 9, limits, False, monkeypatch, bound)
    assert "RelayError" in c["raised"] and "answer_bytes_per_token" in c["raised"], c["raised"]
    assert c["content_chunks"] < 20 and not c["cut"] and c["body_bytes"] > bound.stream_bytes
    c.pop("python_calls"), py.pop("python_calls")
    assert c == py


@needs_c
def test_a_step_needs_its_transport_with_its_connection() -> None:
    with pytest.raises(ValueError, match="go together"):
        speedups.ChunkStep(None, monotonic, None, Tally(_request(), None, ChunkHistogram((1.0,)), monotonic),  # type: ignore[union-attr, arg-type]
                           None, object(), None)

