"""One upstream attempt's connection: the pooled client session, the body sent, the request
opened, and the exceptions that say how an attempt ended: `RelayError` (its `kind`, a
`FailureKind`; the front decides whether it goes again), `UpstreamStatus`, `Suspended`. They are `GatewayError`s; the whole tree is drawn in `tailguard/errors.py`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import aiohttp
import httptools
import orjson

from tailguard.clock import Now
from tailguard.errors import APIError, GatewayError
from tailguard.config import BackendConfig, LimitsConfig
from tailguard.gateway.upstream.backends import prepare_body
from tailguard.gateway.upstream.h1 import H1Response, UpstreamBroke
from tailguard.gateway.upstream.kinds import get_kind
from tailguard.gateway.upstream.pool import Pool, origin_of
from tailguard.gateway.upstream.refusals import Refusals
from tailguard.types import FailureKind
from tailguard.wire.openai import CHUNKED, Endpoint, error_body, error_fields, is_json_media_type
from tailguard.wire.sse import EventTooLarge

UPSTREAM_PATHS: dict[Endpoint, str] = {
    "chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses",
    "messages": "/v1/messages", "embeddings": "/v1/embeddings", "rerank": "/v1/rerank", "score": "/score",
    "tokenize": "/tokenize", "detokenize": "/detokenize",
}
# Largest upstream error body read (a 4xx is small; a runaway one is cut).
_MAX_ERROR_BODY = 64 * 1024
# What an error message passed on from a backend may say: one line, this long at most, with
# anything that looks like a credential blanked (a token after Bearer, OpenAI/HF-style keys).
_REASON_CHARS = 200
_SECRET_LIKE = re.compile(r"(?i)(?:bearer|token|key|password|secret)[\s:=\"']+\S+|\b(?:sk|hf|ghp|xox[a-z])[-_][\w-]{6,}")
_NOT_PRINTABLE = re.compile(r"[^\x20-\x7e\u00a0-\uffff]+")

log = logging.getLogger("tailguard.gateway")


class BodyTooLarge(aiohttp.ClientPayloadError):
    """A probe's or the model list's answer passed `limits.max_probe_bytes` (an aiohttp client
    error, so whoever reads one treats it as any failed read)."""


async def read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body of a small answer (a probe, a load page, `/v1/models`), refused past `limit`
    bytes as they arrive, so a backend that answers endlessly costs at most `limit`."""
    if resp.content_length is not None and resp.content_length > limit:
        raise BodyTooLarge(f"answer of {resp.content_length} bytes is over the limit of {limit}")
    out = bytearray()
    async for piece in resp.content.iter_any():
        out += piece
        if len(out) > limit:
            raise BodyTooLarge(f"answer over the limit of {limit} bytes")
    return bytes(out)


class RelayError(GatewayError):
    """An upstream attempt failed as `kind`; whether it goes again is the front's to decide."""

    def __init__(self, kind: FailureKind, message: str, *, status: int = 502) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status

    @property
    def is_timeout(self) -> bool:
        return self.kind.is_timeout

    def api_error(self) -> APIError:
        return APIError(self.message, status=self.status, type="upstream_error", code=self.kind)


class UpstreamStatus(GatewayError):
    """The upstream answered with an error status before streaming (e.g. a 400 for a context
    overflow); the client gets the same status, and the body `sanitized_error` made of it."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(f"upstream status {status}")
        self.status = status
        self.body = body
        self.content_type = content_type


def stream_failure(e: UpstreamBroke | EventTooLarge) -> RelayError:
    """How a stream being read failed: cut off (`DISCONNECT`) or an event past its bound
    (`PROTOCOL`: the backend broke the protocol, as a malformed answer does). An attempt's
    failure, whether or not the client has seen bytes: the front decides what follows (a retry,
    a continuation on another backend, or the end of the client's stream with an error event)."""
    if isinstance(e, EventTooLarge):
        return RelayError(FailureKind.PROTOCOL, f"Backend sent {e} (limits.max_event_bytes)")
    return RelayError(FailureKind.DISCONNECT, f"Backend closed the stream early: {e}")


def check_answer(up: H1Response, backend: str, *, stream: bool) -> None:
    """Raise `RelayError(PROTOCOL)` unless `up`'s head says what was asked for: an SSE stream
    (`text/event-stream`) or a JSON body, either in the identity encoding (the gateway asks for
    no other: a gzip body relayed as it came reaches a client that cannot read it, and one
    assembled from it is empty). The attempt is the backend's failure, tried again elsewhere
    while nothing reached the client."""
    headers = up.headers
    ctype = headers.get("content-type", "")
    if stream and "content-encoding" not in headers and ctype[:17] == "text/event-stream" and ctype[17:18] in ("", ";"):
        return  # what every engine answers a stream (vLLM adds `; charset=utf-8`): one look
    mime = ctype.partition(";")[0].strip().lower()
    encoding = headers.get("content-encoding", "identity").strip().lower()
    wanted = "text/event-stream" if stream else "application/json"
    if (mime == wanted if stream else is_json_media_type(mime)) and encoding in ("identity", ""):
        return
    said = f"Content-Type {ctype[:64]!r}" + (f", Content-Encoding {encoding[:32]!r}" if encoding != "identity" else "")
    raise RelayError(FailureKind.PROTOCOL, f"Backend '{backend}' answered a {'stream' if stream else 'non-stream'} "
                     f"request with {said}; {wanted} in the identity encoding was asked for")


class Suspended(GatewayError):
    """The dispatcher preempted this request: its upstream was closed, and the client's response
    stays open until the request is resumed."""


def upstream_body(
    raw: bytes, body: dict[str, Any], *, client_stream: bool, client_usage: bool, body_changed: bool,
    backend: BackendConfig, rank: int, count_tokens: bool = False, dropped: frozenset[str] = frozenset(),
    endpoint: Endpoint = "chat", own_priority: bool = False,
) -> bytes:
    """The bytes sent upstream: always a stream with usage. The client's raw bytes when they
    already say exactly that, else the body serialised once (the only JSON encode per request).

    `count_tokens` (a request that may be continued) asks a backend whose chunks may carry several
    tokens for the running usage on every chunk, so the tokens generated so far are known exactly,
    and one that returns token ids for them (`Kind.continues_by_ids`), to continue by ids.
    Fields the backend refused (`dropped`) are left out; a client's `priority` stays only when
    `own_priority` (`backends.translate_body`). Routes other than chat and completions go as the
    client sent them (streamed or not), with only the class and model fields set."""
    prepared = prepare_body(backend, body, rank, dropped, own_priority)
    if endpoint not in CHUNKED:
        return raw if prepared is None and not body_changed else orjson.dumps(prepared if prepared is not None else body)
    kind = get_kind(backend.kind)
    running = kind.running_usage_options if count_tokens and not kind.one_token_per_chunk else {}
    running = {k: v for k, v in running.items() if k not in dropped}
    ids = (count_tokens and kind.continues_by_ids and body.get("return_token_ids") is not True
           and "return_token_ids" not in dropped)
    if prepared is None and client_stream and client_usage and not body_changed and not running and not ids:
        return raw
    b = dict(prepared if prepared is not None else body)
    b["stream"] = True
    if ids:
        b["return_token_ids"] = True
    so = b.get("stream_options")
    b["stream_options"] = {**(so if isinstance(so, dict) else {}), **running, "include_usage": True}
    return orjson.dumps(b)


class Upstream:
    """The shared upstream client. Requests go over `gateway.upstream.h1` connections from one keep-alive
    `Pool` (a retry asks for a fresh connection: after a reset, another pooled one the server
    closed just the same would fail again). `session`, an aiohttp client, serves the gateway's
    own small requests (probes, the model list)."""

    def __init__(self, clock: Now) -> None:
        self.pool = Pool(asyncio.get_running_loop(), clock, keepalive_s=30.0)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30.0),
            timeout=aiohttp.ClientTimeout(total=None),  # each of its requests sets its own bound
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            # A gateway keeps no cookies: one backend's Set-Cookie must never ride on another request.
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._said: set[tuple[str, str]] = set()  # (backend, failure kind) logged already
        self.refusals = Refusals()  # fields the gateway adds that a backend refused

    async def close(self) -> None:
        self.pool.close()
        await self.session.close()

    async def open(
        self, backend: BackendConfig, endpoint: Endpoint, body: bytes, req_id: str, connect_s: float,
        limits: LimitsConfig, *, fresh: bool = False, traceparent: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> H1Response:
        """Send the request (`fresh`: on a new connection, opened within `connect_s`; `traceparent`:
        the W3C trace context of this attempt); returns a 2xx streaming response whose head is
        within `limits.max_response_head_bytes`.
        Raises `RelayError` (connect failures, resets, redirects, 5xx) or `UpstreamStatus` (4xx,
        passed back to the client)."""
        origin = origin_of(backend.url)
        kind_headers = get_kind(backend.kind).upstream_headers  # e.g. llama-server: no stale keep-alive reuse
        sent = {"Content-Type": "application/json", "Accept": "text/event-stream", "X-Request-Id": req_id,
                **dict(headers), **kind_headers}
        if backend.api_key:
            sent["Authorization"] = f"Bearer {backend.api_key}"
        if traceparent is not None:  # the engine's own spans join the request's trace
            sent["traceparent"] = traceparent
        try:
            conn = await self.pool.connection(origin, connect_s, fresh=fresh)
        except TimeoutError:
            raise RelayError(FailureKind.TIMEOUT_CONNECT, f"Connecting to backend '{backend.name}' timed out "
                             f"after {connect_s:g} s", status=504) from None
        except OSError as e:
            # Refused or unreachable: that backend is down (the front tries another).
            raise RelayError(FailureKind.CONNECT, f"Backend '{backend.name}' is unreachable: {e}") from None
        keep = kind_headers.get("Connection", "").lower() != "close"
        try:
            resp = await conn.request(origin.head("POST", UPSTREAM_PATHS[endpoint], sent, len(body)), body, keep=keep,
                                      max_head=limits.max_response_head_bytes)
        except UpstreamBroke as e:
            # Reset or closed before an answer: typically a pooled keep-alive connection the
            # backend had just closed (the front tries it again on a fresh connection).
            raise RelayError(FailureKind.RESET, f"Backend '{backend.name}' closed the connection: {e}") from None
        except httptools.HttpParserError as e:
            raise RelayError(FailureKind.PROTOCOL, f"Backend '{backend.name}' sent a malformed response: {e}") from None
        except BaseException:
            conn.abort()  # cancelled (a deadline, the client gone) while waiting for the answer
            raise
        if resp.status >= 300:
            await self._refused(backend, resp, limits.pass_backend_errors)
        return resp

    def said_once(self, backend: str, err: RelayError) -> None:
        """Log a failure of a backend, once per backend and kind: a hostile backend repeats
        itself, and the log must not grow with it (the metric counts every time)."""
        if (backend, err.kind) not in self._said:
            self._said.add((backend, err.kind))
            log.warning("backend %s: %s (said once; tailguard_upstream_errors_total counts each)", backend, err.message)

    async def _refused(self, backend: BackendConfig, resp: H1Response, passthrough: bool) -> None:
        """An error status: a redirect, 5xx or 429 is that backend's failure (retried elsewhere),
        a 4xx is the client's, passed back with its message sanitized (as it came, with
        `passthrough`); so is a 501, the backend's word that it does not serve this route (as
        llama-server answers `/v1/rerank` when not started with `--reranking`, saying so). A 5xx body is the backend's business (a traceback, its credentials):
        only its status goes on, unless `passthrough`."""
        try:
            payload = await resp.read(_MAX_ERROR_BODY)
        except UpstreamBroke:
            payload = b""
        finally:
            resp.release()
        if resp.status < 400:  # a redirect: the backend's URL is not where the API is
            raise RelayError(FailureKind.STATUS, f"Backend '{backend.name}' answered {resp.status} (redirect to "
                             f"{resp.headers.get('location', '?')}); set its url to where the API is",
                             status=502)
        if (resp.status >= 500 and resp.status != 501) or resp.status == 429:
            said = f": {payload[:500].decode('utf-8', 'replace')}" if passthrough else ""
            raise RelayError(FailureKind.STATUS, f"Backend '{backend.name}' answered {resp.status}{said}", status=502)
        if passthrough:
            raise UpstreamStatus(resp.status, payload, resp.headers.get("content-type", "application/json"))
        raise UpstreamStatus(resp.status, sanitized_error(resp.status, payload, backend), "application/json")


def sanitized_error(status: int, payload: bytes, backend: BackendConfig) -> bytes:
    """A backend's 4xx as OpenAI's error body: its type, code and param when it sent them in
    OpenAI's shape (a client acts on `context_length_exceeded`), and its message cut to one line
    of 200 characters with anything credential-like blanked; never the body itself."""
    fields, err = error_fields(payload)
    said = [m for m in (fields.get("message"), err, fields.get("detail")) if isinstance(m, str)]  # OpenAI, TGI, FastAPI
    text = _sanitized(said[0] if said else "", backend) or f"Backend '{backend.name}' refused the request ({status})."
    return error_body(APIError(text, status=status, type=_short(fields.get("type")) or "invalid_request_error",
                               code=_short(fields.get("code")), param=_short(fields.get("param"))))


def _sanitized(text: str, backend: BackendConfig) -> str:
    if backend.api_key:
        text = text.replace(backend.api_key, "[redacted]")
    text = _SECRET_LIKE.sub("[redacted]", _NOT_PRINTABLE.sub(" ", text)).strip()
    return text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS - 3] + "..."


def _short(value: object) -> str | None:
    """An error's type, code or param as passed on: a short word, or nothing."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return value if isinstance(value, str) and re.fullmatch(r"[\w.\[\]-]{1,64}", value) else None
