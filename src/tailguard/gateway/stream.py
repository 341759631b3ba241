"""The client side of a streamed request: relays one upstream SSE stream to the client chunk
by chunk, and ends it with an OpenAI error event when it breaks after the client got bytes.

The fast path never parses JSON per chunk: content chunks are recognised by their bytes
(`wire.chunks`) and only the usage chunk is parsed. Bytes that precede the first content chunk
(the role-only delta) are held back until it arrives, so the response headers can carry the
TTFT and a failure before any content can still be retried on another backend. A preemptible
request takes the tracked path instead, which parses every event to keep the text so far.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import aiohttp
import orjson
from aiohttp import web

from tailguard.gateway.resume import Progress
from tailguard.gateway.tally import Tally
from tailguard.gateway.upstream import ClientGone, RelayError, Suspended
from tailguard.wire.chunks import delta_text, has_content, has_usage, is_error, parse, role_only, running_completion_tokens
from tailguard.wire.openai import Endpoint, error_body
from tailguard.wire.sse import DONE, DONE_EVENT, SSEDecoder, encode_event

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _event_json(data: bytes, start: int, end: int) -> object:
    """Parse the `data:` payload of one event (used for the usage chunk only)."""
    block = data[start:end]
    k = block.find(b"data:")
    return None if k < 0 else parse(block[k + 5:].strip())


@dataclass(slots=True)
class StreamRelay:
    """Relays one upstream SSE stream to a streaming client."""

    request: web.Request
    endpoint: Endpoint
    tally: Tally
    client_usage: bool
    make_headers: Callable[[], dict[str, str]]
    response: web.StreamResponse | None = None
    upstream_error: bool = False
    ended: bool = False  # the client's response is complete (eof written)
    progress: Progress | None = None  # set for preemptible requests: the text so far is tracked
    # A preemptible request's chunk id from its first run: a resumed run's chunks are given it
    # back, so the client sees one response id throughout.
    stream_id: str | None = None

    async def run(self, up: aiohttp.ClientResponse) -> None:
        """Relay until the upstream ends. Raises `RelayError` (retryable while nothing was
        sent), `ClientGone`, `Suspended`, or CancelledError; the caller closes `up`."""
        self.tally.start_run()
        if self.progress is not None:
            await self._run_tracked(up, self.progress)
            return
        loop_time = time.perf_counter  # metrics need sub-ms; uvloop's loop.time() is ms
        tally = self.tally
        t = tally.times
        wd = tally.watchdog
        held: list[bytes] = []
        carry = b""
        try:
            async for data in up.content.iter_any():
                now = loop_time()
                wd.last_at = now
                if self.ended:
                    continue  # past [DONE]: drain so the connection can be reused
                if carry:
                    data = carry + data
                    carry = b""
                if not data.endswith(b"\n\n"):
                    cut = data.rfind(b"\n\n")
                    cut = cut + 2 if cut >= 0 else 0
                    carry = data[cut:]
                    data = data[:cut]
                    if not data:
                        continue
                content = 0
                drop: tuple[int, int] | None = None
                pos = 0
                while True:
                    end = data.find(b"\n\n", pos)
                    if end < 0:
                        break
                    if has_content(data, pos, end):
                        content += 1
                    elif has_usage(data, pos, end):
                        if tally.usage.read(_event_json(data, pos, end)) and not self.client_usage:
                            drop = (pos, end + 2)
                    elif is_error(data, pos, end):
                        self.upstream_error = True
                    pos = end + 2
                last = data.endswith(DONE_EVENT)
                if drop is not None:
                    data = data[:drop[0]] + data[drop[1]:]
                if content:
                    tally.content(now, content)
                if self.response is None:
                    if t.first_content_at is None and not last:
                        if data:
                            held.append(data)
                        continue
                    held.append(data)
                    await self._start(b"".join(held), eof=last)
                    held.clear()
                elif last:
                    # The final event and the chunked terminator in one send.
                    await self._end(data)
                elif data:
                    await self._write(data)
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientConnectionError) as e:
            if self.response is None:
                raise RelayError("disconnect", f"Backend closed the stream early: {e}", retryable=True) from None
            await self.fail(RelayError("disconnect", f"Backend closed the stream early: {e}"))
            return
        if carry:
            held.append(carry)
        if self.response is None:
            await self._start(b"".join(held), eof=True)
        elif not self.ended:
            await self._end(carry)

    async def _run_tracked(self, up: aiohttp.ClientResponse, prog: Progress) -> None:
        """The relay of a preemptible request: every event is parsed, to keep the text so far
        (the one thing a continuation needs). On a resumed run the client's stream is already
        open: the new upstream's role-only preamble is dropped and its usage is rewritten once,
        so the client sees one response. Between reads it stops with `Suspended` once the
        dispatcher has preempted the request."""
        loop_time = time.perf_counter  # metrics need sub-ms; uvloop's loop.time() is ms
        chat = self.endpoint == "chat"
        tally = self.tally
        t, wd = tally.times, tally.watchdog
        dec = SSEDecoder()
        held: list[bytes] = []
        try:
            async for data in up.content.iter_any():
                if prog.suspended and not self.ended:
                    raise Suspended()
                now = loop_time()
                wd.last_at = now
                if self.ended:
                    continue
                out: list[bytes] = []
                content = 0
                last = False
                for ev in dec.feed(data):
                    if ev.data == DONE:
                        out.append(DONE_EVENT)
                        last = True
                        continue
                    try:
                        obj = orjson.loads(ev.data)
                    except orjson.JSONDecodeError:
                        out.append(ev.raw)
                        continue
                    if not isinstance(obj, dict):
                        out.append(ev.raw)
                        continue
                    raw = ev.raw
                    cid = obj.get("id")
                    if isinstance(cid, str):
                        if self.stream_id is None:
                            self.stream_id = cid
                        elif cid != self.stream_id:  # a resumed run: its engine named it anew
                            raw = raw.replace(orjson.dumps(cid), orjson.dumps(self.stream_id), 1)
                            obj["id"] = self.stream_id
                    if isinstance(obj.get("error"), dict):
                        self.upstream_error = True
                        out.append(raw)
                        continue
                    text = delta_text(obj, chat)
                    if text:
                        prog.add(text, running_completion_tokens(obj))
                        content += 1
                        out.append(raw)
                        continue
                    u = obj.get("usage")
                    if isinstance(u, dict):
                        usage_only = tally.usage.read(obj)
                        if usage_only and not self.client_usage:
                            continue
                        if prog.runs > 1:  # the one JSON rewrite of a resumed request
                            pt, ct = prog.client_usage(tally.usage.prompt_tokens, tally.usage.completion_tokens)
                            if pt is not None and ct is not None:
                                obj["usage"] = {**u, "prompt_tokens": pt, "completion_tokens": ct,
                                                "total_tokens": pt + ct}
                                out.append(encode_event(orjson.dumps(obj)))
                                continue
                        out.append(raw)
                        continue
                    if self.response is not None and not tally.run_started and role_only(obj):
                        continue  # a resumed run's preamble: the client has had it
                    out.append(raw)
                if content:
                    tally.content(now, content)
                chunk = b"".join(out)
                if self.response is None:
                    held.append(chunk)
                    if t.first_content_at is None and not last:
                        continue
                    await self._start(b"".join(held), eof=last)
                    held.clear()
                elif last:
                    await self._end(chunk)
                elif chunk:
                    await self._write(chunk)
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientConnectionError) as e:
            if prog.suspended and not self.ended:
                raise Suspended() from None
            if self.response is None:
                raise RelayError("disconnect", f"Backend closed the stream early: {e}", retryable=True) from None
            await self.fail(RelayError("disconnect", f"Backend closed the stream early: {e}"))
            return
        if prog.suspended and not self.ended:
            raise Suspended()
        tail = b"".join(ev.raw for ev in dec.flush())
        if self.response is None:
            await self._start(b"".join(held) + tail, eof=True)
        elif not self.ended:
            await self._end(tail)

    async def _start(self, first: bytes, eof: bool) -> None:
        resp = _SSEResponse(status=200, headers={**_SSE_HEADERS, **self.make_headers()})
        self.response = resp
        try:
            await resp.prepare(self.request)
            if eof:
                self.ended = True
                await resp.write_eof(first)
            else:
                await resp.write(first)
        except ConnectionError:
            raise ClientGone() from None

    async def _write(self, data: bytes) -> None:
        try:
            await self.response.write(data)  # type: ignore[union-attr]
        except ConnectionError:
            raise ClientGone() from None

    async def _end(self, data: bytes) -> None:
        self.ended = True
        try:
            await self.response.write_eof(data)  # type: ignore[union-attr]
        except ConnectionError:
            raise ClientGone() from None

    async def fail(self, err: RelayError) -> None:
        """The stream broke after the client got bytes: end it with an OpenAI error event."""
        self.upstream_error = True
        if not self.ended:
            await self._end(b"data: " + error_body(err.api_error()) + b"\n\n")

class _SSEResponse(web.StreamResponse):
    """Sends its headers together with the first chunk (one write instead of two), as aiohttp's
    own `web.Response` does; the relay always writes a chunk right after `prepare`."""

    _send_headers_immediately = False

