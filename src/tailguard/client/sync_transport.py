"""The sync driver: an httpx transport that gives `openai.OpenAI` staged deadlines and retries.

    transport = RetryTransport(ClientState(Timeouts(), RetryPolicy(), RetryBudget(), (base_url,)))
    client = openai.OpenAI(base_url=base_url, max_retries=0, http_client=httpx.Client(transport=transport))

A streamed response is returned to the SDK only once its first content chunk has arrived, so a
try that stalls before it (a queue, a hang, keep-alives) can still be retried; from then on the
stream is read under the idle and total deadlines and is never retried.
"""

from __future__ import annotations

import socket
import time
from typing import Iterator

from tailguard.client.flow import (
    LIMITS, Call, ClientState, Reading, TryFailed, connect_failure, deadline_failure, release_read_timeout,
    status_failure,
)
from tailguard.client.httplib import httpx
from tailguard.client.retry import NoRetry
from tailguard.client.exceptions import DeadlineExceeded
from tailguard.client.watchdog import Watchdog


class RetryTransport(httpx.BaseTransport):
    def __init__(self, state: ClientState, inner: httpx.BaseTransport | None = None) -> None:
        self._state = state
        self._inner = inner or httpx.HTTPTransport(limits=LIMITS)
        self._watchdog = Watchdog()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        call = self._state.start_call(request)
        while True:
            try:
                return self._try(call)
            except TryFailed as failed:
                decision = call.after(failed)
                if isinstance(decision, NoRetry):
                    raise call.give_up(failed, decision.reason) from None
                time.sleep(decision.delay_s)

    def _try(self, call: Call) -> httpx.Response:
        request, progress = call.request()
        try:
            response = self._inner.handle_request(request)
        except httpx.ReadTimeout:
            raise deadline_failure(request, progress.deadlines, time.monotonic()) from None
        except httpx.TransportError as err:
            raise connect_failure(request, err, self._state.timeouts.connect, progress.deadlines.sent_at) from err
        if response.status_code != 200:
            body = _read_all(response)
            failed = status_failure(request, response.status_code, response.headers, body)
            if failed is not None:
                raise failed
            return response
        release_read_timeout(request)
        stream = _DeadlineStream(response, progress, self._watchdog)
        stream.prefetch()
        if progress.assembler is not None:
            return progress.assembled(response)
        return httpx.Response(200, headers=response.headers, stream=stream, extensions=response.extensions)

    def close(self) -> None:
        self._watchdog.close()
        self._inner.close()


class _DeadlineStream(httpx.SyncByteStream):
    """A response body read under its try's deadlines; the watchdog wakes a read that stalls."""

    def __init__(self, response: httpx.Response, progress: Reading, watchdog: Watchdog) -> None:
        self._response = response
        self._raw = response.iter_raw()
        self._progress = progress
        self._watchdog = watchdog
        self._sock = _socket(response)
        self._key = watchdog.arm(None, progress.deadlines.next_at(), self._sock)
        self._buffer: list[bytes] = []
        self._done = False

    def prefetch(self) -> None:
        """Read until the caller may have it (`Reading.prefetched`): until then a failure is retryable."""
        try:
            while not self._progress.prefetched():
                chunk = self._next()
                if chunk is None:
                    break
                self._buffer.append(chunk)
        except (DeadlineExceeded, httpx.TransportError) as err:
            self.close()
            raise TryFailed(None, None, err) from None

    def __iter__(self) -> Iterator[bytes]:
        buffered, self._buffer = self._buffer, []
        yield from buffered
        try:
            while (chunk := self._next()) is not None:
                yield chunk
        except httpx.TransportError as err:
            raise self._progress.broken(err) from err

    def _next(self) -> bytes | None:
        if self._done:
            return None
        try:
            chunk = next(self._raw)
        except StopIteration:
            chunk = None
        except httpx.TransportError:
            if self._watchdog.fired(self._key):
                raise self._progress.timed_out(time.monotonic()) from None
            raise
        now = time.monotonic()
        if chunk is None:
            if self._watchdog.fired(self._key):
                raise self._progress.timed_out(now)
            self._done = True
            self._progress.ended(now)
            return None
        self._progress.took(chunk, now)
        self._watchdog.arm(self._key, self._progress.deadlines.next_at(), self._sock)
        return chunk

    def close(self) -> None:
        self._watchdog.disarm(self._key)
        self._response.close()


def _read_all(response: httpx.Response) -> bytes:
    """An error response's body (within the try's read timeout); lost if the server breaks off."""
    try:
        return response.read()
    except httpx.TransportError:
        return b""
    finally:
        response.close()


def _socket(response: httpx.Response) -> socket.socket | None:
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    return sock if isinstance(sock, socket.socket) else None
