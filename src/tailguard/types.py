"""Shared aliases and small enums used by every part; a leaf module."""

from __future__ import annotations

import enum
from typing import TypeAlias

Seconds: TypeAlias = float
ClassName: TypeAlias = str


class Outcome(enum.StrEnum):
    """How a request ended. Every accepted request ends exactly once, with one of these."""

    SUCCESS = "success"
    CLIENT_ERROR = "client_error"
    REJECTED = "rejected"
    UPSTREAM_ERROR = "upstream_error"
    TIMEOUT = "timeout"
    CLIENT_GONE = "client_gone"


class FailureKind(enum.StrEnum):
    """How an upstream attempt failed. The driver names what it saw; the front alone decides
    from it (and from whether bytes reached the consumer, or the engine answered) whether the
    request goes again, where, and whether the backend's health suffers (`front.retry`)."""

    CONNECT = "connect"  # refused or unreachable
    TIMEOUT_CONNECT = "timeout_connect"
    RESET = "reset"  # the connection broke before an answer (often a stale keep-alive one)
    DISCONNECT = "disconnect"  # the stream ended early
    STATUS = "status"  # a 5xx or 429 (or a redirect) before streaming
    PROTOCOL = "protocol"  # malformed HTTP or a chunk that is not JSON
    STREAM_ERROR = "stream_error"  # the engine sent an error event mid-stream
    TIMEOUT_HEADER = "timeout_header"  # no response head within its deadline: a hung server
    TIMEOUT_FIRST_TOKEN = "timeout_first_token"  # no content within the first-token deadline
    TIMEOUT_IDLE = "timeout_idle"
    TIMEOUT_TOTAL = "timeout_total"

    @property
    def is_timeout(self) -> bool:
        return self.value.startswith("timeout")


class RejectReason(enum.StrEnum):
    """Why the front refused or dropped a request (`X-Tailguard-Reject-Reason`, the
    `tailguard_rejected_total{reason}` label)."""

    QUEUE_FULL = "queue_full"
    WAIT_BOUND = "wait_bound"  # its expected wait is past its class's bound
    DEADLINE = "deadline"  # predicted to miss its TTFT target (a class that sheds)
    SHED = "shed"  # queued, then shed for cheaper requests that can make their targets in its place
    LATE = "late"  # queued until it could no longer make its TTFT target (a class that sheds)
    QUEUE_TIMEOUT = "queue_timeout"  # it waited past its class's bound
    NO_HEALTHY_BACKEND = "no_healthy_backend"
    MODEL_NOT_FOUND = "model_not_found"  # no backend serves the model it names
    SHUTTING_DOWN = "shutting_down"
    RATE_LIMIT_REQUESTS = "rate_limit_requests"  # its caller's requests per minute
    RATE_LIMIT_TOKENS = "rate_limit_tokens"  # its caller's tokens per minute
    RATE_LIMIT_PARALLEL = "rate_limit_parallel"  # its caller's requests at once (`max_parallel_requests`)
    GUARD_UNAVAILABLE = "guard_unavailable"  # an input guard failed or timed out, and fails closed
    AUDIT_UNAVAILABLE = "audit_unavailable"  # the audit trail's queue is full and `audit.when_full: refuse`
    SHARED_STATE_UNAVAILABLE = "shared_state_unavailable"  # Redis is away and `state.on_unavailable` is `closed`
