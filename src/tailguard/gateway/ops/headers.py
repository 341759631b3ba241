"""The headers a bound response carries to its client: `X-Tailguard-Class`, `-Backend`,
`-Queue-Ms`, the rate limits' standing, and `Server-Timing` (queue, connect, ttft)."""

from __future__ import annotations

from tailguard.gateway.request import Request


def _ms(v: float) -> str:
    return f"{v * 1000.0:.3f}"


def server_timing(t: Request) -> str:
    """`Server-Timing` value: queue, connect (bind to upstream headers) and ttft, in ms."""
    parts: list[str] = []
    if t.bound_at is not None:
        parts.append(f"queue;dur={_ms(t.bound_at - t.arrived_at)}")
        if t.upstream_headers_at is not None:
            parts.append(f"connect;dur={_ms(t.upstream_headers_at - t.bound_at)}")
    if t.first_content_at is not None:
        parts.append(f"ttft;dur={_ms(t.first_content_at - t.arrived_at)}")
    return ", ".join(parts)


def response_headers(t: Request) -> dict[str, str]:
    """The `X-Tailguard-*` and `Server-Timing` headers for a response that has been bound."""
    h = {"X-Tailguard-Class": t.cls, "X-Tailguard-Backend": t.backend}
    if t.bound_at is not None:
        h["X-Tailguard-Queue-Ms"] = f"{(t.bound_at - t.arrived_at) * 1000.0:.1f}"
    st = server_timing(t)
    if st:
        h["Server-Timing"] = st
    if t.rate_headers is not None:
        h.update(t.rate_headers)
    return h
