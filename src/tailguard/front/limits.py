"""Requests and tokens per minute per caller: a token bucket each, told the time; pure, no I/O.

A caller is an API key's name. Its request bucket holds `requests_per_minute` and refills at a
sixtieth of that per second: a request is let in while it holds one, and takes it (Envoy's
local rate limit, LiteLLM's `rpm_limit`). Its token bucket holds `tokens_per_minute`; what a
request costs is known only when it ends (prompt and generated tokens), so it is charged then and
may leave the bucket in debt, and the caller's next requests wait until the debt is paid back
(LiteLLM's `tpm_limit` counts usage the same way). A refusal says when the caller may try again.

    limits = CallerLimits([CallerSpec("reports", requests_per_minute=60, tokens_per_minute=100_000)])
    refusal = limits.refusal("reports", now)     # None, or why and for how long
    limits.take_request("reports", now)          # once the request is in
    limits.charge("reports", tokens, now)        # when it ends
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tailguard.front.params import CallerSpec
from tailguard.types import RejectReason


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: RejectReason  # RATE_LIMIT_REQUESTS | RATE_LIMIT_TOKENS
    retry_after_s: float


@dataclass(frozen=True, slots=True)
class Standing:
    """Where one of a caller's limits stands: what OpenAI's `x-ratelimit-*` headers say."""

    limit: int
    remaining: int  # whole requests or tokens the bucket holds now (0 in debt)
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
        """Seconds until the bucket holds `need` (0 when it does now)."""
        short = need - self.refill(now)
        return short / self.rate if short > 0 else 0.0

    def standing(self, now: float) -> Standing:
        level = self.refill(now)
        return Standing(int(self.capacity), max(0, int(level)), (self.capacity - level) / self.rate)

    def resize(self, per_minute: int) -> None:
        self.capacity, self.rate = float(per_minute), per_minute / 60.0
        self.level = min(self.level, self.capacity)


class _Caller:
    __slots__ = ("requests", "tokens")

    def __init__(self, spec: CallerSpec) -> None:
        self.requests = _Bucket(spec.requests_per_minute) if spec.requests_per_minute else None
        self.tokens = _Bucket(spec.tokens_per_minute) if spec.tokens_per_minute else None

    def follow(self, spec: CallerSpec) -> None:
        """New limits, keeping what the caller has used (a bucket shrinks to its new capacity)."""
        self.requests = _resized(self.requests, spec.requests_per_minute)
        self.tokens = _resized(self.tokens, spec.tokens_per_minute)


def _resized(bucket: _Bucket | None, per_minute: int | None) -> _Bucket | None:
    if not per_minute:
        return None
    if bucket is None:
        return _Bucket(per_minute)
    bucket.resize(per_minute)
    return bucket


class CallerLimits:
    """The buckets of every caller that has limits (see the module docstring). A caller with
    none is never refused; a request with no caller (no keys configured) is never asked about."""

    def __init__(self, specs: Iterable[CallerSpec] = ()) -> None:
        self._callers: dict[str, _Caller] = {}
        self.reconfigure(specs)

    def reconfigure(self, specs: Iterable[CallerSpec]) -> None:
        """A live reload: new limits apply from now, and a caller keeps what it has used."""
        callers: dict[str, _Caller] = {}
        for s in specs:
            if not (s.requests_per_minute or s.tokens_per_minute):
                continue
            c = self._callers.get(s.name)
            if c is None:
                c = _Caller(s)
            else:
                c.follow(s)
            callers[s.name] = c
        self._callers = callers

    def refusal(self, caller: str, now: float) -> Refusal | None:
        """Why `caller` may not send a request now, or None."""
        c = self._callers.get(caller)
        if c is None:
            return None
        if c.requests is not None:
            wait = c.requests.wait_s(1.0, now)
            if wait > 0:
                return Refusal(RejectReason.RATE_LIMIT_REQUESTS, wait)
        if c.tokens is not None:
            # In debt: wait until it is paid back and a little is free again.
            wait = c.tokens.wait_s(min(1.0, c.tokens.capacity), now)
            if wait > 0:
                return Refusal(RejectReason.RATE_LIMIT_TOKENS, wait)
        return None

    def take_request(self, caller: str, now: float) -> None:
        c = self._callers.get(caller)
        if c is not None and c.requests is not None:
            c.requests.refill(now)
            c.requests.level -= 1.0

    def charge(self, caller: str, tokens: int, now: float) -> None:
        """A request of `caller` ended having used `tokens` (prompt and generated)."""
        c = self._callers.get(caller)
        if c is not None and c.tokens is not None and tokens > 0:
            c.tokens.refill(now)
            c.tokens.level -= tokens

    def standing(self, caller: str, now: float) -> tuple[Standing | None, Standing | None]:
        """Where the caller's request and token limits stand (None: no such limit)."""
        c = self._callers.get(caller)
        if c is None:
            return None, None
        return (c.requests.standing(now) if c.requests is not None else None,
                c.tokens.standing(now) if c.tokens is not None else None)
