"""When a call is tried again and how long it waits first: backoff with full jitter and
Retry-After, and the statuses worth another try; pure, stdlib only. The one rule for the client's
calls (`tailguard.client`) and for batch lines (`tailguard.batch.runner`); the budget that bounds
retries is `tailguard.retry_budget`'s.

The shape comes from the clients that had to stop retry storms: full jitter from AWS's backoff
study (every client draws its wait from [0, cap], so a fleet's retries spread over the window
instead of arriving in waves).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

# Why a call stops being retried; shown in the exception so a user knows which knob to turn.
NoRetryReason = Literal["not_retryable", "attempts", "retry_after_too_long", "budget"]

# 408 and 409 are the server asking to be asked again; 502/503/504 an instance restarting or full.
# A 500 is not: the same request would meet the same bug (the gateway answers 502 when its backend
# fails).
RETRY_STATUSES = frozenset({408, 409, 429, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class RetryAfter:
    delay_s: float


@dataclass(frozen=True, slots=True)
class NoRetry:
    reason: NoRetryReason


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How one call is retried. `max_attempts` counts the first try; delays are in seconds.

        RetryPolicy(max_attempts=4, base_delay=1.0, max_delay=8.0, max_retry_after=60)

    A 503 (an instance restarting) is retried after a full-jitter draw from
    [0, min(max_delay, base_delay * 2**n)]; a 429 (the server is overloaded or this caller is
    over its limit) draws from a window `overload_factor` times longer. A `Retry-After` is a floor
    the draw is added to, so clients told the same instant still spread out after it; one longer
    than `max_retry_after` ends the call at once rather than sleeping (a client once slept on
    `retry-after: 198300`).
    """

    max_attempts: int = 4
    base_delay: float = 1.0
    max_delay: float = 8.0
    max_retry_after: float = 60.0
    overload_factor: float = 2.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts counts the first try: it must be at least 1")
        if self.base_delay < 0 or self.max_delay < 0 or self.max_retry_after < 0:
            raise ValueError("delays must not be negative")

    def decide(self, attempts: int, status: int | None, retry_after_s: float | None,
               rng: random.Random) -> RetryAfter | NoRetry:
        """After `attempts` tries, the last of which failed with `status` (None: the connection
        failed or timed out before any content), retry after a delay or give up."""
        if status is not None and status not in RETRY_STATUSES:
            return NoRetry("not_retryable")
        if attempts >= self.max_attempts:
            return NoRetry("attempts")
        if retry_after_s is not None and retry_after_s > self.max_retry_after:
            return NoRetry("retry_after_too_long")
        factor = self.overload_factor if status == 429 else 1.0
        window = min(self.max_delay, self.base_delay * factor * 2.0 ** min(attempts - 1, 60))
        return RetryAfter(max(0.0, retry_after_s or 0.0) + rng.uniform(0.0, window))
