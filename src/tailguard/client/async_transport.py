"""The async driver: the same tries, deadlines and retries as `sync_transport`, for `openai.AsyncOpenAI`.

    transport = AsyncRetryTransport(ClientState(Timeouts(), RetryPolicy(), RetryBudget(), (base_url,)))
    client = openai.AsyncOpenAI(base_url=base_url, max_retries=0,
                                http_client=httpx.AsyncClient(transport=transport))

Each read of the body waits at most until the try's next deadline (anyio's `fail_after`, so it
works under asyncio and trio), which keep-alive bytes do not move.
"""

from __future__ import annotations

import math
import time
from typing import AsyncIterator

import anyio

from tailguard.client.exceptions import DeadlineExceeded
from tailguard.client.flow import (
    LIMITS, Call, ClientState, Reading, TryFailed, connect_failure, deadline_failure, release_read_timeout,
    status_failure,
)
from tailguard.client.httplib import httpx
from tailguard.client.retry import NoRetry


class AsyncRetryTransport(httpx.AsyncBaseTransport):
    def __init__(self, state: ClientState, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self._state = state
        self._inner = inner or httpx.AsyncHTTPTransport(limits=LIMITS)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        call = self._state.start_call(request)
        while True:
            try:
                return await self._try(call)
            except TryFailed as failed:
                decision = call.after(failed)
                if isinstance(decision, NoRetry):
                    raise call.give_up(failed, decision.reason) from None
                await anyio.sleep(decision.delay_s)

    async def _try(self, call: Call) -> httpx.Response:
        request, progress = call.request()
        try:
            response = await self._inner.handle_async_request(request)
        except httpx.ReadTimeout:
            raise deadline_failure(request, progress.deadlines, time.monotonic()) from None
        except httpx.TransportError as err:
            raise connect_failure(request, err, self._state.timeouts.connect, progress.deadlines.sent_at) from err
        if response.status_code != 200:
            body = await _read_all(response)
            failed = status_failure(request, response.status_code, response.headers, body)
            if failed is not None:
                raise failed
            return response
        release_read_timeout(request)
        stream = _AsyncDeadlineStream(response, progress)
        await stream.prefetch()
        if progress.assembler is not None:
            return progress.assembled(response)
        return httpx.Response(200, headers=response.headers, stream=stream, extensions=response.extensions)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _AsyncDeadlineStream(httpx.AsyncByteStream):
    """A response body read under its try's deadlines."""

    def __init__(self, response: httpx.Response, progress: Reading) -> None:
        self._response = response
        self._raw = response.aiter_raw()
        self._progress = progress
        self._buffer: list[bytes] = []
        self._done = False

    async def prefetch(self) -> None:
        """Read until the caller may have it (`Reading.prefetched`): until then a failure is retryable."""
        try:
            while not self._progress.prefetched():
                chunk = await self._next()
                if chunk is None:
                    break
                self._buffer.append(chunk)
        except (DeadlineExceeded, httpx.TransportError) as err:
            await self.aclose()
            raise TryFailed(None, None, err) from None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        buffered, self._buffer = self._buffer, []
        for piece in buffered:
            yield piece
        try:
            while (chunk := await self._next()) is not None:
                yield chunk
        except httpx.TransportError as err:
            raise self._progress.broken(err) from err

    async def _next(self) -> bytes | None:
        if self._done:
            return None
        wait = self._progress.deadlines.remaining_s(time.monotonic())
        try:
            with anyio.fail_after(None if math.isinf(wait) else wait):
                chunk = await self._raw.__anext__()
        except StopAsyncIteration:
            self._done = True
            self._progress.ended(time.monotonic())
            return None
        except TimeoutError:
            raise self._progress.timed_out(time.monotonic()) from None
        self._progress.took(chunk, time.monotonic())
        return chunk

    async def aclose(self) -> None:
        await self._response.aclose()


async def _read_all(response: httpx.Response) -> bytes:
    """An error response's body (within the try's read timeout); lost if the server breaks off."""
    try:
        return await response.aread()
    except httpx.TransportError:
        return b""
    finally:
        await response.aclose()
