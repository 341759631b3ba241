"""One upstream attempt: send the body as a stream, relay SSE chunk by chunk to a streaming
client or assemble a normal response for a non-streaming one, enforce phase deadlines, and
close the upstream at once when the client leaves so the engine aborts the request.

The streaming path never re-parses JSON per chunk: content chunks are recognised by their bytes
and only the usage chunk is parsed. Bytes that precede the first content chunk (the role-only
delta) are held back until it arrives, so the response headers can carry the TTFT and a failure
before any content can still be retried on another backend.

    RelayError                 an attempt failed; `retryable` while the client has seen nothing
    └── kinds: connect | status | disconnect | timeout_connect | timeout_first_token
               | timeout_idle | timeout_total | protocol
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp
import orjson
from aiohttp import web

from tailguard.errors import APIError
from tailguard.gateway.backends import prepare_body
from tailguard.gateway.config import BackendConfig, TimeoutsConfig
from tailguard.gateway.kinds import get_kind
from tailguard.gateway.metrics import ChunkHistogram, RequestTimes
from tailguard.gateway.resume import Progress
from tailguard.wire.openai import Endpoint, error_body
from tailguard.wire.sse import DONE, DONE_EVENT, SSEDecoder, encode_event

UPSTREAM_PATHS: dict[Endpoint, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# Byte keys whose non-empty string value marks a chunk that carries generated content.
_CONTENT_KEYS: dict[Endpoint, tuple[bytes, ...]] = {
    "chat": (b'"content":', b'"reasoning_content":', b'"reasoning":', b'"tool_calls":'),
    "completions": (b'"text":',),
}
_USAGE_KEY = b'"usage":'
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Largest upstream error body passed back to a client (a 4xx is small; a runaway one is cut).
_MAX_ERROR_BODY = 64 * 1024


class RelayError(Exception):
    """An upstream attempt failed. `retryable` means no byte has reached the client yet."""

    def __init__(self, kind: str, message: str, *, status: int = 502, retryable: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retryable = retryable

    @property
    def is_timeout(self) -> bool:
        return self.kind.startswith("timeout")

    def api_error(self) -> APIError:
        return APIError(self.message, status=self.status, type="upstream_error", code=self.kind)


class UpstreamStatus(Exception):
    """The upstream answered with an error status before streaming (e.g. a 400 for a context
    overflow); the client gets the same status and body."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(f"upstream status {status}")
        self.status = status
        self.body = body
        self.content_type = content_type


class ClientGone(Exception):
    """Writing to the client failed: it disconnected."""


class Suspended(Exception):
    """The dispatcher preempted this request: its upstream was closed, and the client's response
    stays open until the request is resumed."""


class Watchdog:
    """Phase deadlines for one request with one timer, re-armed lazily.

    Chunks only store `last_at`; the timer, when it fires, re-arms itself at the next deadline
    if nothing expired. That costs one callback per idle period instead of a timer per chunk.
    On expiry it cancels the request's task (like `asyncio.timeout`), and `take_expiry()` tells
    that cancellation apart from a client disconnect. Instants are `time.perf_counter()` seconds,
    the clock of the request's timings (uvloop's `loop.time()` only has millisecond resolution).
    """

    __slots__ = ("_loop", "_task", "_base", "_handle", "total_at", "first_token_at", "idle_s",
                 "last_at", "first_seen", "expired")

    def __init__(self, loop: asyncio.AbstractEventLoop, total_at: float, idle_s: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._loop = loop
        self._task = task
        self._base = task.cancelling()
        self._handle: asyncio.TimerHandle | None = None
        self.total_at = total_at
        self.first_token_at = total_at
        self.idle_s = idle_s
        self.last_at = time.perf_counter()
        self.first_seen = False
        self.expired: str | None = None

    def start_attempt(self, first_token_at: float) -> None:
        self.first_token_at = first_token_at
        self.first_seen = False
        self._arm(min(first_token_at, self.total_at))

    def first_content(self, now: float) -> None:
        """From here on the idle deadline applies instead of the first-token one."""
        self.first_seen = True
        self.last_at = now
        self._arm(min(now + self.idle_s, self.total_at))

    def _arm(self, at: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._loop.call_later(max(0.0, at - time.perf_counter()), self._fire)

    def _fire(self) -> None:
        self._handle = None
        now = time.perf_counter()
        if now >= self.total_at:
            kind = "timeout_total"
        elif not self.first_seen:
            if now < self.first_token_at:
                self._arm(min(self.first_token_at, self.total_at))
                return
            kind = "timeout_first_token"
        else:
            due = self.last_at + self.idle_s
            if now < due:
                self._arm(min(due, self.total_at))
                return
            kind = "timeout_idle"
        self.expired = kind
        self._task.cancel()

    def take_expiry(self) -> str | None:
        """After a CancelledError: the deadline that caused it, or None if it came from outside
        (the client left), in which case the caller must re-raise."""
        if self.expired is None:
            return None
        if self._task.uncancel() > self._base:
            return None  # also cancelled from outside: that one wins
        return self.expired

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def upstream_body(
    raw: bytes, body: dict[str, Any], *, client_stream: bool, client_usage: bool, body_changed: bool,
    backend: BackendConfig, rank: int, count_tokens: bool = False,
) -> bytes:
    """The bytes sent upstream: always a stream with usage. The client's raw bytes when they
    already say exactly that, else the body serialised once (the only JSON encode per request).

    `count_tokens` (a preemptible request) asks a backend whose chunks may carry several tokens
    for the running usage on every chunk, so the tokens generated so far are known exactly."""
    prepared = prepare_body(backend, body, rank)
    kind = get_kind(backend.kind)
    running = kind.running_usage_options if count_tokens and not kind.one_token_per_chunk else {}
    if prepared is None and client_stream and client_usage and not body_changed and not running:
        return raw
    b = dict(prepared if prepared is not None else body)
    b["stream"] = True
    so = b.get("stream_options")
    b["stream_options"] = {**(so if isinstance(so, dict) else {}), **running, "include_usage": True}
    return orjson.dumps(b)


class Upstream:
    """The shared upstream client: one pooled `ClientSession` for every backend and request."""

    def __init__(self, timeouts: TimeoutsConfig) -> None:
        self.timeouts = timeouts
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30.0)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=timeouts.connect_s, sock_connect=timeouts.connect_s),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        await self.session.close()

    async def open(self, backend: BackendConfig, endpoint: Endpoint, body: bytes, req_id: str) -> aiohttp.ClientResponse:
        """Send the request; returns a 2xx streaming response. Raises `RelayError` (connect
        failures, 5xx) or `UpstreamStatus` (4xx, passed back to the client)."""
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", "X-Request-Id": req_id}
        headers.update(get_kind(backend.kind).upstream_headers)  # e.g. llama-server: no stale keep-alive reuse
        if backend.api_key:
            headers["Authorization"] = f"Bearer {backend.api_key}"
        try:
            resp = await self.session.post(backend.url + UPSTREAM_PATHS[endpoint], data=body, headers=headers)
        except (aiohttp.ConnectionTimeoutError, aiohttp.ServerTimeoutError) as e:
            raise RelayError("timeout_connect", f"Connecting to backend '{backend.name}' timed out: {e}",
                             status=504, retryable=True) from None
        except aiohttp.ServerDisconnectedError as e:
            # Typically a pooled keep-alive connection the backend had just closed.
            raise RelayError("disconnect", f"Backend '{backend.name}' closed the connection: {e}",
                             retryable=True) from None
        except aiohttp.ClientError as e:
            raise RelayError("connect", f"Backend '{backend.name}' is unreachable: {e}", retryable=True) from None
        if resp.status >= 400:
            try:
                payload = await resp.content.read(_MAX_ERROR_BODY)
            except aiohttp.ClientError:
                payload = b""
            finally:
                resp.close()
            if resp.status >= 500 or resp.status == 429:
                raise RelayError(
                    "status", f"Backend '{backend.name}' answered {resp.status}: {payload[:500].decode('utf-8', 'replace')}",
                    status=502, retryable=True,
                )
            raise UpstreamStatus(resp.status, payload, resp.headers.get("Content-Type", "application/json"))
        return resp


@dataclass(slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def _has_content(data: bytes, start: int, end: int, keys: tuple[bytes, ...]) -> bool:
    for key in keys:
        i = data.find(key, start, end)
        while i >= 0:
            j = i + len(key)
            while j < end and data[j] == 0x20:
                j += 1
            if j + 1 < end:
                c = data[j]
                if c == 0x22 and data[j + 1] != 0x22:  # a non-empty string
                    return True
                if c == 0x5B and data[j + 1] != 0x5D:  # a non-empty array (tool_calls)
                    return True
            i = data.find(key, j, end)
    return False


def _usage_value_at(data: bytes, start: int, end: int) -> bool:
    """True if the event in data[start:end] carries a `usage` object (not null)."""
    i = data.find(_USAGE_KEY, start, end)
    if i < 0:
        return False
    j = i + len(_USAGE_KEY)
    while j < end and data[j] == 0x20:
        j += 1
    return j < end and data[j] == 0x7B


def _event_json(data: bytes, start: int, end: int) -> Any:
    """Parse the `data:` payload of one event (used for the usage chunk only)."""
    block = data[start:end]
    k = block.find(b"data:")
    if k < 0:
        return None
    payload = block[k + 5:].strip()
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None


def _read_usage(obj: Any, usage: Usage) -> bool:
    """Copy the usage counts; True if this chunk is usage-only (`choices: []`)."""
    if not isinstance(obj, dict):
        return False
    u = obj.get("usage")
    if isinstance(u, dict):
        pt, ct = u.get("prompt_tokens"), u.get("completion_tokens")
        if isinstance(pt, int):
            usage.prompt_tokens = pt
        if isinstance(ct, int):
            usage.completion_tokens = ct
    return obj.get("choices") == []


@dataclass(slots=True)
class StreamRelay:
    """Relays one upstream SSE stream to a streaming client."""

    request: web.Request
    endpoint: Endpoint
    times: RequestTimes
    watchdog: Watchdog
    client_usage: bool
    itl: ChunkHistogram
    make_headers: Callable[[], dict[str, str]]
    usage: Usage = field(default_factory=Usage)
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
        if self.progress is not None:
            await self._run_tracked(up, self.progress)
            return
        loop_time = time.perf_counter  # metrics need sub-ms; uvloop's loop.time() is ms
        keys = _CONTENT_KEYS[self.endpoint]
        t = self.times
        wd = self.watchdog
        itl = self.itl
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
                    if _has_content(data, pos, end, keys):
                        content += 1
                    elif _usage_value_at(data, pos, end):
                        if _read_usage(_event_json(data, pos, end), self.usage) and not self.client_usage:
                            drop = (pos, end + 2)
                    elif data.startswith(b'data: {"error"', pos):
                        self.upstream_error = True
                    pos = end + 2
                last = data.endswith(DONE_EVENT)
                if drop is not None:
                    data = data[:drop[0]] + data[drop[1]:]
                if content:
                    t.content_chunks += content
                    if t.first_content_at is None:
                        t.first_content_at = now
                        wd.first_content(now)
                    else:
                        itl.observe(now - t.last_content_at)  # type: ignore[operator]
                    if content > 1:  # events that arrived in the same read: no gap
                        itl.observe_zeros(content - 1)
                    t.last_content_at = now
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
        t, wd, itl = self.times, self.watchdog, self.itl
        dec = SSEDecoder()
        started_run = False  # content seen in this run (the watchdog's first-token phase ends)
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
                    text = _delta_text(obj, chat)
                    if text:
                        prog.add(text, _running_completion_tokens(obj))
                        content += 1
                        out.append(raw)
                        continue
                    u = obj.get("usage")
                    if isinstance(u, dict):
                        usage_only = _read_usage(obj, self.usage)
                        if usage_only and not self.client_usage:
                            continue
                        if prog.runs > 1:  # the one JSON rewrite of a resumed request
                            pt, ct = prog.client_usage(self.usage.prompt_tokens, self.usage.completion_tokens)
                            if pt is not None and ct is not None:
                                obj["usage"] = {**u, "prompt_tokens": pt, "completion_tokens": ct,
                                                "total_tokens": pt + ct}
                                out.append(encode_event(orjson.dumps(obj)))
                                continue
                        out.append(raw)
                        continue
                    if self.response is not None and not started_run and _role_only(obj):
                        continue  # a resumed run's preamble: the client has had it
                    out.append(raw)
                if content:
                    t.content_chunks += content
                    if not started_run:
                        started_run = True
                        wd.first_content(now)
                        if t.first_content_at is None:
                            t.first_content_at = now
                        elif t.last_content_at is not None:
                            itl.observe(now - t.last_content_at)
                    else:
                        itl.observe(now - t.last_content_at)  # type: ignore[operator]
                    if content > 1:
                        itl.observe_zeros(content - 1)
                    t.last_content_at = now
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


def _running_completion_tokens(obj: dict[str, Any]) -> int | None:
    """The run's tokens so far, where the backend puts a running `usage` on every chunk."""
    u = obj.get("usage")
    if isinstance(u, dict):
        ct = u.get("completion_tokens")
        if isinstance(ct, int) and not isinstance(ct, bool):
            return ct
    return None


def _delta_text(obj: dict[str, Any], chat: bool) -> str:
    """The generated text a parsed chunk carries (first choice; preemptible requests have one)."""
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    ch = choices[0]
    if chat:
        delta = ch.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else None
    else:
        text = ch.get("text")
    return text if isinstance(text, str) else ""


def _role_only(obj: dict[str, Any]) -> bool:
    """A chunk with no text and no finish reason (the role-only first chunk of a chat stream)."""
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    for ch in choices:
        if not isinstance(ch, dict) or ch.get("finish_reason") is not None:
            return False
    return True


class _SSEResponse(web.StreamResponse):
    """Sends its headers together with the first chunk (one write instead of two), as aiohttp's
    own `web.Response` does; the relay always writes a chunk right after `prepare`."""

    _send_headers_immediately = False


@dataclass(slots=True)
class _ToolCall:
    """One tool call as its stream deltas build it: the id, type and name come once, the
    arguments in pieces."""

    id: str | None = None
    type: str = "function"
    name: list[str] = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)

    def absorb(self, delta: dict[str, Any]) -> None:
        if isinstance(delta.get("id"), str):
            self.id = delta["id"]
        if isinstance(delta.get("type"), str):
            self.type = delta["type"]
        fn = delta.get("function")
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str):
                self.name.append(fn["name"])
            if isinstance(fn.get("arguments"), str):
                self.arguments.append(fn["arguments"])

    def body(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type,
                "function": {"name": "".join(self.name), "arguments": "".join(self.arguments)}}


@dataclass(slots=True)
class _Choice:
    parts: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    reasoning_key: str = "reasoning_content"  # vLLM 0.10 and llama-server; newer vLLM says "reasoning"
    tool_calls: dict[int, _ToolCall] = field(default_factory=dict)
    # Chat: the `logprobs.content` entries in order. Completions: `tokens`, `token_logprobs`,
    # `top_logprobs`, `text_offset`, each the chunks' lists joined.
    logprobs: dict[str, list[Any]] | None = None
    finish_reason: str | None = None
    role: str = "assistant"

    def absorb_logprobs(self, lp: dict[str, Any]) -> None:
        if self.logprobs is None:
            self.logprobs = {}
        for key, items in lp.items():
            if isinstance(items, list):
                self.logprobs.setdefault(key, []).extend(items)


@dataclass(slots=True)
class Assembler:
    """Turns an upstream SSE stream into one `chat.completion` / `text_completion` body."""

    endpoint: Endpoint
    times: RequestTimes
    watchdog: Watchdog
    itl: ChunkHistogram
    usage: Usage = field(default_factory=Usage)
    id: str = ""
    model: str = ""
    created: int = 0
    choices: dict[int, _Choice] = field(default_factory=dict)
    error: dict[str, Any] | None = None

    progress: Progress | None = None  # set for preemptible requests
    _run_started: bool = False  # content seen in the current run

    async def run(self, up: aiohttp.ClientResponse) -> bytes:
        """Assemble until the upstream ends. A preemptible request's assembler outlives a
        suspension (`Suspended`) and keeps accumulating over the resumed run."""
        loop_time = time.perf_counter  # metrics need sub-ms; uvloop's loop.time() is ms
        dec = SSEDecoder()
        prog = self.progress
        self._run_started = False
        done = False
        try:
            async for data in up.content.iter_any():
                if prog is not None and prog.suspended:
                    raise Suspended()
                now = loop_time()
                self.watchdog.last_at = now
                for ev in dec.feed(data):
                    done = done or ev.data == DONE
                    self._absorb(ev.data, now)
            for ev in dec.flush():
                done = done or ev.data == DONE
                self._absorb(ev.data, loop_time())
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientConnectionError) as e:
            if prog is not None and prog.suspended:
                raise Suspended() from None
            raise RelayError("disconnect", f"Backend closed the stream early: {e}",
                             retryable=self.times.first_content_at is None) from None
        if prog is not None and prog.suspended and not done:
            raise Suspended()
        if self.error is not None:
            raise RelayError("stream_error", str(self.error.get("message", "upstream error")), retryable=False)
        if prog is not None:
            pt, ct = prog.client_usage(self.usage.prompt_tokens, self.usage.completion_tokens)
            self.usage.prompt_tokens, self.usage.completion_tokens = pt, ct
        return self.body()

    def _absorb(self, data: bytes, now: float) -> None:
        if data == DONE:
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise RelayError("protocol", "Backend sent a chunk that is not JSON.",
                             retryable=self.times.first_content_at is None) from None
        if not isinstance(obj, dict):
            return
        if "error" in obj and isinstance(obj["error"], dict):
            self.error = obj["error"]
            return
        _read_usage(obj, self.usage)
        if not self.id:
            self.id = str(obj.get("id", ""))
            self.model = str(obj.get("model", ""))
            c = obj.get("created")
            self.created = c if isinstance(c, int) else 0
        got = False
        for ch in obj.get("choices") or ():
            if not isinstance(ch, dict):
                continue
            idx = ch.get("index", 0)
            slot = self.choices.get(idx)
            if slot is None:
                slot = self.choices[idx] = _Choice()
            if self.endpoint == "chat":
                delta = ch.get("delta") or {}
                text = delta.get("content")
                if isinstance(delta.get("role"), str):
                    slot.role = delta["role"]
                for key in ("reasoning_content", "reasoning"):
                    reasoning = delta.get(key)
                    if isinstance(reasoning, str) and reasoning:
                        slot.reasoning.append(reasoning)
                        slot.reasoning_key = key
                        got = True
                calls = delta.get("tool_calls")
                if isinstance(calls, list):
                    for call in calls:
                        if isinstance(call, dict):
                            i = call.get("index", 0)
                            slot.tool_calls.setdefault(i if isinstance(i, int) else 0, _ToolCall()).absorb(call)
                            got = True
            else:
                text = ch.get("text")
            lp = ch.get("logprobs")
            if isinstance(lp, dict):
                slot.absorb_logprobs(lp)
            if isinstance(text, str) and text:
                slot.parts.append(text)
                got = True
                if self.progress is not None:
                    self.progress.add(text, _running_completion_tokens(obj))
            fr = ch.get("finish_reason")
            if isinstance(fr, str):
                slot.finish_reason = fr
        if got:
            t = self.times
            if not self._run_started:
                self._run_started = True
                self.watchdog.first_content(now)
            if t.first_content_at is None:
                t.first_content_at = now
            else:
                self.itl.observe(now - t.last_content_at)  # type: ignore[operator]
            t.last_content_at = now
            t.content_chunks += 1

    def text(self) -> str:
        return "".join("".join(c.parts) for _, c in sorted(self.choices.items()))

    def body(self) -> bytes:
        choices: list[dict[str, Any]] = []
        for idx, c in sorted(self.choices.items()):
            if self.endpoint == "chat":
                # As OpenAI answers: a message that only calls tools has `content: null`.
                content = "".join(c.parts) if c.parts or not c.tool_calls else None
                msg: dict[str, Any] = {"role": c.role, "content": content}
                if c.reasoning:
                    msg[c.reasoning_key] = "".join(c.reasoning)
                if c.tool_calls:
                    msg["tool_calls"] = [call.body() for _, call in sorted(c.tool_calls.items())]
                choices.append({"index": idx, "message": msg, "logprobs": c.logprobs,
                                "finish_reason": c.finish_reason or "stop"})
            else:
                choices.append({"index": idx, "text": "".join(c.parts), "logprobs": c.logprobs,
                                "finish_reason": c.finish_reason or "stop"})
        pt = self.usage.prompt_tokens if self.usage.prompt_tokens is not None else self.times.prompt_tokens
        ct = self.usage.completion_tokens if self.usage.completion_tokens is not None else self.times.content_chunks
        return orjson.dumps({
            "id": self.id, "object": "chat.completion" if self.endpoint == "chat" else "text_completion",
            "created": self.created, "model": self.model, "choices": choices,
            "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
        })
