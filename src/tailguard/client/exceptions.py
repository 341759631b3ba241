"""The client's exceptions, placed under the openai package's own so that code which already
catches `openai.APITimeoutError` or `openai.RateLimitError` keeps working:

    openai.APIError
    ├── openai.APIConnectionError
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
`X-Tailguard-Reject-Reason`, the server's `Retry-After`, the number of tries and why the client
stopped (`gave_up`: attempts, retry_after_too_long, budget).
"""

from __future__ import annotations

import httpx2
import openai

from tailguard.client.retry import GiveUpReason
from tailguard.client.timeouts import Expired, Phase


class DeadlineExceeded(openai.APITimeoutError):
    """A staged deadline ran out; the message says which, after how long, and what had arrived."""

    def __init__(self, request: httpx2.Request, expired: Expired, content_chunks: int) -> None:
        message = (f"{expired.phase} deadline of {expired.limit_s:.3g} s ran out after "
                   f"{expired.elapsed_s:.3g} s; {content_chunks} content chunks had arrived")
        openai.APIConnectionError.__init__(self, message=message, request=request)
        self.phase: Phase = expired.phase
        self.limit_s = expired.limit_s
        self.elapsed_s = expired.elapsed_s
        self.content_chunks = content_chunks


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

    def __init__(self, response: httpx2.Response, body: object, *, retry_after_s: float | None) -> None:
        self._status = response.status_code
        self.reason = response.headers.get("x-tailguard-reject-reason")
        self.retry_after_s = retry_after_s
        self.attempts = 1
        self.gave_up: GiveUpReason = "attempts"
        self._detail = _error_message(body) or response.reason_phrase
        super().__init__(self._compose(), response=response, body=body)

    def stopped(self, attempts: int, gave_up: GiveUpReason) -> None:
        """Record how the retries ended, in the fields and the message."""
        self.attempts = attempts
        self.gave_up = gave_up
        self.message = self._compose()
        self.args = (self.message,)

    def _compose(self) -> str:
        reason = f" ({self.reason})" if self.reason else ""
        wait = f", Retry-After {self.retry_after_s:.3g} s" if self.retry_after_s is not None else ""
        return (f"{self._status}{reason}: {self._detail}; gave up after {self.attempts} tries "
                f"({self.gave_up}{wait})")


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
