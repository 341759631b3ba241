"""The client's exceptions, placed under the openai package's own so that code which already
catches `openai.APITimeoutError` or `openai.RateLimitError` keeps working:

    openai.APIError
    ├── openai.APIConnectionError
    │   ├── ConnectionFailed              every try failed to connect or was cut before a response
    │   ├── StreamBroken                  the connection broke after content reached the caller
    │   └── openai.APITimeoutError
    │       └── DeadlineExceeded          one of this client's staged deadlines ran out
    │           ├── ConnectTimeout        no connection within `connect`
    │           ├── FirstTokenTimeout     no content within `first_token` of sending
    │           ├── IdleTimeout           no content within `idle` of the last content
    │           └── TotalTimeout          the try outlived `total`
    └── openai.APIStatusError
        ├── openai.RateLimitError         429
        │   └── RateLimited               (a Rejected) retries stopped on a 429
        └── openai.InternalServerError    5xx
            └── Unavailable               (a Rejected) retries stopped on a 502, 503 or 504

`Rejected` is the base of the last two: it carries the status, the gateway's
`X-Tailguard-Reject-Reason` and the server's `Retry-After`. Each error that ends a call after its
tries (`Rejected`, `DeadlineExceeded`, `ConnectionFailed`) carries the number of tries, why the
client stopped (`gave_up`: attempts, retry_after_too_long, budget) and `tries`: per try, its URL
and what went wrong, all of which its message says.
"""

from __future__ import annotations

import openai

from tailguard.client.httplib import httpx
from tailguard.client.retry import NoRetryReason
from tailguard.client.timeouts import Expired, Phase


WHY: dict[NoRetryReason, str] = {
    "attempts": "no tries left", "retry_after_too_long": "the server asked for a longer wait than max_retry_after",
    "budget": "the retry budget is spent", "not_retryable": "not retryable",
}


def gave_up_text(attempts: int, gave_up: NoRetryReason, tries: list[str]) -> str:
    """`gave up after 2 tries (no tries left): try 1 to URL: ...; try 2 to URL: ...`"""
    return (f"gave up after {attempts} {'try' if attempts == 1 else 'tries'} ({WHY[gave_up]}): "
            + "; ".join(tries))


class DeadlineExceeded(openai.APITimeoutError):
    """A staged deadline ran out; the message says which, after how long, and what had arrived
    (and, when it ended a call, every try's URL and deadline)."""

    def __init__(self, request: httpx.Request, expired: Expired, content_chunks: int) -> None:
        self._detail = (f"{expired.phase} deadline of {expired.limit_s:.3g} s ran out after "
                        f"{expired.elapsed_s:.3g} s; {content_chunks} content chunks had arrived")
        openai.APIConnectionError.__init__(self, message=self._detail, request=request)
        self.phase: Phase = expired.phase
        self.limit_s = expired.limit_s
        self.elapsed_s = expired.elapsed_s
        self.content_chunks = content_chunks
        self.attempts = 1
        self.gave_up: NoRetryReason = "attempts"
        self.tries: list[str] = []

    def detail(self) -> str:
        """This try's deadline alone, for the list of tries."""
        return self._detail

    def stopped(self, attempts: int, gave_up: NoRetryReason, tries: list[str]) -> None:
        """The call ended with this try: say every try in the message."""
        self.attempts, self.gave_up, self.tries = attempts, gave_up, tries
        self.message = f"{self._detail}; {gave_up_text(attempts, gave_up, tries)}"
        self.args = (self.message,)


class StreamBroken(openai.APIConnectionError):
    """The connection broke after content had reached the caller, so the call is not retried
    (the caller holds part of the answer). Raised by the client itself, so every openai release
    reports it the same way, naming the URL and how much had arrived."""

    def __init__(self, request: httpx.Request, content_chunks: int, cause: Exception) -> None:
        super().__init__(message=(f"the answer from {request.url} broke off after {content_chunks} content chunks "
                                  f"({type(cause).__name__}: {cause}); not retried: content had reached the caller"),
                         request=request)
        self.content_chunks = content_chunks


class ConnectionFailed(openai.APIConnectionError):
    """Every try failed before a response: refused, reset, unreachable. Unlike the SDK's bare
    "Connection error.", the message names each try's URL and reason and how many there were."""

    def __init__(self, request: httpx.Request, attempts: int, gave_up: NoRetryReason, tries: list[str]) -> None:
        super().__init__(message=f"could not reach {request.url}: {gave_up_text(attempts, gave_up, tries)}",
                         request=request)
        self.attempts, self.gave_up, self.tries = attempts, gave_up, tries


class ConnectTimeout(DeadlineExceeded):
    """No connection was open within `Timeouts.connect`."""


class FirstTokenTimeout(DeadlineExceeded):
    """No chunk with content arrived within `Timeouts.first_token` of sending the request."""


class IdleTimeout(DeadlineExceeded):
    """No chunk with content arrived within `Timeouts.idle` of the previous one."""


class TotalTimeout(DeadlineExceeded):
    """The try ran longer than its total deadline."""


DEADLINE_ERRORS: dict[Phase, type[DeadlineExceeded]] = {
    "connect": ConnectTimeout, "first_token": FirstTokenTimeout, "idle": IdleTimeout, "total": TotalTimeout,
}


class Rejected(openai.APIStatusError):
    """The server refused the call and the client stopped retrying it."""

    def __init__(self, response: httpx.Response, body: object, *, retry_after_s: float | None) -> None:
        self._status = response.status_code
        self.reason = response.headers.get("x-tailguard-reject-reason")
        self.retry_after_s = retry_after_s
        self.attempts = 1
        self.gave_up: NoRetryReason = "attempts"
        self.tries: list[str] = []
        self._text = _error_message(body) or response.reason_phrase
        super().__init__(self.detail(), response=response, body=body)

    def detail(self) -> str:
        """This answer alone: `503 (queue_full): <the server's message>, Retry-After 2 s`."""
        reason = f" ({self.reason})" if self.reason else ""
        wait = f", Retry-After {self.retry_after_s:.3g} s" if self.retry_after_s is not None else ""
        return f"{self._status}{reason}: {self._text}{wait}"

    def stopped(self, attempts: int, gave_up: NoRetryReason, tries: list[str]) -> None:
        """Record how the retries ended, in the fields and the message."""
        self.attempts, self.gave_up, self.tries = attempts, gave_up, tries
        self.message = f"{self.detail()}; {gave_up_text(attempts, gave_up, tries)}"
        self.args = (self.message,)


class RateLimited(Rejected, openai.RateLimitError):
    """Retries stopped on a 429."""


class Unavailable(Rejected, openai.InternalServerError):
    """Retries stopped on a 502, 503 or 504."""


def _error_message(body: object) -> str | None:
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
    return None
