"""`tailguard bench --workers N`: one open-loop run spread over N processes, as AIPerf spreads its
workers, so the generator is not bound to one core.

One schedule: every worker plans the whole run from the same seed (the same due times, the same
requests) and sends the requests whose index is its own modulo N. One clock origin: each worker
opens its connections, says it is ready, and gets the instant its clock starts (on the system's
monotonic clock, which `time.perf_counter` reads in every process alike). Merged results: the
records of all, in index order, and each worker's own dispatch-lag check (`validity` judges the
run by every worker's, so one late worker cannot hide among punctual ones). Workers ignore
SIGINT; the parent's `stop` reaches them as a message, with the usual grace for requests in flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from tailguard.bench import stalls
from tailguard.bench.load import BenchConfig, RunResult, run_load

_START_LEAD_S = 0.2  # from the last worker's "ready" to the clock's start


def _worker(config: BenchConfig, conn: Connection) -> None:
    """One worker's process: run its share, send back its result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when the run stops
    import uvloop

    conn.send(uvloop.run(_share(config, conn)))
    conn.close()


async def _share(config: BenchConfig, conn: Connection) -> RunResult:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def listen() -> None:  # after the origin: the only message left is "stop" (or the pipe closing)
        try:
            conn.recv()
        except EOFError:
            pass
        loop.call_soon_threadsafe(stop.set)

    async def origin() -> float:
        conn.send("ready")
        t0 = float(await asyncio.to_thread(conn.recv))
        threading.Thread(target=listen, daemon=True).start()
        return t0

    return await run_load(config, stop=stop, origin=origin)


async def run_spread(config: BenchConfig, stop: asyncio.Event | None = None) -> RunResult:
    """Run `config` over `config.workers` processes and merge what they recorded."""
    ctx = mp.get_context("spawn")  # a fresh interpreter each: the parent's loop is not copied
    pipes = [ctx.Pipe() for _ in range(config.workers)]
    procs = [ctx.Process(target=_worker, args=(dataclasses.replace(config, worker=i), child), daemon=True)
             for i, (_, child) in enumerate(pipes)]
    for p in procs:
        p.start()
    ends = [parent for parent, _ in pipes]
    try:
        for end in ends:  # every worker has probed the target and opened its connections
            if await asyncio.to_thread(end.recv) != "ready":
                raise RuntimeError("a bench worker failed before the run started")
        t0 = time.perf_counter() + _START_LEAD_S
        for end in ends:
            end.send(t0)
        results: asyncio.Future[list[Any]] = asyncio.gather(*(asyncio.to_thread(end.recv) for end in ends))
        if stop is not None:
            stopping: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
            await asyncio.wait({results, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not results.done():
                for end in ends:
                    end.send("stop")
        done: list[RunResult] = list(await results)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return merge(done)


def merge(results: list[RunResult]) -> RunResult:
    """One run from its workers' parts: records in index order, the first worker's description
    with the loop lag and the interrupt of the worst worker, and each worker's own figures."""
    records = sorted((r for res in results for r in res.records), key=lambda r: r.index)
    meta: dict[str, Any] = dict(results[0].meta)
    lags = [res.meta["loop_lag_s"] for res in results]
    meta["loop_lag_s"] = {"p50": max(x["p50"] for x in lags), "p99": max(x["p99"] for x in lags),
                          "max": max(x["max"] for x in lags), "samples": sum(x["samples"] for x in lags)}
    meta["loop_stalls"] = stalls.merged([res.meta.get("loop_stalls") for res in results])
    meta["wall_s"] = max(res.meta["wall_s"] for res in results)
    cut = [res.meta["interrupted"] for res in results if res.meta.get("interrupted")]
    meta["interrupted"] = cut[0] if cut else None
    meta["workers"] = len(results)
    meta["per_worker"] = [{"worker": i, "requests": len(res.records), "loop_lag_s": res.meta["loop_lag_s"]}
                          for i, res in enumerate(results)]
    return RunResult(records, meta)
