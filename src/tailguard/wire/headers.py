"""What the gateway reads from a request's HTTP headers, read once (`told`) into one value: the
caller's key, the class it names, the TTFT target it asks for, the agent program it says it
belongs to (`front.identity`), its own request id (sanitized), its user agent, the headers its
route passes on to the backend, and its trace context; pure. Both servers (aiohttp's and the lean
one) read a request here, and the DES's gate reads the headers a bench would send the same way, so
the request's life past its headers (`gateway.lifecycle`, the intake in the front) sees values,
never headers."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from tailguard.wire.openai import Endpoint

CLASS_HEADER = "X-Tailguard-Class"
PROGRAM_HEADER = "X-Tailguard-Program"
# A program (a session's calls) named by its client, ours first (`front.identity`).
SESSION_HEADERS = (PROGRAM_HEADER, "X-Session-Id")
# What coding agents send of their session on every call: Claude Code (since 2.1.86), Codex (its
# current hyphen form, then the older underscore one), OpenCode; the order Dynamo's router
# (ai-dynamo/dynamo#10875) and CLIProxyAPI (router-for-me/CLIProxyAPI#4452) read them in.
AGENT_SESSION_HEADERS = ("X-Claude-Code-Session-Id", "Session-Id", "Session_Id", "X-Opencode-Session")
TTFT_SLO_HEADER = "x-tailguard-ttft-slo-ms"  # a tighter TTFT target for this request (docs/slo.md)
# Client headers a route passes on to the backend (Anthropic's API version and beta flags).
PASSED_HEADERS: dict[Endpoint, tuple[str, ...]] = {"messages": ("anthropic-version", "anthropic-beta")}
TRACE_HEADERS = ("traceparent", "tracestate")  # W3C trace context, continued by the request's trace
_MAX_REQUEST_ID = 128
_MAX_UA = 256
# What a client's X-Request-Id may carry into logs and upstream headers: the characters of UUIDs,
# OpenAI's `req_...` ids and the usual tracing ids; anything else is dropped.
_NOT_ID = re.compile(r"[^A-Za-z0-9._:+=/@-]")


@dataclass(frozen=True, slots=True)
class Told:
    """What a request's headers told the gateway (see the module docstring)."""

    api_key: str | None = None
    class_name: str | None = None  # `X-Tailguard-Class`, as sent
    ttft_slo_ms: str | None = None  # `x-tailguard-ttft-slo-ms`, as sent (the intake judges it)
    request_id: str | None = None  # `X-Request-Id`, bounded and sanitized
    user_agent: str | None = None
    passed: tuple[tuple[str, str], ...] = ()  # what its route passes on to the backend
    trace: Mapping[str, str] | None = None  # its W3C trace context, when it sent one
    session: tuple[str, str] | None = None  # the program it names (`session_header`)
    agent: tuple[str, str] | None = None  # the session its coding agent names (`agent_session`)


def told(headers: Mapping[str, str], endpoint: Endpoint) -> Told:
    """Everything the gateway reads from a request's headers, in one pass."""
    api_key = bearer_key(headers)
    if api_key is None and endpoint == "messages":  # Anthropic's SDK sends its key this way
        api_key = header(headers, "x-api-key") or None
    trace = {n: v for n in TRACE_HEADERS if (v := header(headers, n)) is not None}
    return Told(api_key, header(headers, CLASS_HEADER), ttft_slo_header(headers), client_request_id(headers),
                (header(headers, "User-Agent") or "")[:_MAX_UA] or None,
                tuple((n, v) for n in PASSED_HEADERS.get(endpoint, ()) if (v := header(headers, n)) is not None),
                trace or None, session_header(headers), agent_session(headers))


def header(headers: Mapping[str, str], name: str) -> str | None:
    """`name`'s value; a plain dict (unlike aiohttp's headers) is searched in lower case too."""
    value = headers.get(name)
    return headers.get(name.lower()) if value is None else value


def bearer_key(headers: Mapping[str, str]) -> str | None:
    """The key of `Authorization: Bearer <key>`, or None."""
    auth = header(headers, "Authorization")
    if auth is None:
        return None
    scheme, _, token = auth.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def class_header(headers: Mapping[str, str]) -> str | None:
    """The class a request names in `X-Tailguard-Class`, as sent."""
    return header(headers, CLASS_HEADER)


def ttft_slo_header(headers: Mapping[str, str]) -> str | None:
    """The TTFT target a request asks for in `x-tailguard-ttft-slo-ms` (milliseconds), as sent."""
    return header(headers, TTFT_SLO_HEADER)


def client_request_id(headers: Mapping[str, str]) -> str | None:
    """The client's `X-Request-Id`, bounded and sanitized; None when absent or nothing is left."""
    raw = header(headers, "X-Request-Id")
    if not raw:
        return None
    return _NOT_ID.sub("", raw[: _MAX_REQUEST_ID * 2])[:_MAX_REQUEST_ID] or None


def session_header(headers: Mapping[str, str]) -> tuple[str, str] | None:
    """The program a request names in `X-Tailguard-Program` or `X-Session-Id`, as (the header's
    name in lower case, its value); None without one."""
    return _first(headers, SESSION_HEADERS)


def agent_session(headers: Mapping[str, str]) -> tuple[str, str] | None:
    """The session a coding agent's own header names (`AGENT_SESSION_HEADERS`), as (the header's
    name in lower case, its value); None without one."""
    return _first(headers, AGENT_SESSION_HEADERS)


def _first(headers: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = (header(headers, name) or "").strip()
        if value:
            return name.lower(), value
    return None
