"""Snapshots of servers' `/metrics` taken during a bench run (`tailguard bench --scrape URL`, and
the exporters beside them: `--gpu-metrics URL` for a DCGM exporter, `--host-metrics URL` for a
node-exporter) and saved beside its records as `metrics.jsonl`, one line per snapshot:
`{"url", "at", "text"}` (or `"error"`), `at` in Unix seconds, plus `"role"` ("gpu" or "host") for
a page named as one. One snapshot is taken before the first request and one after the last, so
counters read as last minus first are what the run did; `tailguard doctor` reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
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


async def _snapshot(session: aiohttp.ClientSession, url: str, role: str | None) -> dict[str, Any]:
    at = time.time()
    head: dict[str, Any] = {"url": url, "at": at} if role is None else {"url": url, "role": role, "at": at}
    try:
        async with asyncio.timeout(SCRAPE_TIMEOUT_S), session.get(url) as r:
            text = await r.text()
            if r.status != 200:
                return {**head, "error": f"HTTP {r.status}"}
            return {**head, "text": text}
    except (aiohttp.ClientError, TimeoutError) as e:
        return {**head, "error": repr(e)[:200]}


def targets(urls: Sequence[str], roles: Mapping[str, Sequence[str]] | None = None) -> dict[str, str | None]:
    """Each page to scrape (by its /metrics URL, once) and the role it was named as: `urls` by
    what they hold, `roles` {"gpu": [...], "host": [...]} as said."""
    out: dict[str, str | None] = {metrics_url(u): None for u in urls}
    for role, named in (roles or {}).items():
        for u in named:
            out[metrics_url(u)] = role
    return out


@contextlib.asynccontextmanager
async def scraping(urls: Sequence[str], interval_s: float,
                   roles: Mapping[str, Sequence[str]] | None = None) -> AsyncIterator[list[dict[str, Any]]]:
    """Snapshot every URL (and every page `roles` names) now, every `interval_s` while the block
    runs, and once more at its end."""
    pages = targets(urls, roles)
    snaps: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session:
        async def all_once() -> None:
            snaps.extend(await asyncio.gather(*(_snapshot(session, u, role) for u, role in pages.items())))

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


async def while_scraping(run: Awaitable[T], urls: Sequence[str], interval_s: float, out_dir: Path,
                         roles: Mapping[str, Sequence[str]] | None = None) -> T:
    """Await `run` (a bench writing `out_dir`) with `urls` (and the pages `roles` names) scraped
    throughout; writes metrics.jsonl."""
    if not targets(urls, roles):
        return await run
    async with scraping(urls, interval_s, roles) as snaps:
        result = await run
    write_scrapes(snaps, out_dir)
    return result


def write_scrapes(snaps: Sequence[dict[str, Any]], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / SCRAPE_FILE).open("wb") as f:
        for s in snaps:
            f.write(orjson.dumps(s) + b"\n")


@dataclass
class Saved:
    """One page's snapshots, oldest first, and the role it was named as (None: tell by its names)."""

    role: str | None = None
    texts: list[str] = field(default_factory=list)


def read_scrapes(run_dir: Path) -> dict[str, Saved]:
    """A run's saved pages by URL (error lines skipped); empty without the file."""
    path = run_dir / SCRAPE_FILE
    out: dict[str, Saved] = {}
    if path.is_file():
        for line in path.read_bytes().splitlines():
            if line.strip():
                s = orjson.loads(line)
                saved = out.setdefault(s["url"], Saved(s.get("role")))
                if "text" in s:
                    saved.texts.append(s["text"])
    return out
