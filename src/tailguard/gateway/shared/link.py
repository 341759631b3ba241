"""The one connection a replica keeps to Redis, and whether shared state is in force.

Redis is up until a round trip fails (refused, reset, or slower than `state.timeout_s`); from
then the replica follows `state.on_unavailable` until its heartbeat, which keeps trying every
third of a lease, gets an answer again. Each change is one log line and the gauge
`tailguard_state_shared` (1 shared, 0 not). The heartbeat also counts the replicas: each renews
its entry in one sorted set scored by its expiry on Redis's own clock (`TIME`), entries past
their expiry are dropped, and the count left is N for the `local` share (1/N of each limit).
Leases scored by expiry are how Dynamo's and the issue's slot-lease designs keep a dead
replica from holding anything for longer than a lease.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis import asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tailguard.config.state import StateConfig

log = logging.getLogger("tailguard.gateway")

T = TypeVar("T")
UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, OSError)
REPLICAS_KEY = "tailguard:replicas"
_CONNECTIONS = 8

# KEYS[1]: the replicas' sorted set; ARGV: this replica's id, its lease in ms. Returns how many
# replicas hold a lease now, this one included.
_HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return redis.call('ZCARD', KEYS[1])
"""


async def stop(task: asyncio.Task[None] | None) -> None:
    """Cancel a background task and wait for its end, cancelling it again until it ends. A
    cancellation that lands mid round trip can be lost inside redis-py: seen in about one run
    in four of a test closing two links, a heartbeat task left cancelling but asleep in its
    next pause, and the close that waited for it waiting for ever."""
    while task is not None and not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=0.1)


class Link:
    """A replica's link to Redis. `shared` says whether shared state is in force; `replicas`
    is the share's N (`state.replicas`, else the count the last heartbeat saw)."""

    def __init__(self, cfg: StateConfig, on_change: Callable[[bool], None]) -> None:
        assert cfg.url is not None
        self.cfg = cfg
        # A few connections kept open and shared: a burst of requests waits for one of them (within
        # the timeout) rather than opening one each, which on a busy host is what runs out of time.
        pool = aioredis.BlockingConnectionPool.from_url(
            cfg.url, max_connections=_CONNECTIONS, timeout=cfg.timeout_s, socket_timeout=cfg.timeout_s,
            socket_connect_timeout=cfg.timeout_s, retry_on_timeout=False, health_check_interval=0)
        pool.connection_kwargs["retry"] = Retry(NoBackoff(), 0)  # no retry: a failed call falls back at once
        self.redis: aioredis.Redis = aioredis.Redis.from_pool(pool)  # it owns the pool: closing it closes them
        self.shared = True  # until a round trip fails: the first request finds out
        self.seen_replicas = 1
        self.id = f"{os.uname().nodename}:{os.getpid()}:{os.urandom(3).hex()}"
        self._on_change = on_change
        self._heartbeat = self.redis.register_script(_HEARTBEAT)
        self._task: asyncio.Task[None] | None = None

    def follow(self, cfg: StateConfig) -> None:
        """A reload's state settings: what to do while Redis is away (`on_unavailable`) and the
        share's N (`replicas`) apply from the next request; the rest (the URL, the round trip's
        timeout, the lease) were read at start, and a reload that changes them is refused."""
        self.cfg = cfg

    @property
    def replicas(self) -> int:
        return self.cfg.replicas or max(1, self.seen_replicas)

    async def call(self, op: Callable[[], Awaitable[T]]) -> T | None:
        """`op`'s answer, or None when Redis did not give one (shared state is then off until
        the heartbeat reaches Redis again)."""
        if not self.shared:
            return None
        try:
            return await op()
        except UNAVAILABLE as err:
            self._set(False, err)
            return None

    def lost(self, err: BaseException) -> None:
        """A round trip made elsewhere (a pipeline) failed: Redis is unavailable."""
        self._set(False, err)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._beat())

    async def close(self) -> None:
        await stop(self._task)
        try:  # leave the count at once rather than at the lease's end
            await self.redis.zrem(REPLICAS_KEY, self.id)
        except UNAVAILABLE:
            pass
        await self.redis.aclose()

    async def _beat(self) -> None:
        lease_ms = int(self.cfg.lease_s * 1000)
        while True:
            try:
                self.seen_replicas = int(await self._heartbeat(keys=[REPLICAS_KEY], args=[self.id, lease_ms]))
                if not self.shared:  # the connections opened before it went are dead: new ones from now
                    await self.redis.connection_pool.disconnect(inuse_connections=False)
                self._set(True, None)
            except UNAVAILABLE as err:
                self._set(False, err)
            await asyncio.sleep(self.cfg.lease_s / 3)

    def _set(self, shared: bool, err: BaseException | None) -> None:
        if shared == self.shared:
            return
        self.shared = shared
        fields = {"url": self.cfg.shown_url(), "shared": shared, "replicas": self.replicas}
        if shared:
            log.warning("shared state is back: callers' limits are shared through Redis again",
                        extra={"event": "state", "fields": fields})
        else:
            log.warning("Redis is unavailable (%s): callers' limits follow state.on_unavailable=%s, over %d "
                        "replicas", type(err).__name__, self.cfg.on_unavailable, self.replicas,
                        extra={"event": "state", "fields": fields})
        self._on_change(shared)
