"""A request's phase deadlines (response head, first token, idle between chunks, total) on one
lazily re-armed timer that cancels the request's task when one passes."""

from __future__ import annotations

import asyncio

from tailguard.clock import Now
from tailguard.types import FailureKind


class DeadlineWatch:
    """Phase deadlines for one request with one timer, re-armed lazily.

    Chunks only store `last_at`; the timer, when it fires, re-arms itself at the next deadline
    if nothing expired. That costs one callback per idle period instead of a timer per chunk.
    On expiry it cancels the request's task (like `asyncio.timeout`), and `take_expiry()` tells
    that cancellation apart from a client disconnect. Instants are on the gateway's one clock
    (`clock`), the clock of the request's record.
    """

    __slots__ = ("_loop", "_clock", "_task", "_base", "_handle", "_armed_at", "total_at", "first_token_at", "idle_s",
                 "last_at", "first_seen", "expired", "head_at")

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Now, total_at: float, idle_s: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._loop = loop
        self._clock = clock
        self._task = task
        self._base = task.cancelling()
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = 0.0  # when the timer fires, while `_handle` is set
        self.total_at = total_at
        self.first_token_at = total_at
        self.idle_s = idle_s
        self.last_at = 0.0  # when the current attempt's backend last sent bytes (0: not yet)
        self.first_seen = False
        self.expired: FailureKind | None = None
        self.head_at: float | None = None  # the response head's deadline, until it comes (None: none)

    def start_attempt(self, first_token_at: float, head_at: float | None = None) -> None:
        """Armed no later than `idle_s` from now as well: no idle deadline can come sooner, so a
        first chunk within `idle_s` (the usual case) leaves the timer as it is. `head_at`: the
        response head must come by then (a host that accepts and never answers)."""
        self.first_token_at = first_token_at
        self.head_at = head_at
        self.first_seen = False
        self.last_at = 0.0
        due = min(first_token_at, self.total_at, self._clock() + self.idle_s)
        self._arm(due if head_at is None else min(due, head_at))

    def answered(self) -> None:
        """The response head came: its deadline is met (the timer, if it fires for it, re-arms)."""
        self.head_at = None

    def first_content(self, now: float) -> None:
        """From here on the idle deadline applies instead of the first-token one."""
        self.first_seen = True
        self.last_at = now
        due = min(now + self.idle_s, self.total_at)
        if self._handle is None or self._armed_at > due:
            self._arm(due)

    def _arm(self, at: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed_at = at
        self._handle = self._loop.call_later(max(0.0, at - self._clock()), self._fire)

    def _fire(self) -> None:
        self._handle = None
        now = self._clock()
        if now >= self.total_at:
            kind = FailureKind.TIMEOUT_TOTAL
        elif self.head_at is not None and now >= self.head_at:
            kind = FailureKind.TIMEOUT_HEADER
        elif not self.first_seen:
            if now < self.first_token_at:
                due = min(self.first_token_at, self.total_at)
                self._arm(due if self.head_at is None else min(due, self.head_at))
                return
            kind = FailureKind.TIMEOUT_FIRST_TOKEN
        else:
            due = self.last_at + self.idle_s
            if now < due:
                self._arm(min(due, self.total_at))
                return
            kind = FailureKind.TIMEOUT_IDLE
        self.expired = kind
        self._task.cancel()

    def take_expiry(self) -> FailureKind | None:
        """After a CancelledError: the deadline that caused it, or None if it came from outside
        (the client left), in which case the caller must re-raise. Taken once: after a retried
        deadline, a later cancellation is judged on its own."""
        kind, self.expired = self.expired, None
        if kind is None:
            return None
        if self._task.uncancel() > self._base:
            return None  # also cancelled from outside: that one wins
        return kind

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

