"""One call's way through its tries, shared by the sync and the async transport: the state a
client keeps across calls, the request of each try, and how a failed try is told apart from a
result. The transports only add the I/O (sending, sleeping, reading with deadlines).

A try fails, and may be retried, only while nothing has reached the caller: a connection that
could not be opened or was reset, a retryable status, a deadline that ran out before the first
content chunk. Once a transport has returned a response, its call is never retried.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field

from tailguard.client.assembly import Assembler, streaming_body
from tailguard.client.chunks import StreamScan, request_fields
from tailguard.client.exceptions import (
    DEADLINE_ERRORS, ConnectionFailed, DeadlineExceeded, RateLimited, Rejected, StreamBroken, Unavailable,
)
from tailguard.client.httplib import httpx
from tailguard.client.retry import RETRY_STATUSES, NoRetry, NoRetryReason, RetryAfter, RetryPolicy, parse_retry_after
from tailguard.client.timeouts import Deadlines, Expired, Speed, Timeouts
from tailguard.retry_budget import RetryBudget

# The connection pool openai's own client uses: a pool smaller than the callers would make
# calls wait for a connection, which is no deadline of ours.
LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)


@dataclass
class ClientState:
    """What one client's calls share: policies, the retry budget and the speed it has learned.
    The lock lets threads of a sync client share it; no I/O ever happens while it is held."""

    timeouts: Timeouts
    policy: RetryPolicy
    budget: RetryBudget | None
    base_urls: tuple[str, ...]
    rng: random.Random = field(default_factory=random.Random)
    speed: Speed = field(default_factory=Speed)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start_call(self, request: httpx.Request) -> Call:
        """A call of `request`, whose body has been read."""
        with self.lock:
            if self.budget is not None:
                self.budget.record_call(time.monotonic())
        return Call(self, request)

    def learned(self, scan: StreamScan, deadlines: Deadlines, now: float) -> None:
        """A stream ended well: remember how fast it decoded."""
        if deadlines.first_content_at is not None:
            with self.lock:
                self.speed.observe(scan.tokens(), now - deadlines.first_content_at)


class TryFailed(Exception):
    """A try that may be retried; `final` is what the caller gets if it is not."""

    def __init__(self, status: int | None, retry_after_s: float | None, final: Exception) -> None:
        super().__init__(str(final))
        self.status = status
        self.retry_after_s = retry_after_s
        self.final = final


class Call:
    """One call: which base URL each try goes to and whether a failed try is retried."""

    def __init__(self, state: ClientState, original: httpx.Request) -> None:
        self._state = state
        self._original = original
        self.fields = request_fields(original.method, original.url.path, original.content)
        self._body = streaming_body(original.content) if self.fields.assembles else original.content
        self.attempts = 0
        self._url = 0
        self._sent: httpx.Request = original  # the last try's request
        self.tries: list[str] = []  # per failed try: its URL and what went wrong

    def request(self) -> tuple[httpx.Request, Reading]:
        """The next try's request, and the progress of its response under this try's deadlines."""
        self.attempts += 1
        t, fields = self._state.timeouts, self.fields
        with self._state.lock:
            total = t.total_s(fields.max_tokens, self._state.speed.tokens_per_s())
        sent_at = time.monotonic()
        streams = fields.endpoint is not None  # only a stream shows a first token and stalls
        if not streams and total is None:
            total = t.first_token  # a models or embeddings call answers as soon as a first token would
        deadlines = Deadlines(t.first_token if streams else None, t.idle if streams else None, total, sent_at)
        remaining = deadlines.remaining_s(sent_at)
        read = None if remaining == float("inf") else remaining
        timeout = {"connect": t.connect, "read": read, "write": t.connect, "pool": t.connect}
        request = _rebase(self._original, self._body, self._state.base_urls, self._url, timeout)
        self._sent = request
        assembler = Assembler(chat=fields.endpoint == "chat") if fields.assembles else None
        return request, Reading(request, deadlines, self._state, assembler)

    def after(self, failed: TryFailed) -> RetryAfter | NoRetry:
        self.tries.append(f"try {self.attempts} to {self._sent.url}: {_what_went_wrong(failed.final)}")
        state = self._state
        with state.lock:
            decision = state.policy.decide(self.attempts, failed.status, failed.retry_after_s, state.rng)
            if isinstance(decision, RetryAfter) and state.budget is not None \
                    and not state.budget.try_withdraw(time.monotonic()):
                decision = NoRetry("budget")
        if isinstance(decision, RetryAfter) and failed.status != 429:
            # A 429 is this caller's limit, the same on every replica; anything else may be one
            # instance's trouble, so the next try goes to the next base URL.
            self._url = (self._url + 1) % len(state.base_urls)
        return decision

    def give_up(self, failed: TryFailed, reason: NoRetryReason) -> Exception:
        """The error the caller gets: the last try's, telling every try."""
        final = failed.final
        if isinstance(final, (Rejected, DeadlineExceeded)):
            final.stopped(self.attempts, reason, self.tries)
            return final
        return ConnectionFailed(self._sent, self.attempts, reason, self.tries)


def _what_went_wrong(err: Exception) -> str:
    if isinstance(err, (Rejected, DeadlineExceeded)):
        return err.detail()
    if isinstance(err, httpx.ConnectError):
        return f"cannot connect ({str(err) or type(err).__name__})"
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__

def _rebase(request: httpx.Request, body: bytes, urls: tuple[str, ...], index: int,
            timeout: dict[str, float | None]) -> httpx.Request:
    url = str(request.url)
    if index and url.startswith(urls[0].rstrip("/")):
        url = urls[index].rstrip("/") + url[len(urls[0].rstrip("/")):]
    extensions = {**request.extensions, "timeout": timeout}
    headers = request.headers.copy()
    headers.pop("host", None)  # the next base URL may name another host
    headers.pop("content-length", None)
    return httpx.Request(request.method, url, headers=headers, content=body, extensions=extensions)


def status_failure(request: httpx.Request, status: int, headers: httpx.Headers, body: bytes) -> TryFailed | None:
    """A response with a retryable status as a failed try, or None for any other response."""
    if status not in RETRY_STATUSES:
        return None
    retry_after = parse_retry_after(headers, time.time())
    response = httpx.Response(status, headers=headers, content=body, request=request)
    try:
        parsed: object = json.loads(body) if body else None
    except ValueError:
        parsed = body.decode("utf-8", "replace")
    cls = RateLimited if status == 429 else Unavailable if status >= 500 else Rejected
    final = cls(response, parsed, retry_after_s=retry_after)
    return TryFailed(status, retry_after, final)


def deadline_failure(request: httpx.Request, deadlines: Deadlines, now: float,
                     expired: Expired | None = None) -> TryFailed:
    """A deadline ran out before content reached the caller (a timeout from the socket layer
    can fire a hair before our own arithmetic says so: then it is the next deadline's)."""
    err = deadline_error(request, deadlines, now, expired)
    return TryFailed(None, None, err)


def deadline_error(request: httpx.Request, deadlines: Deadlines, now: float,
                   expired: Expired | None = None) -> DeadlineExceeded:
    found = expired or deadlines.expired(now) or deadlines.expired(max(now, deadlines.next_at() or now))
    assert found is not None, "a deadline error needs an armed deadline"
    return DEADLINE_ERRORS[found.phase](request, found, deadlines.content_chunks)


def connect_failure(request: httpx.Request, err: httpx.TransportError, connect_s: float | None,
                    started_at: float) -> TryFailed:
    """A connection that timed out, was refused or was reset before a response."""
    if isinstance(err, httpx.ConnectTimeout) and connect_s is not None:
        final: Exception = DEADLINE_ERRORS["connect"](
            request, Expired("connect", connect_s, time.monotonic() - started_at), 0)
        return TryFailed(None, None, final)
    return TryFailed(None, None, err)



class Reading:
    """A response body read under a try's deadlines: each piece is scanned for content, which
    moves the deadlines, and a deadline that has run out raises. Both transports' streams use it."""

    def __init__(self, request: httpx.Request, deadlines: Deadlines, state: ClientState,
                 assembler: Assembler | None) -> None:
        self.request = request
        self.deadlines = deadlines
        self.scan = StreamScan()
        self.assembler = assembler
        self._state = state
        self._ended = False

    def took(self, chunk: bytes, now: float) -> None:
        if self.assembler is not None:
            self.assembler.feed(chunk)
        found = self.scan.feed(chunk)
        if found:
            self.deadlines.on_content(now, found)
        if self.scan.done:
            # The answer is whole: learn from it now, since an SDK may stop reading at `[DONE]`
            # (openai before 3.x does) and never reach the end of the body; no deadline is left.
            self.ended(now)
            return
        expired = self.deadlines.expired(now)
        if expired is not None:
            raise deadline_error(self.request, self.deadlines, now, expired)

    def ended(self, now: float) -> None:
        """The answer ended well (its `[DONE]`, or the end of the body): learn its speed, once."""
        if not self._ended:
            self._ended = True
            self._state.learned(self.scan, self.deadlines, now)

    def timed_out(self, now: float) -> DeadlineExceeded:
        return deadline_error(self.request, self.deadlines, now)

    def broken(self, err: Exception) -> StreamBroken:
        """The connection failed after the caller got content."""
        return StreamBroken(self.request, self.scan.content_chunks, err)

    def prefetched(self) -> bool:
        """Whether what was read so far may be handed to the caller: the first content chunk of a
        stream, the whole of an assembled call."""
        return self.assembler is None and self.scan.content_chunks > 0

    def assembled(self, response: httpx.Response) -> httpx.Response:
        """The joined response of a non-stream call, as the server would have sent it."""
        assert self.assembler is not None
        headers = httpx.Headers(response.headers)
        for name in ("content-length", "transfer-encoding", "content-encoding"):
            headers.pop(name, None)
        headers["content-type"] = "application/json"
        return httpx.Response(200, headers=headers, content=self.assembler.finish(), extensions=response.extensions)


def release_read_timeout(request: httpx.Request) -> None:
    """From the body on, the try's own deadlines bound each read, not httpx's read timeout,
    which would restart with every keep-alive byte. httpcore reads the timeout dict again when
    the body starts, so clearing it here (after the headers) takes effect for the body alone."""
    timeout = request.extensions.get("timeout")
    if isinstance(timeout, dict):
        timeout["read"] = None
