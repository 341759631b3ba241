"""The discrete-event run of a fleet (`sim.des.run_fleet`): several engines behind one front,
the front's `Start` picking the engine, hosts that are slow, die or hang; on virtual time."""

from collections.abc import Sequence

import pytest

from tailguard.clock import VirtualClock
from tailguard.front.events import Decision, Drop, Ejected, Event, Failed, HealthChanged, Probed, Start, StartMode
from tailguard.front.front import Front
from tailguard.front.params import (
    BackendSpec, ClassSpec, FrontParams, HedgeParams, PreemptionParams, QueueParams, RoutingParams,
)
from tailguard.sim.cost import CostModel, EngineConfig
from tailguard.sim.des import run_fleet
from tailguard.sim.scenario import Arrival, Host, Probing, Timeline
from tailguard.sim.engine import Engine
from tailguard.sim.fault import Faults
from tailguard.types import FailureKind, Outcome

COST = CostModel(a_s=0.01, b_s_per_prefill_token=0.0001, c_s_per_decode_seq=0.0001, d_s_per_kv_token=1e-6)
CFG = EngineConfig(cost=COST, max_num_seqs=4, max_num_batched_tokens=256, max_model_len=1024, kv_cache_tokens=4096)


class _Recorded(Front):
    """A front that keeps each `Start` and change of health it decided, and each `Failed` and
    `Probed` it was told (with its instant)."""

    def __init__(self, params: FrontParams) -> None:
        super().__init__(params)
        self.starts: list[Start] = []
        self.failed: list[Failed] = []
        self.probed: list[tuple[float, Probed]] = []
        self.health: list[tuple[float, HealthChanged]] = []
        self.ejected: list[tuple[int, Ejected]] = []  # with how many Starts came before it
        self.hedge_decisions: list[Start | Drop] = []  # hedges' Starts and their Drops

    def handle(self, event: Event, now: float, *, preempt: bool = True) -> Sequence[Decision]:
        if isinstance(event, Failed):
            self.failed.append(event)
        if isinstance(event, Probed):
            self.probed.append((now, event))
        out = super().handle(event, now, preempt=preempt)
        for d in out:
            if isinstance(d, Start) and d.mode is StartMode.HEDGE:
                self.hedge_decisions.append(d)
            elif isinstance(d, Start):
                self.starts.append(d)
            elif isinstance(d, Ejected):
                self.ejected.append((len(self.starts), d))
            elif isinstance(d, Drop):
                self.hedge_decisions.append(d)
        self.health += [(now, d) for d in out if isinstance(d, HealthChanged)]
        return out


def fleet_front(*backends: tuple[str, int], classes: list[ClassSpec] | None = None, preempt: bool = False,
                routing: str = "round-robin", hedging: HedgeParams = HedgeParams()) -> _Recorded:
    """A front over `backends` (name, max_concurrency); round-robin unless said, so a test knows
    where each request goes."""
    return _Recorded(FrontParams(
        classes=classes or [ClassSpec("interactive", 0)],
        backends=[BackendSpec(name, max_concurrency=mc, continues=True) for name, mc in backends],
        queue=QueueParams(policy="ranked-sjf"), preemption=PreemptionParams(enabled=preempt),
        routing=RoutingParams(policy=routing), hedging=hedging))  # type: ignore[arg-type]


def whole(tl: Timeline) -> bool:
    """Every token it counts has its time, in order: nothing lost, nothing counted twice."""
    times = tl.token_times or []
    return len(times) == tl.output_tokens and times == sorted(times)


def test_three_engines_each_take_what_the_front_starts_there() -> None:
    f = fleet_front(("a", 2), ("b", 2), ("c", 2))
    hosts = [Host(n, Engine(CFG)) for n in "abc"]
    arrivals = [Arrival(f"r{i}", 0.02 * i, 50, 30) for i in range(30)]
    tls = run_fleet(hosts, arrivals, VirtualClock(), f, record_tokens=True)
    last = {s.id: s.backend for s in f.starts}
    assert all(tl.outcome is Outcome.SUCCESS and whole(tl) and tl.output_tokens == 30 for tl in tls)
    assert {tl.id: tl.backend for tl in tls} == last
    assert {tl.backend for tl in tls} == {"a", "b", "c"}
    # each engine did exactly the work the front sent it: its prompt tokens are its requests'
    for h in hosts:
        assert h.engine.prompt_tokens_total == 50 * sum(tl.backend == h.name for tl in tls)


def test_a_slow_engine_does_the_same_work_five_times_slower() -> None:
    f = fleet_front(("fast", 1), ("slow", 1))
    hosts = [Host("fast", Engine(CFG)), Host("slow", Engine(CFG.slowed(5)))]
    tls = run_fleet(hosts, [Arrival("x", 0.0, 100, 20), Arrival("y", 0.0, 100, 20)], VirtualClock(), f)
    by = {tl.backend: tl for tl in tls}
    fast, slow = by["fast"], by["slow"]
    assert fast.ttft_s is not None and slow.ttft_s == pytest.approx(5 * fast.ttft_s)
    assert fast.e2e_s is not None and slow.e2e_s == pytest.approx(5 * fast.e2e_s)


def test_a_dying_engine_fails_what_it_holds_and_the_front_decides_what_goes_again() -> None:
    """b dies at 0.5 s. The stream it was generating had delivered tokens: the front moves it to a,
    which continues it from its text to its full length, each token once, after a pause. The one
    waiting in b's engine had nothing yet: the front tries b again on a fresh connection (refused)
    and then a. Requests sent to b later are refused at connect and go to a, until three failures
    in a row eject b."""
    f = fleet_front(("a", 8), ("b", 4))
    one_at_a_time = EngineConfig(cost=COST, max_num_seqs=1, max_num_batched_tokens=256, max_model_len=1024,
                                 kv_cache_tokens=4096)
    hosts = [Host("a", Engine(CFG)), Host("b", Engine(one_at_a_time), dies_at=0.5)]
    early = [Arrival(f"e{i}", 0.0, 50, 200) for i in range(4)]
    late = [Arrival(f"l{i}", 1.0 + 0.1 * i, 50, 10) for i in range(6)]
    tls = {tl.id: tl for tl in run_fleet(hosts, early + late, VirtualClock(), f, record_tokens=True)}
    assert all(tl.outcome is Outcome.SUCCESS and tl.backend == "a" and whole(tl) for tl in tls.values())
    assert all(tls[f"e{i}"].output_tokens == 200 for i in range(4))
    [moved] = [s.id for s in f.starts if s.mode is StartMode.MIGRATE]
    m = tls[moved]
    assert [e.kind for e in f.failed if e.id == moved] == [FailureKind.DISCONNECT]
    assert [e.delivered for e in f.failed if e.id == moved] == [True] and m.failures == 1
    times = m.token_times or []
    before = [t for t in times if t <= 0.5]
    assert 0 < len(before) < 200 and times[len(before)] > 0.5  # it paused while moving, nothing lost or repeated
    [waited] = [i for i in dict.fromkeys(s.id for s in f.starts if s.backend == "b" and s.id.startswith("e"))
                if i != moved]
    assert [e.kind for e in f.failed if e.id == waited] == [FailureKind.DISCONNECT, FailureKind.CONNECT]
    assert tls[waited].failures == 2
    # three failed attempts in a row eject b: nothing is started there after that
    [(before_ejection, ejected)] = f.ejected
    assert (ejected.backend, ejected.failures) == ("b", 3)
    assert not any(s.backend == "b" for s in f.starts[before_ejection:])


def test_a_hung_host_fails_each_request_at_the_header_deadline_and_it_goes_elsewhere() -> None:
    f = fleet_front(("ok", 8), ("hung", 8))
    hosts = [Host("ok", Engine(CFG)), Host("hung", Engine(CFG), faults=Faults(fault="hang-completions"))]
    arrivals = [Arrival(f"r{i}", 0.1 * i, 50, 10) for i in range(10)]
    tls = run_fleet(hosts, arrivals, VirtualClock(), f, header_timeout_s=2.0, record_tokens=True)
    assert all(tl.outcome is Outcome.SUCCESS and tl.backend == "ok" and whole(tl) for tl in tls)
    stalled = [tl for tl in tls if tl.failures]
    assert stalled and all(e.kind is FailureKind.TIMEOUT_HEADER and not e.answered for e in f.failed)
    assert all(tl.ttft_s is not None and 2.0 <= tl.ttft_s < 2.1 for tl in stalled)
    assert all(tl.ttft_s is not None and tl.ttft_s < 0.1 for tl in tls if not tl.failures)
    assert len(stalled) == sum(s.backend == "hung" for s in f.starts)
    assert hosts[1].engine.steps_total == 0


def test_a_host_answers_404_for_a_model_it_does_not_serve() -> None:
    f = fleet_front(("llama", 4), ("qwen", 4))
    hosts = [Host("llama", Engine(CFG), models=("llama-a",)), Host("qwen", Engine(CFG), models=("qwen-b",))]
    arrivals = [Arrival(f"r{i}", 0.05 * i, 20, 5, model=("llama-a", "qwen-b")[i % 2]) for i in range(8)]
    tls = run_fleet(hosts, arrivals, VirtualClock(), f)
    served = {"llama": "llama-a", "qwen": "qwen-b"}
    for tl, a in zip(tls, arrivals):
        if served[tl.backend or ""] == a.model:
            assert tl.outcome is Outcome.SUCCESS
        else:
            assert (tl.outcome, tl.reject_reason, tl.output_tokens) == (Outcome.CLIENT_ERROR, "model_not_found", 0)
    assert len(f) == 0 and all(b.in_flight == 0 and b.healthy for b in f.backends())


def test_a_request_suspended_while_its_engine_is_mid_step_loses_that_step_and_nothing_else() -> None:
    """Steps of a slower engine end between those of a faster one, so a chat arriving there gets
    a batch job suspended on the other engine mid-step: the job is continued later to its full
    length, each of its tokens delivered once."""
    cls = [ClassSpec("interactive", 0), ClassSpec("batch", 1, preemptible=True, max_queue_wait_s=600)]
    f = fleet_front(("a", 1), ("b", 1), classes=cls, preempt=True)
    hosts = [Host("a", Engine(CFG)), Host("b", Engine(CFG.slowed(1.37)))]
    arrivals = [Arrival("j1", 0.0, 30, 300, cls="batch"), Arrival("j2", 0.0, 30, 300, cls="batch")]
    arrivals += [Arrival(f"c{i}", 0.5 + 0.31 * i, 30, 20) for i in range(6)]
    tls = run_fleet(hosts, arrivals, VirtualClock(), f, record_tokens=True)
    assert all(tl.outcome is Outcome.SUCCESS and whole(tl) for tl in tls)
    jobs = tls[:2]
    assert all(tl.output_tokens == 300 for tl in jobs) and sum(tl.suspensions for tl in jobs) >= 2


def test_probes_take_a_dead_host_out_before_any_request_and_bring_it_back_when_it_revives() -> None:
    """b dies at 1 s and is back at 20 s: probes every 2 s see it refuse three times in a row
    (at 2, 4, 6 s: unhealthy) and answer again at 20 s (the probe of that instant finds it
    back); meanwhile every request goes to a, and afterwards b takes its share again. A host
    hung on everything times out each probe."""
    f = fleet_front(("a", 4), ("b", 4), ("h", 4))
    hosts = [Host("a", Engine(CFG)), Host("b", Engine(CFG), dies_at=1.0, revives_at=20.0),
             Host("h", Engine(CFG), faults=Faults(fault="hang"))]
    arrivals = [Arrival(f"r{i}", 7.0 + 0.5 * i, 20, 5) for i in range(40)]
    tls = run_fleet(hosts, arrivals, VirtualClock(), f, probes=Probing(interval_s=2.0, timeout_s=0.5))
    assert all(tl.outcome is Outcome.SUCCESS and tl.failures == 0 for tl in tls)
    assert [(t, (c.backend, c.healthy)) for t, c in f.health] == [
        (4.5, ("h", False)), (6.0, ("b", False)), (20.0, ("b", True))]
    assert {tl.backend for tl in tls if tl.arrived_at < 20.0} == {"a"}
    assert {tl.backend for tl in tls if tl.arrived_at >= 20.0} == {"a", "b"}
    assert all(p.ok for t, p in f.probed if p.backend == "a")
    assert [t for t, p in f.probed if p.backend == "h"][:3] == [0.5, 2.5, 4.5]  # each at its timeout
    last = tls[-1].finished_at
    assert last is not None and f.probed[-1][0] < last + 2.0  # probes stop with the work


def test_an_error_rate_fails_that_share_with_a_500_and_the_front_tries_elsewhere() -> None:
    f = fleet_front(("ok", 8), ("flaky", 8))
    hosts = [Host("ok", Engine(CFG)), Host("flaky", Engine(CFG), faults=Faults(error_rate=0.5))]
    tls = run_fleet(hosts, [Arrival(f"r{i}", 0.1 * i, 20, 5) for i in range(20)], VirtualClock(), f)
    assert all(tl.outcome is Outcome.SUCCESS for tl in tls)
    sent = sum(s.backend == "flaky" for s in f.starts)
    assert len(f.failed) == sent // 2 and all(e.kind is FailureKind.STATUS and e.answered for e in f.failed)
    assert {tl.backend for tl in tls if tl.failures} == {"ok"}


def test_a_hedge_runs_beside_the_first_attempt_and_the_first_to_stream_wins() -> None:
    """Every other chat goes to an engine 5x slower; once the front knows the class's TTFT, a chat
    still without content past it is sent to the fast engine too; the first attempt to stream wins
    (the slow one, when its prefill was nearly done), the other is dropped at once, and the chat
    gets each of its tokens once."""
    hedging = HedgeParams(enabled=True, min_samples=4, max_share=0.5, min_delay_s=0.01)
    f = fleet_front(("fast", 8), ("slow", 8), hedging=hedging)
    hosts = [Host("fast", Engine(CFG)), Host("slow", Engine(CFG.slowed(5)))]
    tls = run_fleet(hosts, [Arrival(f"r{i}", 0.3 * i, 200, 20) for i in range(30)], VirtualClock(), f,
                    record_tokens=True)
    assert all(tl.outcome is Outcome.SUCCESS and tl.output_tokens == 20 and whole(tl) for tl in tls)
    hedged = {d.id for d in f.hedge_decisions if isinstance(d, Start)}
    drops = [d for d in f.hedge_decisions if isinstance(d, Drop)]
    assert hedged and sorted(d.id for d in drops) == sorted(hedged)  # one loser each
    assert {tl.id for tl in tls if tl.hedges} == hedged and all(tl.hedges <= 1 for tl in tls)
    loser = {d.id: d.loser for d in drops}
    assert all(tl.backend != loser[tl.id] for tl in tls if tl.id in hedged)  # served by the winner
    assert {d.backend for d in f.hedge_decisions if isinstance(d, Start)} == {"fast"}  # only the slow one's chats wait
    # each losing attempt was stopped in its engine at once
    assert sum(h.engine.finished_total["abort"] for h in hosts) == len(hedged)


def test_a_fleet_must_match_the_front_and_faults_need_one() -> None:
    with pytest.raises(ValueError, match="must be the fleet's hosts"):
        run_fleet([Host("a", Engine(CFG))], [], VirtualClock(), fleet_front(("a", 1), ("b", 1)))
    with pytest.raises(ValueError, match="without a front"):
        run_fleet([Host("a", Engine(CFG), dies_at=1.0)], [], VirtualClock())
    with pytest.raises(ValueError, match="stall: not modeled"):
        run_fleet([Host("a", Engine(CFG), faults=Faults(fault="stall"))], [], VirtualClock(), fleet_front(("a", 1)))
    with pytest.raises(ValueError, match="only after it dies"):
        run_fleet([Host("a", Engine(CFG), revives_at=1.0)], [], VirtualClock(), fleet_front(("a", 1)))
    with pytest.raises(ValueError, match="distinct names"):
        run_fleet([Host("a", Engine(CFG)), Host("a", Engine(CFG))], [], VirtualClock(), fleet_front(("a", 1)))
