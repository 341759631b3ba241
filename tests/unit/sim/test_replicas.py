"""`sim.replicas`: several fronts in front of one engine on virtual time, sharing the backend's
`max_concurrency` by slot allotments (`SlotStore`, the renewal script of `gateway.shared.slots`
in Python): together they never put more than the cap in the engine, every request is served,
and without the allotments each front fills the engine to its own whole cap."""

from __future__ import annotations

import random
import statistics

import pytest

from tailguard.front.params import BackendSpec, CallerSpec, ClassSpec, FrontParams, QueueParams
from tailguard.sim.cost import CostModel, EngineConfig
from tailguard.sim.scenario import Arrival
from tailguard.sim.engine import Engine
from tailguard.front.leases import SlotStore
from tailguard.sim.replicas import run_replicas
from tailguard.types import Outcome

COST = CostModel(a_s=0.01, b_s_per_prefill_token=0.0001, c_s_per_decode_seq=0.0001, d_s_per_kv_token=1e-7)
CAP = 6


def engine() -> Engine:
    return Engine(EngineConfig(cost=COST, max_num_seqs=64, max_num_batched_tokens=4096, max_model_len=4096,
                               kv_cache_tokens=1 << 20))


def params() -> FrontParams:
    return FrontParams(classes=[ClassSpec(name="interactive", max_queue_len=10_000, max_queue_wait_s=600)],
                       backends=[BackendSpec("engine", max_concurrency=CAP)])


def arrivals(n: int, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(40.0)
        out.append(Arrival(f"r{i}", t, rng.randint(20, 200), rng.randint(5, 80)))
    return out


@pytest.mark.parametrize("replicas", [2, 3])
def test_replicas_sharing_allotments_never_pass_the_cap_and_serve_everything(replicas: int) -> None:
    run = run_replicas(engine(), arrivals(600, seed=replicas), params(), replicas, lease_s=1.0)
    assert run.most_in_engine == CAP  # used whole, never passed
    assert all(tl.outcome is Outcome.SUCCESS for tl in run.timelines)
    assert {run.replica_of[tl.id] for tl in run.timelines} == set(range(replicas))
    assert run.renewals > 0


def test_without_allotments_each_replica_fills_the_engine_to_its_own_cap() -> None:
    run = run_replicas(engine(), arrivals(600, seed=2), params(), 2, shared=False)
    assert CAP < run.most_in_engine <= 2 * CAP
    assert run.renewals == 0


def test_the_store_gives_each_replica_its_fair_part_and_never_more_than_the_others_leave() -> None:
    store = SlotStore(cap=6)
    assert store.renew(0, demand=10, running=0, now=0.0, lease_s=1.0) == (6, 6)  # alone: all of it
    assert store.renew(1, demand=10, running=0, now=0.1, lease_s=1.0) == (0, 0)  # the first holds all
    assert store.renew(0, demand=10, running=6, now=0.2, lease_s=1.0) == (6, 3)  # runs 6: holds 6, starts none
    assert store.renew(0, demand=3, running=3, now=0.3, lease_s=1.0) == (3, 3)  # down to its part
    assert store.renew(1, demand=10, running=0, now=0.4, lease_s=1.0) == (3, 3)
    assert store.renew(1, demand=10, running=3, now=1.35, lease_s=1.0) == (6, 6)  # the first's lease ran out


def test_shared_fair_share_counters_put_a_quiet_caller_ahead_on_every_replica() -> None:
    """`f` floods both replicas, `q` sends a quarter of the requests, all of them to the second
    (the balancer's turns). On its own counters the second sees `f` and `q` served alike and
    alternates them; told what the first gave `f` (`ServedElsewhere` with each renewal, as
    `gateway.shared.fair` exchanges it), it serves `q` first: `q` waits far less, and the
    engine's work is the same."""
    fair = FrontParams(classes=params().classes, backends=[BackendSpec("engine", max_concurrency=2)],
                       queue=QueueParams(fair_share=True, fair_credit=0.0, aging_s=1e9),
                       callers=[CallerSpec("f"), CallerSpec("q")])
    sent = [Arrival(f"{c}{k}", 0.05 * (k + 1), 100, 40, caller=c)
            for k in range(400) for c in ["q" if k % 4 == 3 else "f"]]
    runs = {share: run_replicas(engine(), sent, fair, 2, lease_s=0.3, share_service=share) for share in (True, False)}
    waits = {share: statistics.median(tl.ttft_s for tl in run.timelines if tl.id[0] == "q" and tl.ttft_s is not None)
             for share, run in runs.items()}
    assert waits[True] < 0.5 * waits[False]
    ends = {share: max(tl.finished_at or 0.0 for tl in run.timelines) for share, run in runs.items()}
    assert ends[True] == pytest.approx(ends[False], rel=0.01)
