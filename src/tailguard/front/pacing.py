"""Spacing the starts of a class on each backend (`classes[].start_interval_s`); pure, told the time.

Why: a request's first step on an engine is its prefill, and a chat that arrives while the
engine runs a step waits for that step to end. A step that carries several batch prefills at
once (lines that ended together, each replaced at once) is the long step a chat lands behind,
which is what a batch adds to the chats' P99 TTFT (docs/batch.md, "Figures"). Starting at most
one request of a paced class per `start_interval_s` on a backend spreads their prefills over
the engine's steps, one per step at most when the interval is about one step, while the class
keeps every slot it may hold.

    pacer = Pacer(classes)
    held = pacer.held("batch", now)        # backends where a batch request may not start yet
    pacer.started("gpu-a", "batch", now)   # it started there
    pacer.expire(now); pacer.next_due()    # the front's Tick and next_wakeup
"""

from __future__ import annotations

from collections.abc import Iterable

from tailguard.front.params import ClassSpec


class Pacer:
    """For each paced class, when it may next start on each backend."""

    def __init__(self, classes: Iterable[ClassSpec]) -> None:
        self._interval = {c.name: c.start_interval_s for c in classes if c.start_interval_s > 0}
        self._until: dict[tuple[str, str], float] = {}  # (backend, class) -> next start allowed at

    def reconfigure(self, classes: Iterable[ClassSpec]) -> None:
        """New intervals; a start already made keeps the bound it set."""
        self._interval = {c.name: c.start_interval_s for c in classes if c.start_interval_s > 0}

    def held(self, cls: str, now: float) -> list[str]:
        """Backends where a request of `cls` may not start at `now` (none for a class not paced)."""
        if cls not in self._interval:
            return []
        return [b for (b, c), until in self._until.items() if c == cls and until > now]

    def started(self, backend: str, cls: str, now: float) -> None:
        """A request of `cls` started (or was resumed) on `backend` at `now`."""
        interval = self._interval.get(cls)
        if interval is not None:
            self._until[(backend, cls)] = now + interval

    def expire(self, now: float) -> None:
        """Forget bounds that have passed (so `next_due` names only those still to come)."""
        self._until = {k: t for k, t in self._until.items() if t > now}

    def next_due(self) -> float | None:
        """The earliest instant a held class may start again somewhere, or None."""
        return min(self._until.values(), default=None)
