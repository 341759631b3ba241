"""The client's reading of a `Retry-After`; pure. When a call is tried again, and how long it
waits first, is `tailguard.retry_policy`'s (the batch runner's rule too), re-exported here."""

from __future__ import annotations

import email.utils
import math
from typing import Mapping

from tailguard.retry_policy import (
    RETRY_STATUSES as RETRY_STATUSES, NoRetry as NoRetry, NoRetryReason as NoRetryReason, RetryAfter as RetryAfter,
    RetryPolicy as RetryPolicy,
)


def parse_retry_after(headers: Mapping[str, str], now_epoch: float) -> float | None:
    """Seconds the server asked us to wait: `retry-after-ms` (OpenAI's), then `Retry-After` as
    seconds or as an HTTP date (RFC 9110), measured from `now_epoch`. None when absent or
    unreadable; a date in the past is 0; a number too large to represent is infinite."""
    lower = {k.lower(): v for k, v in headers.items()}
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = lower.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            continue
        if not math.isnan(seconds):
            return max(0.0, seconds)
    value = lower.get("retry-after")
    if value is None:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a naive one is read as such
        return None
    return max(0.0, when.timestamp() - now_epoch)
