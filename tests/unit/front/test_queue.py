"""Scheduler policies driven with literal numbers: a list of push/pop calls at stated `now` values
and the order that comes out."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tailguard.errors import ConfigError
from tailguard.front.params import (
    BackendSpec, ClassSpec, EjectionParams, QueueParams, RoutingParams,
)
from tailguard.front.ejection import Ejector
from tailguard.front.router import NO_ROUTE, Router
from tailguard.front.slots import BackendPool
from tailguard.front.queue import BaseScheduler, FcfsScheduler, Pending
from tailguard.front.ranked import RankedSjfScheduler
from tailguard.front.refusal import Refusal
from tailguard.front.schedulers import SCHEDULERS, carry_over, make_scheduler
from tailguard.types import Outcome

CLASSES = [
    ClassSpec(name="interactive", rank=0, max_queue_len=4, max_queue_wait_s=30.0),
    ClassSpec(name="batch", rank=1, max_queue_len=6, max_queue_wait_s=600.0, max_share=0.75),
]
RANK = {c.name: c.rank for c in CLASSES}
WAIT = {c.name: c.max_queue_wait_s for c in CLASSES}


def req(id: str, cls: str, est: int, at: float) -> Pending:
    return Pending(id, cls, RANK[cls], est, at, at + WAIT[cls])


def sjf(aging_s: float = 10.0) -> RankedSjfScheduler:
    return RankedSjfScheduler(QueueParams(aging_s=aging_s), CLASSES)


def drain(s: BaseScheduler, now: float) -> list[str]:
    out = []
    while (p := s.pop(now)) is not None:
        out.append(p.id)
    return out


def set_drain_rate(s: BaseScheduler, interval_s: float, start: float = 0.0) -> float:
    """Two completions `interval_s` apart while a request is queued: the rate becomes 1/interval."""
    s.push(req("filler", "batch", 1, start), start)
    s.on_finish(None, Outcome.SUCCESS, start)
    s.on_finish(None, Outcome.SUCCESS, start + interval_s)
    assert s.remove("filler", start + interval_s)
    return start + interval_s


# --- ranked SJF ordering ----------------------------------------------------------------------

def test_strict_priority_between_ranks_then_shortest_first() -> None:
    s = sjf()
    s.push(req("b-long", "batch", 2080, 0.0), 0.0)
    s.push(req("b-short", "batch", 100, 0.1), 0.1)
    s.push(req("i-long", "interactive", 900, 0.2), 0.2)
    s.push(req("i-short", "interactive", 40, 0.3), 0.3)
    assert drain(s, 1.0) == ["i-short", "i-long", "b-short", "b-long"]
    assert len(s) == 0


def test_equal_sizes_keep_arrival_order() -> None:
    s = sjf()
    for i, at in enumerate([0.0, 0.5, 0.7]):
        s.push(req(f"c{i}", "interactive", 40, at), at)
    assert drain(s, 1.0) == ["c0", "c1", "c2"]


def test_aged_request_goes_before_younger_shorter_ones() -> None:
    s = sjf(aging_s=10.0)
    s.push(req("long", "batch", 4000, 0.0), 0.0)
    s.push(req("short1", "batch", 50, 1.0), 1.0)
    # At t=9.9 the long one is not aged yet: shortest first.
    assert s.pop(9.9) is not None and len(s) == 1
    s.push(req("short2", "batch", 50, 9.95), 9.95)
    # At t=10.0 it has waited aging_s: it goes before the younger, shorter short2.
    p = s.pop(10.0)
    assert p is not None and p.id == "long"
    p = s.pop(10.0)
    assert p is not None and p.id == "short2"


def test_aged_requests_go_oldest_first_and_higher_rank_still_wins() -> None:
    s = sjf(aging_s=5.0)
    s.push(req("b0", "batch", 900, 0.0), 0.0)
    s.push(req("b1", "batch", 100, 1.0), 1.0)
    s.push(req("i0", "interactive", 500, 7.0), 7.0)
    # Both batch requests are aged at t=8: b0 is older. But the interactive one is a higher rank.
    assert drain(s, 8.0) == ["i0", "b0", "b1"]


def test_aging_bound_holds_under_random_load() -> None:
    """No request is overtaken by a younger one of its rank later than arrived_at + aging_s."""
    aging_s = 30.0
    classes = [ClassSpec(name="batch", rank=0, max_queue_len=10_000, max_queue_wait_s=1e9)]
    s = RankedSjfScheduler(QueueParams(aging_s=aging_s), classes)
    rng = random.Random(7)
    queued: dict[str, Pending] = {}
    now = 0.0
    violations = overtaken = aged_pops = 0
    for i in range(4000):
        now += rng.expovariate(2.0)
        p = Pending(f"r{i}", "batch", 0, rng.choice([10, 100, 1000, 5000]), now, now + 1e9)
        assert s.push(p, now) is None
        queued[p.id] = p
        # Serve slower than arrivals for a while so a real backlog builds, then catch up.
        serve = (1 if rng.random() < 0.5 else 0) if (i // 500) % 2 == 0 else 2
        for _ in range(serve):
            got = s.pop(now)
            if got is None:
                break
            del queued[got.id]
            aged_pops += now >= got.arrived_at + aging_s
            for waiting in queued.values():
                if waiting.arrived_at < got.arrived_at:
                    overtaken += 1
                    if now > waiting.arrived_at + aging_s:
                        violations += 1
    assert overtaken > 1000  # SJF really did reorder, so the bound was exercised
    assert aged_pops > 100  # and aging really did decide some pops
    assert violations == 0


# --- FCFS ---------------------------------------------------------------------------------------

def test_fcfs_serves_arrival_order_across_classes() -> None:
    s = FcfsScheduler(QueueParams(policy="fcfs"), CLASSES)
    s.push(req("b-long", "batch", 2080, 0.0), 0.0)
    s.push(req("i-short", "interactive", 40, 0.5), 0.5)
    s.push(req("b-short", "batch", 10, 0.7), 0.7)
    assert drain(s, 1.0) == ["b-long", "i-short", "b-short"]


def test_fcfs_skips_a_class_that_is_not_admissible() -> None:
    s = FcfsScheduler(QueueParams(policy="fcfs"), CLASSES)
    s.push(req("b0", "batch", 2080, 0.0), 0.0)
    s.push(req("i0", "interactive", 40, 0.5), 0.5)
    p = s.pop(1.0, admissible=lambda p: p.cls != "batch")
    assert p is not None and p.id == "i0"
    assert s.pop(1.0, admissible=lambda p: p.cls != "batch") is None
    p = s.pop(1.0)
    assert p is not None and p.id == "b0"


def test_make_scheduler_picks_by_name_and_lists_known_on_unknown() -> None:
    assert isinstance(make_scheduler(QueueParams(policy="fcfs"), CLASSES), FcfsScheduler)
    assert isinstance(make_scheduler(QueueParams(), CLASSES), RankedSjfScheduler)
    assert set(SCHEDULERS) == {"fcfs", "ranked-sjf"}
    bad = QueueParams(policy="lifo")
    with pytest.raises(ConfigError, match=r"unknown scheduler policy 'lifo' \(known: fcfs, ranked-sjf\)"):
        make_scheduler(bad, CLASSES)


# --- reservation through the pool ---------------------------------------------------------------

def test_batch_cannot_take_the_slots_kept_for_interactive() -> None:
    pool = BackendPool([BackendSpec(name="gpu", max_concurrency=4)], CLASSES)
    s = sjf()
    for i in range(5):
        s.push(req(f"b{i}", "batch", 2000, float(i)), float(i))

    router = Router(RoutingParams(), Ejector(EjectionParams()))
    specs = {c.name: c for c in CLASSES}

    def admissible(p: Pending) -> bool:
        return router.choose(pool, specs[p.cls], p, NO_ROUTE, 5.0) is not None

    started = []
    while (p := s.pop(5.0, admissible)) is not None:
        pool.acquire("gpu", p.cls)
        started.append(p.id)
    # max_share 0.75 of 4 slots: batch holds 3, the fourth stays free.
    assert started == ["b0", "b1", "b2"]
    assert pool.in_flight("gpu") == 3 and len(s) == 2
    s.push(req("i0", "interactive", 40, 5.5), 5.5)
    p = s.pop(5.5, admissible)
    assert p is not None and p.id == "i0"
    pool.acquire("gpu", "interactive")
    assert s.pop(5.5, admissible) is None
    # A batch request finishing frees a batch-usable slot.
    pool.release("gpu", "batch")
    p = s.pop(6.0, admissible)
    assert p is not None and p.id == "b3"


def test_near_equal_sizes_keep_arrival_order_and_a_real_gap_jumps_the_queue() -> None:
    # Chats of 96..224 prompt tokens + 32 output tokens cost about the same time: with the default
    # ratio 4 none overtakes an older one (strict SJF starved the larger ones until aged).
    s = sjf()
    for i, (est, at) in enumerate([(256, 0.0), (128, 0.1), (200, 0.2)]):
        s.push(req(f"c{i}", "interactive", est, at), at)
    assert drain(s, 1.0) == ["c0", "c1", "c2"]
    # A gap beyond the ratio: 2080 > 4 * 500, so the 500 goes first; 500 < 4 * 200 keeps the 500 ahead of a younger 200.
    s.push(req("long", "batch", 2080, 2.0), 2.0)
    s.push(req("mid", "batch", 500, 2.1), 2.1)
    s.push(req("small", "batch", 200, 2.2), 2.2)
    assert drain(s, 3.0) == ["small", "mid", "long"]


def test_sjf_size_ratio_1_is_strict_shortest_first() -> None:
    s = RankedSjfScheduler(QueueParams(sjf_size_ratio=1.0), CLASSES)
    for i, (est, at) in enumerate([(256, 0.0), (128, 0.1), (200, 0.2)]):
        s.push(req(f"c{i}", "interactive", est, at), at)
    assert drain(s, 1.0) == ["c1", "c2", "c0"]


GUARANTEED = [
    ClassSpec(name="interactive", rank=0, max_queue_wait_s=30.0),
    ClassSpec(name="batch", rank=1, max_queue_wait_s=600.0, max_share=0.75, min_share=0.5),
]


def test_min_share_gives_batch_the_freed_slot_until_it_holds_its_guarantee() -> None:
    s = RankedSjfScheduler(QueueParams(), GUARANTEED)
    # Four slots, all held by chats (popped while no batch was queued).
    for i in range(4):
        s.push(Pending(f"i{i}", "interactive", 0, 40, 0.0, 30.0), 0.0)
    assert drain(s, 0.0) == ["i0", "i1", "i2", "i3"]
    assert (s.running("interactive"), s.running("batch"), s.running()) == (4, 0, 4)
    s.push(Pending("b0", "batch", 1, 2080, 1.0, 601.0), 1.0)
    s.push(Pending("b1", "batch", 1, 2080, 1.1, 601.1), 1.1)
    s.push(Pending("b2", "batch", 1, 2080, 1.2, 601.2), 1.2)
    for i in range(4, 8):
        s.push(Pending(f"i{i}", "interactive", 0, 40, 1.5, 31.5), 1.5)
    # A chat ends: 3 running + 1 = 4 slots; batch holds 0 < floor(0.5 * 4) = 2, so batch goes
    # first although chats are queued.
    s.on_finish("interactive", Outcome.SUCCESS, 2.0)
    p = s.pop(2.0)
    assert p is not None and p.id == "b0"
    s.on_finish("interactive", Outcome.SUCCESS, 2.5)
    p = s.pop(2.5)
    assert p is not None and p.id == "b1"
    # Batch holds 2 = its guarantee: strict priority again, chats first.
    s.on_finish("interactive", Outcome.SUCCESS, 3.0)
    p = s.pop(3.0)
    assert p is not None and p.id == "i4"
    assert (s.running("interactive"), s.running("batch")) == (2, 2)
    # A batch request ends: below the guarantee again, the next batch request goes.
    s.on_finish("batch", Outcome.SUCCESS, 4.0)
    p = s.pop(4.0)
    assert p is not None and p.id == "b2"
    # A request that ended while suspended (out of the running counts already) changes no count.
    s.on_finish(None, Outcome.SUCCESS, 4.5)
    assert s.running() == 4


def test_without_min_share_a_stream_of_chats_starves_batch() -> None:
    no_guarantee = [GUARANTEED[0], replace(GUARANTEED[1], min_share=0.0)]
    for classes, expected in ((no_guarantee, []), (GUARANTEED, ["b0", "b1"])):
        s = RankedSjfScheduler(QueueParams(), classes)
        # Four slots full of chats, then two batch requests queue.
        for i in range(4):
            s.push(Pending(f"c{i}", "interactive", 0, 40, 0.0, 30.0), 0.0)
        running = drain(s, 0.0)
        s.push(Pending("b0", "batch", 1, 2080, 0.0, 600.0), 0.0)
        s.push(Pending("b1", "batch", 1, 2080, 0.0, 600.0), 0.0)
        # Every 0.1 s a chat ends and a new one arrives; batch requests once started keep their slot.
        started_batch = []
        t = 0.0
        for i in range(4, 40):
            t = round(t + 0.1, 1)
            s.push(Pending(f"c{i}", "interactive", 0, 40, t, t + 30.0), t)
            running.pop(0)
            s.on_finish("interactive", Outcome.SUCCESS, t)
            p = s.pop(t)
            assert p is not None
            if p.cls == "batch":
                started_batch.append(p.id)
            else:
                running.append(p.id)
        assert started_batch == expected


def test_min_share_respects_admissibility() -> None:
    s = RankedSjfScheduler(QueueParams(), GUARANTEED)
    s.push(Pending("i0", "interactive", 0, 40, 0.0, 30.0), 0.0)
    s.push(Pending("b0", "batch", 1, 2080, 0.0, 600.0), 0.0)
    s.on_finish(None, Outcome.SUCCESS, 0.0)
    # Batch is below its guarantee but no backend may take it: the chat goes.
    p = s.pop(1.0, admissible=lambda p: p.cls != "batch")
    assert p is not None and p.id == "i0"
    assert s.pop(1.0, admissible=lambda p: p.cls != "batch") is None


# --- overload: queue_full, wait_bound, expire, remove ---------------------------------------

def test_queue_full_rejects_with_retry_after_from_drain_rate() -> None:
    s = sjf()
    now = set_drain_rate(s, 0.5)  # 2 completions/s
    assert s.admission.drain_rate() == pytest.approx(2.0)
    for i in range(4):
        assert s.push(req(f"i{i}", "interactive", 40, now), now) is None
    rej = s.push(req("i4", "interactive", 40, now), now)
    assert rej == Refusal("queue_full", 1.0)  # (0 of higher rank + 1) / 2 per s, floored at 1 s
    # A full batch queue waits behind the 4 interactive requests too: (4 + 1) / 2 = 2.5 s.
    for i in range(6):
        assert s.push(req(f"b{i}", "batch", 10, now), now) is None
    assert s.push(req("b6", "batch", 10, now), now) == Refusal("queue_full", 2.5)


def test_queue_full_without_measured_rate_uses_the_minimum() -> None:
    s = sjf()
    for i in range(4):
        s.push(req(f"i{i}", "interactive", 40, 0.0), 0.0)
    assert s.push(req("i4", "interactive", 40, 0.0), 0.0) == Refusal("queue_full", 1.0)


def test_wait_bound_rejects_a_request_that_would_wait_too_long() -> None:
    classes = [ClassSpec(name="interactive", rank=0, max_queue_len=100, max_queue_wait_s=10.0)]
    s = RankedSjfScheduler(QueueParams(), classes)
    s.push(Pending("filler", "interactive", 0, 1, 0.0, 10.0), 0.0)
    s.on_finish(None, Outcome.SUCCESS, 0.0)
    s.on_finish(None, Outcome.SUCCESS, 4.0)  # one completion every 4 s
    s.remove("filler", 4.0)
    now = 4.0
    # Two requests of equal size queued: a third expects 2 ahead / 0.25 per s = 8 s <= 10 s.
    s.push(Pending("a", "interactive", 0, 100, now, now + 10), now)
    s.push(Pending("b", "interactive", 0, 100, now, now + 10), now)
    assert s.push(Pending("c", "interactive", 0, 100, now, now + 10), now) is None
    # A fourth expects 3 / 0.25 = 12 s > 10 s: rejected, retry once 2 s of backlog has drained.
    assert s.push(Pending("d", "interactive", 0, 100, now, now + 10), now) == Refusal("wait_bound", 2.0)
    # A much shorter request is ahead of all three under SJF, so its bound is met.
    assert s.push(Pending("e", "interactive", 0, 10, now, now + 10), now) is None


def test_first_request_is_never_refused_for_its_bound() -> None:
    classes = [ClassSpec(name="interactive", rank=0, max_queue_len=100, max_queue_wait_s=0.1)]
    s = RankedSjfScheduler(QueueParams(), classes)
    s.push(Pending("f", "interactive", 0, 1, 0.0, 0.1), 0.0)
    s.on_finish(None, Outcome.SUCCESS, 0.0)
    s.on_finish(None, Outcome.SUCCESS, 100.0)  # very slow drain
    s.remove("f", 100.0)
    # Nothing ahead: it may go as soon as a slot is free, whatever the drain rate.
    assert s.push(Pending("g", "interactive", 0, 1, 100.0, 100.1), 100.0) is None


def test_drain_rate_ignores_intervals_with_an_empty_queue() -> None:
    s = sjf()
    s.on_finish(None, Outcome.SUCCESS, 0.0)
    s.on_finish(None, Outcome.SUCCESS, 100.0)  # idle gateway: says nothing about capacity
    assert s.admission.drain_rate() is None
    s.push(req("q", "batch", 10, 100.0), 100.0)
    s.on_finish(None, Outcome.SUCCESS, 101.0)
    s.on_finish(None, Outcome.SUCCESS, 102.0)
    assert s.admission.drain_rate() == pytest.approx(1.0)
    s.on_finish(None, Outcome.SUCCESS, 104.0)  # a window: two completions after the first, in 3 s
    assert s.admission.drain_rate() == pytest.approx(2 / 3)
    assert s.admission.retry_after_s() == pytest.approx(1.5)


def test_a_queue_that_ran_empty_restarts_the_drain_window() -> None:
    s = sjf()
    now = set_drain_rate(s, 1.0)  # ends by removing the filler: nothing is queued
    assert s.admission.drain_rate() == pytest.approx(1.0)
    s.on_finish(None, Outcome.SUCCESS, now + 50.0)
    assert s.admission.drain_rate() is None


def test_carry_over_keeps_queued_requests_and_what_admission_learned() -> None:
    classes = [ClassSpec(name="interactive", rank=0, max_queue_len=100, max_queue_wait_s=10.0)]
    cfg = QueueParams(drain_ewma_weight=1.0)
    s = RankedSjfScheduler(cfg, classes)
    s.push(Pending("filler", "interactive", 0, 1, 0.0, 10.0), 0.0)
    s.on_finish(None, Outcome.SUCCESS, 0.0)
    s.on_finish(None, Outcome.SUCCESS, 1.0)  # one completion a second
    s.remove("filler", 1.0)
    # Predicted to wait 0 s, it waits 1 s: the wait factor goes to its cap, 8.
    s.push(Pending("a", "interactive", 0, 100, 1.0, 11.0), 1.0)
    assert s.pop(2.0) is not None
    s.push(Pending("b", "interactive", 0, 100, 2.0, 12.0), 2.0)
    new = carry_over(s, replace(cfg, policy="fcfs"), classes)
    assert isinstance(new, FcfsScheduler) and len(new) == 1
    assert new.admission.drain_rate() == pytest.approx(1.0)
    # One ahead: 1 s * 8 = 8 s, within 0.8 of the 10 s bound; two ahead: 16 s is not.
    assert new.push(Pending("c", "interactive", 0, 100, 2.0, 12.0), 2.0) is None
    assert new.push(Pending("d", "interactive", 0, 100, 2.0, 12.0), 2.0) == Refusal("wait_bound", 6.0)
    assert drain(new, 3.0) == ["b", "c"]


def test_expire_removes_requests_past_their_bound_in_order() -> None:
    s = sjf()
    s.push(req("i0", "interactive", 40, 0.0), 0.0)  # bound 30
    s.push(req("b0", "batch", 40, 1.0), 1.0)  # bound 601
    s.push(req("i1", "interactive", 40, 5.0), 5.0)  # bound 35
    assert s.next_wakeup() == 30.0
    assert s.expire(29.9) == []
    assert [p.id for p in s.expire(30.0)] == ["i0"]
    assert s.next_wakeup() == 35.0
    assert [p.id for p in s.expire(700.0)] == ["i1", "b0"]
    assert len(s) == 0 and s.next_wakeup() is None


def test_remove_drops_a_queued_request_once() -> None:
    s = sjf()
    s.push(req("i0", "interactive", 40, 0.0), 0.0)
    s.push(req("i1", "interactive", 50, 0.0), 0.0)
    assert s.queue_len("interactive") == 2
    assert s.remove("i0", 1.0) is True
    assert s.remove("i0", 1.0) is False
    assert s.queue_len("interactive") == 1
    # Its deadline no longer wakes the driver, and it is never popped.
    assert s.next_wakeup() == 30.0
    assert drain(s, 2.0) == ["i1"]
    assert s.next_wakeup() is None


def test_queue_slot_frees_when_a_request_leaves() -> None:
    s = sjf()
    for i in range(4):
        s.push(req(f"i{i}", "interactive", 40, 0.0), 0.0)
    assert isinstance(s.push(req("i4", "interactive", 40, 0.0), 0.0), Refusal)
    s.remove("i2", 0.5)
    assert s.push(req("i4", "interactive", 40, 0.5), 0.5) is None


def test_memory_stays_bounded_under_churn() -> None:
    classes = [ClassSpec(name="batch", rank=0, max_queue_len=50, max_queue_wait_s=1e9)]
    s = RankedSjfScheduler(QueueParams(), classes)
    for i in range(20_000):
        s.push(Pending(f"r{i}", "batch", 0, i % 97, float(i), 1e9), float(i))
        if i % 3 == 0:
            s.pop(float(i))
        else:
            s.remove(f"r{i - 1}", float(i))
        while len(s) >= 50:
            s.pop(float(i))
    assert len(s) < 50
    assert s._refs.n <= 3 * len(s) * 2 + 256 + 3


def test_unknown_class_rank_mismatch_and_duplicate_ids_are_errors() -> None:
    s = sjf()
    with pytest.raises(ValueError, match="unknown class 'gold' .known: interactive, batch."):
        s.push(Pending("x", "gold", 0, 1, 0.0, 1.0), 0.0)
    with pytest.raises(ValueError, match="rank 5"):
        s.push(Pending("x", "batch", 5, 1, 0.0, 1.0), 0.0)
    s.push(req("x", "batch", 1, 0.0), 0.0)
    with pytest.raises(ValueError, match="already queued"):
        s.push(req("x", "batch", 1, 0.0), 0.0)


def test_an_infinite_bound_never_wakes_the_driver() -> None:
    s = sjf()
    s.push(Pending("forever", "batch", 1, 10, 0.0, float("inf")), 0.0)
    assert s.next_wakeup() is None
    assert s.expire(1e12) == [] and len(s) == 1
