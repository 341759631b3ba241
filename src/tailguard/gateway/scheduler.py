"""Who goes next: the scheduler protocol and its policies; pure, no I/O.

The asyncio dispatcher (gateway) and the discrete-event run (sim/des.py) drive the very same
objects, passing `now` in, so a policy is evaluated on a million requests without a socket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from tailguard.types import Outcome


@dataclass(slots=True, frozen=True)
class Pending:
    """A request waiting in front of the backends."""

    id: str
    cls: str
    rank: int  # lower goes first
    est_tokens: int  # estimated prompt tokens + capped max_tokens: the job size for SJF
    arrived_at: float
    wait_bound_at: float  # past this instant it leaves the queue with a 503


@dataclass(slots=True, frozen=True)
class Reject:
    """Why `push` refused a request, and when the client may try again."""

    reason: str  # "queue_full" | "wait_bound" | ...
    retry_after_s: float


class Scheduler(Protocol):
    def push(self, req: Pending, now: float) -> Reject | None:
        """Queue a request, or refuse it (full queue, or a bound it cannot meet)."""
        ...

    def pop(self, now: float, admissible: Callable[[Pending], bool] | None = None) -> Pending | None:
        """Called when a slot frees: the best queued request for which `admissible` holds (the
        driver passes a check that some backend can take it, which is how per-class slot shares
        are enforced), or None."""
        ...

    def remove(self, req_id: str, now: float) -> bool:
        """A queued client left: drop its request. True if it was queued."""
        ...

    def expire(self, now: float) -> list[Pending]:
        """Requests that have waited past their bound; they leave the queue."""
        ...

    def on_finish(self, req_id: str, outcome: Outcome, now: float) -> None:
        """Once per dispatched request, when it ends (feeds drain-rate and size estimates)."""
        ...

    def next_wakeup(self) -> float | None:
        """Earliest instant at which `expire` would return something."""
        ...

    def __len__(self) -> int: ...
