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
- `protocol` (an answer that is not what was asked: a JSON or gzip body to a stream request, a
  malformed stream, a bound broken before anything reached the consumer): that backend is broken
  for this request; another is tried, never the same. It counts toward ejecting the backend.
- anything else (deadlines once the engine answered, an error event): not retried, since the
  engine may have done the work.

An attempt whose answer had already reached its consumer is never sent again from the start,
but it may be *continued* (`Again.CONTINUE`): when its backend died or stalled (`reset`,
`disconnect`, an idle deadline), or the backend a continuation went to could not take it (any
of the failures above that send a request to another backend), and the request can be
continued from its text (`continuable`: the intake's `resumable` rule, no tools, structured
output, `n` > 1 or logprobs, and its driver kept the text: `Front.tracks`), another backend
carries on from what was generated so far, as a suspended request is resumed. NVIDIA Dynamo
migrates on the same facts only (`lib/llm/src/migration.rs`: connect, disconnect, timeout,
engine shutdown; never a cancellation, never guided decoding, at most `migration_limit`
times); LiteLLM's continuation of tool calls from text silently returned prose
(BerriAI/litellm#31067), which is why a request that is not resumable ends instead. A
client's own cancel is no `FailureKind`: it never reaches here.
"""

from __future__ import annotations

import enum

from tailguard.front.params import RetryParams
from tailguard.retry_budget import RetryBudget
from tailguard.types import FailureKind

_SAME_BACKEND = frozenset({FailureKind.RESET, FailureKind.DISCONNECT})
_DOWN = _SAME_BACKEND | {FailureKind.CONNECT, FailureKind.TIMEOUT_CONNECT, FailureKind.STATUS}
_OTHER_BACKEND = _DOWN | {FailureKind.PROTOCOL}
# The backend died or stalled mid-answer (or the one its continuation went to is down): what
# was generated can go on elsewhere. Not a total deadline (the request's own bound), nor an error
# event or a malformed stream (the engine answered; its text elsewhere could repeat what broke it).
_CONTINUABLE = _DOWN | {FailureKind.TIMEOUT_IDLE}
# Failures that count toward ejecting a backend (`front.ejection`): what a dead, hung or broken
# host does, never what a busy one does.
_HEALTH = frozenset({FailureKind.CONNECT, FailureKind.TIMEOUT_CONNECT, FailureKind.STATUS, FailureKind.PROTOCOL})


class Again(enum.Enum):
    """Where a failed attempt may go again."""

    NO = "no"
    SAME_OR_OTHER = "same_or_other"  # the same backend once on a fresh connection, else another
    OTHER = "other"
    CONTINUE = "continue"  # on another backend, from the text already delivered (a migration)


def _hung(kind: FailureKind, answered: bool) -> bool:
    """No response head within its deadline (or the first-token one): the server is hung."""
    return kind is FailureKind.TIMEOUT_HEADER or (kind is FailureKind.TIMEOUT_FIRST_TOKEN and not answered)


def retry_of(kind: FailureKind, delivered: bool, answered: bool, continuable: bool = False) -> Again:
    """Whether (and where) an attempt that failed as `kind` may be sent again, or continued."""
    if delivered:
        return Again.CONTINUE if continuable and continues_after(kind, answered) else Again.NO
    if kind in _SAME_BACKEND:
        return Again.SAME_OR_OTHER
    if kind in _OTHER_BACKEND or _hung(kind, answered):
        return Again.OTHER
    return Again.NO


def continues_after(kind: FailureKind, answered: bool) -> bool:
    """Whether a stream that failed as `kind` mid-answer is continued elsewhere when it can be
    continued from its text (what the driver tells a client whose request cannot be)."""
    return kind in _CONTINUABLE or _hung(kind, answered)


def stale_connection(kind: FailureKind, answered: bool) -> bool:
    """The connection broke before any answer (typically a pooled keep-alive one the server had
    just closed): its backend may be fine, so a continuation, like a retry, is tried there once
    more over a fresh connection. A stream that broke mid-answer was answered: not this."""
    return kind in _SAME_BACKEND and not answered


def hurts_health(kind: FailureKind, answered: bool) -> bool:
    """Whether the failure counts toward ejecting its backend."""
    return kind in _HEALTH or _hung(kind, answered)


def retry_budget(params: RetryParams) -> RetryBudget:
    """The budget `params` describe: retries at most `budget_ratio` of the requests of the last
    `window_s` plus `min_retries_per_s` (the budget itself is shared with the client)."""
    return RetryBudget(params.budget_ratio, params.min_retries_per_s, params.window_s)
