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
"""

from __future__ import annotations

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
