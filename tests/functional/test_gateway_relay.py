"""The gateway relays the simulator's answers to the real `openai` client: streams chunk by chunk,
non-stream requests assembled from an upstream stream, usage, headers, models, health, metrics."""

from __future__ import annotations

import asyncio
import logging
import socket
import tracemalloc

import aiohttp
import openai
import orjson
import pytest

from tailguard.config import BackendConfig
from tailguard.sim.server import running_sim
from tailguard.wire.sse import DONE, SSEDecoder
from tests.functional.gateways import engine, gateway, health, sample, scrape, until
from tests.functional.raw_servers import DONE_END, SSE_HEAD, TOK_EVENT, chunk, raw_server, read_request

CHAT = [{"role": "user", "content": "x" * 400}]  # 104 prompt tokens by the bytes/4 estimate


async def test_non_stream_chat_is_assembled_with_usage_and_headers() -> None:
    async with asyncio.timeout(20), gateway() as gw, gw.client() as c:
        raw = await c.chat.completions.with_raw_response.create(model="tailguard-sim", messages=CHAT, max_tokens=9)
        r = raw.parse()
    assert r.object == "chat.completion" and r.model == "tailguard-sim"
    assert r.choices[0].message.content == " tok" * 9
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 9 and r.usage.prompt_tokens == 104
    h = raw.headers
    assert h["x-tailguard-class"] == "interactive"
    assert h["x-tailguard-backend"] == "sim0"
    assert float(h["x-tailguard-queue-ms"]) >= 0.0
    st = h["server-timing"]
    assert "queue;dur=" in st and "connect;dur=" in st and "ttft;dur=" in st


async def test_stream_chat_relays_every_token_and_usage_only_when_asked() -> None:
    async with asyncio.timeout(20), gateway() as gw, gw.client() as c:
        plain = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=12, stream=True)
        chunks = [ch async for ch in plain]
        with_usage = await c.chat.completions.create(
            model="tailguard-sim", messages=CHAT, max_tokens=12, stream=True, stream_options={"include_usage": True})
        chunks_u = [ch async for ch in with_usage]
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == " tok" * 12
    assert all(ch.usage is None for ch in chunks)  # the usage chunk the gateway asked for is dropped
    assert all(ch.choices for ch in chunks)
    assert chunks_u[-1].choices == [] and chunks_u[-1].usage is not None
    assert chunks_u[-1].usage.completion_tokens == 12 and chunks_u[-1].usage.prompt_tokens == 104


async def test_stream_headers_arrive_with_the_first_token() -> None:
    async with asyncio.timeout(20), gateway() as gw, gw.client() as c:
        raw = await c.chat.completions.with_raw_response.create(
            model="tailguard-sim", messages=CHAT, max_tokens=5, stream=True, extra_headers={"X-Tailguard-Class": "batch"})
        assert raw.headers["content-type"].startswith("text/event-stream")
        assert raw.headers["x-tailguard-class"] == "batch"
        assert raw.headers["x-tailguard-backend"] == "sim0"
        assert "ttft;dur=" in raw.headers["server-timing"]
        stream = raw.parse()
        n = len([ch async for ch in stream if ch.choices and ch.choices[0].delta.content])
    assert n == 5


async def test_completions_stream_and_non_stream() -> None:
    async with asyncio.timeout(20), gateway() as gw, gw.client() as c:
        r = await c.completions.create(model="tailguard-sim", prompt="hello there", max_tokens=4)
        s = await c.completions.create(model="tailguard-sim", prompt="hello there", max_tokens=4, stream=True,
                                       stream_options={"include_usage": True})
        chunks = [ch async for ch in s]
    assert r.object == "text_completion" and r.choices[0].text == " tok" * 4
    assert r.usage is not None and r.usage.completion_tokens == 4 and r.usage.prompt_tokens == 3
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == " tok" * 4
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


async def test_raw_stream_is_valid_sse_ending_in_done() -> None:
    body = orjson.dumps({"model": "tailguard-sim", "messages": CHAT, "max_tokens": 6, "stream": True})
    async with asyncio.timeout(20), gateway() as gw, aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}/v1/chat/completions", data=body,
                          headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200
            dec = SSEDecoder()
            events = []
            async for data in r.content.iter_any():
                events += dec.feed(data)
            events += dec.flush()
    assert events[-1].data == DONE
    objs = [orjson.loads(e.data) for e in events[:-1]]
    assert objs[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum(1 for o in objs if o["choices"][0]["delta"].get("content")) == 6
    assert all("usage" not in o for o in objs)


async def test_models_health_and_metrics_move() -> None:
    async with asyncio.timeout(20), gateway(sims=2) as gw, gw.client() as c:
        models = await c.models.list()
        assert [m.id for m in models.data] == ["tailguard-sim"]  # union, deduplicated
        async def probed() -> bool:  # "ok" once both backends' first probes have answered
            return bool((await health(gw.url))["status"] == "ok")
        await until(probed)
        h = await health(gw.url)
        assert set(h["backends"]) == {"sim0", "sim1"}
        before = await scrape(gw.url)
        await asyncio.gather(*(c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=8)
                               for _ in range(4)))
        s = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=8, stream=True)
        async for _ in s:
            pass
        after = await scrape(gw.url)
    assert sample(before, "tailguard_requests_total", **{"class": "interactive", "outcome": "success"}) == 0
    assert sample(after, "tailguard_requests_total", **{"class": "interactive", "outcome": "success"}) == 5
    assert sample(after, "tailguard_ttft_seconds_count", **{"class": "interactive"}) == 5
    assert sample(after, "tailguard_e2e_seconds_count", **{"class": "interactive"}) == 5
    assert sample(after, "tailguard_queue_wait_seconds_count", **{"class": "interactive"}) == 5
    assert sample(after, "tailguard_output_tokens_total", **{"class": "interactive"}) == 40
    assert sample(after, "tailguard_prompt_tokens_total", **{"class": "interactive"}) == 5 * 104
    # ITL: one observation per content chunk after the first
    assert sample(after, "tailguard_itl_seconds_count", **{"class": "interactive"}) == 5 * 7
    assert sample(after, "tailguard_inflight", backend="sim0") == 0
    assert sample(after, "tailguard_inflight", backend="sim1") == 0
    assert sample(after, "tailguard_queue_length", **{"class": "interactive"}) == 0
    assert sample(after, "tailguard_backend_healthy", backend="sim0") == 1


@pytest.mark.parametrize("log_prompts", [False, True])
async def test_access_log_has_one_json_line_per_request_and_text_only_when_asked(
    caplog: pytest.LogCaptureFixture, log_prompts: bool,
) -> None:
    caplog.set_level(logging.INFO, logger="tailguard.access")
    secret = "the secret prompt"
    async with asyncio.timeout(20), gateway(log_prompts=log_prompts) as gw, gw.client() as c:
        await c.chat.completions.create(model="tailguard-sim", messages=[{"role": "user", "content": secret}], max_tokens=2)
        s = await c.chat.completions.create(model="tailguard-sim", messages=[{"role": "user", "content": secret}],
                                            max_tokens=2, stream=True)
        async for _ in s:
            pass
        with pytest.raises(openai.BadRequestError):
            await c.chat.completions.create(model="tailguard-sim", messages=[], max_tokens=2)
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "tailguard.access"]
    assert [(x["status"], x["outcome"]) for x in lines] == [(200, "success"), (200, "success"), (400, "client_error")]
    first = lines[0]
    assert first["class"] == "interactive" and first["backend"] == "sim0" and first["output_tokens"] == 2
    assert first["queue_ms"] >= 0 and first["ttft_ms"] > 0 and first["e2e_ms"] >= first["ttft_ms"]
    text = " ".join(r.getMessage() for r in caplog.records)
    assert (secret in text) == log_prompts
    if log_prompts:
        assert first["completion"] == " tok tok"


async def test_vllm_backends_get_the_class_rank_as_priority() -> None:
    # A vLLM-kind backend gets `priority` = class rank; a simulator with FCFS refuses a non-zero
    # priority exactly as vLLM does, which shows the field was sent.
    fcfs = BackendConfig(name="fcfs", url="http://127.0.0.1:1", kind="vllm")
    async with asyncio.timeout(20), running_sim(engine(scheduling_policy="priority"), time_scale=0.02) as prio, \
            running_sim(engine(), time_scale=0.02) as plain:
        for sim, ok in ((prio, True), (plain, False)):
            backend = fcfs.model_copy(update={"url": sim.url})
            async with gateway(sims=0, extra_backends=[backend]) as gw, gw.client() as c:
                chat = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2)  # rank 0: no field
                assert chat.choices[0].message.content == " tok tok"
                if ok:
                    r = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2,
                                                        extra_headers={"X-Tailguard-Class": "batch"})
                    assert r.choices[0].message.content == " tok tok"
                else:  # refused once, then sent without it (tests/functional/test_gateway_refusals.py)
                    r = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2,
                                                        extra_headers={"X-Tailguard-Class": "batch"})
                    assert r.choices[0].message.content == " tok tok"
                assert (await health(gw.url))["backends"]["fcfs"]["dropped_fields"] == ([] if ok else ["priority"])


# The flood: 40,000 content events of about 550 bytes, 22 MB in all: several times what the
# kernel's socket buffers between backend, gateway and client hold on loopback (each autotunes to
# a few MB), so a gateway that reads the backend regardless of its client cannot hide the answer
# in the kernel and must hold most of it in its own memory.
FLOOD_EVENTS = 40_000
FLOOD_EVENT = TOK_EVENT.replace(b'"content":" tok"', b'"content":"' + b" tok" * 100 + b'"')
FLOOD_BLOCK = 100  # events per write: the backend's progress is counted in these


class _Flood:
    """A backend that answers FLOOD_EVENTS content events as fast as its socket takes them, and
    the gateway's probes with an empty model list. It counts the bytes its socket has taken, so
    a test sees when its writes block (the gateway stopped reading it) and whether it finished."""

    def __init__(self) -> None:
        self.sent = 0  # body bytes the socket took (written and drained)
        self.size = len(chunk(FLOOD_EVENT)) * FLOOD_EVENTS
        self.finished = asyncio.Event()

    async def __call__(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if not (await read_request(r)).startswith(b"POST"):
            w.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"data":[]}')
            return
        # A small send buffer (autotuning would grow it to 4 MB): the backend's writes block soon
        # after the gateway stops reading it, instead of the kernel taking MBs more on its behalf.
        w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        w.write(SSE_HEAD)
        block = chunk(FLOOD_EVENT) * FLOOD_BLOCK
        for _ in range(FLOOD_EVENTS // FLOOD_BLOCK):
            w.write(block)
            await w.drain()
            self.sent += len(block)
        w.write(DONE_END)
        await w.drain()
        self.finished.set()

    async def stalled(self, quiet_s: float = 0.3, step_s: float = 0.02) -> None:
        """Returns once the socket has taken nothing for `quiet_s` (its writes block), or the
        backend wrote everything; the caller bounds the wait."""
        last, quiet_since = -1, 0.0
        loop = asyncio.get_running_loop()
        while not self.finished.is_set():
            if self.sent != last:
                last, quiet_since = self.sent, loop.time()
            elif loop.time() - quiet_since >= quiet_s:
                return
            await asyncio.sleep(step_s)


async def test_a_client_that_stops_reading_slows_the_backend_and_loses_nothing() -> None:
    """The relay's flow control: a backend writes a 22 MB answer faster than its client, which
    stops reading after the response head, can take. The gateway must not buffer the answer: the
    first chunk reaches the client while the backend is still writing; once the kernel's buffers
    are full the relay stops pushing and pauses reading the backend, whose writes then block
    before it has written the whole answer, and the gateway's memory stays far below the
    answer's size. Then the client reads, and every chunk arrives, in order, once.

    The client socket is read only by explicit `sock_recv` calls: an asyncio stream reader
    would keep reading into its own buffer while the test "does not read", so the gateway
    would never see a slow client at all."""
    body = orjson.dumps({"model": "tailguard-sim", "messages": CHAT, "max_tokens": FLOOD_EVENTS, "stream": True})
    flood = _Flood()
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(60), raw_server(flood) as url, \
            gateway(sims=0, extra_backends=[BackendConfig(name="flood", url=url, kind="openai")]) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", port))
            tracing = tracemalloc.is_tracing()  # (left on if the run traces already)
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                await loop.sock_sendall(sock, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                        b"Content-Type: application/json\r\nConnection: close\r\n"
                                        b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
                raw = bytearray()
                while b"\r\n\r\n" not in raw:  # the head, which the gateway sends with the first chunk
                    raw += await loop.sock_recv(sock, 1 << 16)
                assert not flood.finished.is_set(), "the first chunk came only after the backend had finished"
                await flood.stalled()  # the client reads nothing meanwhile
                held_mb = (tracemalloc.get_traced_memory()[0] - base) / 1e6
            finally:
                if not tracing:
                    tracemalloc.stop()
            size_mb = flood.size / 1e6
            assert not flood.finished.is_set(), (
                f"the backend wrote the whole answer ({size_mb:.0f} MB) while the client read nothing: "
                f"the gateway buffered it (its memory grew {held_mb:.1f} MB)")
            assert held_mb < size_mb / 8, (f"the gateway holds {held_mb:.1f} MB of a {size_mb:.0f} MB answer "
                                           f"(the backend got {flood.sent / 1e6:.1f} MB out)")
            while data := await loop.sock_recv(sock, 1 << 20):
                raw += data
    assert flood.finished.is_set()  # once the client read, the backend could finish
    events = SSEDecoder().feed(_unchunk(bytes(raw.split(b"\r\n\r\n", 1)[1])))
    assert len(events) == FLOOD_EVENTS + 1
    assert all(ev.raw == FLOOD_EVENT for ev in events[:-1]) and events[-1].data == DONE


def _unchunk(raw: bytes) -> bytes:
    """The body of an HTTP/1.1 chunked response."""
    out, pos = bytearray(), 0
    while True:
        end = raw.index(b"\r\n", pos)
        size = int(raw[pos:end], 16)
        if size == 0:
            return bytes(out)
        out += raw[end + 2:end + 2 + size]
        pos = end + 4 + size
