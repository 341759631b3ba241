"""Staged deadlines for one try of a call, and the tokens-per-second figure a total deadline is
derived from. Pure: no I/O, told the time.

One timeout cannot serve a generation: a queue wait, a first token and a thousand more tokens
take very different times, and a read timeout that restarts with every byte never trips while a
server sends keep-alives. So each phase has its own deadline, counted from events that mean
progress (content), not from bytes.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

Phase = Literal["connect", "first_token", "idle", "total"]


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Deadlines in seconds; None switches a phase off.

        Timeouts(connect=5, first_token=30, idle=15, total=None)

    - `connect`: opening the connection (the article's 3-5 s).
    - `first_token`: from sending the request to the first chunk that carries content; response
      headers, the role-only chunk and SSE comments do not count (the article's 15-30 s).
    - `idle`: between two content chunks; keep-alive comments do not reset it.
    - `total`: the whole try. None derives it from the request's `max_tokens`: `first_token` plus
      `max_tokens` at the speed this client has measured on its own recent calls (until it has,
      `tokens_per_s`), times `slack`. A request without `max_tokens` then has no total deadline.
    """

    connect: float | None = 5.0
    first_token: float | None = 30.0
    idle: float | None = 15.0
    total: float | None = None
    tokens_per_s: float = 10.0
    slack: float = 2.0

    def __post_init__(self) -> None:
        for name in ("connect", "first_token", "idle", "total"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"Timeouts.{name} must be positive or None, not {value!r}")
        if not self.tokens_per_s > 0 or self.slack < 1:
            raise ValueError("tokens_per_s must be positive and slack at least 1")

    def total_s(self, max_tokens: int | None, learned_tokens_per_s: float | None) -> float | None:
        """The total deadline of a try that may generate `max_tokens`."""
        if self.total is not None:
            return self.total
        if max_tokens is None:
            return None
        speed = learned_tokens_per_s or self.tokens_per_s
        return ((self.first_token or 0.0) + max_tokens / speed) * self.slack


class Speed:
    """Decode speed learned from this client's own finished streams.

    It keeps the last `window` figures and answers a slow one (the `quantile`, by default the
    10th percentile), because a deadline derived from a typical speed would cut off every call
    that runs slower than typical. None until `min_samples` streams have finished.
    """

    __slots__ = ("_seen", "quantile", "min_samples")

    def __init__(self, window: int = 32, quantile: float = 0.1, min_samples: int = 3) -> None:
        self._seen: deque[float] = deque(maxlen=window)
        self.quantile = quantile
        self.min_samples = min_samples

    def observe(self, tokens: int, seconds: float) -> None:
        """A stream gave `tokens` content tokens over `seconds` after its first one."""
        if tokens > 1 and seconds > 0:
            self._seen.append((tokens - 1) / seconds)

    def tokens_per_s(self) -> float | None:
        if len(self._seen) < self.min_samples:
            return None
        ordered = sorted(self._seen)
        return ordered[min(len(ordered) - 1, int(self.quantile * len(ordered)))]


@dataclass(frozen=True, slots=True)
class Expired:
    phase: Phase
    limit_s: float  # the deadline's length
    elapsed_s: float  # time since the phase began


class Deadlines:
    """The first-token, idle and total deadlines of one try, moved on by content.

        d = Deadlines(first_token_s=30, idle_s=15, total_s=120, sent_at=now)
        d.on_content(now)       # a chunk that carries content arrived
        d.next_at()             # the earliest instant something expires (None: nothing can)
        d.expired(now)          # which phase ran out, if one did
    """

    __slots__ = ("first_token_s", "idle_s", "total_s", "sent_at", "first_content_at", "last_content_at",
                 "content_chunks")

    def __init__(self, first_token_s: float | None, idle_s: float | None, total_s: float | None,
                 sent_at: float) -> None:
        self.first_token_s = first_token_s
        self.idle_s = idle_s
        self.total_s = total_s
        self.sent_at = sent_at
        self.first_content_at: float | None = None
        self.last_content_at: float | None = None
        self.content_chunks = 0

    def on_content(self, now: float, chunks: int = 1) -> None:
        if self.first_content_at is None:
            self.first_content_at = now
        self.last_content_at = now
        self.content_chunks += chunks

    def _pending(self) -> list[tuple[float, Phase, float, float]]:
        """(expires_at, phase, limit, phase start) of each armed deadline."""
        out: list[tuple[float, Phase, float, float]] = []
        if self.total_s is not None:
            out.append((self.sent_at + self.total_s, "total", self.total_s, self.sent_at))
        if self.last_content_at is None:
            if self.first_token_s is not None:
                out.append((self.sent_at + self.first_token_s, "first_token", self.first_token_s, self.sent_at))
        elif self.idle_s is not None:
            out.append((self.last_content_at + self.idle_s, "idle", self.idle_s, self.last_content_at))
        return out

    def next_at(self) -> float | None:
        pending = self._pending()
        return min(p[0] for p in pending) if pending else None

    def remaining_s(self, now: float) -> float:
        """Seconds until the earliest deadline; infinite when none is armed."""
        at = self.next_at()
        return math.inf if at is None else max(0.0, at - now)

    def expired(self, now: float) -> Expired | None:
        due = [p for p in self._pending() if p[0] <= now]
        if not due:
            return None
        _, phase, limit, start = min(due)
        return Expired(phase, limit, now - start)
