"""The client side of a streamed request: relays one upstream SSE stream to the client chunk
by chunk, and ends it with an OpenAI error event when it breaks after the client got bytes.

The fast path never parses JSON per chunk, and runs in the upstream connection's callback:
content chunks are recognised by their bytes (`wire.chunks`) and only the usage chunk is parsed.
Bytes that precede the first content chunk (the role-only delta) are held back until it arrives,
so the response headers can carry the TTFT and a failure before any content can still be retried
on another backend; they are bounded (`limits.max_preamble_bytes`), as is each event
(`limits.max_event_bytes`) and what is drained past the end. A preemptible request takes the
tracked path instead, which parses every event to keep the text so far; one that may only be
moved to another backend if its own dies mid-answer keeps the fast path and its content events
raw (`Transcript.keep`), parsed only then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import orjson

from tailguard.errors import APIError
from tailguard.config import LimitsConfig
from tailguard.gateway.sink import Sink
from tailguard.gateway.upstream.client import RelayError, Suspended, check_answer, stream_failure
from tailguard.gateway.upstream.h1 import H1Response, UpstreamBroke
from tailguard.gateway.upstream.resume import Transcript
from tailguard.gateway.upstream.tally import Tally
from tailguard.speedups import speedups
from tailguard.types import FailureKind
from tailguard.wire.chunks import (
    delta_text, has_content, parse, role_only, running_usage, with_service_tier,
)
from tailguard.wire.framing import OPENAI, Cut, Framing
from tailguard.wire.openai import Endpoint
from tailguard.wire.sse import DONE, DONE_EVENT, EventTooLarge, SSEDecoder, SSEEvent, encode_event, events_of
from tailguard.wire.token_ids import without_token_ids

if TYPE_CHECKING:
    from tailguard.guards.output import OutputScreen

# What a stream may still send after its `[DONE]`, drained so its connection can be reused; past
# this the connection is closed instead.
_DRAIN_BYTES = 64 * 1024


def _event_json(data: bytes, start: int, end: int) -> object:
    """Parse the `data:` payload of one event (used for the usage chunk only)."""
    block = data[start:end]
    k = block.find(b"data:")
    return None if k < 0 else parse(block[k + 5:].strip())


@dataclass(slots=True)
class StreamRelay:
    """Relays one upstream SSE stream to a streaming consumer (`sink`: the HTTP client's
    response, or a queue inside the process)."""

    sink: Sink
    endpoint: Endpoint
    tally: Tally
    client_usage: bool
    make_headers: Callable[[], dict[str, str]]
    limits: LimitsConfig
    upstream_error: bool = False
    ended: bool = False  # the client's response is complete (eof written)
    transcript: Transcript | None = None  # set for preemptible requests: the text so far is tracked
    # A preemptible request's chunk id from its first run: a resumed run's chunks are given it
    # back, so the client sees one response id throughout.
    stream_id: str | None = None
    # Bytes before the first content chunk (the role-only delta), sent with it; `held_bytes` long.
    held: list[bytes] = field(default_factory=list)
    held_bytes: int = 0
    service_tier: bytes | None = None  # the tier to report, when the request named one
    framing: Framing = OPENAI  # what the route's events carry (`wire.framing`)
    # Its output guards (`tailguard.guards.output`): the stream then takes the general path, each
    # event read; None costs the push path nothing.
    screen: OutputScreen | None = None
    _up: H1Response | None = None  # this run's upstream: a guard's block closes it
    # The callback relay's state (`_chunk`): this run's decoder, the events it handed back, and
    # whether the client's buffer is full.
    _dec: SSEDecoder = field(init=False)  # made by each run
    _pending: tuple[bytes, int, bool, float] | None = None
    _blocked: bool = False

    async def run(self, up: H1Response) -> None:
        """Relay until the upstream ends. Raises `RelayError` (only while nothing was sent),
        `ClientGone`, `Suspended`, or CancelledError; the caller closes `up`.

        Once the client's stream is open, the usual piece of the body (one content chunk) is
        relayed by `_chunk` from the connection's own callback (`H1Response.push`): no task is
        woken per chunk. Anything else (the preamble, usage, the end, a client that reads slower
        than the backend writes) comes back here and takes `_emit`."""
        check_answer(up, self.tally.request.backend, stream=True)
        self.tally.start_run()
        self._up = up
        self.held.clear()  # a failed attempt's preamble is not this one's
        self.held_bytes = 0
        try:
            transcript = self.transcript
            if transcript is not None and not transcript.lazy:
                if self.stream_id is None:
                    self.stream_id = transcript.first_id  # (a lazy first run's, continued after a migration)
                await self._run_tracked(up, transcript)
            else:
                await self._run_pushed(up)
        finally:
            self.tally.end_run()

    async def _run_pushed(self, up: H1Response) -> None:
        self._dec = dec = SSEDecoder(self.limits.max_event_bytes)
        sink, tally = self.sink, self.tally
        wd = tally.watchdog
        drained = 0
        step: Callable[[bytes], bool] | None = None
        try:
            while True:
                if sink.started and not self.ended and self.service_tier is None and self.screen is None:
                    step = step or self._step()
                    ended = await up.push(step)
                    if self._pending is not None:
                        pending, self._pending = self._pending, None
                        await self._emit(*pending)
                    elif self._blocked:
                        self._blocked = False
                        await sink.drain()
                    if ended:
                        break
                    continue
                data = await up.readany()
                if not data:
                    break
                now = self.tally.clock()
                wd.last_at = now
                if self.ended:
                    drained += len(data)  # past [DONE]: drain so the connection can be reused
                    if drained > _DRAIN_BYTES:
                        return  # not worth it: the caller closes it
                    continue
                tally.read(len(data))
                buf, ends = dec.frame(data)
                if ends:
                    await self._emit(*self._scan(buf, ends), now)
        except (UpstreamBroke, EventTooLarge) as e:
            if not self.ended:
                raise stream_failure(e) from None
        await self._eof(dec)

    def _step(self) -> Callable[[bytes], bool]:
        """What this run's stream calls per piece of the body once the client's has begun:
        `_chunk`, or its twin in C (`tailguard.speedups`), which takes the usual content chunk of
        an OpenAI stream itself and hands any other piece to `_chunk`."""
        if speedups is None or self.framing is not OPENAI or self.tally.traced:
            return self._chunk
        conn, transport = self.sink.direct or (None, None)
        tally = self.tally
        step: Callable[[bytes], bool] = speedups.ChunkStep(self, tally.clock, self._dec, tally, self.sink, conn,
                                                           transport)
        return step

    def _chunk(self, data: bytes) -> bool:
        """One piece of the body, in the connection's callback: read by the one rule of what
        its events carry (`_scan`), and a lone content chunk goes straight to the sink. False
        hands the rest back to `run` (`_pending`: what needs `_emit`; `_blocked`: the client must
        drain first). Its bytes count toward the answer's bound (`Tally.read`) unless it is one
        whole content event of at most `Tally.event_bytes` read alone (the C step's own piece),
        which the bound on content events holds instead."""
        tally = self.tally
        now = tally.clock()
        tally.watchdog.last_at = now
        buf, ends = self._dec.frame(data)
        if not ends:
            tally.read(len(data))
            return True  # part of an event: the decoder keeps it
        chunk, content, last = self._scan(buf, ends)
        if content == 1 and len(ends) == 1:
            if buf is not data or len(data) > tally.event_bytes:
                tally.read(len(data))
            tally.content(now, 1)
            if self.sink.write_nowait(chunk):
                return True
            self._blocked = True
            return False
        tally.read(len(data))
        self._pending = (chunk, content, last, now)
        return False

    async def _run_tracked(self, up: H1Response, transcript: Transcript) -> None:
        """The loop of a preemptible request: every event parsed (`_track`); between reads it
        stops with `Suspended` once the dispatcher has preempted the request."""
        clock = self.tally.clock
        wd, read = self.tally.watchdog, up.readany
        dec = SSEDecoder(self.limits.max_event_bytes)
        try:
            while data := await read():
                if transcript.suspended and not self.ended:
                    raise Suspended()
                now = clock()
                wd.last_at = now
                self.tally.read(len(data))
                if not self.ended:
                    await self._emit(*self._track(dec.feed(data), transcript), now)
        except (UpstreamBroke, EventTooLarge) as e:
            if isinstance(e, UpstreamBroke) and transcript.suspended and not self.ended:
                raise Suspended() from None
            if not self.ended:
                raise stream_failure(e) from None
        if transcript.suspended and not self.ended:
            raise Suspended()
        await self._eof(dec)

    async def _eof(self, dec: SSEDecoder) -> None:
        """The upstream ended: a last event without its blank line counts, then the end."""
        if self.ended:
            return
        tail = dec.flush_raw()
        transcript = self.transcript
        chunk, content, _ = (self._scan(tail, [len(tail)]) if transcript is None or transcript.lazy
                             else self._track(events_of(tail), transcript))
        await self._emit(chunk, content, True, self.tally.clock())

    def _scan(self, buf: bytes, ends: list[int]) -> tuple[bytes, int, bool]:
        """The zero-parse path: which events carry content, usage or an error, found by their
        bytes in place. Returns the bytes to send (`buf` itself unless a usage-only chunk the
        client did not ask for is cut out), the content chunk count, and whether it ended."""
        content = 0
        drop: tuple[int, int] | None = None
        pos = last_start = 0
        if self.tally.traced:
            self.tally.answer_end(buf, 0, len(buf))
        f = self.framing
        for end in ends:
            if f.has_content(buf, pos, end):
                content += 1
            elif f.has_usage(buf, pos, end):
                if f.read_usage(self.tally.usage, _event_json(buf, pos, end)) and not self.client_usage:
                    drop = (pos, end)
                self.tally.counted()
            elif f.is_error(buf, pos, end):
                self.upstream_error = True
            last_start, pos = pos, end
        last = content < len(ends) and f.is_last(buf, last_start, pos)  # [DONE] is not content
        transcript = self.transcript
        if transcript is not None and (content or transcript.wants_ids()):
            if content:
                self.tally.room(content)  # text past the answer's bound is neither relayed nor kept
            transcript.keep(buf, self.endpoint == "chat")
        if drop is not None:
            buf = buf[:drop[0]] + buf[drop[1]:]
        if transcript is not None and transcript.hide_ids:
            buf = without_token_ids(buf)
        return buf, content, last

    def _track(self, events: list[SSEEvent], transcript: Transcript) -> tuple[bytes, int, bool]:
        """The relay of a preemptible request: every event is parsed, to keep the text so far
        (the one thing a continuation needs). On a resumed run the client's stream is already
        open: the new upstream's role-only preamble is dropped and its usage is rewritten once,
        so the client sees one response."""
        out: list[bytes] = []
        content = 0
        last = False
        for ev in events:
            if ev.data == DONE:
                out.append(DONE_EVENT)
                last = True
                continue
            obj = parse(ev.data)
            if not isinstance(obj, dict):
                out.append(ev.raw)
                continue
            if self.tally.traced:
                self.tally.answer_end(ev.data, 0, len(ev.data))
            shaped = transcript.absorb(obj)  # its token ids kept; a continuation by ids back in chat's shape
            raw = ev.raw if shaped is obj else encode_event(orjson.dumps(shaped))
            raw = self._same_id(raw, shaped)
            obj = shaped
            if isinstance(obj.get("error"), dict):
                self.upstream_error = True
                out.append(raw)
            elif has_content(ev.data):
                pt, ct = running_usage(obj)
                transcript.add(delta_text(obj, self.endpoint == "chat"), ct, pt)
                content += 1
                out.append(raw)
            elif isinstance(obj.get("usage"), dict):
                usage = self._usage_event(raw, obj, transcript)
                if usage:
                    out.append(usage)
            elif not (self.sink.started and not self.tally.run_started and role_only(obj)):
                out.append(raw)  # (else a resumed run's preamble: the client has had it)
        data = b"".join(out)
        return (without_token_ids(data) if transcript.hide_ids else data), content, last

    def _same_id(self, raw: bytes, obj: dict[str, Any]) -> bytes:
        """A resumed run's chunk with the first run's id, which its engine named anew."""
        cid = obj.get("id")
        if not isinstance(cid, str):
            return raw
        if self.stream_id is None:
            self.stream_id = cid
        elif cid != self.stream_id:
            raw = raw.replace(orjson.dumps(cid), orjson.dumps(self.stream_id), 1)
            obj["id"] = self.stream_id
        return raw

    def _usage_event(self, raw: bytes, obj: dict[str, Any], transcript: Transcript) -> bytes:
        """The usage chunk as the client gets it: dropped if it did not ask for it, rewritten
        once (the one JSON rewrite of a resumed request) to count every run. The tally keeps
        the same counts, as the assembler's does: the request is metered from them."""
        usage = self.tally.usage
        usage_only = usage.read(obj)
        if transcript.runs > 1:
            usage.prompt_tokens, usage.completion_tokens = transcript.client_usage(usage.prompt_tokens,
                                                                             usage.completion_tokens)
        self.tally.counted()
        if usage_only and not self.client_usage:
            return b""
        if transcript.runs > 1:
            pt, ct = usage.prompt_tokens, usage.completion_tokens
            if pt is not None and ct is not None:
                obj["usage"] = {**obj["usage"], "prompt_tokens": pt, "completion_tokens": ct,
                                "total_tokens": pt + ct}
                return encode_event(orjson.dumps(obj))
        return raw

    async def _emit(self, chunk: bytes, content: int, last: bool, now: float) -> None:
        """Count one read's content chunks and pass its bytes on: held back until the first
        content chunk, then written at once; the final event and the end of the response in
        one send."""
        tally = self.tally
        if content:
            tally.content(now, content)
        if self.screen is not None:
            chunk, last = await self._screened(chunk, last)
            if not chunk and not last and not self.sink.started:
                return  # held by the guards: the client's stream opens with the first bytes they let go
        if self.service_tier is not None and chunk:
            chunk = with_service_tier(chunk, self.service_tier)
        if not self.sink.started:
            if chunk:
                self.held.append(chunk)
                self.held_bytes += len(chunk)
            if tally.request.first_content_at is None and not last:
                self._bound_preamble(now)
                return
            first = b"".join(self.held)
            self.held.clear()
            self.held_bytes = 0
            await self._start(first, eof=last)
        elif self.ended:
            return
        elif last:
            await self._end(chunk)
        elif chunk:
            await self._write(chunk)

    async def _screened(self, chunk: bytes, last: bool) -> tuple[bytes, bool]:
        """The output guards' part (`guards.output`): what they hold back waits for its check; a
        block ends the stream here, and closes the engine's, so nothing more is generated."""
        assert self.screen is not None
        chunk, last = await self.screen.feed(chunk, last)
        if self.screen.reason is not None and self._up is not None:
            self._up.close()
        return chunk, last

    def _bound_preamble(self, now: float) -> None:
        """Bytes keep coming and none is content: bounded in size and in time (`Tally.no_content`)."""
        limits = self.limits
        if self.held_bytes > limits.max_preamble_bytes:
            raise RelayError(FailureKind.PROTOCOL, f"Backend sent {self.held_bytes} bytes without content, "
                             f"over limits.max_preamble_bytes ({limits.max_preamble_bytes})")
        self.tally.no_content(now, limits)

    async def _start(self, first: bytes, eof: bool) -> None:
        self.ended = eof
        await self.sink.begin(first, self.make_headers(), eof=eof)

    async def _write(self, data: bytes) -> None:
        await self.sink.write(data)

    async def _end(self, data: bytes) -> None:
        self.ended = True
        await self.sink.end(data)

    async def fail(self, err: APIError) -> None:
        """The stream broke after the client got bytes: end it with the route's error event,
        after the event that says it ended at its length when it was cut there (`Tally.cut`)."""
        self.upstream_error = True
        if self.ended:
            return
        last = self.framing.error_event(err)
        tally = self.tally
        if tally.cut:
            t, bound = tally.request, tally.bound
            cut = Cut(t.request_id, t.model or "", bound.n, bound.charged, chat=self.endpoint == "chat")
            last = self.framing.cut_event(cut) + last
        await self._end(last)

