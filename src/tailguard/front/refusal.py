"""`Refusal`: why a part of the front turned a request away before it was queued (the queue is
full, its wait would pass its class bound, its caller is over a limit), when the client may try
again, and, for a limit, the limit and how much of it was used (what the refusal's words say);
pure. The front turns it into its `Reject` decision."""

from __future__ import annotations

from dataclasses import dataclass

from tailguard.types import RejectReason


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: RejectReason
    retry_after_s: float
    limit: int | None = None
    used: int | None = None
