"""Token-fair sharing between callers (`front.fairshare`, `front.fairqueue`) on plain numbers:
the order against a reference written apart (least weighted counter first, SJF within a caller),
weights, the lift of a caller back from idle (with and without credit), the correction to real
use at the end, ranks kept, the front's switch, fair-share preemption (its rule, at most one
suspension per arrival, never back and forth), and VTC's two-client case on the discrete-event
simulator."""

from __future__ import annotations

import random
from dataclasses import replace

from tailguard.clock import VirtualClock
from tailguard.front.events import Arrive, Decision, Finished, Opened, ServedElsewhere, Start, Suspend
from tailguard.front.fairshare import VirtualCounters
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, CallerSpec, ClassSpec, FrontParams, QueueParams
from tailguard.front.fairqueue import FairShareScheduler
from tailguard.front.queue import Pending
from tailguard.front.ranked import RankedSjfScheduler
from tailguard.front.schedulers import carry_over, make_scheduler
from tailguard.front.tracked import State
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import run
from tailguard.sim.scenario import Arrival
from tailguard.sim.engine import Engine
from tailguard.types import Outcome

CLASSES = [ClassSpec(name="interactive", rank=0, max_queue_len=10_000, max_queue_wait_s=1e6),
           ClassSpec(name="batch", rank=1, max_queue_len=10_000, max_queue_wait_s=1e6)]
FAIR = QueueParams(fair_share=True, aging_s=1e9, fair_credit=0.0)  # VTC exactly: no credit


def pending(req_id: str, caller: str, prompt: int, out: int, at: float = 0.0, cls: str = "interactive") -> Pending:
    rank = 0 if cls == "interactive" else 1
    return Pending(req_id, cls, rank, prompt + out, at, 1e6, caller, out)


def drain(s: FairShareScheduler | RankedSjfScheduler) -> list[str]:
    out = []
    while (p := s.pop(0.0)) is not None:
        out.append(p.id)
    return out


def reference(jobs: list[tuple[str, str, int, int]], weights: dict[str, float]) -> list[str]:
    """VTC's order written out plainly: each step, the caller with the least counter (ties by
    name) sends its shortest job (ties by arrival); it is charged prompt x 1 + output x 2 over
    its weight."""
    queues: dict[str, list[tuple[int, int, str, int, int]]] = {}
    for i, (rid, caller, prompt, out) in enumerate(jobs):
        queues.setdefault(caller, []).append((prompt + out, i, rid, prompt, out))
    counter = {c: 0.0 for c in queues}
    order = []
    while any(queues.values()):
        caller = min((c for c in queues if queues[c]), key=lambda c: (counter[c], c))
        job = min(queues[caller])
        queues[caller].remove(job)
        counter[caller] += (job[3] + 2 * job[4]) / weights.get(caller, 1.0)
        order.append(job[2])
    return order


def test_the_order_matches_the_reference_with_weights_and_sjf_inside_each_caller() -> None:
    jobs = [("a1", "a", 200, 100), ("a2", "a", 50, 20), ("a3", "a", 900, 300), ("a4", "a", 200, 100),
            ("b1", "b", 100, 500), ("b2", "b", 300, 50), ("c1", "c", 10, 10), ("c2", "c", 800, 800),
            ("c3", "c", 40, 40), ("a5", "a", 60, 60), ("b3", "b", 20, 20)]
    for weights in ({}, {"a": 2.0}, {"b": 3.0, "c": 0.5}):
        s = FairShareScheduler(QueueParams(fair_share=True, aging_s=1e9, sjf_size_ratio=1.0), CLASSES, weights)
        for rid, caller, prompt, out in jobs:
            assert s.push(pending(rid, caller, prompt, out), 0.0) is None
        assert drain(s) == reference(jobs, weights), weights


def test_equal_callers_alternate_and_a_weight_of_two_gets_two_turns() -> None:
    s = FairShareScheduler(FAIR, CLASSES, {"a": 2.0})
    for i in range(6):
        s.push(pending(f"a{i}", "a", 200, 100), 0.0)
        s.push(pending(f"b{i}", "b", 200, 100), 0.0)
    assert [rid[0] for rid in drain(s)][:9] == list("abaabaaba")
    plain = RankedSjfScheduler(FAIR, CLASSES)  # without fair sharing: arrival order among equals
    for i in range(3):
        for j, caller in enumerate("aab"):
            plain.push(pending(f"{caller}{i}{j}", caller, 200, 100), 0.0)
    assert [rid[0] for rid in drain(plain)] == list("aabaabaab")


def test_a_caller_back_from_idle_is_lifted_to_the_least_backlogged_counter() -> None:
    s = FairShareScheduler(FAIR, CLASSES)
    for i in range(4):
        s.push(pending(f"a{i}", "a", 100, 100), 0.0)
        s.push(pending(f"b{i}", "b", 100, 100), 0.0)
    for _ in range(4):
        s.pop(0.0)  # two of each dispatched: both counters at 600
    assert s.vtc.counter("a") == s.vtc.counter("b") == 600
    s.push(pending("c0", "c", 100, 100), 0.0)  # idle until now: it banks nothing
    assert s.vtc.counter("c") == 600
    s.push(pending("c1", "c", 100, 100), 0.0)
    assert [rid[0] for rid in drain(s)] == list("abcabc")  # not c, c first


def test_the_end_corrects_the_charge_to_what_was_used() -> None:
    vtc = VirtualCounters({"a": 2.0})
    vtc.dispatched("r", "a", prompt_tokens=300, output_tokens=200)
    assert vtc.counter("a") == (300 + 400) / 2
    vtc.dispatched("r", "a", prompt_tokens=300, output_tokens=200)  # resumed: charged once
    vtc.ended("r", used_tokens=350)  # 300 prompt + 50 generated
    assert vtc.counter("a") == (300 + 100) / 2
    vtc.dispatched("q", "a", 100, 100)
    vtc.ended("q", 0)  # no engine answered it: it cost nothing
    assert vtc.counter("a") == 200
    vtc.ended("never", 10)  # never dispatched: nothing to correct


def test_ranks_still_come_first() -> None:
    s = FairShareScheduler(FAIR, CLASSES)
    s.push(pending("b-batch", "b", 10, 10, cls="batch"), 0.0)
    for i in range(3):
        s.push(pending(f"a{i}", "a", 100, 100), 0.0)
    assert drain(s) == ["a0", "a1", "a2", "b-batch"]


def test_the_switch_and_its_rule() -> None:
    assert isinstance(make_scheduler(FAIR, CLASSES), FairShareScheduler)
    assert type(make_scheduler(QueueParams(), CLASSES)) is RankedSjfScheduler
    try:
        make_scheduler(QueueParams(policy="fcfs", fair_share=True), CLASSES)
    except Exception as e:
        assert "ranked-sjf" in str(e)
    else:
        raise AssertionError("fair_share with fcfs must be refused")


def test_the_front_shares_one_slot_fairly_and_corrects_at_each_end() -> None:
    f = Front(FrontParams(classes=CLASSES, backends=[BackendSpec("e", max_concurrency=1)], queue=FAIR,
                          callers=[CallerSpec("a"), CallerSpec("b")]))
    started = []
    for i in range(4):
        for j, caller in enumerate(("a", "a", "b")):  # a sends twice as much
            started += f.handle(Arrive(f"{caller}{i}{j}", "interactive", 300, max_tokens=100, caller=caller), 0.0)
    order = [d.id for d in started if isinstance(d, Start)]
    t = 0.0
    while order and len(order) < 12:
        t += 1.0
        ended = order[-1]
        order += [d.id for d in f.handle(Finished(ended, Outcome.SUCCESS, tokens=300), t) if isinstance(d, Start)]
    # b arrived while a's first ran: lifted to a's counter, it ties, then they alternate while both
    # wait (arrival order would be a a b a a b a a b), and a has the slot to itself once b is done.
    assert [rid[0] for rid in order] == list("aababababaaa")


def _served(fair: bool) -> float:
    """VTC's two-client case: client a at 1.5 requests a second, b at 3, both backlogged on an
    engine that serves about 2; the ratio of tokens served to b and to a after the warm-up."""
    cfg = EngineConfig.from_preset("h100-llama8b", max_num_seqs=4, max_model_len=4096, kv_cache_tokens=65536)
    front = Front(FrontParams(classes=CLASSES, backends=[BackendSpec("engine", max_concurrency=4, continues=True)],
                              queue=QueueParams(fair_share=fair, aging_s=1e9),
                              callers=[CallerSpec("a"), CallerSpec("b")]))
    arrivals = [Arrival(f"a{i}", at=i / 1.5, prompt_tokens=256, max_tokens=256, caller="a") for i in range(90)]
    arrivals += [Arrival(f"b{i}", at=i / 3.0, prompt_tokens=256, max_tokens=256, caller="b") for i in range(180)]
    timelines = run(Engine(cfg), sorted(arrivals, key=lambda a: a.at), VirtualClock(), front)
    served = {"a": 0, "b": 0}
    for tl in timelines:
        if tl.finished_at is not None and 10.0 <= tl.finished_at <= 55.0:
            served[tl.id[0]] += tl.prompt_tokens + 2 * tl.output_tokens
    return served["b"] / served["a"]


def test_vtcs_two_client_case_on_the_simulator() -> None:
    fair, plain = _served(True), _served(False)
    assert fair <= 1.15, fair
    assert 1.7 <= plain <= 2.3, plain


def test_a_caller_back_from_idle_starts_at_most_its_credit_below_the_backlogged() -> None:
    vtc = VirtualCounters(credit=500.0)
    vtc.counters.update(a=2000.0, b=3000.0, c=1800.0)
    vtc.arrived("c", backlogged=["a", "b"])
    assert vtc.counter("c") == 1800.0  # within its credit of a's 2000: kept
    vtc.counters["d"] = 100.0
    vtc.arrived("d", backlogged=["a", "b"])
    assert vtc.counter("d") == 1500.0  # lifted to a's 2000 less its credit
    vtc.arrived("e", backlogged=[])
    assert vtc.counter("e") == 0.0  # nobody waiting: nothing to be lifted to


def test_credit_lets_a_returning_callers_burst_ahead_of_a_backlogged_one() -> None:
    s = FairShareScheduler(replace(FAIR, fair_credit=900.0), CLASSES)
    for i in range(6):
        s.push(pending(f"f{i}", "f", 100, 100), 0.0)
    for _ in range(4):
        s.pop(0.0)  # f at 1200
    for i in range(3):
        s.push(pending(f"w{i}", "w", 100, 100), 0.0)  # w starts at 1200 - 900 = 300
    # w goes first until it has caught up: 300 -> 600 -> 900 -> 1200 (a tie, then by name)
    assert [rid[0] for rid in drain(s)] == list("wwwff")


def _displacing(gap: float | None) -> FairShareScheduler:
    s = FairShareScheduler(replace(FAIR, fair_preempt_gap=gap), CLASSES)
    for i in range(4):
        s.push(pending(f"f{i}", "f", 100, 100), 0.0)
    for _ in range(4):
        s.pop(0.0)  # f's four run: f at 1200
    s.push(pending("w0", "w", 100, 100), 0.0)  # w at 0 (nobody waiting to be lifted to)
    return s


def test_displacement_follows_the_gap_once_the_waiting_request_is_paid_for() -> None:
    w0 = pending("w0", "w", 100, 100)
    # w at 0 + its own request's 300 = 300, f at 1200: a gap of 900
    assert _displacing(0.0).displaceable(w0, ["f2", "f3"]) == {"f2", "f3"}
    assert _displacing(899.0).displaceable(w0, ["f3"]) == {"f3"}
    assert _displacing(900.0).displaceable(w0, ["f3"]) == set()
    assert _displacing(None).displaceable(w0, ["f3"]) == set()  # off
    s = _displacing(0.0)
    s.push(pending("f4", "f", 100, 100), 0.0)
    assert s.displaceable(pending("f4", "f", 100, 100), ["f3"]) == set()  # never its own caller's
    assert RankedSjfScheduler(FAIR, CLASSES).displaceable(w0, ["f3"]) == set()


def test_only_the_caller_furthest_above_is_displaced() -> None:
    s = _displacing(0.0)
    s.push(pending("g0", "g", 100, 100), 0.0)
    s.take("g0", 0.0)  # g at 300: above w's 0, but not once w0 is paid for
    s.vtc.counters["g"] = 1000.0  # above w0's 300, below f's 1200
    assert s.displaceable(pending("w0", "w", 100, 100), ["g0", "f3", "f1"]) == {"f1", "f3"}


def test_the_displaced_caller_cannot_displace_back() -> None:
    """Whatever the counters and sizes, once `w` has taken `f`'s slot, `f` cannot take it back."""
    rng = random.Random(7)
    for _ in range(300):
        gap = rng.choice([0.0, 100.0, 1000.0])
        vtc = VirtualCounters()
        vtc.counters.update(w=rng.uniform(0, 5000), f=rng.uniform(0, 5000))
        s = FairShareScheduler(replace(FAIR, fair_preempt_gap=gap), CLASSES)
        s.vtc = vtc
        w = pending("w", "w", rng.randint(1, 2000), rng.randint(1, 2000))
        f = pending("f", "f", rng.randint(1, 2000), rng.randint(1, 2000))
        s.push(f, 0.0)
        s.take("f", 0.0)  # f runs, charged
        s.push(w, 0.0)
        if not s.displaceable(w, ["f"]):
            continue
        s.take("w", 0.0)  # w took f's slot, charged; f waits again
        s.requeue(replace(f, caller=None), 0.0)
        assert not s.displaceable(f, ["w"])


def test_a_request_that_leaves_while_queued_leaves_the_fair_queue_and_the_front_whole() -> None:
    # A client gone while its request waited: the queue still knows its caller as it removes it
    # (the front once settled the charge first, and the next Finished of a queued one broke it).
    f = Front(FrontParams(classes=CLASSES, backends=[BackendSpec("e", max_concurrency=1)], queue=FAIR,
                          callers=[CallerSpec("a"), CallerSpec("b")]))
    f.handle(Arrive("a0", "interactive", 300, max_tokens=100, caller="a"), 0.0)
    f.handle(Arrive("b0", "interactive", 300, max_tokens=100, caller="b"), 0.0)
    assert not f.handle(Finished("b0", Outcome.CLIENT_GONE, tokens=0), 1.0)
    started = list(f.handle(Arrive("b1", "interactive", 300, max_tokens=100, caller="b"), 1.0))
    started += f.handle(Finished("a0", Outcome.SUCCESS, tokens=300), 2.0)
    assert [d.id for d in started if isinstance(d, Start)] == ["b1"]


def _flood_front(slots: int, preemptible: bool, gap: float | None = 0.0) -> Front:
    cls = ClassSpec(name="interactive", max_queue_len=10_000, max_queue_wait_s=1e6, preemptible=preemptible)
    return Front(FrontParams(classes=[cls], backends=[BackendSpec("e", max_concurrency=slots, continues=True)],
                             queue=QueueParams(fair_share=True, aging_s=1e9, fair_preempt_gap=gap),
                             callers=[CallerSpec("f"), CallerSpec("w")]))  # w back from idle: its credit


def _started(front: Front, ev: Arrive, now: float) -> list[Decision]:
    out = list(front.handle(ev, now))
    for d in list(out):
        if isinstance(d, Start):
            out += front.handle(Opened(d.id), now)
    return out


def test_a_waiting_caller_below_its_share_takes_the_youngest_slot_of_the_one_above() -> None:
    f = _flood_front(2, preemptible=True)
    for i in range(3):
        _started(f, Arrive(f"f{i}", "interactive", 300, True, 100, "f"), float(i))
    out = _started(f, Arrive("w0", "interactive", 300, True, 100, "w"), 5.0)
    assert out[:2] == [Suspend("f1", "e"), Start("w0", "e")]  # f1 started last: least progress lost
    assert f.state("f1") is State.SUSPENDED and f.state("w0") is State.RUNNING
    # a second arrival of w: w is now charged for w0 and no longer far enough below f
    out = _started(f, Arrive("w1", "interactive", 300, True, 100, "w"), 6.0)
    assert not any(isinstance(d, Suspend) for d in out)


def test_no_fair_share_preemption_in_a_class_that_is_not_preemptible_or_when_it_is_off() -> None:
    for front in (_flood_front(2, preemptible=False), _flood_front(2, preemptible=True, gap=None)):
        for i in range(3):
            _started(front, Arrive(f"f{i}", "interactive", 300, True, 100, "f"), float(i))
        out = _started(front, Arrive("w0", "interactive", 300, True, 100, "w"), 5.0)
        assert not any(isinstance(d, Suspend) for d in out)
        assert front.state("w0") is State.QUEUED


def test_on_the_simulator_a_flood_is_suspended_at_most_once_per_arrival_of_the_others() -> None:
    """One caller at 5x the rate of two others on one engine: the others are never suspended,
    and the flood no more often than they arrive (no thrash)."""
    cls = ClassSpec(name="interactive", max_queue_len=100_000, max_queue_wait_s=1e6, preemptible=True)
    front = Front(FrontParams(classes=[cls], backends=[BackendSpec("engine", max_concurrency=4, continues=True)],
                              queue=QueueParams(fair_share=True),
                              callers=[CallerSpec("f"), CallerSpec("a"), CallerSpec("b")]))
    rng = random.Random(3)
    arrivals = []
    for caller, rate in (("f", 7.5), ("a", 1.5), ("b", 1.5)):
        t = rng.expovariate(rate)
        while t < 20.0:
            arrivals.append(Arrival(f"{caller}{len(arrivals)}", at=t, prompt_tokens=256, max_tokens=64, caller=caller))
            t += rng.expovariate(rate)
    cfg = EngineConfig.from_preset("h100-llama8b", max_num_seqs=4, max_model_len=4096, kv_cache_tokens=65536)
    timelines = run(Engine(cfg), sorted(arrivals, key=lambda a: a.at), VirtualClock(), front)
    others = [tl for tl in timelines if tl.id[0] != "f"]
    suspended = sum(tl.suspensions for tl in timelines if tl.id[0] == "f")
    assert all(tl.outcome is Outcome.SUCCESS for tl in timelines)
    assert all(tl.suspensions == 0 for tl in others)
    assert 0 < suspended <= len(others)


def test_a_reload_keeps_the_counters_and_applies_the_new_weights_and_credit() -> None:
    old = FairShareScheduler(FAIR, CLASSES)
    old.push(pending("a0", "a", 100, 100), 0.0)
    old.pop(0.0)  # a at 300, a0 running
    new = carry_over(old, replace(FAIR, fair_credit=1000.0), CLASSES, {"b": 2.0})
    assert isinstance(new, FairShareScheduler) and new.vtc.counter("a") == 300
    new.settled("a0", 150)  # charged 300 by the old one, corrected by the new: 100 + 2 x 50
    assert new.vtc.counter("a") == 200
    assert new.vtc.credit == 1000.0 and new.vtc.weights == {"b": 2.0}


def test_replicas_sharing_service_order_their_callers_as_one_front_would() -> None:
    """Two fronts, each with one slot: `a` floods the first; `a` and `b` each queue one request
    at the second. Alone, the second serves `a` first (both at zero, ties by name); told the
    first's service (`ServedElsewhere`, as `gateway.shared.fair` carries it), it serves `b`
    first. What the first gives away is the service it gave, once."""
    def front() -> Front:
        return Front(FrontParams(classes=CLASSES, backends=[BackendSpec("e", max_concurrency=1)], queue=FAIR,
                                 callers=[CallerSpec("a"), CallerSpec("b")]))

    def second_starts(told: dict[str, float] | None) -> list[str]:
        f = front()
        out: list[Decision] = []
        out += f.handle(Arrive("busy", "interactive", 10, max_tokens=5, caller="c"), 0.0)  # holds the slot
        out += f.handle(Arrive("a1", "interactive", 300, max_tokens=100, caller="a"), 0.1)
        out += f.handle(Arrive("b1", "interactive", 300, max_tokens=100, caller="b"), 0.2)
        if told:
            out += f.handle(ServedElsewhere(told), 0.3)
        out += f.handle(Finished("busy", Outcome.SUCCESS, tokens=15), 1.0)
        return [d.id for d in out if isinstance(d, Start)]

    first = front()
    for i in range(3):
        first.handle(Arrive(f"flood{i}", "interactive", 300, max_tokens=100, caller="a"), 0.0)
    served = first.take_served()
    assert served == {"a": (300 - 100) + 2 * 100}  # the one started: its prompt, and its output twice
    assert first.take_served() == {}  # taken once
    assert second_starts(None) == ["busy", "a1"]
    assert second_starts(served) == ["busy", "b1"]


def test_taken_service_is_charges_and_corrections_and_absorbed_service_moves_only_the_counter() -> None:
    v = VirtualCounters(credit=0.0)
    v.dispatched("r1", "a", prompt_tokens=100, output_tokens=50)  # 200
    v.ended("r1", used_tokens=120)  # 100 + 2 x 20 = 140: -60
    v.arrived("b", backlogged=["a"])  # a lift: this front's own, not service
    assert v.counter("b") == 140.0
    assert v.take_served() == {"a": 140.0}
    v.absorb({"a": 1000.0, "c": 5.0})
    assert (v.counter("a"), v.counter("c")) == (1140.0, 5.0)
    assert v.take_served() == {}
