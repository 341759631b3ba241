"""Token-fair sharing between callers (`front.fairshare`, `FairShareScheduler`) on plain numbers:
the order against a reference written apart (least weighted counter first, SJF within a caller),
weights, the lift of a caller back from idle, the correction to real use at the end, ranks kept,
the front's switch, and VTC's two-client case on the discrete-event simulator."""

from __future__ import annotations

from tailguard.clock import VirtualClock
from tailguard.front.events import Arrive, Finished, Start
from tailguard.front.fairshare import VirtualCounters
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, CallerSpec, ClassSpec, FrontParams, QueueParams
from tailguard.front.queue import FairShareScheduler, Pending, RankedSjfScheduler, make_scheduler
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import Arrival, run
from tailguard.sim.engine import Engine
from tailguard.types import Outcome

CLASSES = [ClassSpec(name="interactive", rank=0, max_queue_len=10_000, max_queue_wait_s=1e6),
           ClassSpec(name="batch", rank=1, max_queue_len=10_000, max_queue_wait_s=1e6)]
FAIR = QueueParams(fair_share=True, aging_s=1e9)


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
