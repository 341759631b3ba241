"""What a request's decisions say of it, counted one way for every driver; pure.

A driver applies each decision about a request to that request's `Counts` as it carries it out
(the gateway's dispatcher into the request's record, the DES into its timeline), so the access
log, the metrics, a recording and a simulated run count attempts, retries, migrations,
suspensions and hedges alike: from what the front decided, never from what a driver worked out
for itself (a start after a wait was once counted by the exchange from what it had delivered).

    counts = Counts()
    for d in decisions_about_it:
        counts.apply(d)
"""

from __future__ import annotations

from dataclasses import dataclass

from tailguard.front.events import Decision, Drop, GiveUp, Start, StartMode, Suspend

# The decisions a request's counts follow.
COUNTED_DECISIONS = frozenset({Start, Suspend, GiveUp, Drop})
# Starts that send the request from its beginning: an attempt on the wire.
_FROM_THE_START = frozenset({StartMode.FRESH, StartMode.RETRY, StartMode.HEDGE})


@dataclass(slots=True)
class Counts:
    """One request's counters. `attempts`: each time it was sent from its start (its first run,
    a retry, a hedge); `retries`: the starts after a failure that sent it again from its start
    (on a fresh connection or another backend); `retries_denied`: a retry or migration its
    failure allowed, refused by a bound (attempts, migrations, the budget, no backend);
    `migrations`: continued elsewhere after its backend failed mid-answer; `preemptions`:
    suspended for another request; `hedges`: a second attempt sent beside the first;
    `hedges_won`: the second attempt streamed first."""

    attempts: int = 0
    retries: int = 0
    retries_denied: int = 0
    migrations: int = 0
    preemptions: int = 0
    hedges: int = 0
    hedges_won: int = 0
    hedge_on: str | None = None  # the backend of the hedge it runs, until one attempt wins

    def apply(self, d: Decision) -> None:
        """Count `d`, a decision about this request."""
        kind = type(d)
        if kind is Start:
            self._started(d)  # type: ignore[arg-type]
        elif kind is Suspend:
            self.preemptions += 1
        elif kind is GiveUp:
            if d.reason.denied:  # type: ignore[union-attr]
                self.retries_denied += 1
        elif kind is Drop:
            if not d.failed and d.winner == self.hedge_on:  # type: ignore[union-attr]
                self.hedges_won += 1
            self.hedge_on = None

    def _started(self, d: Start) -> None:
        mode = d.mode
        if mode in _FROM_THE_START:
            self.attempts += 1
        if mode is StartMode.RETRY:
            self.retries += 1
        elif mode is StartMode.MIGRATE:
            self.migrations += 1
        elif mode is StartMode.HEDGE:
            self.hedges += 1
            self.hedge_on = d.backend
