"""When a replica renews its leased part of each backend's slots: the one pacing that the gateway
(`gateway.shared.slots`, on asyncio, against Redis) and the replicas' discrete-event run
(`sim.replicas`, on virtual time) both follow. Pure: told the time and the replica's own counts.

A replica renews every third of a lease, so that its lease never runs out while it lives (one
renewal may be lost or late), and sooner whenever it falls `short`: requests wait in its queue
for a backend whose whole cap it does not hold, or it holds slots that neither its running nor
its waiting requests use (another replica may be waiting for them). It looks at its own counts
for that every `EAGER_S` (no round trip unless it renews).

    pacing = RenewalPacing(lease_s)
    if pacing.due(now, short(running, waiting, allotted, held, cap)): renew()
    look again at now + pacing.eager_s

What a renewal answers is `SlotStore`: the rule the renewal script in Redis
(`gateway.shared.scripts`) is the one other copy of, held to it by
`tests/functional/test_shared_slots.py`; the replicas' DES runs it in place of Redis.
"""

from __future__ import annotations

import math

EAGER_S = 0.05


def short(running: int, waiting: int, allotted: int, held: int, cap: int) -> bool:
    """Whether a replica's part of one backend's slots no longer fits what it has: requests wait
    here while it holds less than the cap, or it holds more than it runs and queues."""
    return bool(waiting and allotted < cap) or held > running + waiting


class RenewalPacing:
    """When the next renewal is due (see the module docstring)."""

    __slots__ = ("period_s", "eager_s", "_due")

    def __init__(self, lease_s: float, eager_s: float = EAGER_S) -> None:
        self.period_s = lease_s / 3
        self.eager_s = eager_s
        self._due = 0.0  # the first look renews

    def due(self, now: float, is_short: bool) -> bool:
        """Whether to renew at `now`; when it is, the next regular renewal is a period later."""
        if now < self._due and not is_short:
            return False
        self._due = now + self.period_s
        return True


class SlotStore:
    """Redis's side of one backend's slot allotments: every replica's lease and demand, and the
    part of the cap each may hold (a max-min fair share of it over their demands, never more than
    the others leave free, at least what it runs)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.allotted: dict[int, int] = {}
        self.demand: dict[int, int] = {}
        self.expiry: dict[int, float] = {}

    def renew(self, replica: int, demand: int, running: int, now: float, lease_s: float) -> tuple[int, int]:
        """What `replica` holds now, and its front's cap."""
        for r in [r for r, at in self.expiry.items() if at <= now]:
            del self.expiry[r]
            self.allotted.pop(r, None)
            self.demand.pop(r, None)
        self.expiry[replica] = now + lease_s
        self.demand[replica] = demand
        others = sum(v for r, v in self.allotted.items() if r != replica)
        demands = sorted(self.demand.values())
        left: float = self.cap
        level = None
        for i, d in enumerate(demands):
            share = left / (len(demands) - i)
            if d > share:
                level = share
                break
            left -= d
        part = demand if level is None else min(demand, math.ceil(level))
        allot = max(0, min(max(part, running), self.cap - others))
        self.allotted[replica] = allot
        return allot, min(allot, part)
