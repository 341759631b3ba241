"""Whether and where a failed attempt is tried again, and the budget that bounds retries
(`tailguard.retry_budget`, the client's too); pure.

Only an attempt that failed before any byte reached its client is retried (the driver says so),
so a client never sees two answers spliced and nothing runs twice: the failed attempt's upstream
is closed before the retry is sent. Where it goes depends on how it failed:

- `reset`, `disconnect`: the connection broke before an answer (typically a pooled keep-alive
  connection the server had just closed). The server itself may be fine, so the same backend is
  tried once more on a fresh connection, even when it is the only one; then another.
- `connect`, `timeout_connect`, `status` (a 5xx or 429 before streaming), `timeout_headers` (the
  first-token deadline passed with not even response headers: a hung server): that backend
  refused or is down; another backend is tried, never the same.
- anything else (deadlines once the request was accepted upstream, protocol errors): not
  retried, since the engine may have done the work.
"""

from __future__ import annotations

from tailguard.front.params import RetryParams
from tailguard.retry_budget import RetryBudget

SAME_BACKEND_KINDS = frozenset({"reset", "disconnect"})
OTHER_BACKEND_KINDS = frozenset({"reset", "disconnect", "connect", "timeout_connect", "status", "timeout_headers"})
# Failures that count against a backend's health (as a failed probe does).
HEALTH_KINDS = frozenset({"connect", "timeout_connect", "timeout_headers"})


def retry_budget(params: RetryParams) -> RetryBudget:
    """The budget `params` describe: retries at most `budget_ratio` of the requests of the last
    `window_s` plus `min_retries_per_s` (the budget itself is shared with the client)."""
    return RetryBudget(params.budget_ratio, params.min_retries_per_s, params.window_s)
