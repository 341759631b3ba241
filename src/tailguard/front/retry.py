"""Whether and where a failed attempt is tried again, and the budget that bounds retries; pure.

Only an attempt that failed before any byte reached its consumer is retried (`delivered` False),
so a client never sees two answers spliced and nothing runs twice: the failed attempt's upstream
is closed before the retry is sent. Where it goes depends on how it failed:

- `reset`, `disconnect`: the connection broke before an answer (typically a pooled keep-alive
  connection the server had just closed). The server itself may be fine, so the same backend is
  tried once more on a fresh connection, even when it is the only one; then another.
- `connect`, `timeout_connect`, `status` (a 5xx or 429 before streaming), and a first-token
  deadline that passed with not even response headers (`answered` False: a hung server): that
  backend refused or is down; another backend is tried, never the same.
- anything else (deadlines once the engine answered, protocol errors, an error event): not
  retried, since the engine may have done the work.
"""

from __future__ import annotations

import enum
import math

from tailguard.front.params import RetryParams
from tailguard.types import FailureKind

_SAME_BACKEND = frozenset({FailureKind.RESET, FailureKind.DISCONNECT})
_OTHER_BACKEND = _SAME_BACKEND | {FailureKind.CONNECT, FailureKind.TIMEOUT_CONNECT, FailureKind.STATUS}
# Failures that count against a backend's health (as a failed probe does).
_HEALTH = frozenset({FailureKind.CONNECT, FailureKind.TIMEOUT_CONNECT})


class Retry(enum.Enum):
    """Where a failed attempt may go again."""

    NO = "no"
    SAME_OR_OTHER = "same_or_other"  # the same backend once on a fresh connection, else another
    OTHER = "other"


def _hung(kind: FailureKind, answered: bool) -> bool:
    """The first-token deadline passed without even a response head: the server is hung."""
    return kind is FailureKind.TIMEOUT_FIRST_TOKEN and not answered


def retry_of(kind: FailureKind, delivered: bool, answered: bool) -> Retry:
    """Whether (and where) an attempt that failed as `kind` may be sent again."""
    if delivered:
        return Retry.NO
    if kind in _SAME_BACKEND:
        return Retry.SAME_OR_OTHER
    if kind in _OTHER_BACKEND or _hung(kind, answered):
        return Retry.OTHER
    return Retry.NO


def hurts_health(kind: FailureKind, answered: bool) -> bool:
    """Whether the failure counts against its backend's health, as a failed probe does."""
    return kind in _HEALTH or _hung(kind, answered)


class RetryBudget:
    """Retries at most `budget_ratio` of recent requests plus `min_retries_per_s` per second.

    Counted in one-second buckets over `window_s`, so both checks are O(1). Like Envoy's
    `retry_budget` and Finagle's `RetryBudget`: while a backend fails every request, the gateway
    sends it at most (1 + ratio) times the offered load instead of `max_attempts` times.

        budget = RetryBudget(RetryParams())
        budget.on_request(now)            # every accepted request
        if budget.try_spend(now): ...     # one retry
    """

    __slots__ = ("_ratio", "_floor", "_n", "_requests", "_retries", "_epoch")

    def __init__(self, params: RetryParams) -> None:
        self._ratio = params.budget_ratio
        self._n = max(1, math.ceil(params.window_s))
        self._floor = params.min_retries_per_s * self._n
        self._requests = [0] * self._n
        self._retries = [0] * self._n
        self._epoch = 0  # the whole second the newest bucket stands for

    def _roll(self, now: float) -> int:
        sec = math.floor(now)
        if sec > self._epoch:
            gap = sec - self._epoch
            for k in range(1, min(gap, self._n) + 1):
                i = (self._epoch + k) % self._n
                self._requests[i] = 0
                self._retries[i] = 0
            self._epoch = sec
        return sec % self._n

    def on_request(self, now: float) -> None:
        self._requests[self._roll(now)] += 1

    def try_spend(self, now: float) -> bool:
        """Take one retry from the budget; False (and nothing taken) when it is spent."""
        i = self._roll(now)
        if sum(self._retries) + 1 > self._ratio * sum(self._requests) + self._floor:
            return False
        self._retries[i] += 1
        return True
