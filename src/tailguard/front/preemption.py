"""Which running request to suspend so that a waiting one of higher priority can start; pure.

The front (`tailguard.front.front`) asks it, whoever drives the front: when the scheduler's best
queued request fits on no backend, is there a running request whose slot it may take? A victim is suspended, not killed: its generation so far is kept and it is resumed later
from there (docs/architecture.md, "Preemption"), so the price of a preemption is one re-prefill of
prompt + text so far, not the work already done.

    policy = PreemptionPolicy(max_preemptions=16, min_run_s=0.0)
    victim = policy.victim(head, candidates, now, fits=lambda c: pool_fits(c.backend, head, c.cls))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tailguard.front.params import PreemptionParams
from tailguard.front.queue import Pending


@dataclass(slots=True, frozen=True)
class Candidate:
    """A running request that could be suspended (its class is preemptible and its backend can
    continue a generation; the caller lists only those)."""

    id: str
    cls: str
    rank: int
    backend: str
    remaining_tokens: int  # output tokens still to generate (max_tokens - generated so far)
    preemptions: int  # times it was suspended already
    running_since: float  # when its current run started (bound to a slot)
    # Of the waiting request's own rank, its caller over its fair share (`front.fairqueue`): it
    # qualifies though not of a lower priority, after every candidate that is.
    displaced: bool = False


@dataclass(slots=True, frozen=True)
class PreemptionPolicy:
    """Pick the victim for a waiting request, or none.

    A candidate qualifies when it is of a strictly lower priority (higher rank) than the waiting
    request, or of the same rank and `displaced` (its caller is over its fair share), has been
    suspended fewer than `max_preemptions` times, has run for at least `min_run_s` since it last
    started, has work left, and `fits` says that freeing its slot lets the waiting request in (its
    backend is healthy and the class shares allow it). A lower priority goes before a displaced
    one; among those, the one with the most remaining work goes: it would hold its slot longest,
    and it is the one whose suspension delays its own completion least in relative terms. Ties:
    the most recently started (least progress lost to the re-prefill), then the id, so the choice
    is deterministic.
    """

    max_preemptions: int = 16
    min_run_s: float = 0.0

    @classmethod
    def from_params(cls, params: PreemptionParams, queue_policy: str) -> PreemptionPolicy | None:
        """The policy `params` ask for, or None when preemption is off (or the queue policy is
        `fcfs`, the baseline, which never reorders running work)."""
        if not params.enabled or queue_policy == "fcfs" or params.max_preemptions_per_request == 0:
            return None
        return cls(max_preemptions=params.max_preemptions_per_request, min_run_s=params.min_run_s)

    def victim(
        self, waiting: Pending, running: Iterable[Candidate], now: float, fits: Callable[[Candidate], bool],
    ) -> Candidate | None:
        best: Candidate | None = None
        for c in running:
            if (
                c.rank < waiting.rank
                or (c.rank == waiting.rank and not c.displaced)
                or c.preemptions >= self.max_preemptions
                or now - c.running_since < self.min_run_s
                or c.remaining_tokens <= 0
            ):
                continue
            if best is not None and _preference(c) <= _preference(best):
                continue
            if fits(c):
                best = c
        return best


def _preference(c: Candidate) -> tuple[bool, int, float, str]:
    """The larger, the likelier a victim (`PreemptionPolicy.victim`'s order)."""
    return (not c.displaced, c.remaining_tokens, c.running_since, c.id)
