"""Requests per minute, tokens per minute and requests at once per caller: a bucket each, told
the time; pure, no I/O.

A caller is an API key's name. Its request bucket holds `requests_per_minute` and refills at a
sixtieth of that per second: a request is let in while it holds one, and takes it (Envoy's local
rate limit, LiteLLM's `rpm_limit`). Its token bucket holds `tokens_per_minute` and works by
reservation, as TensorZero's and SGLang's model gateway's limiters do: a request arriving reserves
what it may cost (its prompt estimate plus its capped output limit) and is let in only if every
one of its caller's buckets can give what it needs at once, else none is touched; when it ends,
whatever the outcome, the reservation is settled against what it really used: the unused part
goes back, an overrun (an estimate that fell short) is taken as debt. A request needing more than
a whole minute's tokens waits for a full bucket, then takes it all and the rest as debt. A caller
also holds at most `max_parallel` requests queued or running. A refusal says when it may try again,
and the limit and its use then (what its words say).

Replicas that share limits through Redis check them there first (the verdict reaches the front
with the request: `Arrive.shared`), and these buckets, told this replica's traffic only, never
bind first. While Redis is unavailable and `state.on_unavailable` is `local`, each limit here is
1/N of itself (`share`), N the replicas last counted: the one bucket rule either way.

    limits = CallerLimits([CallerSpec("reports", requests_per_minute=60, tokens_per_minute=100_000)])
    refusal = limits.refusal("reports", need_tokens, now)   # None, or why and for how long
    held = limits.take("reports", need_tokens, now)         # once the request is in
    limits.settle("reports", held, used_tokens, now)        # exactly once, when it ends
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from tailguard.front.params import CallerSpec
from tailguard.front.refusal import Refusal
from tailguard.types import RejectReason


@dataclass(frozen=True, slots=True)
class Standing:
    """Where one of a caller's limits stands: what OpenAI's `x-ratelimit-*` headers say."""

    limit: int
    remaining: int  # whole requests or tokens the bucket holds now, reservations taken (0 in debt)
    reset_s: float  # until the bucket is full again


class _Bucket:
    """Capacity `per_minute`, refilled continuously; full when first used."""

    __slots__ = ("capacity", "rate", "level", "at")

    def __init__(self, per_minute: int) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self.level = self.capacity
        self.at: float | None = None

    def refill(self, now: float) -> float:
        """The level at `now` (time never runs back: an earlier `now` changes nothing)."""
        if self.at is None:
            self.at = now
        elif now > self.at:
            self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
            self.at = now
        return self.level

    def wait_s(self, need: float, now: float) -> float:
        """Seconds until the bucket holds `need`, or its whole capacity if `need` is more (0
        when it does now)."""
        short = min(need, self.capacity) - self.refill(now)
        return short / self.rate if short > 0 else 0.0

    def standing(self, now: float) -> Standing:
        """Where it stands at `now`, read without refilling it: a view must change nothing, or
        a replay (which reads no views) would refill at other instants and round otherwise."""
        level = self.level if self.at is None or now <= self.at else min(
            self.capacity, self.level + (now - self.at) * self.rate)
        return Standing(int(self.capacity), max(0, int(level)), (self.capacity - level) / self.rate)

    def resize(self, per_minute: int) -> None:
        self.capacity, self.rate = float(per_minute), per_minute / 60.0
        self.level = min(self.level, self.capacity)


class _Caller:
    __slots__ = ("requests", "tokens", "max_parallel", "in_flight")

    def __init__(self, spec: CallerSpec) -> None:
        self.requests = _Bucket(spec.requests_per_minute) if spec.requests_per_minute else None
        self.tokens = _Bucket(spec.tokens_per_minute) if spec.tokens_per_minute else None
        self.max_parallel = spec.max_parallel
        self.in_flight = 0

    def follow(self, spec: CallerSpec) -> None:
        """New limits, keeping what the caller has used (a bucket shrinks to its new capacity)."""
        self.requests = _resized(self.requests, spec.requests_per_minute)
        self.tokens = _resized(self.tokens, spec.tokens_per_minute)
        self.max_parallel = spec.max_parallel

    def refill(self) -> None:
        """Every bucket full, at the capacity it has."""
        for bucket in (self.requests, self.tokens):
            if bucket is not None:
                bucket.level = bucket.capacity


def _resized(bucket: _Bucket | None, per_minute: int | None) -> _Bucket | None:
    if not per_minute:
        return None
    if bucket is None:
        return _Bucket(per_minute)
    bucket.resize(per_minute)
    return bucket


def _refused(reason: RejectReason, wait_s: float, bucket: _Bucket, now: float) -> Refusal:
    s = bucket.standing(now)
    return Refusal(reason, wait_s, s.limit, s.limit - s.remaining)


def _part(spec: CallerSpec, n: int) -> CallerSpec:
    """1/n of each of a caller's limits (at least 1 each)."""
    if n == 1:
        return spec

    def part(v: int | None) -> int | None:
        return None if not v else max(1, v // n)
    return replace(spec, requests_per_minute=part(spec.requests_per_minute),
                   tokens_per_minute=part(spec.tokens_per_minute), max_parallel=part(spec.max_parallel))


def limited(spec: CallerSpec) -> bool:
    """Whether the caller has any limit to keep (else it is never refused, nor asked about)."""
    return bool(spec.requests_per_minute or spec.tokens_per_minute or spec.max_parallel)


class CallerLimits:
    """The buckets of every caller that has limits (see the module docstring). A caller with
    none is never refused; a request with no caller (no keys configured) is never asked about."""

    def __init__(self, specs: Iterable[CallerSpec] = ()) -> None:
        self._callers: dict[str, _Caller] = {}
        self._specs: list[CallerSpec] = []
        self._share = 1
        self.reconfigure(specs)

    def reconfigure(self, specs: Iterable[CallerSpec]) -> None:
        """A live reload: new limits apply from now, and a caller keeps what it has used and
        what it holds (requests in flight settle against the buckets they reserved from)."""
        self._specs = list(specs)
        self._follow()

    def share(self, replicas: int | None) -> None:
        """Enforce 1/`replicas` of each limit here (at least one of each), or (None) each whole
        again. Each bucket starts full at its new size: while Redis decided, what a caller used
        was counted there, not here, so going local it has a fresh 1/N here (as a replica that
        had just started would), and once Redis is back this replica's own buckets never bind
        before the shared ones. Its requests in flight stay counted."""
        self._share = replicas or 1
        self._follow()
        for c in self._callers.values():
            c.refill()

    def _follow(self) -> None:
        callers: dict[str, _Caller] = {}
        for s in (_part(spec, self._share) for spec in self._specs):
            if not limited(s):
                continue
            c = self._callers.get(s.name)
            if c is None:
                c = _Caller(s)
            else:
                c.follow(s)
            callers[s.name] = c
        self._callers = callers

    def refusal(self, caller: str, need_tokens: int, now: float) -> Refusal | None:
        """Why `caller` may not send a request reserving `need_tokens` now, or None."""
        c = self._callers.get(caller)
        if c is None:
            return None
        if c.max_parallel is not None and c.in_flight >= c.max_parallel:
            # No bucket says when one ends: a second is what a client polling for it waits.
            return Refusal(RejectReason.RATE_LIMIT_PARALLEL, 1.0, c.max_parallel, c.in_flight)
        if c.requests is not None:
            wait = c.requests.wait_s(1.0, now)
            if wait > 0:
                return _refused(RejectReason.RATE_LIMIT_REQUESTS, wait, c.requests, now)
        if c.tokens is not None:
            wait = c.tokens.wait_s(max(1.0, need_tokens), now)
            if wait > 0:
                return _refused(RejectReason.RATE_LIMIT_TOKENS, wait, c.tokens, now)
        return None

    def take(self, caller: str, need_tokens: int, now: float) -> int:
        """Let a request in (after `refusal` said None at this `now`): one request, a place in
        flight and `need_tokens` reserved. Returns the tokens it holds, to give `settle`."""
        c = self._callers.get(caller)
        if c is None:
            return 0
        c.in_flight += 1
        if c.requests is not None:
            c.requests.refill(now)
            c.requests.level -= 1.0
        if c.tokens is None or need_tokens <= 0:
            return 0
        c.tokens.refill(now)
        c.tokens.level -= need_tokens
        return need_tokens

    def settle(self, caller: str, held_tokens: int, used_tokens: int, now: float) -> None:
        """A request of `caller` that `take` let in ended, whatever the outcome, having used
        `used_tokens` (prompt and generated): what it held and did not use goes back, what it used
        past that is taken."""
        c = self._callers.get(caller)
        if c is None:
            return  # its limits were removed while it ran
        c.in_flight = max(0, c.in_flight - 1)
        if c.tokens is not None and held_tokens != used_tokens:
            c.tokens.refill(now)
            c.tokens.level = min(c.tokens.capacity, c.tokens.level + held_tokens - used_tokens)

    def standing(self, caller: str, now: float) -> tuple[Standing | None, Standing | None]:
        """Where the caller's request and token limits stand (None: no such limit)."""
        c = self._callers.get(caller)
        if c is None:
            return None, None
        return (c.requests.standing(now) if c.requests is not None else None,
                c.tokens.standing(now) if c.tokens is not None else None)
