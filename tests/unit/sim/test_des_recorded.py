"""The DES's conversation with its front, recorded through its tap in the gateway's own format, is a
recording like the gateway's: a fresh front replays it decision for decision, and every request's
counts on its timeline are what its decisions say (`front.counts`), which is how the gateway counts
them too (`tests/functional/test_gateway_record.py` holds the gateway to the same)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from tailguard.clock import VirtualClock
from tailguard.front.events import Decision, Event
from tailguard.front.front import Front
from tailguard.front.params import (
    BackendSpec, ClassSpec, FrontParams, HedgeParams, PreemptionParams, QueueParams, RoutingParams, Slo,
)
from tailguard.recording.codec import Header, Observation, header_line, read, request_line, step_line
from tailguard.recording.replay import COUNTED, conform, counted
from tailguard.sim.cost import CostModel, EngineConfig
from tailguard.sim.des import run_fleet
from tailguard.sim.engine import Engine
from tailguard.sim.scenario import Arrival, Host, Timeline
from tailguard.types import Outcome

COST = CostModel(a_s=0.01, b_s_per_prefill_token=0.0001, c_s_per_decode_seq=0.0001, d_s_per_kv_token=1e-6)
CFG = EngineConfig(cost=COST, max_num_seqs=4, max_num_batched_tokens=256, max_model_len=2048, kv_cache_tokens=8192)
CLASSES = [ClassSpec("interactive", 0, max_queue_wait_s=30.0),
           ClassSpec("batch", 1, max_queue_wait_s=120.0, preemptible=True)]


class Tape:
    """The tap: every event the run hands its front, as the gateway's recorder writes it."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, event: Event, now: float, preempt: bool, decisions: Sequence[Decision]) -> None:
        self.lines.append(json.dumps(step_line(event, now, preempt, decisions)))


def observed(tl: Timeline) -> Observation:
    c = tl.counts
    return Observation(tl.id, tl.cls, tl.outcome or Outcome.REJECTED, tl.prompt_tokens, tl.output_tokens,
                       tl.arrived_at, tl.finished_at or tl.arrived_at, tl.dispatched_at, tl.first_token_at, tl.backend,
                       None, c.attempts, c.preemptions, c.retries, c.retries_denied, c.migrations, c.hedges,
                       c.hedges_won)


def test_a_fleet_run_with_deaths_hedges_and_suspensions_replays_and_counts_as_its_decisions_say() -> None:
    params = FrontParams(classes=CLASSES, backends=[BackendSpec(n, 3, continues=True) for n in ("a", "b", "c")],
                         queue=QueueParams(), preemption=PreemptionParams(enabled=True),
                         hedging=HedgeParams(enabled=True, min_samples=3, min_delay_s=0.01, max_share=0.5))
    hosts = [Host("a", Engine(CFG)), Host("b", Engine(CFG.slowed(4)), dies_at=1.5, revives_at=4.0),
             Host("c", Engine(CFG))]
    arrivals = [Arrival(f"c{i}", 0.1 * i, 100, 20) for i in range(60)]
    arrivals += [Arrival(f"b{i}", 0.3 * i, 200, 600, cls="batch") for i in range(12)]
    tape = Tape()
    tls = run_fleet(hosts, sorted(arrivals, key=lambda a: a.at), VirtualClock(), Front(params), tap=tape)
    total = {n: sum(getattr(tl.counts, n) for tl in tls) for n in COUNTED}
    # The run met every counter's cause: retries, migrations, suspensions and hedges.
    assert all(total[n] > 0 for n in ("retries", "migrations", "preemptions", "hedges")), total
    lines = [json.dumps(header_line(Header(params))), *tape.lines,
             *(json.dumps(request_line(observed(tl))) for tl in tls)]
    recording = read(lines)
    result = conform(recording)
    assert result.identical, str(result)
    decided = counted(recording)
    assert all(decided.get(tl.id) == tl.counts or (tl.counts == type(tl.counts)() and tl.id not in decided)
               for tl in tls)


def test_an_overloaded_fleet_with_ttft_targets_replays_its_refusals_and_sheds() -> None:
    """Deadline refusals, sheds and predicted-TTFT routing decide from the latency fit, learnt from
    the recorded first tokens: a fresh front reaches every one of them again (issue 30)."""
    targeted = [ClassSpec("interactive", 0, max_queue_wait_s=30.0, slo=Slo(ttft_s=0.6)),
                ClassSpec("batch", 1, max_queue_wait_s=120.0, preemptible=True)]
    params = FrontParams(classes=targeted, backends=[BackendSpec(n, 3, continues=True) for n in ("a", "b")],
                         routing=RoutingParams(policy="predicted-ttft"))
    hosts = [Host("a", Engine(CFG)), Host("b", Engine(CFG.slowed(3)))]
    arrivals = [Arrival(f"c{i}", 0.02 * i, 50 + (i * 37) % 400, 20) for i in range(400)]
    tape = Tape()
    tls = run_fleet(hosts, arrivals, VirtualClock(), Front(params), tap=tape)
    reasons = {tl.reject_reason for tl in tls if tl.outcome is Outcome.REJECTED}
    assert {"deadline", "shed"} <= reasons, reasons
    lines = [json.dumps(header_line(Header(params))), *tape.lines,
             *(json.dumps(request_line(observed(tl))) for tl in tls)]
    result = conform(read(lines))
    assert result.identical, str(result)
