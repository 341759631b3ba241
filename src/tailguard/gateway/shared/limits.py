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
from the last one this replica saw, refilled since: what the `x-ratelimit-*` headers say. The
front keeps its own buckets and parallel count for the same caller, told only this replica's
traffic: they never bind before the shared ones do. While Redis is unavailable (`link.Link`),
`state.on_unavailable: local` enforces 1/N of each limit here with the front's own pure
`CallerLimits`, and `closed` refuses callers that have limits.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, replace

from tailguard.clock import monotonic
from tailguard.errors import APIError, Overloaded
from tailguard.front.limits import CallerLimits, Standing, limited
from tailguard.front.refusal import Refusal
from tailguard.front.params import CallerSpec
from tailguard.gateway.dispatch import overloaded
from tailguard.gateway.shared.link import UNAVAILABLE, Link, stop
from tailguard.gateway.shared.scripts import RENEW_PLACES, RESERVE, SETTLE, Script
from tailguard.wire.openai import duration_text
from tailguard.types import RejectReason

UNAVAILABLE_CODE = "shared_state_unavailable"

# A caller's shared buckets as last seen: when (monotonic), and per kind (requests, tokens) its
# capacity and level then, or None for a limit the caller does not have.
_Seen = tuple[float, tuple[tuple[int, float] | None, tuple[int, float] | None]]


@dataclass(frozen=True, slots=True)
class Held:
    """What one admitted request holds: in Redis (`shared`) or in the local share; `place`, its
    entry among its caller's places in flight in Redis ('' for none)."""

    caller: str
    tokens: int
    shared: bool
    place: str = ""


def _keys(caller: str) -> tuple[str, str, str]:
    # One hash tag per caller: its keys live in one Redis Cluster slot, as one script needs.
    return f"tailguard:{{{caller}}}:rpm", f"tailguard:{{{caller}}}:tpm", f"tailguard:{{{caller}}}:parallel"


def _share(spec: CallerSpec, n: int) -> CallerSpec:
    """1/n of each of a caller's limits (at least 1 each)."""
    def part(v: int | None) -> int | None:
        return None if not v else max(1, v // n)
    return replace(spec, requests_per_minute=part(spec.requests_per_minute),
                   tokens_per_minute=part(spec.tokens_per_minute), max_parallel=part(spec.max_parallel))


class SharedLimits:
    """See the module docstring.

        shared.start()                                    # the places' renewals
        held = await shared.reserve(caller, est_tokens)   # raises RateLimited / Overloaded
        shared.standing(caller)                           # for the x-ratelimit-* headers
        shared.settle(held, used_tokens, admitted=True)   # exactly once; returns at once
    """

    def __init__(self, link: Link, specs: list[CallerSpec]) -> None:
        self.link = link
        self._reserve, self._settle, self._renew = Script(RESERVE), Script(SETTLE), Script(RENEW_PLACES)
        self._specs: dict[str, CallerSpec] = {}
        self._local = CallerLimits()
        self._pending: set[asyncio.Task[None]] = set()
        self._seen: dict[str, _Seen] = {}
        self._places: dict[str, set[str]] = {}  # caller -> this replica's places in flight in Redis
        self._ids = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self.reconfigure(specs)

    def reconfigure(self, specs: list[CallerSpec]) -> None:
        self._specs = {s.name: s for s in specs if limited(s)}
        self._seen = {c: seen for c, seen in self._seen.items() if c in self._specs}
        self.follow_link()

    def follow_link(self) -> None:
        """Redis went away or came back: the local share restarts from full buckets of 1/N."""
        self._local = CallerLimits(_share(s, self.link.replicas) for s in self._specs.values())

    def start(self) -> None:
        """The link's heartbeat, and the renewal of this replica's places every third of a lease."""
        self.link.start()
        self._task = asyncio.get_running_loop().create_task(self._renewing())

    async def reserve(self, caller: str, tokens: int) -> Held | None:
        """Take a place, one request and `tokens` from every limit of `caller`, or raise the
        refusal (`RateLimited`, 429 with Retry-After; `Overloaded`, 503, when Redis is
        unavailable and `on_unavailable` is `closed`). None: the caller has no limits."""
        spec = self._specs.get(caller)
        if spec is None:
            return None
        place = f"{self.link.id}:{next(self._ids):x}" if spec.max_parallel else ""
        keys, args = self._limits(spec, place, 1, max(1, tokens))
        answer = await self.link.call(lambda: self._reserve(self.link.redis, keys, args))
        if answer is not None:
            self._saw(spec, answer[3:])
            if int(answer[0]) == 1:
                if place:
                    self._places.setdefault(caller, set()).add(place)
                return Held(caller, tokens, True, place)
            raise _refused(caller, spec, Refusal(_reason(spec, int(answer[1])), float(answer[2])))
        if self.link.cfg.on_unavailable == "closed":
            raise Overloaded("The gateway cannot reach its shared state (Redis) to check this caller's limits; "
                             "retry later.", code=UNAVAILABLE_CODE, retry_after_s=1.0,
                             headers={"X-Tailguard-Reject-Reason": UNAVAILABLE_CODE})
        now = monotonic()
        refusal = self._local.refusal(caller, tokens, now)
        if refusal is not None:
            raise _refused(caller, spec, refusal)
        return Held(caller, self._local.take(caller, tokens, now), False)

    def settle(self, held: Held, used_tokens: int, *, admitted: bool) -> None:
        """The request ended having used `used_tokens`; `admitted`: it got past the front (else
        its request is given back too). Sent to Redis in the background: the end never waits."""
        spec = self._specs.get(held.caller)
        if held.place:
            self._places.get(held.caller, set()).discard(held.place)
        if spec is None:
            return
        if not held.shared:
            self._local.settle(held.caller, held.tokens, 0 if not admitted else used_tokens, monotonic())
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
        Redis refilled since (the local share's while Redis is unavailable); None when nothing
        is known of them here."""
        if caller not in self._specs:
            return None
        now = monotonic()
        if not self.link.shared:
            return self._local.standing(caller, now)
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
            self._saw(spec, levels)

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

    def _saw(self, spec: CallerSpec, levels: list[bytes]) -> None:
        """Keep the bucket levels a script answered, in the order `_limits` named the buckets."""
        found = iter(float(v) for v in levels)
        kinds = tuple(None if not cap else (cap, next(found))
                      for cap in (spec.requests_per_minute, spec.tokens_per_minute))
        self._seen[spec.name] = (monotonic(), (kinds[0], kinds[1]))

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


def _refused(caller: str, spec: CallerSpec, refusal: Refusal) -> APIError:
    """OpenAI's 429 for a shared limit, worded as the front's own (`Dispatcher._rate_message`)."""
    what, limit = {
        RejectReason.RATE_LIMIT_REQUESTS: ("requests per min (RPM)", spec.requests_per_minute),
        RejectReason.RATE_LIMIT_TOKENS: ("tokens per min (TPM)", spec.tokens_per_minute),
        RejectReason.RATE_LIMIT_PARALLEL: ("requests at once (max_parallel_requests)", spec.max_parallel),
    }[refusal.reason]
    return overloaded(refusal.reason, refusal.retry_after_s,
                      f"Rate limit reached for caller '{caller}' on {what} over all replicas: Limit {limit}. "
                      f"Please try again in {duration_text(refusal.retry_after_s)}.")
