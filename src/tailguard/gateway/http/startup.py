"""A gateway app's start and stop (its `cleanup_ctx`): the parts it runs with, made once the loop
runs and in the order they need each other (the audit trail first, then the front and its driver,
the request path, guards, usage, probes, and the parts shared with other replicas through Redis),
and closed in order as it stops, so the last spans, usage rows and audit entries are written.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncIterator

from aiohttp import web

from tailguard.clock import Now
from tailguard.config import GatewayConfig
from tailguard.front.events import Allotted, LocalShare, ServedElsewhere
from tailguard.front.intake import OutputEstimator
from tailguard.gateway.classes import ClassTable
from tailguard.gateway.dispatch import Dispatcher
from tailguard.gateway.exchange import Context
from tailguard.gateway.http.keys import (
    AUDIT, BACKENDS, CLOCK, DISPATCHER, LIFECYCLE, LIVE, METER, METRICS, MODERATION, PROBES, PROXY, RECORD, STATE_DIR,
    UPSTREAM,
)
from tailguard.gateway.http.proxy import Proxy
from tailguard.gateway.lifecycle import Lifecycle
from tailguard.gateway.ops.audit import AuditLog
from tailguard.gateway.ops.live import Live
from tailguard.gateway.ops.metering import FILE_NAME as USAGE_FILE
from tailguard.gateway.ops.metering import Meter
from tailguard.gateway.ops.metrics import GatewayMetrics
from tailguard.gateway.ops.recorder import Recorder
from tailguard.gateway.ops.tracing import Tracer
from tailguard.gateway.upstream.backends import resolved
from tailguard.gateway.upstream.client import Upstream
from tailguard.gateway.upstream.kinds import get_kind
from tailguard.gateway.upstream.probes import Probes
from tailguard.guards.guard import GuardSet
from tailguard.guards.moderation import Moderation

if TYPE_CHECKING:
    from tailguard.gateway.shared.fair import SharedFairShare
    from tailguard.gateway.shared.limits import SharedLimits
    from tailguard.gateway.shared.slots import SlotLeases


async def lifecycle(app: web.Application) -> AsyncIterator[None]:
    """The app's parts from its start to its stop."""
    # First, so a store that cannot be opened stops the start before anything else is made.
    audit = await asyncio.to_thread(AuditLog.open, app[LIVE], app.get(STATE_DIR))
    running = _start(app, audit)
    try:
        yield
    finally:
        await running.close()


@dataclass
class _Running:
    """What a started app runs that must be stopped or flushed, in the order `close` takes it."""

    dispatcher: Dispatcher
    upstream: Upstream
    probes: Probes
    meter: Meter
    flushing: asyncio.Task[None]
    moderation: Moderation
    recorder: Recorder | None
    tracer: Tracer | None
    audit: AuditLog | None
    shared: SharedLimits | None = None
    leases: SlotLeases | None = None
    fair: SharedFairShare | None = None

    async def close(self) -> None:
        self.flushing.cancel()
        if self.shared is not None:
            if self.leases is not None:
                await self.leases.close()
            if self.fair is not None:
                await self.fair.close()
            await self.meter.flush()  # the last rows added into Redis while the link is open
            await self.shared.close()
            await self.shared.link.close()
        await self.probes.stop()
        self.dispatcher.close()
        await self.upstream.close()
        if self.recorder is not None:
            self.recorder.close()
        if self.tracer is not None:
            await asyncio.to_thread(self.tracer.shutdown)  # the last spans are exported, off the loop
        await self.meter.close()  # the last rows are written
        await self.moderation.close()
        if self.audit is not None:
            await asyncio.to_thread(self.audit.close)  # the last entries written, the chain's head logged


def _start(app: web.Application, audit: AuditLog | None) -> _Running:
    cfg = app[LIVE].cfg
    recorder = _front(app, cfg)
    tracer, lifecycle = _request_path(app, cfg)
    state_dir = app.get(STATE_DIR)
    if state_dir is not None:
        state_dir.mkdir(parents=True, exist_ok=True)
    moderation = app[MODERATION] = Moderation()
    lifecycle.guards = GuardSet.of(cfg, moderation, app[METRICS])
    app[UPSTREAM].redact = cfg.redaction.finder().redact
    meter = app[METER] = Meter(state_dir / USAGE_FILE if state_dir is not None else None)
    flushing = asyncio.get_running_loop().create_task(meter.run())
    probes = app[PROBES] = Probes(app[LIVE], app[BACKENDS], app[DISPATCHER], app[UPSTREAM].session, app[METRICS],
                                  app[CLOCK])
    probes.start()
    running = _Running(app[DISPATCHER], app[UPSTREAM], probes, meter, flushing, moderation, recorder, tracer, audit)
    _listen(app, lifecycle, running)
    return running


def _front(app: web.Application, cfg: GatewayConfig) -> Recorder | None:
    """The front over the config's backends, its driver (recorded with `--record`) and the
    upstream session; returns the recorder."""
    metrics, clock = app[METRICS], app[CLOCK]
    backends = {b.name: resolved(b) for b in cfg.backends}  # kind `auto` is `openai` until detected
    params = cfg.front_params({n: get_kind(b.kind).continues_generation for n, b in backends.items()})
    path = app.get(RECORD)
    recorder = None if path is None else Recorder.open(path, params, config_hash=app[LIVE].hash,
                                                       settings=cfg.settings())
    dispatcher = Dispatcher(params, metrics, asyncio.get_running_loop(), clock, recorder)
    upstream = Upstream(clock)
    app[DISPATCHER] = dispatcher
    app[UPSTREAM] = upstream
    app[BACKENDS] = backends
    return recorder


def _request_path(app: web.Application, cfg: GatewayConfig) -> tuple[Tracer | None, Lifecycle]:
    """What each request goes through (its lifecycle, the proxy in front of it) and the tracer
    of its spans; each backend counted from the start."""
    metrics, clock, dispatcher, backends = app[METRICS], app[CLOCK], app[DISPATCHER], app[BACKENDS]
    estimator = OutputEstimator(cfg.scheduler.output_estimate.params())
    tracer = Tracer.of(cfg, clock)
    keep_text = cfg.log_prompts or cfg.audit.retain_text  # a non-stream answer's text, for the log or the trail
    ctx = Context(dispatcher.front, clock, app[UPSTREAM], backends, metrics, app[LIVE], estimator,
                  asyncio.get_running_loop(), keep_text=keep_text)
    lifecycle = app[LIFECYCLE] = Lifecycle(cfg, ClassTable(cfg), ctx, dispatcher, clock, tracer)
    app[PROXY] = Proxy(cfg, lifecycle)
    for b in backends.values():
        metrics.add_backend(b.name, b.kind)
    return tracer, lifecycle


def _listen(app: web.Application, lifecycle: Lifecycle, running: _Running) -> None:
    """Who hears each request's end, in this order: the shared limits, usage, the recording, the
    audit trail; and the parts shared with other replicas, when Redis is configured."""
    cfg, dispatcher, clock = app[LIVE].cfg, running.dispatcher, app[CLOCK]
    shared = lifecycle.shared = running.shared = _shared_limits(cfg, app[METRICS], dispatcher, clock)
    if shared is not None:
        lifecycle.listen(shared.ended)
    lifecycle.listen(running.meter.ended)
    if running.recorder is not None:
        lifecycle.listen(running.recorder.ended)
    lifecycle.audit = running.audit
    if running.audit is not None:
        app[AUDIT] = running.audit
        lifecycle.listen(running.audit.ended)
    if shared is not None:
        running.leases = _slot_leases(app[LIVE], shared, dispatcher, clock)
        running.fair = _fair_share(app[LIVE], shared, dispatcher, running.meter)


def _shared_limits(cfg: GatewayConfig, metrics: GatewayMetrics, dispatcher: Dispatcher,
                   clock: Now) -> SharedLimits | None:
    """Callers' limits shared with other replicas through Redis (`state.url`), or None; as Redis
    goes or comes back, the front is told what it keeps of each limit itself (`LocalShare`).
    redis-py is the `redis` extra, imported only when a config names Redis."""
    if cfg.state.url is None:
        return None
    from tailguard.gateway.shared.limits import SharedLimits
    from tailguard.gateway.shared.link import Link

    gauge = metrics.families["tailguard_state_shared"]
    gauge.set(1)

    def changed(up: bool) -> None:
        gauge.set(1 if up else 0)
        dispatcher.tell(LocalShare(shared.local_share()))

    shared = SharedLimits(Link(cfg.state, changed), cfg.auth.callers(), clock)
    shared.start()
    return shared


def _slot_leases(live: Live, shared: SharedLimits, dispatcher: Dispatcher, clock: Now) -> SlotLeases:
    """Each backend's `max_concurrency` shared with the other replicas through Redis: this
    replica's part of it, leased, is its front's cap (`gateway.shared.slots`)."""
    from tailguard.gateway.shared.slots import SlotLeases

    def caps() -> dict[str, int]:  # the config running now: a reload's backends from the next renewal
        return {b.name: b.max_concurrency for b in live.cfg.backends}

    def allot(backend: str, slots: int | None) -> None:
        dispatcher.tell(Allotted(backend, slots))

    leases = SlotLeases(shared.link, caps, dispatcher.running_waiting, allot, clock)
    leases.start()
    return leases


def _fair_share(live: Live, shared: SharedLimits, dispatcher: Dispatcher, meter: Meter) -> SharedFairShare:
    """The fair-share counters as one set across replicas: this one's service in, the others'
    told to its front (`ServedElsewhere`); usage rows summed in Redis too."""
    from tailguard.gateway.shared.fair import SharedFairShare
    from tailguard.gateway.shared.usage import SharedUsage

    meter.shared = SharedUsage(shared.link)

    def elsewhere(service: dict[str, float]) -> None:
        dispatcher.tell(ServedElsewhere(service))

    fair = SharedFairShare(shared.link, dispatcher.take_served, elsewhere, lambda: live.cfg.fair_share())
    fair.start()
    return fair
