"""The discrete-event run with the latency samples an adaptive cap learns from; pure, no I/O.

`sim.des.run` tells the front when requests arrive, start and finish, but not when their first
token came, so the front's `Observed` event (`front.adaptive`) needs a witness: `ObservingEngine`
is the engine model noting each run's start, first token and finish, and `ObservedFront` is the
front that is handed those samples as `Observed` just before the next event the run sends it (a
step's end while requests wait, an arrival, a finish), with their decisions carried out by the
run like any other; never before a `Generated`, whose decisions the run drops (it has none). A sample reaches the front at most one engine step after the gateway's own
dispatcher would send it. Once `sim.des` sends `Observed` itself, this module goes.

    engine = ObservingEngine(config)
    front = ObservedFront(params, engine)
    run(engine, arrivals, clock, front)
"""

from __future__ import annotations

from collections.abc import Sequence

from tailguard.front.events import Decision, Event, Generated, Observed
from tailguard.front.front import Front
from tailguard.front.params import FrontParams
from tailguard.sim.cost import EngineConfig
from tailguard.sim.engine import Engine, FirstToken, RequestFinished, SimRequest, Step


class ObservingEngine(Engine):
    """The engine model, noting each run's TTFT (from its `add`, the front's `Start`) at its first
    token and its ITL (mean gap between its tokens) at its finish, as samples to hand over."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.samples: list[tuple[float | None, float | None]] = []
        self._added: dict[str, float] = {}
        self._first: dict[str, float] = {}

    def add(self, req: SimRequest, now: float) -> None:
        self._added[req.id] = now
        self._first.pop(req.id, None)  # a continuation is a run of its own
        super().add(req, now)

    def step(self, now: float) -> Step:
        step = super().step(now)
        end = step.ended_at
        for ev in step.events:
            if isinstance(ev, FirstToken) and ev.req_id not in self._first:
                self._first[ev.req_id] = end
                self.samples.append((end - self._added[ev.req_id], None))
            elif isinstance(ev, RequestFinished):
                first = self._first.pop(ev.req_id, None)
                del self._added[ev.req_id]
                out = ev.output_tokens
                if first is not None and out >= 2 and ev.preemptions == 0:
                    self.samples.append((None, (end - first) / (out - 1)))
        return step


class ObservedFront(Front):
    """A front with one backend, told its engine's latency samples as `Observed` before each
    event the run hands it; `caps` is its cap over the run, (since, cap) at each change."""

    def __init__(self, params: FrontParams, engine: ObservingEngine) -> None:
        super().__init__(params)
        self._engine = engine
        self._backend = params.backends[0].name
        self.caps: list[tuple[float, int]] = [(0.0, self.backend(self._backend).cap)]

    def handle(self, event: Event, now: float, *, preempt: bool = True) -> Sequence[Decision]:
        samples = self._engine.samples
        if not samples or type(event) is Generated:  # the run drops what a `Generated` decides (nothing)
            return super().handle(event, now, preempt=preempt)
        out: list[Decision] = []
        for ttft_s, itl_s in samples:
            out.extend(super().handle(Observed(self._backend, ttft_s, itl_s), now, preempt=preempt))
        samples.clear()
        cap = self.backend(self._backend).cap
        if cap != self.caps[-1][1]:
            self.caps.append((now, cap))
        out.extend(super().handle(event, now, preempt=preempt))
        return out

    def mean_cap(self, start: float, end: float) -> float:
        """The cap's mean over [start, end), weighted by time."""
        total = 0.0
        for (t, cap), (t_next, _) in zip(self.caps, [*self.caps[1:], (end, 0)]):
            total += cap * max(0.0, min(t_next, end) - max(t, start))
        return total / (end - start)

    def cap_range(self, start: float, end: float) -> tuple[int, int]:
        """The lowest and highest cap in force during [start, end)."""
        during = [cap for (t, cap), (t_next, _) in zip(self.caps, [*self.caps[1:], (end, 0)])
                  if t < end and t_next > start]
        return min(during), max(during)
