"""One request on the wire, recorded: post it, read the streamed or the whole answer into its
`RequestRecord`, and say how it failed (an HTTP status, a connect error, a disconnect, a reply
that makes no sense, a staged timeout, or a cut by the bench's own interrupt). No retries: a
failure is a measurement. Times are seconds since the run's start, `t0` (set when the run's
clock starts).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp
import orjson
from multidict import CIMultiDictProxy

from tailguard.bench.recorder import ERROR_TEXT_LIMIT, RequestRecord, StreamRecorder, parse_server_timing
from tailguard.bench.stream import PlannedRequest
from tailguard.wire.chunks import Usage
from tailguard.wire.framing import ANSWER_USAGE
from tailguard.wire.tokens import text_tokens


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Staged client timeouts, in wall seconds: TCP connect, first content token (from send),
    whole request (from send)."""

    connect_s: float = 10.0
    first_token_s: float = 120.0
    total_s: float = 600.0


class Sender:
    """Sends requests over one session and records each in full: to one server, or spread over
    several round-robin by request index (AIPerf's repeated --url), each request's server then
    recorded as its backend."""

    def __init__(self, session: aiohttp.ClientSession, urls: tuple[str, ...], headers: dict[str, str],
                 timeouts: Timeouts) -> None:
        self.session = session
        self.urls = urls
        self.headers = headers
        self.timeouts = timeouts
        self.t0 = 0.0

    async def send(self, req: PlannedRequest, rec: RequestRecord, answer: list[str] | None = None) -> None:
        """Fill `rec` from its send to its end; a cancel (the run's interrupt) marks it
        `interrupted` and goes on up. With `answer`, the answer's text is added to it (what an
        agent program sends back in its next call)."""
        to = self.timeouts
        rec.sent_at = time.perf_counter() - self.t0
        sent_loop = asyncio.get_running_loop().time()
        # A stream must show a token within first_token_s; a non-stream reply has no first token
        # before its last byte, so only the total deadline applies to it.
        first_s = min(to.first_token_s, to.total_s) if req.stream else to.total_s
        phase = "first_token" if first_s < to.total_s else "total"
        headers = self.headers if not req.headers else {**self.headers, **dict(req.headers)}
        urls = self.urls
        url = urls[0] if len(urls) == 1 else urls[req.index % len(urls)]
        try:
            async with asyncio.timeout_at(sent_loop + first_s) as cm:
                async with self.session.post(url + req.path, data=req.body, headers=headers) as resp:
                    _take_headers(rec, resp.status, resp.headers)
                    if rec.backend is None and len(urls) > 1:
                        rec.backend = url
                    if resp.status != 200:
                        rec.error_kind = "http"
                        rec.error = (await resp.read())[:ERROR_TEXT_LIMIT].decode("utf-8", "replace")
                    elif req.stream:
                        await self._read_stream(resp, rec, cm, sent_loop + to.total_s, req.endpoint, answer)
                    else:
                        await self._read_whole(resp, rec, req.endpoint, answer)
        except aiohttp.ConnectionTimeoutError:
            rec.error_kind, rec.timeout_phase = "timeout", "connect"
        except TimeoutError:
            rec.error_kind = "timeout"
            rec.timeout_phase = "total" if rec.first_token_at is not None else phase
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as e:
            rec.error_kind = "disconnect" if rec.status is not None else "connect"
            rec.error = repr(e)[:ERROR_TEXT_LIMIT]
        except aiohttp.ClientError as e:
            rec.error_kind = "connect" if rec.status is None else "protocol"
            rec.error = repr(e)[:ERROR_TEXT_LIMIT]
        except (ValueError, TypeError, AttributeError, UnicodeError) as e:
            # A reply we cannot make sense of is the server's failure, recorded like any other;
            # one odd response must not end a run of thousands.
            rec.error_kind = "protocol"
            rec.error = repr(e)[:ERROR_TEXT_LIMIT]
        except asyncio.CancelledError:
            rec.error_kind = "interrupted"  # cut by an interrupt: the bench's doing, not the server's
            raise
        finally:
            rec.ended_at = time.perf_counter() - self.t0
            rec.ok = rec.error_kind is None
            rec.finish_tokens()

    async def _read_stream(self, resp: aiohttp.ClientResponse, rec: RequestRecord,
                           cm: asyncio.Timeout, total_deadline: float, endpoint: str,
                           answer: list[str] | None) -> None:
        t0 = self.t0
        perf = time.perf_counter
        reader = StreamRecorder(rec, endpoint, answer)
        async for data in resp.content.iter_any():
            if reader.feed(data, perf() - t0):
                cm.reschedule(total_deadline)  # the first token came: now only the total deadline
        reader.finish(perf() - t0)

    async def _read_whole(self, resp: aiohttp.ClientResponse, rec: RequestRecord, endpoint: str,
                          answer: list[str] | None) -> None:
        raw = await resp.read()
        arrived = time.perf_counter() - self.t0
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            rec.error_kind, rec.error = "protocol", "response body is not JSON"
            return
        rec.first_token_at = arrived  # a non-stream reply's first token is its last byte
        if endpoint not in ("chat", "completions"):  # each route states its usage its own way
            counted = Usage()
            ANSWER_USAGE[endpoint](counted, obj)  # type: ignore[index]
            rec.usage_prompt_tokens, rec.usage_output_tokens = counted.prompt_tokens, counted.completion_tokens or 0
            return
        usage = obj.get("usage") if isinstance(obj, dict) else None
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                rec.usage_output_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                rec.usage_prompt_tokens = usage["prompt_tokens"]
        choice = (obj.get("choices") or [{}])[0] if isinstance(obj, dict) else {}
        text = choice.get("text") or (choice.get("message") or {}).get("content") or ""
        if answer is not None and isinstance(text, str):
            answer.append(text)
        if rec.usage_output_tokens is None and isinstance(obj, dict):
            rec.usage_output_tokens = text_tokens(text) if isinstance(text, str) else 0


def _take_headers(rec: RequestRecord, status: int, h: CIMultiDictProxy[str]) -> None:
    """What a gateway says about the request: queue wait, backend, class, Server-Timing."""
    rec.status = status
    q = h.get("X-Tailguard-Queue-Ms")
    if q is not None:
        try:
            rec.queue_ms = float(q)
        except ValueError:
            pass
    rec.backend = h.get("X-Tailguard-Backend")
    rec.server_class = h.get("X-Tailguard-Class")
    rec.config = h.get("X-Tailguard-Config")
    if (st := h.get("Server-Timing")) is not None:
        rec.server_timing_s = parse_server_timing(st)
