"""The gateway's bounds on what a backend or a client can make it hold or wait for: `LimitsConfig`
(the `limits:` section). Every path that reads from a backend or a client is bounded in bytes and
time by one of these, each with a default chosen after nginx's and Envoy's (docs/security.md)."""

from __future__ import annotations

from pydantic import Field, model_validator

from tailguard.config.base import _Model

KiB = 1024
MiB = 1024 * KiB


class LimitsConfig(_Model):
    """Bytes and seconds a backend or a client may cost the gateway."""

    # -- a backend's answers -----------------------------------------------------------------
    max_event_bytes: int = Field(
        default=1 * MiB, ge=4 * KiB,
        description="Largest single SSE event from a backend (an event with logprobs is a few KiB); a longer one "
        "fails the attempt (502, or an error event once the client's stream has started). Envoy's "
        "`per_connection_buffer_limit_bytes` is 1 MiB too.",
    )
    max_preamble_bytes: int = Field(
        default=1 * MiB, ge=4 * KiB,
        description="Bytes a stream may send before its first content (role chunk, comments, keep-alives), which "
        "the gateway holds until that content comes; past it the attempt fails as a protocol error.",
    )
    max_preamble_s: float = Field(
        default=60.0, gt=0,
        description="Seconds a stream may keep sending bytes (comments, keep-alives, empty chunks) without content, "
        "counted from its second such read; past it the attempt fails as a protocol error. Shorter than "
        "`timeouts.first_token_s`, which a long prefill needs: a role chunk and then silence is not bounded here.",
    )
    max_answer_bytes: int = Field(
        default=64 * MiB, ge=64 * KiB,
        description="Bytes of stream a non-stream answer may be assembled from (32k tokens with logprobs fit); "
        "past it the request fails with a 502 instead of growing the gateway until `total_s`.",
    )
    max_tokens_margin: int = Field(
        default=16, ge=0, le=4096,
        description="Tokens a choice may run past the request's `max_tokens` before its answer is cut (a stream "
        "ends with `finish_reason: length` and an error event, a non-stream answer is a 502), for engines that "
        "count a stop token, a tool call's last delta or a reasoning boundary differently. A caller is never "
        "charged past `max_tokens`: the rest is counted as the backend's fault "
        "(`tailguard_upstream_overrun_tokens_total`).",
    )
    answer_bytes_per_token: int = Field(
        default=4 * KiB, ge=256,
        description="Bytes of stream an answer may carry per token it may generate (`max_tokens` and the margin, "
        "times `n`), on top of `max_preamble_bytes` and twice the request's size; past it the answer is cut as "
        "with too many tokens. A chunk is about 200 bytes, 1.5 KiB with 20 `top_logprobs`. A request without "
        "`max_tokens` has no such bound (only `max_answer_bytes` when it is not streamed).",
    )
    max_response_head_bytes: int = Field(
        default=64 * KiB, ge=4 * KiB,
        description="Largest status line plus headers of a backend's answer, any single header value included "
        "(checked as the bytes arrive; Envoy's `max_request_headers_kb` is 60 KiB).",
    )
    max_probe_bytes: int = Field(
        default=4 * MiB, ge=4 * KiB,
        description="Largest body read from a health probe, a kind or load page (an engine's /metrics) or "
        "`/v1/models`; a larger one counts as a failed probe (an empty model list).",
    )
    # -- clients' connections ----------------------------------------------------------------
    header_timeout_s: float = Field(
        default=10.0, gt=0,
        description="Longest time a client may take to send a request's headers, from its connection or its "
        "first byte (nginx's `client_header_timeout`, 60 s); then the connection is closed. A socket that "
        "sends nothing is closed at this time too.",
    )
    keepalive_timeout_s: float = Field(
        default=75.0, gt=0,
        description="An idle keep-alive connection is closed after this long (nginx's `keepalive_timeout`; "
        "aiohttp's own default is an hour).",
    )
    max_connections: int = Field(
        default=8192, ge=16,
        description="Open client connections at most. At the cap the longest-idle keep-alive connection is "
        "closed for a new one; with none idle, the new one gets a 503 `too_many_connections` and is closed. "
        "The process's open-file limit is raised at start to fit (`ulimit -Hn` permitting).",
    )
    reserved_connections: int = Field(
        default=32, ge=1,
        description="Connections kept above `max_connections` for `/health` and `/metrics` only, so an "
        "operator and a load balancer still see the gateway when clients have taken every other one.",
    )
    max_queued_body_bytes: int = Field(
        default=256 * MiB, ge=1 * MiB,
        description="Bytes of request bodies waiting in the queue at most; past it a request is refused with 503 "
        "`queue_full` and Retry-After. `scheduler.max_queue_len` bounds their number, this their memory: a "
        "queued request costs about 3.6 times its body once parsed (80 queued bodies of 3.8 MiB held 1,091 MiB).",
    )
    # -- what is passed back -----------------------------------------------------------------
    pass_backend_errors: bool = Field(
        default=False,
        description="Relay a backend's error body to the client. Off: a 4xx gives its status and the message "
        "of an OpenAI error body, sanitized and cut to 200 characters; a 5xx gives its status and the "
        "backend's name only (its body may hold a traceback or credentials). On, for debugging: as sent.",
    )

    @model_validator(mode="after")
    def _event_fits(self) -> LimitsConfig:
        if self.max_event_bytes > self.max_answer_bytes:
            raise ValueError(f"max_event_bytes ({self.max_event_bytes}) is above max_answer_bytes "
                             f"({self.max_answer_bytes})")
        return self
