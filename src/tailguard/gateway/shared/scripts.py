"""The Lua scripts that change callers' shared limits in Redis, and how a script is sent: by its
SHA-1 (`EVALSHA`), one round trip, the script itself only when Redis answers that it does not
know it (a Redis restarted empty). redis-py's own script objects ask `SCRIPT EXISTS` first on
every pipeline: two round trips where one does.

Every script reads Redis's `TIME`, the one clock, so the replicas' clocks never matter. A
caller's keys share one hash tag, so a Redis Cluster keeps them in one slot, as a script needs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from redis import asyncio as aioredis
from redis.exceptions import NoScriptError

# A bucket's level at `now`: its stored level refilled since it was stored, at most its capacity
# (a key never stored, or expired once full, is a full bucket).
_LEVEL = """
local function level_of(key, cap, now)
  local b = redis.call('HMGET', key, 'level', 'at')
  if not b[1] then return cap end
  return math.min(cap, tonumber(b[1]) + math.max(0, now - tonumber(b[2])) * cap / 60)
end
local function store(key, cap, level, now)
  redis.call('HSET', key, 'level', tostring(level), 'at', tostring(now))
  redis.call('PEXPIRE', key, math.ceil((cap - level) * 60000 / cap) + 1000)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[1])
"""

# KEYS[1..n]: the caller's buckets (hashes of a level and when it was stored); KEYS[n+1], when the
# caller has a parallel limit: its places, a sorted set of requests in flight scored by their
# lease's expiry in ms. ARGV: n, the parallel limit (0: none), this request's member, the lease in
# ms, then per bucket its capacity per minute and what this request needs from it.
# All or none: returns {1, 0, '0', level...} having taken a place and from every bucket, or
# {0, i, wait_s, level...} naming the first limit that cannot give (i = n+1: the places) and
# when it could; the levels are each bucket's after the answer (what the headers say).
RESERVE = _LEVEL + """
local most, member, lease = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local levels, answer = {}, nil
for i = 1, n do levels[i] = level_of(KEYS[i], tonumber(ARGV[3 + 2 * i]), now) end
if most > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[n + 1], '-inf', now_ms)
  if redis.call('ZCARD', KEYS[n + 1]) >= most then answer = {0, n + 1, '1'} end
end
for i = 1, n do
  if answer then break end
  local cap, need = tonumber(ARGV[3 + 2 * i]), tonumber(ARGV[4 + 2 * i])
  local short = math.min(need, cap) - levels[i]
  if short > 0 then answer = {0, i, tostring(short * 60 / cap)} end
end
if not answer then
  answer = {1, 0, '0'}
  for i = 1, n do
    local cap = tonumber(ARGV[3 + 2 * i])
    levels[i] = levels[i] - tonumber(ARGV[4 + 2 * i])
    store(KEYS[i], cap, levels[i], now)
  end
  if most > 0 then
    redis.call('ZADD', KEYS[n + 1], now_ms + lease, member)
    redis.call('PEXPIRE', KEYS[n + 1], lease)
  end
end
for i = 1, n do answer[#answer + 1] = tostring(levels[i]) end
return answer
"""

# KEYS and ARGV as RESERVE's (the parallel limit and the lease unused; the member '': the request
# holds no place), but per bucket what goes back to it (negative: debt). Returns each bucket's
# level after.
SETTLE = _LEVEL + """
if ARGV[3] ~= '' then redis.call('ZREM', KEYS[n + 1], ARGV[3]) end
local levels = {}
for i = 1, n do
  local cap = tonumber(ARGV[3 + 2 * i])
  levels[i] = math.min(cap, level_of(KEYS[i], cap, now) + tonumber(ARGV[4 + 2 * i]))
  store(KEYS[i], cap, levels[i], now)
  levels[i] = tostring(levels[i])
end
return levels
"""

# KEYS[1]: a caller's places; ARGV: the lease in ms, then this replica's requests in flight there.
# Each one still there (not ended, not expired) is held one lease more.
RENEW_PLACES = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now_ms + lease, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], lease)
return 1
"""


class Script:
    """A Lua script sent by its SHA-1, once or many in one pipeline (see the module docstring)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()  # as Redis names a script

    async def __call__(self, redis: aioredis.Redis, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """One run: one round trip."""
        try:
            return await redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await redis.script_load(self.text)
            return await redis.evalsha(self.sha, len(keys), *keys, *args)

    async def pipelined(self, redis: aioredis.Redis, rows: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """One run per row of keys and args, all in one round trip."""
        try:
            return await self._pipelined(redis, rows)
        except NoScriptError:
            await redis.script_load(self.text)
            return await self._pipelined(redis, rows)

    async def _pipelined(self, redis: aioredis.Redis, rows: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        async with redis.pipeline(transaction=False) as pipe:
            for keys, args in rows:
                pipe.evalsha(self.sha, len(keys), *keys, *args)
            return list(await pipe.execute())
