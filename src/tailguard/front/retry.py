"""Whether and where a failed attempt is tried again, and the budget that bounds retries
(`tailguard.retry_budget`, the client's too); pure.

Only an attempt that failed before any byte reached its consumer is retried (`delivered` False),
so a client never sees two answers spliced and nothing runs twice: the failed attempt's upstream
is closed before the retry is sent. Where it goes depends on how it failed:

- `reset`, `disconnect`: the connection broke before an answer (typically a pooled keep-alive
  connection the server had just closed). The server itself may be fine, so the same backend is
  tried once more on a fresh connection, even when it is the only one; then another.
- `connect`, `timeout_connect`, `status` (a 5xx or 429 before streaming), and a response-head or
  first-token deadline that passed with not even response headers (`answered` False: a hung server): that
  backend refused or is down; another backend is tried, never the same.
- anything else (deadlines once the engine answered, protocol errors, an error event): not
  retried, since the engine may have done the work.
"""

from __future__ import annotations

import enum

from tailguard.front.params import RetryParams
from tailguard.retry_budget import RetryBudget
from tailguard.types import FailureKind

_SAME_BACKEND = frozenset({FailureKind.RESET, FailureKind.DISCONNECT})
_OTHER_BACKEND = _SAME_BACKEND | {FailureKind.CONNECT, FailureKind.TIMEOUT_CONNECT, FailureKind.STATUS}
# Failures that count toward ejecting a backend (`front.ejection`): what a dead, hung or broken
# host does, never what a busy one does.
_HEALTH = frozenset({FailureKind.CONNECT, FailureKind.TIMEOUT_CONNECT, FailureKind.STATUS})


class Retry(enum.Enum):
    """Where a failed attempt may go again."""

    NO = "no"
    SAME_OR_OTHER = "same_or_other"  # the same backend once on a fresh connection, else another
    OTHER = "other"


def _hung(kind: FailureKind, answered: bool) -> bool:
    """No response head within its deadline (or the first-token one): the server is hung."""
    return kind is FailureKind.TIMEOUT_HEADER or (kind is FailureKind.TIMEOUT_FIRST_TOKEN and not answered)


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
    """Whether the failure counts toward ejecting its backend."""
    return kind in _HEALTH or _hung(kind, answered)


def retry_budget(params: RetryParams) -> RetryBudget:
    """The budget `params` describe: retries at most `budget_ratio` of the requests of the last
    `window_s` plus `min_retries_per_s` (the budget itself is shared with the client)."""
    return RetryBudget(params.budget_ratio, params.min_retries_per_s, params.window_s)
