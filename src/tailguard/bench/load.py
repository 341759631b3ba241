"""The load generator: sends a workload's requests in a closed or open loop over one aiohttp session
and records each request's timeline in one process (`run_load`); `bench.run.run_bench` is the entrypoint,
which spreads a run over processes (`bench.workers`) when asked.

Honesty rules: in open loop every request has a due time fixed in advance, and latencies are
measured from it, so a slow generator cannot hide queueing; the gap between due and actual send
(dispatch lag) and the event loop's own lag are recorded, and `stats.validity` marks a run whose
dispatch lag P99 is above the threshold as invalid. A run's settings are `config.py`'s, its
loop `loop.py`'s, one request's own way on the wire `sender.py`'s; this module reads what a run
sends, checks the target and runs the loop.

Before the clock starts, the target is checked (`target.probe`: one line and no load if it cannot
be measured) and the connections the first requests need are opened, so the first dispatch
measures the generator's pace, not its start-up. A `stop` event ends a run early: nothing more is
sent, requests in flight get `interrupt_grace_s` to finish, and those still running then are cut
and recorded as `interrupted`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp

from tailguard.bench.agents import AgentWorkload, agent_workload
from tailguard.bench.programs import ProgramRun
from tailguard.bench.trace.plan import Replay, TraceFactory, load_replay
from tailguard.bench.stream import RequestFactory
from tailguard.bench.workload import Workload, load_workload, with_lengths
from tailguard.bench.target import base_url, engine_name, gateway_config, probe, time_scale_for
# A run's API in one place: what run_load takes and gives is imported from here (benchmarks/ do).
from tailguard.bench.config import BenchConfig as BenchConfig
from tailguard.bench.loop import LoadProgress as LoadProgress, Loop, RunResult as RunResult
from tailguard.bench.sender import Timeouts as Timeouts


@dataclass(frozen=True, slots=True)
class _Source:
    """Where a run's requests come from: a trace's replay, an agent workload's programs, or a
    workload's classes (with the folder its files are read from)."""

    workload: Workload
    replay: Replay | None = None
    agents: AgentWorkload | None = None
    base_dir: Path | None = None

    def loop(self, config: BenchConfig, session: aiohttp.ClientSession, model: str,
             progress: Callable[[LoadProgress], None] | None, stop: asyncio.Event | None,
             origin: Callable[[], Awaitable[float]] | None, time_scale: float) -> Loop:
        """The run's loop over this source: its requests built for the target's `model`."""
        factory: RequestFactory | TraceFactory
        if self.replay is not None:
            factory = TraceFactory(self.replay, seed=config.seed, model=model, endpoint=config.endpoint)
        else:
            factory = RequestFactory(self.workload, seed=config.seed, model=model, base_dir=self.base_dir)
        if self.agents is None:
            return Loop(config, self.workload, factory, session, model, progress, stop, origin, time_scale)
        return ProgramRun(self.agents, config, self.workload, factory, session, model, progress, stop, origin,
                          time_scale)


def _source(config: BenchConfig) -> _Source:
    """What `config` sends, read and checked before anything connects: a trace, programs of calls
    (`bench.programs`), or requests of a workload's classes (given, or read from a file or a
    built-in), with the run's lengths and endpoint applied."""
    if config.trace is not None:
        replay = load_replay(config.trace)
        source = _Source(TraceFactory(replay).workload, replay=replay)
    elif (agents := agent_workload(config.workload)) is not None:
        source = _Source(agents.as_workload(), agents=agents)
    elif isinstance(config.workload, Workload):
        source = _Source(config.workload)
    else:
        workload, base_dir = load_workload(config.workload)
        source = _Source(workload, base_dir=base_dir)
    workload = source.workload
    if source.replay is None:
        workload = with_lengths(workload, config.input_tokens, config.output_tokens, config.ignore_eos)
    if config.endpoint is not None:
        workload = workload.model_copy(update={"endpoint": config.endpoint})
    config.check(workload)
    return replace(source, workload=workload)


async def run_load(config: BenchConfig, progress: Callable[[LoadProgress], None] | None = None,
                   stop: asyncio.Event | None = None, origin: Callable[[], Awaitable[float]] | None = None,
                   ) -> RunResult:
    """Run one benchmark in this process; `progress` is called about four times a second from
    the event loop. Setting `stop` interrupts the run (`meta["interrupted"]` says when and how
    many were cut). A worker of a spread run (`bench.workers`) passes `origin`, which says when
    its clock starts (the same instant for all)."""
    source = _source(config)  # read and checked before anything connects
    connector = aiohttp.TCPConnector(limit=config.max_connections, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=None, connect=config.timeouts.connect_s)
    url = base_url(config.url)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        probe_s = config.timeouts.connect_s + 5.0
        target = await probe(session, url, api_key=config.api_key, timeout_s=probe_s, model=config.model)
        for extra in config.extra_urls:  # every server of a spread run must answer before the clock starts
            await probe(session, base_url(extra), api_key=config.api_key, timeout_s=probe_s, model=target.model)
        time_scale = time_scale_for(config.time_scale, target.time_scale, url)
        gateway = await gateway_config(session, url, api_key=config.api_key, timeout_s=probe_s)
        engine = None if gateway is not None else await engine_name(session, url, timeout_s=probe_s)
        run = source.loop(config, session, target.model, progress, stop, origin, time_scale)
        result = await run.go()
    if isinstance(run.factory, TraceFactory):
        result.meta["trace"] = run.factory.describe()
    result.meta["gateway_config"] = gateway
    result.meta["target_time_scale"] = target.time_scale  # announced by a simulator (or a gateway before one)
    result.meta["engine"] = engine  # what the target says it is at /version, when no gateway was in front
    if time_scale != 1.0:
        rescale(result, time_scale)
    return result


def rescale(result: RunResult, time_scale: float) -> None:
    """Divide every recorded time by `time_scale` (wall seconds per simulated second)."""
    k = 1.0 / time_scale
    for r in result.records:
        r.scheduled_at *= k
        r.sent_at *= k
        r.ended_at *= k
        if r.first_token_at is not None:
            r.first_token_at *= k
        r.chunk_at = [t * k for t in r.chunk_at]
        if r.queue_ms is not None:
            r.queue_ms *= k
        if r.server_timing_s is not None:
            r.server_timing_s = {name: v * k for name, v in r.server_timing_s.items()}
    m = result.meta
    m["time_scale"] = time_scale
    m["times_in"] = "simulated seconds (wall seconds / time_scale)"
    m["max_dispatch_lag_s"] = m["max_dispatch_lag_s"] * k
    m["loop_lag_s"] = {key: (v * k if key != "samples" else v) for key, v in m["loop_lag_s"].items()}
    if m.get("interrupted"):
        m["interrupted"]["after_s"] *= k

