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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import orjson

from tailguard.gateway.shared.link import UNAVAILABLE, Link

RETENTION_S = 8 * 86400  # a week, and a day to ask about it
MAX_UNSENT = 100_000
MINUTES_KEY = "tailguard:usage:minutes"
_FLOATS = frozenset({3, 4})  # of the figures: requests, prompt and output tokens, E2E s, TTFT s, TTFTs counted

Key = tuple[int, str, str, str, str, str]  # minute, caller, class, model, outcome, reason
Row = tuple[Any, ...]  # caller, class, model, outcome, reason, then the six figures


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

    async def add(self, rows: dict[Key, list[float]]) -> None:
        """Add `rows` (and those kept from a write that failed) into Redis: one round trip."""
        for k, v in rows.items():
            kept = self._unsent.get(k)
            self._unsent[k] = v if kept is None else [a + b for a, b in zip(kept, v)]
        if not self._unsent or not self.link.shared:
            self._bound()
            return
        sending, self._unsent = self._unsent, {}
        try:
            await self._send(sending)
        except UNAVAILABLE as err:
            self.link.lost(err)
            for k, v in sending.items():  # kept for the next write (nothing here was added since)
                self._unsent.setdefault(k, v)
            self._bound()

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

    async def _send(self, rows: dict[Key, list[float]]) -> None:
        r = self.link.redis
        minutes = {k[0] for k in rows}
        async with r.pipeline(transaction=False) as pipe:
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
            pipe.zadd(MINUTES_KEY, {str(m): m for m in minutes})
            pipe.zremrangebyscore(MINUTES_KEY, "-inf", f"({max(minutes) - self._retention_s}")
            pipe.expire(MINUTES_KEY, self._retention_s)
            await pipe.execute()

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
