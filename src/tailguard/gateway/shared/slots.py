"""Each backend's `max_concurrency` as one count over every replica: each replica leases an
allotment of a backend's slots in Redis and tells its front that allotment as its cap
(`front.events.Allotted`), so the front stays pure and decides as ever within it.

One Lua script per backend, all of them sent in one pipelined round trip per renewal, with
Redis's `TIME` as the clock. A replica says what it wants (requests running there plus those
waiting in its queue) and what it runs; Redis keeps each replica's allotment and demand, and a
lease per replica scored by its expiry. The script first drops the replicas whose lease ran
out (a replica that died: its slots come back within `state.lease_s`), then gives this one its
fair part (water-filling the cap over the replicas' demands, as max-min fairness does) but never
more than the others leave free. It holds its part, or what it runs if that is more, and its
cap is its part: so the holdings never add up to more than the cap, and a replica that runs more
than its part (another arrived while it held everything) starts nothing until its requests
have ended down to its part, and then holds no more.

Before each renewal the replica lowers its cap to what it runs: no request starts while the
answer is on its way (the script counts what it was told is running, so one started meanwhile
would be counted nowhere). When it renews is `front.leases`' pacing, the same on virtual time
(`sim.replicas`): every third of a lease, and within `EAGER_S` of falling short. While Redis is
unavailable, a replica takes 1/N of each cap (N as for the limits), whatever
`state.on_unavailable` says.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tailguard.clock import Now
from tailguard.front.leases import RenewalPacing, short
from tailguard.gateway.shared.link import UNAVAILABLE, Link, stop
from tailguard.gateway.shared.scripts import Script

# KEYS: the backend's allotments, demands (hashes: replica -> slots) and leases (sorted set:
# replica -> expiry in ms). ARGV: replica, demand, running, cap, lease in ms. Returns what the
# replica holds now (its fair part, or what it runs if more) and its cap (no more than its part).
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, r in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
  redis.call('HDEL', KEYS[1], r)
  redis.call('HDEL', KEYS[2], r)
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local id, demand, running, cap, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('ZADD', KEYS[3], now + lease, id)
redis.call('HSET', KEYS[2], id, demand)
local others = 0
local held = redis.call('HGETALL', KEYS[1])
for i = 1, #held, 2 do
  if held[i] ~= id then others = others + tonumber(held[i + 1]) end
end
local demands = {}
for _, d in ipairs(redis.call('HVALS', KEYS[2])) do demands[#demands + 1] = tonumber(d) end
table.sort(demands)
local left, level = cap, nil
for i, d in ipairs(demands) do
  local share = left / (#demands - i + 1)
  if d > share then level = share break end
  left = left - d
end
local part = demand
if level ~= nil then part = math.min(demand, math.ceil(level)) end
local allot = math.max(0, math.min(math.max(part, running), cap - others))
redis.call('HSET', KEYS[1], id, allot)
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], lease * 3) end
return {allot, math.min(allot, part)}
"""


def _keys(backend: str) -> list[str]:
    tag = f"tailguard:slots:{{{backend}}}"  # one hash tag: one Redis Cluster slot per backend
    return [f"{tag}:allotted", f"{tag}:demand", f"{tag}:leases"]


class SlotLeases:
    """This replica's leases on its backends' slots (see the module docstring). `caps()` names
    the backends and their `max_concurrency` (read at each renewal: a reload's backends are
    shared from the next); `load(backend)` says (running here, waiting here); `allot(backend,
    slots)` tells the front its cap."""

    def __init__(self, link: Link, caps: Callable[[], dict[str, int]], load: Callable[[str], tuple[int, int]],
                 allot: Callable[[str, int | None], None], clock: Now) -> None:
        self.link = link
        self._clock = clock
        self._caps = caps
        self._load, self._allot = load, allot
        self._renew = Script(_RENEW)  # every backend in one pipeline: one round trip
        self.allotted: dict[str, int] = {}  # the cap told to the front
        self.held: dict[str, int] = {}  # what Redis counts as this replica's
        self._pacing = RenewalPacing(link.cfg.lease_s)
        self._task: asyncio.Task[None] | None = None

    @property
    def caps(self) -> dict[str, int]:
        return self._caps()

    def start(self) -> None:
        for b in self.caps:  # nothing starts before the first renewal says what is this replica's
            self._tell(b, 0)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        await stop(self._task)
        try:  # give the slots back at once rather than at the lease's end
            async with self.link.redis.pipeline(transaction=False) as pipe:
                for b in self.caps:
                    allotted, demand, leases = _keys(b)
                    for key in (allotted, demand):
                        pipe.hdel(key, self.link.id)
                    pipe.zrem(leases, self.link.id)
                await pipe.execute()
        except UNAVAILABLE:
            pass

    async def _run(self) -> None:
        """Renew when `front.leases`' pacing says so, looking at this replica's own counts every
        `eager_s`."""
        pacing = self._pacing
        while True:
            if pacing.due(self._clock(), self._short()):
                await self.renew()
            await asyncio.sleep(pacing.eager_s)

    def _short(self) -> bool:
        return any(short(*self._load(b), self.allotted.get(b, 0), self.held.get(b, 0), cap)
                   for b, cap in self.caps.items())

    async def renew(self) -> None:
        """One round trip: every backend's allotment renewed and told to the front."""
        caps = self.caps
        if not self.link.shared:
            self._local(caps)
            return
        lease_ms = int(self.link.cfg.lease_s * 1000)
        loads = {b: self._load(b) for b in caps}
        for b, (running, _) in loads.items():
            self._tell(b, min(running, self.allotted.get(b, 0)))  # nothing starts until the answer
        rows = [(_keys(b), [self.link.id, loads[b][0] + loads[b][1], loads[b][0], cap, lease_ms])
                for b, cap in caps.items()]
        try:
            answers = await self._renew.pipelined(self.link.redis, rows)
        except UNAVAILABLE as err:
            self.link.lost(err)
            self._local(caps)
            return
        for b, (held, allotted) in zip(caps, answers):
            self.held[b] = int(held)
            self._tell(b, int(allotted))

    def _local(self, caps: dict[str, int]) -> None:
        for b, cap in caps.items():
            self._tell(b, max(1, cap // self.link.replicas))

    def _tell(self, backend: str, slots: int) -> None:
        if self.allotted.get(backend) != slots:
            self.allotted[backend] = slots
            self._allot(backend, slots)
