"""`run_bench(config)`: the load generator's one entrypoint. A run goes in this process
(`bench.load`) or, with `config.workers` > 1, spread over that many processes (`bench.workers`),
so neither of those two needs the other's way of running."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tailguard.bench.load import BenchConfig, LoadProgress, RunResult, run_load
from tailguard.bench.workers import run_spread


async def run_bench(config: BenchConfig, progress: Callable[[LoadProgress], None] | None = None,
                    stop: asyncio.Event | None = None) -> RunResult:
    """Run one benchmark; `progress` is called about four times a second (one process only).
    Setting `stop` interrupts the run (`meta["interrupted"]` says when and how many were cut)."""
    if config.workers > 1:
        return await run_spread(config, stop)
    return await run_load(config, progress, stop)
