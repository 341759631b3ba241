"""Recorded exporter pages for doctor's hardware rules, read as `tailguard doctor` reads a run's
metrics.jsonl (`pages/`):

- `sim-calm`, `sim-saturated`, `sim-throttled`: the DCGM part of `tailguard sim --preset a100-llama8b
  --max-num-seqs 8 --time-scale 0.1` pages, scraped every 0.2 s by `tailguard bench --scrape` during
  40 chats of 48 tokens from 2 clients (calm), 300 at 150/s (saturated, about 1.5x what 8 slots
  serve), and 40 from 2 clients with `--throttle 0.5` (its card held down two seconds in four);
- `node-busy`: a real node-exporter 1.5.0 (Debian's) on this 2-CPU machine while four processes
  spun, scraped each second;
- `node-calm`, `node-swapping`: written in node-exporter's format (its names, labels and help
  lines) for an 8-CPU host at 20% CPU, and one at 30% swapping 4,000 pages in and 8,000 out a second.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from tailguard.doctor.evidence import Samples
from tailguard.doctor.metrics import parse
from tailguard.doctor.pages import Evidence, evidence, sort_pages
from tailguard.wire import dcgm

HERE = Path(__file__).resolve().parent / "pages"
# What dcgm-exporter's default counters hold of the names the simulator exports (no SM activity,
# power limit or maximum clock: a counters CSV adds those).
DEFAULT_COUNTERS = (dcgm.GPU_UTIL, dcgm.GR_ENGINE_ACTIVE, dcgm.FB_USED, dcgm.FB_FREE, dcgm.POWER_USAGE, dcgm.SM_CLOCK)


def snaps(name: str, only: tuple[str, ...] = ()) -> tuple[str, str | None, list[Samples]]:
    """(URL, role, snapshots) of a recorded page; `only`: keep these sample names alone."""
    lines = [orjson.loads(line) for line in (HERE / f"{name}.jsonl").read_bytes().splitlines() if line.strip()]
    parsed = [parse(s["text"]) for s in lines]
    if only:
        parsed = [{k: v for k, v in s.items() if k[0] in only} for s in parsed]
    return lines[0]["url"], lines[0].get("role"), parsed


def evidence_of(*names: str, only: tuple[str, ...] = ()) -> Evidence:
    """The evidence doctor reads from these recorded pages."""
    pages = {}
    for n in names:
        url, role, s = snaps(n, only)
        pages[f"{url}#{n}"] = (role, s)
    return evidence(sort_pages(pages))
