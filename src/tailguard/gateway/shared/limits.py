"""Callers' `rpm_limit`, `tpm_limit` and `max_parallel_requests` as one limit over every
replica: the same token buckets as `front.limits` (capacity a minute's worth, refilled
continuously, reserved at admission and settled to real use at the end) and the caller's places
in flight, kept in Redis and changed only by two Lua scripts (`scripts.RESERVE`, `scripts.SETTLE`),
each one round trip, with Redis's `TIME` as the one clock.

`reserve` takes a place, one request and the request's reservation from all of its caller's
limits, or from none (TensorZero's one Valkey script for all buckets; SGLang's model gateway
reserves and settles the same way). `settle` gives the place back and what was reserved and not
used (an overrun is taken as debt), or the whole reservation when the request never got in. A
bucket's key expires only once it would be full again, so an expiry never forgets a debt
(llm-d/llm-d-async#335: a counter that expired mid-flight over-admitted every window). A place
is a lease: one sorted-set entry per request in flight, scored by its expiry and renewed every
third of `state.lease_s` (all of this replica's in one pipelined round trip) while it runs, so
a replica that dies gives its callers' places back within a lease and no lost settlement leaks
one (LiteLLM's PR #28160 leaked one for good on a client's cancel).

Each answer carries the caller's shared bucket levels; `standing` says where the caller stands
from the last one this replica saw, refilled since: what the `x-ratelimit-*` headers say. What
`reserve` answers is a verdict, never a refusal of its own: the front is told it with the request
(`Arrive.shared`) and refuses what it refuses, so a recording holds every refusal and a replay
or the DES reproduces it. The front keeps its own buckets for the same caller, told only this
replica's traffic: they never bind before the shared ones do. While Redis is unavailable
(`link.Link`), `state.on_unavailable: local` has the front keep 1/N of each limit itself
(`LocalShare`, the same bucket rule), and `closed` makes every verdict for a limited caller
`shared_state_unavailable`.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, replace

from tailguard.clock import Now
from tailguard.front.events import SharedVerdict
from tailguard.front.limits import Standing, limited
from tailguard.front.params import CallerSpec
from tailguard.gateway.request import Ended, Request
from tailguard.gateway.shared.link import UNAVAILABLE, Link, stop
from tailguard.gateway.shared.scripts import RENEW_PLACES, RESERVE, SETTLE, Script
from tailguard.types import RejectReason

GRANTED = SharedVerdict()
UNAVAILABLE_VERDICT = SharedVerdict(RejectReason.SHARED_STATE_UNAVAILABLE, 1.0)

# A caller's shared buckets as last seen: when (the gateway's clock), and per kind (requests, tokens) its
# capacity and level then, or None for a limit the caller does not have.
_Seen = tuple[float, tuple[tuple[int, float] | None, tuple[int, float] | None]]


@dataclass(frozen=True, slots=True)
class Held:
    """What one request holds in Redis: a request and `tokens` from its caller's buckets, and
    `place`, its entry among its caller's places in flight ('' for none)."""

    caller: str
    tokens: int
    place: str = ""


def _keys(caller: str) -> tuple[str, str, str]:
    # One hash tag per caller: its keys live in one Redis Cluster slot, as one script needs.
    return f"tailguard:{{{caller}}}:rpm", f"tailguard:{{{caller}}}:tpm", f"tailguard:{{{caller}}}:parallel"


class SharedLimits:
    """See the module docstring.

        shared.start()                                             # the places' renewals
        verdict, held = await shared.reserve(caller, est_tokens)   # the front is told the verdict
        shared.standing(caller)                                    # for the x-ratelimit-* headers
        shared.settle(held, used_tokens, admitted=True)            # exactly once; returns at once
    """

    def __init__(self, link: Link, specs: list[CallerSpec], clock: Now) -> None:
        self.link = link
        self._clock = clock
        self._reserve, self._settle, self._renew = Script(RESERVE), Script(SETTLE), Script(RENEW_PLACES)
        self._specs: dict[str, CallerSpec] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self._seen: dict[str, _Seen] = {}
        self._places: dict[str, set[str]] = {}  # caller -> this replica's places in flight in Redis
        self._held: dict[str, Held] = {}  # by request id: what each of the gateway's requests holds
        self._ids = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self.reconfigure(specs)

    def reconfigure(self, specs: list[CallerSpec]) -> None:
        self._specs = {s.name: s for s in specs if limited(s)}
        self._seen = {c: seen for c, seen in self._seen.items() if c in self._specs}

    def local_share(self) -> int | None:
        """What the front keeps of each limit itself now (`LocalShare`): 1/N while Redis is
        unavailable under `on_unavailable: local`, else (None) the whole, never binding first."""
        if self.link.shared or self.link.cfg.on_unavailable != "local":
            return None
        return self.link.replicas

    def start(self) -> None:
        """The link's heartbeat, and the renewal of this replica's places every third of a lease."""
        self.link.start()
        self._task = asyncio.get_running_loop().create_task(self._renewing())

    async def reserve(self, caller: str, tokens: int) -> tuple[SharedVerdict | None, Held | None]:
        """Take a place, one request and `tokens` from every limit of `caller` in Redis, or from
        none: the verdict to tell the front with the request, and what it holds (for `settle`;
        None when nothing was taken). No verdict: the caller has no limits, or Redis is
        unavailable under `on_unavailable: local` (the front then keeps 1/N itself)."""
        spec = self._specs.get(caller)
        if spec is None:
            return None, None
        place = f"{self.link.id}:{next(self._ids):x}" if spec.max_parallel else ""
        keys, args = self._limits(spec, place, 1, max(1, tokens))
        answer = await self.link.call(lambda: self._reserve(self.link.redis, keys, args))
        if answer is None:
            return (UNAVAILABLE_VERDICT if self.link.cfg.on_unavailable == "closed" else None), None
        levels = [float(v) for v in answer[3:]]
        self._saw(spec, levels)
        if int(answer[0]) == 1:
            if place:
                self._places.setdefault(caller, set()).add(place)
            return GRANTED, Held(caller, tokens, place)
        reason = _reason(spec, int(answer[1]))
        limit, used = _use(spec, reason, levels)
        return SharedVerdict(reason, float(answer[2]), limit, used), None

    async def reserve_for(self, req: Request, tokens: int) -> SharedVerdict | None:
        """`reserve` for a request of the gateway's, whose hold is settled as it ends (`ended`)."""
        if req.caller is None:
            return None
        verdict, held = await self.reserve(req.caller, tokens)
        if held is not None:
            self._held[req.id] = held
        return verdict

    def ended(self, e: Ended) -> None:
        """A request ended (the gateway's one end): what it holds goes back, settled to what it
        used; all of it, its request too, when it never started (refused, or gone while queued)."""
        held = self._held.pop(e.request.id, None)
        if held is not None:
            req = e.request
            self.settle(held, req.used_tokens(), admitted=req.bound_at is not None)

    def settle(self, held: Held, used_tokens: int, *, admitted: bool) -> None:
        """The request ended having used `used_tokens`; `admitted`: it got past the front (else
        its request is given back too). Sent to Redis in the background: the end never waits."""
        spec = self._specs.get(held.caller)
        if held.place:
            self._places.get(held.caller, set()).discard(held.place)
        if spec is None:
            return
        back = held.tokens - (used_tokens if admitted else 0)
        keys, args = self._limits(spec, held.place, 0 if admitted else 1, back)
        if not held.place and all(a == 0 for a in args[5::2]):  # nothing to give back
            return
        task = asyncio.get_running_loop().create_task(self._send(spec, keys, args))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def standing(self, caller: str) -> tuple[Standing | None, Standing | None] | None:
        """Where `caller`'s shared buckets stand now, from the last answer this replica had from
        Redis refilled since; None when nothing is known of them here, or Redis is unavailable
        (the front's own buckets say then)."""
        if caller not in self._specs or not self.link.shared:
            return None
        now = self._clock()
        seen = self._seen.get(caller)
        if seen is None:
            return None
        at, (requests, tokens) = seen
        return _standing(requests, now - at), _standing(tokens, now - at)

    async def close(self) -> None:
        """Stop renewing; let the settlements in flight reach Redis (each bounded by
        `state.timeout_s`)."""
        await stop(self._task)
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    async def _send(self, spec: CallerSpec, keys: list[str], args: list[object]) -> None:
        levels = await self.link.call(lambda: self._settle(self.link.redis, keys, args))
        if levels is not None:
            self._saw(spec, [float(v) for v in levels])

    async def _renewing(self) -> None:
        """Every third of a lease, every place this replica holds is held one lease more: one
        pipelined round trip, whatever the number of callers and requests."""
        while True:
            await asyncio.sleep(self.link.cfg.lease_s / 3)
            lease_ms = int(self.link.cfg.lease_s * 1000)
            rows = [([_keys(c)[2]], [lease_ms, *places]) for c, places in self._places.items() if places]
            if not rows or not self.link.shared:
                continue
            try:
                await self._renew.pipelined(self.link.redis, rows)
            except UNAVAILABLE as err:
                self.link.lost(err)

    def _saw(self, spec: CallerSpec, levels: list[float]) -> None:
        """Keep the bucket levels a script answered, in the order `_limits` named the buckets."""
        found = iter(levels)
        kinds = tuple(None if not cap else (cap, next(found))
                      for cap in (spec.requests_per_minute, spec.tokens_per_minute))
        self._seen[spec.name] = (self._clock(), (kinds[0], kinds[1]))

    def _limits(self, spec: CallerSpec, place: str, requests: int, tokens: int) -> tuple[list[str], list[object]]:
        """The caller's keys and the scripts' args: its buckets, each with its capacity and an
        amount (what `reserve` takes, or what `settle` gives back; negative: debt), then its
        places when it has a parallel limit."""
        rpm, tpm, parallel = _keys(spec.name)
        keys: list[str] = []
        amounts: list[object] = []
        if spec.requests_per_minute:
            keys.append(rpm)
            amounts += [spec.requests_per_minute, requests]
        if spec.tokens_per_minute:
            keys.append(tpm)
            amounts += [spec.tokens_per_minute, tokens]
        n = len(keys)
        if spec.max_parallel:
            keys.append(parallel)
        head: list[object] = [n, spec.max_parallel or 0, place, int(self.link.cfg.lease_s * 1000)]
        return keys, head + amounts


def _reason(spec: CallerSpec, which: int) -> RejectReason:
    """The limit a refusal's 1-based index names: the buckets in `_limits`' order, then the places."""
    kinds = [k for k, cap in ((RejectReason.RATE_LIMIT_REQUESTS, spec.requests_per_minute),
                              (RejectReason.RATE_LIMIT_TOKENS, spec.tokens_per_minute)) if cap]
    return kinds[which - 1] if which <= len(kinds) else RejectReason.RATE_LIMIT_PARALLEL


def _standing(seen: tuple[int, float] | None, elapsed_s: float) -> Standing | None:
    """A bucket seen at `level` with capacity `cap`, `elapsed_s` ago, refilled since."""
    if seen is None:
        return None
    cap, level = seen
    level = min(float(cap), level + max(0.0, elapsed_s) * cap / 60)
    return Standing(cap, max(0, int(level)), (cap - level) * 60 / cap)


def _use(spec: CallerSpec, reason: RejectReason, levels: list[float]) -> tuple[int | None, int | None]:
    """The refusing limit and how much of it is used, from the levels a script answered (in the
    order `_limits` named the buckets): what the refusal's words say."""
    if reason is RejectReason.RATE_LIMIT_PARALLEL:
        return spec.max_parallel, spec.max_parallel
    caps = [cap for cap in (spec.requests_per_minute, spec.tokens_per_minute) if cap]
    k = 0 if reason is RejectReason.RATE_LIMIT_REQUESTS or not spec.requests_per_minute else 1
    if k >= len(levels):
        return None, None
    return caps[k], caps[k] - max(0, int(levels[k]))
