"""Usage per caller, class and model, kept across restarts: what `GET /admin/usage` answers
("what did team-a use yesterday"), in one-minute rows of a SQLite file in the gateway's state
directory (`usage.sqlite3`, beside the config history of `gateway.ops.store`).

A request is counted once, as it leaves (`Meter.record`, a few dict updates on the loop); the
rows gathered since the last write go to the file from a worker thread every `FLUSH_S` and at
shutdown, so a restart loses nothing and a crash at most the last few seconds. Without a state
directory the rows are kept in an in-memory database, for the life of the process.

Metric labels are bounded apart (`CallerLabels`): past `max_callers` distinct callers, the rest
are counted as `other` in Prometheus, never here.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tailguard.front.intake import NO_CLASS
from tailguard.gateway.request import Ended, Request
from tailguard.types import Outcome

if TYPE_CHECKING:
    from tailguard.gateway.shared.usage import SharedUsage

FILE_NAME = "usage.sqlite3"
FLUSH_S = 5.0
ANONYMOUS = "-"  # the caller of a request when no keys are configured
OTHER = "other"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    minute INTEGER NOT NULL, caller TEXT NOT NULL, class TEXT NOT NULL, model TEXT NOT NULL,
    outcome TEXT NOT NULL, reason TEXT NOT NULL,
    requests INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    e2e_s REAL NOT NULL, ttft_s REAL NOT NULL, ttft_n INTEGER NOT NULL,
    PRIMARY KEY (minute, caller, class, model, outcome, reason)
)"""
_UPSERT = """
INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (minute, caller, class, model, outcome, reason) DO UPDATE SET
    requests = requests + excluded.requests, prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    output_tokens = output_tokens + excluded.output_tokens, e2e_s = e2e_s + excluded.e2e_s,
    ttft_s = ttft_s + excluded.ttft_s, ttft_n = ttft_n + excluded.ttft_n"""
_SELECT = """
SELECT caller, class, model, outcome, reason, SUM(requests), SUM(prompt_tokens), SUM(output_tokens),
       SUM(e2e_s), SUM(ttft_s), SUM(ttft_n)
FROM usage WHERE minute >= ? AND minute < ? AND (? IS NULL OR caller = ?)
GROUP BY caller, class, model, outcome, reason"""

_Key = tuple[int, str, str, str, str, str]  # minute, caller, class, model, outcome, reason


class Meter:
    """Counts each ended request into its minute's row; writes rows to SQLite off the loop.

        meter = Meter(state_dir / FILE_NAME)        # or Meter(None): in memory
        meter.record(t)                             # once per request, as it leaves
        await meter.flush()                         # every FLUSH_S, and at shutdown
        rows, scope = await meter.usage(since, until, caller=None)

    With `shared` set (`state.url`), each write is also added into Redis, and `usage` answers
    for every replica from there (`gateway.shared.usage`), or for this one while Redis is away.
    """

    def __init__(self, path: Path | None, clock: Callable[[], float] = time.time) -> None:
        if path is not None:  # private, as everything in the state directory (its journal files follow it)
            os.close(os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600))
        self._db = sqlite3.connect(str(path) if path is not None else ":memory:", check_same_thread=False,
                                   isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL" if path is not None else "PRAGMA journal_mode=MEMORY")
        self._db.execute(_SCHEMA)
        self._lock = threading.Lock()  # the connection is used from worker threads, one at a time
        # One write at a time, file and Redis: what Redis was handed is then all the file holds
        # (`SharedUsage.add` adds the file's rows again when Redis lost them).
        self._writing = asyncio.Lock()
        self._pending: dict[_Key, list[float]] = {}
        self._clock = clock
        self.shared: SharedUsage | None = None  # the replicas' sums in Redis, set by the app

    def ended(self, e: Ended) -> None:
        """A request's one end (`gateway.lifecycle`): counted when it had a caller or a class (a
        request refused before either is the gateway's, not a caller's)."""
        t = e.request
        if t.caller is not None or t.cls != NO_CLASS:
            self.record(t)

    def record(self, t: Request) -> None:
        """One request that left, however it ended (refused ones included, by reason)."""
        minute = int(self._clock() // 60) * 60
        reason = (t.reason or "") if t.outcome is not Outcome.SUCCESS else ""
        key = (minute, t.caller or ANONYMOUS, t.cls, t.model or "", t.outcome.value, reason)
        row = self._pending.get(key)
        if row is None:
            row = self._pending[key] = [0, 0, 0, 0.0, 0.0, 0]
        row[0] += 1
        if t.answered:
            row[1] += t.prompt_tokens
        row[2] += t.output_tokens
        end = t.finished_at if t.finished_at is not None else t.arrived_at
        row[3] += end - t.arrived_at
        if t.first_content_at is not None:
            row[4] += t.first_content_at - t.arrived_at
            row[5] += 1

    async def flush(self) -> None:
        """Write what was counted since the last flush."""
        async with self._writing:
            rows, self._pending = self._pending, {}
            if rows:
                await asyncio.to_thread(self._write, rows.items())
            if self.shared is not None:  # also those a failed write kept
                await self.shared.add(rows, self._history)

    async def _history(self, retention_s: int, limit: int) -> dict[_Key, list[float]]:
        """This replica's rows of the last `retention_s` seconds, the newest `limit`."""
        since = int(self._clock() // 60) * 60 - retention_s
        found = await asyncio.to_thread(self._read_rows, since, limit)
        return {tuple(r[:6]): list(r[6:]) for r in found}

    def _read_rows(self, since: int, limit: int) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute("SELECT * FROM usage WHERE minute >= ? ORDER BY minute DESC LIMIT ?",
                                    (since, limit)).fetchall()

    def _write(self, rows: Iterable[tuple[_Key, list[float]]]) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany(_UPSERT, [(*k, *v) for k, v in rows])
            self._db.execute("COMMIT")

    async def usage(self, since: float | None, until: float | None,
                    caller: str | None) -> tuple[list[dict[str, Any]], str]:
        """Per caller, class and model over [since, until) (Unix seconds, whole minutes; default
        everything): requests by outcome, rejections by reason, tokens, mean E2E and TTFT. And
        whose: `replicas` (summed in Redis) or `replica` (this one's own file)."""
        await self.flush()
        lo = int(since // 60 * 60) if since is not None else 0
        hi = int(until) if until is not None else 1 << 62
        if self.shared is not None:
            found = await self.shared.rows(lo, hi, caller)
            if found is not None:
                return _grouped(found), "replicas"
        return _grouped(await asyncio.to_thread(self._read, (lo, hi, caller, caller))), "replica"

    def _read(self, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(_SELECT, args).fetchall()

    async def run(self) -> None:
        """Flush every FLUSH_S until cancelled."""
        while True:
            await asyncio.sleep(FLUSH_S)
            await self.flush()

    async def close(self) -> None:
        await self.flush()
        with self._lock:
            self._db.close()


def _grouped(found: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for caller, cls, model, outcome, reason, n, prompt, output, e2e, ttft, ttft_n in found:
        g = out.get((caller, cls, model))
        if g is None:
            g = out[(caller, cls, model)] = {
                "caller": caller, "class": cls, "model": model or None, "requests": 0, "outcomes": {},
                "rejections": {}, "prompt_tokens": 0, "output_tokens": 0, "_e2e": 0.0, "_ttft": 0.0, "_ttft_n": 0}
        g["requests"] += n
        g["outcomes"][outcome] = g["outcomes"].get(outcome, 0) + n
        if outcome == Outcome.REJECTED.value:
            g["rejections"][reason] = g["rejections"].get(reason, 0) + n
        g["prompt_tokens"] += prompt
        g["output_tokens"] += output
        g["_e2e"] += e2e
        g["_ttft"] += ttft
        g["_ttft_n"] += ttft_n
    for g in out.values():
        g["mean_e2e_s"] = round(g.pop("_e2e") / g["requests"], 6)
        ttft, ttft_n = g.pop("_ttft"), g.pop("_ttft_n")
        g["mean_ttft_s"] = round(ttft / ttft_n, 6) if ttft_n else None
    return sorted(out.values(), key=lambda g: (g["caller"], g["class"], g["model"] or ""))


class CallerLabels:
    """A caller's metric label: its name for the first `max_callers` seen, `other` after, so a
    key file of thousands of callers cannot blow up Prometheus's series."""

    def __init__(self, max_callers: int = 100) -> None:
        self._max = max_callers
        self._seen: set[str] = set()

    def __call__(self, caller: str) -> str:
        if caller in self._seen:
            return caller
        if len(self._seen) >= self._max:
            return OTHER
        self._seen.add(caller)
        return caller
