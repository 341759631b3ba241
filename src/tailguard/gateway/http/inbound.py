"""One generation request as the proxy reads it, whichever server received it: its headers, its
body (bounded in size and time), the sink its answer streams into, and the answer it gets when
nothing was streamed (`Reply`). Two servers implement `Inbound`: aiohttp's (`AiohttpInbound`,
here) and the lean one of the hot routes (`gateway.http.lean`), so the proxy's request flow is
written once for both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from aiohttp.hdrs import CONTENT_ENCODING, CONTENT_TYPE

from tailguard.errors import APIError, BadRequest, PayloadTooLarge
from tailguard.gateway.sink import ResponseSink, Sink
from tailguard.wire.openai import error_body, error_headers, is_json_media_type


REQUEST_ID = web.RequestKey("request_id", str)  # x-request-id of the response, once known


class Inbound(Protocol):
    """What the proxy needs of the request it serves."""

    @property
    def headers(self) -> Mapping[str, str]: ...  # case-insensitive, as aiohttp's are

    @property
    def remote(self) -> str | None: ...

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    def named(self, request_id: str) -> None:
        """The request's id is known: every answer to it carries it (`x-request-id`)."""
        ...

    async def read_body(self, max_bytes: int, timeout_s: float) -> bytes:
        """The whole body, or an `APIError` (413, 415, 408, 400) from `body_errors`."""
        ...

    def body_unread(self) -> bool:
        """Part of the body is still to come: the connection cannot be reused after the answer."""
        ...

    def sink(self) -> Sink: ...


@dataclass(slots=True)
class Reply:
    """An answer that was not streamed through the sink: an error, or a backend's own answer."""

    status: int
    body: bytes
    headers: dict[str, str]
    close: bool = False  # the connection is closed after it

    @classmethod
    def of_error(cls, err: APIError, extra: Mapping[str, str] | None = None, *, close: bool = False,
                 body: Callable[[APIError], bytes] = error_body) -> Reply:
        """`err` answered in `body`'s shape (OpenAI's; Anthropic's on its Messages route)."""
        headers = {"Content-Type": "application/json", **error_headers(err)}
        if extra:
            headers.update(extra)
        return cls(err.status, body(err), headers, close)


# What a request's head may be, on either server: aiohttp's own limits a line and a count (nginx's
# `large_client_header_buffers` is 8 KiB a line), and 64 KiB in all, counted as the bytes arrive
# (aiohttp alone would take 128 lines of 8 KiB: a MiB).
MAX_HEAD_LINE = 8190
MAX_HEADERS = 128
MAX_HEAD_BYTES = 64 * 1024


def head_too_large() -> APIError:
    """431, as nginx and Envoy answer a head past their bounds; nothing of the head is echoed."""
    return APIError(f"The request's head is too large: at most {MAX_HEAD_LINE} bytes a line, {MAX_HEADERS} headers "
                    f"and {MAX_HEAD_BYTES} bytes in all.", status=431, type="invalid_request_error",
                    code="request_header_fields_too_large")


def too_large(max_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"Request body is larger than the limit of {max_bytes} bytes.", code="body_too_large")


def check_media_type(mime: str | None) -> None:
    """Refuse a body that does not say JSON (`mime`: lower case, no parameters; None: no header)."""
    if mime is not None and not is_json_media_type(mime):
        raise BadRequest(f"Content-Type must be application/json, got {mime!r}.", status=415,
                         param="Content-Type", code="unsupported_media_type")


def body_late(timeout_s: float) -> BadRequest:
    return BadRequest(f"The request body did not arrive within {timeout_s:g} s.", status=408, code="body_timeout")


def body_broken() -> BadRequest:
    return BadRequest("The request body could not be decoded: its Content-Encoding or chunked framing is broken.",
                      code="invalid_body")


class AiohttpInbound:
    """A request aiohttp's server received (every route the lean server hands to it)."""

    __slots__ = ("request", "_sink")

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self._sink: ResponseSink | None = None

    @property
    def headers(self) -> Mapping[str, str]:
        return self.request.headers

    @property
    def remote(self) -> str | None:
        return self.request.remote

    @property
    def method(self) -> str:
        return self.request.method

    @property
    def path(self) -> str:
        return self.request.path

    def named(self, request_id: str) -> None:
        self.request[REQUEST_ID] = request_id

    async def read_body(self, max_bytes: int, timeout_s: float) -> bytes:
        """A body too large is refused at its Content-Length, before it is read; a slow one
        cannot hold a handler open for ever."""
        request = self.request
        length = request.content_length
        if length is not None and length > max_bytes:
            raise too_large(max_bytes)
        check_media_type(request.content_type if CONTENT_TYPE in request.headers else None)
        try:
            if length is not None and request.content.total_bytes == length and CONTENT_ENCODING not in request.headers:
                return await request.read()  # all here already (the usual case): no timer to arm
            async with asyncio.timeout(timeout_s):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise too_large(max_bytes) from None
        except TimeoutError:
            raise body_late(timeout_s) from None
        except web.RequestPayloadError:
            raise body_broken() from None

    def body_unread(self) -> bool:
        return not self.request.content.is_eof()

    def sink(self) -> ResponseSink:
        self._sink = ResponseSink(self.request)
        return self._sink

    def response(self, reply: Reply | None) -> web.StreamResponse:
        """aiohttp's response for how the proxy answered."""
        if reply is None:
            streamed = None if self._sink is None else self._sink.response
            return streamed if streamed is not None else web.Response(status=499)
        resp = web.Response(status=reply.status, body=reply.body, headers=reply.headers)
        if reply.close:
            # Refused before its body was read (or the body is broken): aiohttp drains what
            # follows for a while, then closes; the client must not reuse the connection.
            resp.force_close()
        return resp
