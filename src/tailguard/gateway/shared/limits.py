"""Callers' `rpm_limit` and `tpm_limit` as one limit over every replica: the same token buckets
as `front.limits` (capacity a minute's worth, refilled continuously, reserved at admission and
settled to real use at the end), kept in Redis and changed only by two Lua scripts, each one
round trip, with Redis's `TIME` as the one clock.

`reserve` takes one request and the request's reservation from all of its caller's buckets, or
from none (TensorZero's one Valkey script for all buckets; SGLang's model gateway reserves and
settles the same way). `settle` gives back what was reserved and not used (an overrun is taken as
debt), or the whole reservation when the request never got in. A bucket's key expires only once
it would be full again, so an expiry never forgets a debt (llm-d/llm-d-async#335: a counter that
expired mid-flight over-admitted every window).

The front keeps its own buckets for the same caller, told only this replica's traffic: they never
bind before the shared ones do, and `max_parallel_requests` stays per replica. While Redis is
unavailable (`link.Link`), `state.on_unavailable: local` enforces 1/N of each limit here with the
front's own pure `CallerLimits`, and `closed` refuses callers that have limits.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from tailguard.clock import monotonic
from tailguard.errors import APIError, Overloaded
from tailguard.front.limits import CallerLimits, Refusal
from tailguard.front.params import CallerSpec
from tailguard.gateway.dispatch import overloaded
from tailguard.gateway.shared.link import Link
from tailguard.wire.openai import duration_text
from tailguard.types import RejectReason

# KEYS[i]: a bucket (a hash of its level and when it was last refilled); ARGV[2i-1], ARGV[2i]: its
# capacity per minute and what this request needs from it. All or none: returns {1} having taken
# from every bucket, or {0, i, wait_s} naming the first that cannot give and when it could.
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local levels = {}
for i = 1, #KEYS do
  local cap, need = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local b = redis.call('HMGET', KEYS[i], 'level', 'at')
  local level = cap
  if b[1] then level = math.min(cap, tonumber(b[1]) + math.max(0, now - tonumber(b[2])) * cap / 60) end
  local short = math.min(need, cap) - level
  if short > 0 then return {0, i, tostring(short * 60 / cap)} end
  levels[i] = level
end
for i = 1, #KEYS do
  local cap, need = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local left = levels[i] - need
  redis.call('HSET', KEYS[i], 'level', tostring(left), 'at', tostring(now))
  redis.call('PEXPIRE', KEYS[i], math.ceil((cap - left) * 60000 / cap) + 1000)
end
return {1}
"""

# KEYS[i]: a bucket; ARGV[2i-1], ARGV[2i]: its capacity and what goes back to it (negative: debt).
_SETTLE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
for i = 1, #KEYS do
  local cap, back = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local b = redis.call('HMGET', KEYS[i], 'level', 'at')
  local level = cap
  if b[1] then level = math.min(cap, tonumber(b[1]) + math.max(0, now - tonumber(b[2])) * cap / 60) end
  level = math.min(cap, level + back)
  redis.call('HSET', KEYS[i], 'level', tostring(level), 'at', tostring(now))
  redis.call('PEXPIRE', KEYS[i], math.ceil((cap - level) * 60000 / cap) + 1000)
end
return 1
"""

_REASONS = (RejectReason.RATE_LIMIT_REQUESTS, RejectReason.RATE_LIMIT_TOKENS)
UNAVAILABLE_CODE = "shared_state_unavailable"


@dataclass(frozen=True, slots=True)
class Held:
    """What one admitted request holds: in Redis (`shared`) or in the local share."""

    caller: str
    tokens: int
    shared: bool


def _keys(caller: str) -> tuple[str, str]:
    # One hash tag per caller: both buckets live in one Redis Cluster slot, as one script needs.
    return f"tailguard:{{{caller}}}:rpm", f"tailguard:{{{caller}}}:tpm"


def _share(spec: CallerSpec, n: int) -> CallerSpec:
    """1/n of a caller's per-minute limits (at least 1 each); its parallel limit is the front's."""
    def part(v: int | None) -> int | None:
        return None if not v else max(1, v // n)
    return replace(spec, requests_per_minute=part(spec.requests_per_minute),
                   tokens_per_minute=part(spec.tokens_per_minute), max_parallel=None)


class SharedLimits:
    """See the module docstring.

        held = await shared.reserve(caller, est_tokens)   # raises RateLimited / Overloaded
        shared.settle(held, used_tokens, admitted=True)   # exactly once; returns at once
    """

    def __init__(self, link: Link, specs: list[CallerSpec]) -> None:
        self.link = link
        self._reserve = link.redis.register_script(_RESERVE)
        self._settle = link.redis.register_script(_SETTLE)
        self._specs: dict[str, CallerSpec] = {}
        self._local = CallerLimits()
        self._pending: set[asyncio.Task[None]] = set()
        self.reconfigure(specs)

    def reconfigure(self, specs: list[CallerSpec]) -> None:
        self._specs = {s.name: s for s in specs if s.requests_per_minute or s.tokens_per_minute}
        self.follow_link()

    def follow_link(self) -> None:
        """Redis went away or came back: the local share restarts from full buckets of 1/N."""
        self._local = CallerLimits(_share(s, self.link.replicas) for s in self._specs.values())

    async def reserve(self, caller: str, tokens: int) -> Held | None:
        """Take one request and `tokens` from every bucket of `caller`, or raise the refusal
        (`RateLimited`, 429 with Retry-After; `Overloaded`, 503, when Redis is unavailable and
        `on_unavailable` is `closed`). None: the caller has no shared limits."""
        spec = self._specs.get(caller)
        if spec is None:
            return None
        keys, args = self._buckets(spec, 1, max(1, tokens))
        answer = await self.link.call(lambda: self._reserve(keys=keys, args=args))
        if answer is not None:
            if int(answer[0]) == 1:
                return Held(caller, tokens, True)
            which = keys[int(answer[1]) - 1]
            reason = _REASONS[0] if which.endswith(":rpm") else _REASONS[1]
            raise _refused(caller, spec, Refusal(reason, float(answer[2])))
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
        if spec is None:
            return
        if not held.shared:
            self._local.settle(held.caller, held.tokens, 0 if not admitted else used_tokens, monotonic())
            return
        back = held.tokens - (used_tokens if admitted else 0)
        keys, args = self._buckets(spec, 0 if admitted else 1, back)
        if not keys or all(a == 0 for a in args[1::2]):
            return
        task = asyncio.get_running_loop().create_task(self._send(keys, args))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def close(self) -> None:
        """Let the settlements in flight reach Redis (each bounded by `state.timeout_s`)."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    async def _send(self, keys: list[str], args: list[int]) -> None:
        await self.link.call(lambda: self._settle(keys=keys, args=args))

    @staticmethod
    def _buckets(spec: CallerSpec, requests: int, tokens: int) -> tuple[list[str], list[int]]:
        """The caller's buckets and, for each, its capacity and an amount: what `reserve` takes,
        or what `settle` gives back (negative: debt)."""
        rpm, tpm = _keys(spec.name)
        keys: list[str] = []
        args: list[int] = []
        if spec.requests_per_minute:
            keys.append(rpm)
            args += [spec.requests_per_minute, requests]
        if spec.tokens_per_minute:
            keys.append(tpm)
            args += [spec.tokens_per_minute, tokens]
        return keys, args


def _refused(caller: str, spec: CallerSpec, refusal: Refusal) -> APIError:
    """OpenAI's 429 for a shared limit, worded as the front's own (`Dispatcher._rate_message`)."""
    per_requests = refusal.reason is RejectReason.RATE_LIMIT_REQUESTS
    what, limit = (("requests per min (RPM)", spec.requests_per_minute) if per_requests
                   else ("tokens per min (TPM)", spec.tokens_per_minute))
    return overloaded(refusal.reason, refusal.retry_after_s,
                      f"Rate limit reached for caller '{caller}' on {what} over all replicas: Limit {limit}. "
                      f"Please try again in {duration_text(refusal.retry_after_s)}.")
