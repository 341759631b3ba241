"""What the gateway reads from a request's HTTP headers: the caller's key, the class it names and
the TTFT target it asks for; pure. Both servers (aiohttp's and the lean one) and the DES's gate, which replays the headers a
bench would send, read them here, so the intake in the front sees values, never headers."""

from __future__ import annotations

from collections.abc import Mapping

CLASS_HEADER = "X-Tailguard-Class"
TTFT_SLO_HEADER = "x-tailguard-ttft-slo-ms"  # a tighter TTFT target for this request (docs/slo.md)


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
