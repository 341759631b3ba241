"""The running simulator's state (engine, scaled clock, live requests, metrics) and the task
that steps the engine and wakes the request handlers.

One task steps the engine: it computes a step, sleeps until the step's end on the wall clock
(an absolute deadline, so timer slack does not accumulate), then hands each request its new tokens.
Handlers add and abort requests directly on the engine (one event loop, so no locking) and wait
on a per-request future (`SimState.wait`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from tailguard.clock import ScaledClock
from tailguard.sim.cost import EngineConfig
from tailguard.sim.engine import Admitted, Engine, FirstToken, RequestFinished, Step
from tailguard.sim.fault import ErrorSpread, Faults
from tailguard.sim.metrics import SimMetrics

_log = logging.getLogger("tailguard.sim")


class Live:
    """A request between `add` and the end of its response, as the handler and the loop see it."""

    __slots__ = ("ready", "done", "finish_reason", "waiter", "added_at", "admitted_at", "first_at")

    def __init__(self, added_at: float) -> None:
        self.ready = 0  # tokens generated so far
        self.done = False
        self.finish_reason = "length"
        self.waiter: asyncio.Future[None] | None = None
        self.added_at = added_at
        self.admitted_at: float | None = None  # first scheduled (prefill starts)
        self.first_at: float | None = None  # first token (decode starts)


class SimState:
    """Everything one simulator app owns: the engine, its clock, live requests and metrics."""

    def __init__(self, config: EngineConfig, time_scale: float, model_name: str, max_body_bytes: int,
                 faults: Faults, strict_model: bool) -> None:
        self.config = config
        self.faults = faults
        self.errors = ErrorSpread(faults)
        self.strict_model = strict_model  # a request for another model is a 404, as vLLM answers it
        self.max_body_bytes = max_body_bytes
        self.engine = Engine(config)
        self.clock = ScaledClock(time_scale)
        self.model_name = model_name
        self.metrics = SimMetrics(self.engine, model_name, self.clock.now)
        self.lives: dict[str, Live] = {}
        self.kick = asyncio.Event()
        self.closing = False
        self.closed = asyncio.Event()  # set on shutdown: what a hung handler waits for
        self.broken = False
        self.task: asyncio.Task[None] | None = None
        self.created = int(time.time())
        self._nonce = os.urandom(4).hex()
        self._counter = 0

    def new_id(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}-{self._nonce}{self._counter:08x}"

    def wake_all(self) -> None:
        for live in self.lives.values():
            _wake(live)

    async def wait(self, live: Live, seen: int) -> None:
        """Until `live` has tokens past `seen`, is done, or the server is closing."""
        loop = asyncio.get_running_loop()
        while live.ready == seen and not live.done and not self.closing:
            live.waiter = loop.create_future()
            try:
                await live.waiter
            finally:
                live.waiter = None


def _wake(live: Live) -> None:
    w = live.waiter
    if w is not None and not w.done():
        w.set_result(None)


async def engine_loop(state: SimState) -> None:
    """Step the engine while it has work; sleep on `state.kick` while it is idle.

    Should the model ever raise, the simulator stops taking requests and answers the live ones
    with a 500 rather than leaving them hanging."""
    try:
        await _step_forever(state)
    except Exception:
        _log.exception("the simulated engine failed; answering every request with 500 from now on")
        state.broken = True
        state.closing = True
        state.wake_all()
        raise


async def _step_forever(state: SimState) -> None:
    engine, clock, metrics = state.engine, state.clock, state.metrics
    t = clock.now()
    while True:
        if state.faults.stalls(clock.now()):
            await state.closed.wait()  # wedged: streams stay open with nothing more until shutdown
            return
        if engine.idle():
            state.kick.clear()
            await state.kick.wait()
            t = clock.now()
            continue
        step = engine.step(t)
        duration = _run(state, step, t)
        end = t + duration
        delay = clock.wall_delay(end)
        if delay > 0:
            # Waking a little late is fine: the next step still starts at `end`, so timer slack
            # never adds up over a long run.
            await asyncio.sleep(delay)
            metrics.behind_s = 0.0
            _deliver(state, step, end, duration)
            t = end
        else:
            # Computing the step took longer than the step itself: this process cannot keep up at
            # this time_scale. Say so, and carry on from now rather than drift ever further behind.
            now = clock.now()
            metrics.behind_s = now - end
            if metrics.gpu is not None:
                metrics.gpu.extend(now)  # the modelled card was working: the lag is this process's, not its
            await asyncio.sleep(0)  # let handlers run even when behind
            _deliver(state, step, end, duration)
            t = max(end, now)


def _run(state: SimState, step: Step, t: float) -> float:
    """How long `step`, begun at `t`, takes on this card (longer while it is throttled), told
    to the GPU model."""
    share = state.faults.clock_share(t)
    duration = step.duration_s / share
    gpu = state.metrics.gpu
    if gpu is not None and duration > 0:
        c = state.config
        fill = max(step.decode_seqs / c.max_num_seqs, (step.prefill_tokens + step.decode_seqs) / c.max_num_batched_tokens)
        gpu.step(t, duration, fill, share)
    return duration


def _deliver(state: SimState, step: Step, end: float, duration: float) -> None:
    lives = state.lives
    for rid in step.emitted:
        live = lives.get(rid)
        if live is not None:
            live.ready += 1
            w = live.waiter
            if w is not None and not w.done():
                w.set_result(None)
    m = state.metrics
    for ev in step.events:
        if isinstance(ev, RequestFinished):
            live = lives.get(ev.req_id)
            if live is not None:
                live.done = True
                live.finish_reason = ev.finish_reason
                m.e2e.observe(end - live.added_at)
                if live.first_at is not None:
                    m.decode.observe(end - live.first_at)
                _wake(live)
        elif isinstance(ev, FirstToken):
            live = lives.get(ev.req_id)
            if live is not None:
                m.ttft.observe(end - live.added_at)
                live.first_at = end
                if live.admitted_at is not None:
                    m.prefill.observe(end - live.admitted_at)
        elif isinstance(ev, Admitted) and not ev.resumed:
            m.queue.observe(ev.queue_s)
            live = lives.get(ev.req_id)
            if live is not None:
                live.admitted_at = end - duration  # the step that scheduled it began then
    # Decoding sequences emit on consecutive steps, so each of their tokens came one step after
    # the previous one: the step's duration is their inter-token latency.
    m.itl.observe(duration, step.decode_seqs)
