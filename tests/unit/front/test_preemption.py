"""The preemption policy, the continuation body and the scheduler/pool hooks they use, on
literal numbers."""

from __future__ import annotations

from tailguard.front.slots import BackendPool
from tailguard.front.params import BackendSpec, ClassSpec, PreemptionParams, QueueParams
from tailguard.front.preemption import Candidate, PreemptionPolicy
from tailguard.front.queue import Pending
from tailguard.front.ranked import RankedSjfScheduler

CHAT = Pending("chat", "interactive", 0, 40, arrived_at=10.0, wait_bound_at=40.0)


def cand(id: str, remaining: int, *, rank: int = 1, preemptions: int = 0, since: float = 0.0) -> Candidate:
    return Candidate(id, "batch" if rank else "interactive", rank, "b0", remaining, preemptions, since)


def test_the_victim_is_the_lower_priority_request_with_most_work_left() -> None:
    p = PreemptionPolicy(max_preemptions=3, min_run_s=0.0)
    running = [cand("a", 500), cand("b", 1900), cand("c", 1200), cand("i", 5000, rank=0)]
    assert p.victim(CHAT, running, 10.0, lambda c: True) == running[1]


def test_never_a_request_of_the_same_or_higher_priority() -> None:
    p = PreemptionPolicy()
    assert p.victim(CHAT, [cand("i", 5000, rank=0)], 10.0, lambda c: True) is None
    batch_head = Pending("b9", "batch", 1, 2080, 10.0, 600.0)
    assert p.victim(batch_head, [cand("a", 1900)], 10.0, lambda c: True) is None


def test_limits_preemption_count_minimum_run_and_fit() -> None:
    p = PreemptionPolicy(max_preemptions=2, min_run_s=1.0)
    tired = cand("a", 1900, preemptions=2)
    fresh = cand("b", 1800, since=9.5)  # started 0.5 s ago
    done = cand("c", 0)
    elsewhere = cand("d", 1700)
    ok = cand("e", 100)
    running = [tired, fresh, done, elsewhere, ok]
    assert p.victim(CHAT, running, 10.0, lambda c: c.id != "d") == ok
    assert p.victim(CHAT, running[:4], 10.0, lambda c: c.id != "d") is None


def test_ties_go_to_the_most_recently_started() -> None:
    p = PreemptionPolicy(min_run_s=0.0)
    assert p.victim(CHAT, [cand("a", 1000, since=1.0), cand("b", 1000, since=3.0)], 10.0, lambda c: True).id == "b"  # type: ignore[union-attr]


def test_a_request_of_the_same_rank_only_when_displaced_and_after_every_lower_priority() -> None:
    p = PreemptionPolicy(min_run_s=0.0)
    peer = Candidate("f1", "interactive", 0, "b0", 5000, 0, 0.0, displaced=True)
    plain_peer = Candidate("f2", "interactive", 0, "b0", 9000, 0, 0.0)
    assert p.victim(CHAT, [plain_peer], 10.0, lambda c: True) is None
    assert p.victim(CHAT, [plain_peer, peer], 10.0, lambda c: True) == peer
    assert p.victim(CHAT, [peer, cand("a", 10)], 10.0, lambda c: True).id == "a"  # type: ignore[union-attr]
    assert p.victim(CHAT, [peer, cand("a", 10)], 10.0, lambda c: c.id != "a") == peer


def test_from_params_off_for_fcfs_and_when_disabled() -> None:
    assert PreemptionPolicy.from_params(PreemptionParams(), "ranked-sjf") == PreemptionPolicy(16, 0.0)
    assert PreemptionPolicy.from_params(PreemptionParams(), "fcfs") is None
    assert PreemptionPolicy.from_params(PreemptionParams(enabled=False), "ranked-sjf") is None


def test_pool_fit_after_release_respects_shares() -> None:
    classes = [ClassSpec(name="interactive", rank=0), ClassSpec(name="batch", rank=1, max_share=0.5)]
    pool = BackendPool([BackendSpec(name="b0", max_concurrency=2)], classes)
    pool.acquire("b0", "batch")
    pool.acquire("b0", "interactive")
    assert pool.fits_after_release("b0", "interactive", "batch")
    assert pool.fits_after_release("b0", "batch", "batch")  # batch may hold 1 of 2
    assert not pool.fits_after_release("b0", "batch", "interactive")  # batch would still hold its 1


def test_scheduler_head_take_requeue_keep_arrival_and_guarantees() -> None:
    classes = [ClassSpec(name="interactive", rank=0), ClassSpec(name="batch", rank=1, min_share=0.5)]
    s = RankedSjfScheduler(QueueParams(), classes)
    s.push(Pending("b1", "batch", 1, 2080, 0.0, 600.0), 0.0)
    assert s.pop(0.0) is not None and s.running("batch") == 1
    assert not s.guaranteed("batch")  # floor(0.5 * 1) = 0 slots guaranteed
    s.push(Pending("c0", "interactive", 0, 40, 1.0, 31.0), 1.0)
    assert s.pop(1.0) is not None
    assert s.guaranteed("batch")  # 1 of 2 running, floor(0.5 * 2) = 1: suspending it breaks the floor
    s.push(CHAT, 10.0)
    assert s.head(10.0) == CHAT and len(s) == 1  # head leaves it queued
    s.requeue(Pending("b1", "batch", 1, 2080, 0.0, 610.0), 10.0)
    assert s.running("batch") == 0 and s.queue_len("batch") == 1
    assert s.take("chat", 10.0) == CHAT and s.running("interactive") == 2
    back = s.pop(10.5)
    assert back is not None and back.id == "b1" and back.arrived_at == 0.0
