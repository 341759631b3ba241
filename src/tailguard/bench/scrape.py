"""Snapshots of servers' `/metrics` taken during a bench run (`tailguard bench --scrape URL`) and
saved beside its records as `metrics.jsonl`, one line per snapshot: `{"url", "at", "text"}` (or
`"error"`), `at` in Unix seconds. One snapshot is taken before the first request and one after
the last, so counters read as last minus first are what the run did; `tailguard doctor` reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson

SCRAPE_FILE = "metrics.jsonl"
SCRAPE_TIMEOUT_S = 2.0  # a page slower than this is an error line, not a stalled run
T = TypeVar("T")


def metrics_url(url: str) -> str:
    """`http://host:port` (or `.../v1`) names the server; its page is `/metrics`."""
    u = url.rstrip("/")
    if u.endswith("/metrics"):
        return u
    return (u[:-3] if u.endswith("/v1") else u) + "/metrics"


async def _snapshot(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    at = time.time()
    try:
        async with asyncio.timeout(SCRAPE_TIMEOUT_S), session.get(url) as r:
            text = await r.text()
            if r.status != 200:
                return {"url": url, "at": at, "error": f"HTTP {r.status}"}
            return {"url": url, "at": at, "text": text}
    except (aiohttp.ClientError, TimeoutError) as e:
        return {"url": url, "at": at, "error": repr(e)[:200]}


@contextlib.asynccontextmanager
async def scraping(urls: Sequence[str], interval_s: float) -> AsyncIterator[list[dict[str, Any]]]:
    """Snapshot every URL now, every `interval_s` while the block runs, and once more at its end."""
    pages = [metrics_url(u) for u in urls]
    snaps: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session:
        async def all_once() -> None:
            snaps.extend(await asyncio.gather(*(_snapshot(session, u) for u in pages)))

        async def every() -> None:
            while True:
                await asyncio.sleep(interval_s)
                await all_once()

        await all_once()
        task = asyncio.create_task(every())
        try:
            yield snaps
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await all_once()


async def while_scraping(run: Awaitable[T], urls: Sequence[str], interval_s: float, out_dir: Path) -> T:
    """Await `run` (a bench writing `out_dir`) with `urls` scraped throughout; writes metrics.jsonl."""
    if not urls:
        return await run
    async with scraping(urls, interval_s) as snaps:
        result = await run
    write_scrapes(snaps, out_dir)
    return result


def write_scrapes(snaps: Sequence[dict[str, Any]], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / SCRAPE_FILE).open("wb") as f:
        for s in snaps:
            f.write(orjson.dumps(s) + b"\n")


def read_scrapes(run_dir: Path) -> dict[str, list[str]]:
    """A run's saved pages by URL, oldest first (error lines skipped); empty without the file."""
    path = run_dir / SCRAPE_FILE
    out: dict[str, list[str]] = {}
    if path.is_file():
        for line in path.read_bytes().splitlines():
            if line.strip():
                s = orjson.loads(line)
                if "text" in s:
                    out.setdefault(s["url"], []).append(s["text"])
    return out
