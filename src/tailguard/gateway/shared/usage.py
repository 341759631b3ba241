"""Usage counted by every replica, added up in Redis: what `GET /admin/usage` answers for the
whole set of replicas when `state.url` is set.

Each replica keeps its own one-minute rows in its own SQLite file (`gateway.ops.metering`); as it
writes them (every few seconds, off the request path) it also adds them into Redis, one hash per
minute (`tailguard:usage:<minute>`, a field per row and figure, each an `HINCRBY`), and names the
minute in a sorted set (`tailguard:usage:minutes`) so a range is read without scanning keys. All
of one write in one pipelined round trip. Both expire after `RETENTION_S`: Redis holds the recent
usage of the set, each replica's SQLite file its own for good.

Rows that could not be added (Redis unavailable) are kept and added with the next write, up to
`MAX_UNSENT` of them; past that the oldest minutes are dropped from Redis's sums (never from the
replica's own file).

A Redis that comes back empty (restarted without persistence, or flushed) has lost every
replica's sums. So the sums carry a generation, a random id the first write to an empty Redis sets
(`tailguard:usage:generation`, `SET NX` in each write's pipeline, as `gateway.shared.fair` marks
its counters): a replica whose write finds another generation than its last adds its own rows of
the retention window again, from its own file (the newest `MAX_UNSENT`), less those the write
itself just added. Every replica does the same for its own rows, so the sums come back whole.
Each write makes its round trip even with no rows, so a restart is found within `FLUSH_S`, or
by the next `/admin/usage`, which writes first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import logging
import os
from collections.abc import Awaitable, Callable

import orjson

from tailguard.gateway.shared.link import UNAVAILABLE, Link

RETENTION_S = 8 * 86400  # a week, and a day to ask about it
MAX_UNSENT = 100_000
MINUTES_KEY = "tailguard:usage:minutes"
GENERATION_KEY = "tailguard:usage:generation"
_BATCH = 5_000  # rows a pipeline adds at most when a replica's rows are added again
_FLOATS = frozenset({3, 4})  # of the figures: requests, prompt and output tokens, E2E s, TTFT s, TTFTs counted

Key = tuple[int, str, str, str, str, str]  # minute, caller, class, model, outcome, reason
Row = tuple[Any, ...]  # caller, class, model, outcome, reason, then the six figures
# The replica's own rows of the last `retention_s` seconds, the newest `limit` of them: its file's.
History = Callable[[int, int], Awaitable[dict[Key, list[float]]]]

log = logging.getLogger("tailguard.gateway")


def _hash(minute: int) -> str:
    return f"tailguard:usage:{minute}"


class SharedUsage:
    """The replicas' usage summed in Redis (see the module docstring).

        await usage.add(rows)                     # {Key: figures}, as the meter writes them
        found = await usage.rows(lo, hi, caller)  # summed per row over [lo, hi); None: no Redis
    """

    def __init__(self, link: Link, retention_s: int = RETENTION_S) -> None:
        self.link = link
        self._retention_s = retention_s
        self._unsent: dict[Key, list[float]] = {}
        self._generation: bytes | None = None  # of the sums this replica last added into

    async def add(self, rows: dict[Key, list[float]], history: History) -> None:
        """Add `rows` (and those kept from a write that failed) into Redis: one round trip, and
        this replica's rows of the retention window again (`history`, less `rows`, which its
        own file already holds) when Redis has lost them. The caller writes one at a time: its
        file holds every row it handed in."""
        for k, v in rows.items():
            kept = self._unsent.get(k)
            self._unsent[k] = v if kept is None else [a + b for a, b in zip(kept, v)]
        if not self.link.shared:
            self._bound()
            return
        sending, self._unsent = self._unsent, {}
        try:
            generation = await self._send(sending)
            if self._generation is not None and generation != self._generation:
                await self._again(await history(self._retention_s, MAX_UNSENT), sending)
            self._generation = generation
        except UNAVAILABLE as err:
            self.link.lost(err)
            for k, v in sending.items():  # kept for the next write (nothing here was added since)
                self._unsent.setdefault(k, v)
            self._bound()

    async def _again(self, history: dict[Key, list[float]], sent: dict[Key, list[float]]) -> None:
        """Redis lost the sums: add this replica's rows again, less those just sent."""
        rows = {k: [a - b for a, b in zip(v, sent[k])] if k in sent else v for k, v in history.items()}
        rows = {k: v for k, v in rows.items() if any(v)}
        log.warning("the usage sums in Redis were lost (a new generation): this replica adds its %d rows of the "
                    "last %d days again", len(rows), self._retention_s // 86400, extra={"event": "state"})
        batch = sorted(rows)
        for i in range(0, len(batch), _BATCH):
            await self._send({k: rows[k] for k in batch[i:i + _BATCH]})

    async def rows(self, lo: int, hi: int, caller: str | None) -> list[Row] | None:
        """Every replica's rows over the minutes [lo, hi), summed per caller, class, model,
        outcome and reason (the meter's `_SELECT`); None when Redis did not answer."""
        if not self.link.shared:
            return None
        try:
            minutes = cast(list[bytes], await self.link.redis.zrangebyscore(MINUTES_KEY, lo, f"({hi}"))
            async with self.link.redis.pipeline(transaction=False) as pipe:
                for m in minutes:
                    pipe.hgetall(_hash(int(m)))
                found = await pipe.execute()
        except UNAVAILABLE as err:
            self.link.lost(err)
            return None
        return _summed(found, caller)

    async def _send(self, rows: dict[Key, list[float]]) -> bytes:
        """Add `rows`; the sums' generation (set now if Redis had none)."""
        r = self.link.redis
        minutes = {k[0] for k in rows}
        async with r.pipeline(transaction=False) as pipe:
            pipe.set(GENERATION_KEY, os.urandom(8).hex(), nx=True)
            pipe.get(GENERATION_KEY)
            for (minute, *row), figures in rows.items():
                for i, v in enumerate(figures):
                    if not v:
                        continue
                    field = orjson.dumps([*row, i])
                    if i in _FLOATS:
                        pipe.hincrbyfloat(_hash(minute), field, v)
                    else:
                        pipe.hincrby(_hash(minute), field, int(v))
            for m in minutes:
                pipe.expire(_hash(m), self._retention_s)
            if minutes:
                pipe.zadd(MINUTES_KEY, {str(m): m for m in minutes})
                pipe.zremrangebyscore(MINUTES_KEY, "-inf", f"({max(minutes) - self._retention_s}")
                pipe.expire(MINUTES_KEY, self._retention_s)
            done = await pipe.execute()
        return cast(bytes, done[1])

    def _bound(self) -> None:
        """At most MAX_UNSENT rows kept: the oldest minutes go first."""
        if len(self._unsent) > MAX_UNSENT:
            for k in sorted(self._unsent)[: len(self._unsent) - MAX_UNSENT]:
                del self._unsent[k]


def _summed(hashes: Iterable[dict[bytes, bytes]], caller: str | None) -> list[Row]:
    out: dict[tuple[str, ...], list[float]] = {}
    for h in hashes:
        for field, value in h.items():
            *row, i = orjson.loads(field)
            if caller is not None and row[0] != caller:
                continue
            figures = out.setdefault(tuple(row), [0, 0, 0, 0.0, 0.0, 0])
            figures[i] += float(value) if i in _FLOATS else int(value)
    return [(*row, *figures) for row, figures in out.items()]
