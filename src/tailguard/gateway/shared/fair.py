"""The fair-share counters (`scheduler.fair_share`) as one set over every replica: each replica
adds the service its front gave each caller into one Redis hash and absorbs what the others
added since its last look (`front.events.ServedElsewhere`), so a caller that floods one replica
waits behind the others' callers on every replica, and the front stays pure.

One script per exchange, every `state.lease_s / 3` with the slot leases' pace: it adds this
replica's service and returns every caller's total. What the others gave is the total less what
this replica saw at its last look and less what it just added. The hash carries a generation
(a random id written when the hash is made), so a Redis restarted empty is seen as such: the
replica then counts from the new hash's totals, never a drop of everything it saw before.
Service not added while Redis is unavailable is kept and added at the next exchange; each
replica's own counters go on meanwhile, as they do without shared state.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping

from tailguard.gateway.shared.link import UNAVAILABLE, Link, stop
from tailguard.gateway.shared.scripts import Script

KEY = "tailguard:fair"
_GENERATION = "\x00generation"  # no caller's name: names are printable

# KEYS[1]: the counters' hash. ARGV: a generation for a new hash, then caller and service pairs.
# Returns the hash whole (its generation among the fields).
_EXCHANGE = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 and #ARGV == 2 then
  return redis.call('HGETALL', KEYS[1])
end
for i = 3, #ARGV, 2 do redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1]) end
return redis.call('HGETALL', KEYS[1])
"""


class SharedFairShare:
    """This replica's part in the shared fair-share counters (see the module docstring).
    `take()` is the service its front gave since the last call; `tell(others)` hands the
    front what the other replicas gave; `enabled()`, whether the running config shares by
    callers at all (without it, and with nothing to add, no round trip is made)."""

    def __init__(self, link: Link, take: Callable[[], dict[str, float]],
                 tell: Callable[[dict[str, float]], None], enabled: Callable[[], bool]) -> None:
        self.link = link
        self._take, self._tell, self._enabled = take, tell, enabled
        self._script = Script(_EXCHANGE)
        self._unsent: dict[str, float] = {}
        self._seen: dict[str, float] = {}  # every caller's total at the last look
        self._generation: str | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        await stop(self._task)
        await self.exchange()  # the last service given here counts for the others

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.link.cfg.lease_s / 3)
            await self.exchange()

    async def exchange(self) -> None:
        """One round trip: add this replica's service, absorb the others'."""
        _add(self._unsent, self._take())
        if not self.link.shared or not (self._unsent or self._enabled()):
            return  # nothing to add, and (fair share off) nothing to absorb
        sending, self._unsent = self._unsent, {}
        args: list[object] = [_GENERATION, os.urandom(8).hex()]
        for caller, amount in sending.items():
            args += [caller, repr(amount)]
        try:
            flat = await self._script(self.link.redis, [KEY], args)
        except UNAVAILABLE as err:
            self.link.lost(err)
            _add(self._unsent, sending)  # kept for the next exchange, with what was given meanwhile
            return
        fields = {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}
        generation = fields.pop(_GENERATION, "")
        totals = {caller: float(v) for caller, v in fields.items()}
        others = self._others(totals, sending, fresh=generation != self._generation)
        self._generation, self._seen = generation, totals
        if others:
            self._tell(others)

    def _others(self, totals: Mapping[str, float], sent: Mapping[str, float], fresh: bool) -> dict[str, float]:
        """What the other replicas gave each caller since the last look: its total less what
        was seen then (nothing when the hash is new to this replica) and less what was just sent."""
        seen: Mapping[str, float] = {} if fresh else self._seen
        out = {}
        for caller, total in totals.items():
            amount = total - seen.get(caller, 0.0) - sent.get(caller, 0.0)
            if abs(amount) > 1e-9:
                out[caller] = amount
        return out


def _add(into: dict[str, float], amounts: Mapping[str, float]) -> None:
    for caller, amount in amounts.items():
        into[caller] = into.get(caller, 0.0) + amount


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
