"""The root of every tailguard exception, and the whole tree below it (the client's are apart).

    TailguardError
    ├── ConfigError            a config or workload file is invalid (message says where)
    │   └── TraceError         a line of a request trace cannot be read (message names the file and line)
    ├── TargetError            the bench's target cannot be measured: unreachable, refused, 401, 404
    ├── ProtocolError          a driver broke the front's protocol; the front is left as it was
    │   │                      (front/events.py)
    │   ├── WrongEvent         an event its state does not allow: a bug, named with the event and
    │   │                      the state it met
    │   ├── NotAnEvent         a decision, or something that is no event at all, handed in
    │   └── ClockWentBack      a `now` earlier than the last one the front was told
    ├── FrontBroken            a handler failed halfway: the front refuses every later call
    │                          (front/events.py)
    ├── Refused                the intake turned a request away, in its own words: a `forbidden`
    │                          one (its key may not) is answered 403, any other 400
    │                          (front/intake.py; gateway/classes.py `answer`)
    ├── APIError               answered to an HTTP client as an OpenAI-style error body
    │   ├── BadRequest         400: malformed, missing or wrongly typed fields
    │   │   └── ContentBlocked  400 `content_policy_violation`: an input guard blocked its
    │   │                      text (tailguard/guards/guard.py)
    │   ├── Unauthorized       401: an API key the gateway does not know (gateway/classes.py)
    │   ├── Forbidden          403: a known key asking for a class, model or route it may not use
    │   ├── NotFound           404: a model no backend serves, a route the gateway does not have
    │   ├── PayloadTooLarge    413: body over the configured limit
    │   └── Overloaded         503 with Retry-After: rejected by admission
    │       ├── RateLimited    429 with Retry-After: over its caller's requests or tokens per minute
    │       ├── GuardUnavailable  503: an input guard failed or timed out and fails closed
    │       └── AuditFull      503: the audit trail's queue is full and `audit.when_full: refuse`
    └── GatewayError           how one request's way through the gateway stopped short; caught
        │                      inside the gateway, where each becomes a retry, a resume or an answer
        ├── RelayError         an upstream attempt failed: its `kind` (a FailureKind) says how, and
        │                      the front decides whether it goes again (gateway/upstream/client.py)
        ├── UpstreamStatus     the backend refused before streaming (a 4xx): its status and body go
        │                      back to the client as they are (gateway/upstream/client.py)
        ├── UpstreamBroke      the backend's connection ended before its response did (gateway/upstream/h1.py)
        ├── ClientGone         writing to the client failed: it disconnected (gateway/sink.py)
        └── Suspended          the front preempted the request; the client's response stays open
                               until it resumes (gateway/upstream/client.py)

`wire.openai.error_body` is the one place an `APIError` becomes bytes on the wire.

`tailguard.client` raises openai's exceptions (its tree is in `client/exceptions.py`): an
application embedding it catches what it already catches for the openai SDK.
"""

from __future__ import annotations


class TailguardError(Exception):
    """Root of all tailguard errors."""


class ConfigError(TailguardError):
    """A configuration or workload file is invalid; the message names the field."""


class TraceError(ConfigError):
    """A request trace (`bench --trace`) cannot be read: the message names the file and the line."""


class TargetError(TailguardError):
    """The bench's target failed its start-up check; the message says what and where, in one line."""


class APIError(TailguardError):
    status: int = 500
    type: str = "server_error"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s
        self.headers = headers or {}

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(status={self.status}, code={self.code!r}, message={self.message!r})"


class BadRequest(APIError):
    status = 400
    type = "invalid_request_error"


class Forbidden(APIError):
    """A known key asked for what it may not use (a class, a model, an admin route): OpenAI's
    `PermissionDeniedError`."""

    status = 403
    type = "permission_error"


class NotFound(APIError):
    status = 404
    type = "invalid_request_error"


class PayloadTooLarge(APIError):
    status = 413
    type = "invalid_request_error"


class Overloaded(APIError):
    status = 503
    type = "server_overloaded"


class RateLimited(Overloaded):
    """OpenAI's shape for a rate limit: 429, type `requests` or `tokens`, code `rate_limit_exceeded`."""

    status = 429
    type = "requests"


class ContentBlocked(BadRequest):
    """An input guard found what it blocks: OpenAI's `content_policy_violation` (a 400)."""

    def __init__(self, guard: str, categories: tuple[str, ...] = ()) -> None:
        said = f" ({', '.join(categories)})" if categories else ""
        super().__init__(f"The request was blocked by the gateway's content guard '{guard}'{said}.",
                         code="content_policy_violation")


class GuardUnavailable(Overloaded):
    """An input guard could not check the request in time and fails closed."""

    def __init__(self, guard: str) -> None:
        super().__init__(f"The gateway's content guard '{guard}' could not check the request; retry later.",
                         code="guard_unavailable", retry_after_s=1.0,
                         headers={"X-Tailguard-Reject-Reason": "guard_unavailable"})


class AuditFull(Overloaded):
    """The audit trail cannot keep up and the operator chose to refuse rather than drop entries."""

    def __init__(self) -> None:
        super().__init__("The gateway's audit trail is behind; retry later.", code="audit_unavailable",
                         retry_after_s=1.0, headers={"X-Tailguard-Reject-Reason": "audit_unavailable"})


class GatewayError(TailguardError):
    """Root of the gateway's own exceptions: how a request's way through the gateway stopped short."""
