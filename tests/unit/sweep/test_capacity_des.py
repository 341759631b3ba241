"""The autoscaler's signal checked on virtual time (issue 21, point 6): a fleet run short of
engines tells `tailguard_capacity_needed`'s arithmetic (`front.capacity`) how many engines
the load needs; a fleet of that many keeps every chat inside its class's queue bound, with none
refused, and one fewer does not. Under a load ramp, a fleet that adds engines as the signal asks
(read every 15 s, each engine up 30 s later) keeps chat TTFT P99 inside the bound; the fleet it
started from does not.

    .venv/bin/python -m tests.unit.sweep.test_capacity_des     # the ramp's figure (docs/observability.md)
"""

from __future__ import annotations

import math
import random

from tailguard.clock import VirtualClock
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams, Slo
from tailguard.front.capacity import Capacity, CapacitySignal
from tailguard.sim.cost import CostModel, EngineConfig
from tailguard.sim.des import run_fleet
from tailguard.sim.scenario import Arrival, Host, Scaling, Timeline
from tailguard.sim.engine import Engine
from tailguard.types import Outcome

COST = CostModel(a_s=0.01, b_s_per_prefill_token=0.0001, c_s_per_decode_seq=0.0001, d_s_per_kv_token=1e-6)
CFG = EngineConfig(cost=COST, max_num_seqs=4, max_num_batched_tokens=256, max_model_len=1024, kv_cache_tokens=4096)
SLOTS = 4
BOUND_S = 2.0  # the chats' max_queue_wait_s: the bound the signal sizes the fleet for


def chats(rate: float, seconds: float, seed: int = 3) -> list[Arrival]:
    rng = random.Random(seed)
    out, at = [], 0.0
    while at < seconds:
        at += rng.expovariate(rate)
        out.append(Arrival(f"c{len(out)}", at, prompt_tokens=200, max_tokens=50))
    return out


def fleet(n: int, arrivals: list[Arrival], scaling: Scaling | None = None) -> list[Timeline]:
    hosts = [Host(f"h{i}", Engine(CFG)) for i in range(n)]
    front = Front(FrontParams(classes=[ClassSpec("interactive", rank=0, max_queue_wait_s=BOUND_S)],
                              backends=[BackendSpec(h.name, max_concurrency=SLOTS, continues=True) for h in hosts]))
    return run_fleet(hosts, arrivals, VirtualClock(), front, scaling=scaling)


def needed(timelines: list[Timeline]) -> int:
    """What the gateway's signal says after this run: every request that ended counts as demand
    (refused ones too), those that ran give the service time (bound to end)."""
    signal = CapacitySignal(window_s=3600.0)
    for tl in sorted(timelines, key=lambda t: t.finished_at if t.finished_at is not None else t.arrived_at):
        ran = tl.outcome is Outcome.SUCCESS and tl.dispatched_at is not None and tl.finished_at is not None
        end = tl.finished_at if tl.finished_at is not None else tl.arrived_at
        signal.ended(end, tl.finished_at - tl.dispatched_at if ran else None)  # type: ignore[operator]
    last = max(t.finished_at if t.finished_at is not None else t.arrived_at for t in timelines)
    return signal.needed(last, queued=0, bound_s=BOUND_S, slots_per_backend=SLOTS)


def ttft_p99(timelines: list[Timeline]) -> float:
    ttfts = sorted(t.first_token_at - t.arrived_at for t in timelines if t.first_token_at is not None)
    return ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]


def test_a_fleet_of_the_size_the_signal_asks_keeps_chats_inside_their_bound() -> None:
    load = chats(rate=30.0, seconds=60.0)
    short = fleet(1, load)
    assert sum(t.outcome is Outcome.REJECTED for t in short) > len(load) / 2  # one engine: far too few
    n = needed(short)
    enough, one_fewer = fleet(n, load), fleet(n - 1, load)
    assert all(t.outcome is Outcome.SUCCESS for t in enough)
    assert ttft_p99(enough) <= BOUND_S
    assert sum(t.outcome is Outcome.REJECTED for t in one_fewer) > 0  # the signal asks for no more than needed


# The ramp: chats from 3/s to 18/s over 4 minutes, then 18/s for one more. Two engines hold the
# start (about 6 chats/s each inside the bound); the end needs four.
RAMP = (3.0, 18.0, 240.0, 60.0)  # from, to (chats/s), ramp and hold (s)
START = 2


def ramp(lo: float, hi: float, ramp_s: float, hold_s: float, seed: int = 5) -> list[Arrival]:
    """Poisson arrivals whose rate rises linearly from `lo` to `hi` over `ramp_s`, then holds
    (drawn at `hi` and thinned to the rate of the moment)."""
    rng = random.Random(seed)
    out: list[Arrival] = []
    at = 0.0
    while True:
        at += rng.expovariate(hi)
        if at >= ramp_s + hold_s:
            return out
        if rng.random() * hi < lo + (hi - lo) * min(at / ramp_s, 1.0):
            out.append(Arrival(f"c{len(out)}", at, prompt_tokens=200, max_tokens=50))


def following(interval_s: float = 15.0, provision_s: float = 30.0) -> Scaling:
    """An autoscaler on the signal as deploy/keda/scaledobject.yaml sets one up (15 s polling)."""
    return Scaling(lambda name: Host(name, Engine(CFG)), interval_s=interval_s, provision_s=provision_s)


def ttft_p99_all(timelines: list[Timeline]) -> float:
    """Chat TTFT P99 over every chat: a refused one never had a first token (infinite), so a
    fleet that refuses more than 1% has no P99 inside any bound."""
    ttfts = sorted(t.first_token_at - t.arrived_at if t.first_token_at is not None else math.inf for t in timelines)
    return ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]


def test_under_a_ramp_a_fleet_that_follows_the_signal_keeps_chats_inside_their_bound() -> None:
    load = ramp(*RAMP)
    fixed = fleet(START, load)
    scaling = following()
    scaled = fleet(START, load, scaling)
    assert sum(t.outcome is Outcome.REJECTED for t in fixed) > 0.01 * len(load)
    assert ttft_p99_all(fixed) > BOUND_S
    assert all(t.outcome is Outcome.SUCCESS for t in scaled)
    assert ttft_p99_all(scaled) <= BOUND_S
    # Engines came as the load rose, each only after its provisioning delay, and they took work.
    assert [a.ready_at - a.asked_at for a in scaling.added] == [30.0] * len(scaling.added)
    assert 1 <= len(scaling.added) <= 3 and all(a.asked_at > 60.0 for a in scaling.added)
    served = {t.backend for t in scaled}
    assert {a.name for a in scaling.added} <= served
    assert all(t.dispatched_at is not None and t.dispatched_at >= a.ready_at
               for a in scaling.added for t in scaled if t.backend == a.name)


def main() -> None:
    """The ramp's figure: the fixed fleet, the fleet following the signal, and the same with a
    slower engine start (the signal has no forecast: it must see the load to ask)."""
    load = ramp(*RAMP)
    end = RAMP[2] + RAMP[3]
    print(f"{len(load)} chats, {RAMP[0]:g} -> {RAMP[1]:g}/s over {RAMP[2]:g} s then {RAMP[3]:g} s; "
          f"engines of {SLOTS} sequences; queue bound {BOUND_S:g} s; {START} engines at the start")
    print("| fleet | refused | chat TTFT P99 (refused = over) | TTFT P99 of those served | engines added (asked at s) "
          "| engine-seconds |")
    print("|---|---:|---:|---:|---|---:|")
    arms: list[tuple[str, int, Scaling | None]] = [
        (f"fixed, {START} engines", START, None), ("fixed, 4 engines (the peak's)", 4, None),
        ("following the signal (15 s polling, up 30 s later)", START, following()),
        ("following the signal (15 s polling, up 60 s later)", START, following(provision_s=60.0))]
    for label, n, scaling in arms:
        tls = fleet(n, load, scaling)
        added = scaling.added if scaling is not None else []
        refused = sum(t.outcome is Outcome.REJECTED for t in tls)
        p99 = ttft_p99_all(tls)
        engine_s = n * end + sum(max(0.0, end - a.ready_at) for a in added)
        print(f"| {label} | {refused} ({refused / len(tls):.1%}) | {'over' if math.isinf(p99) else f'{p99:.2f} s'} "
              f"| {ttft_p99(tls):.2f} s | {', '.join(f'{a.asked_at:g}' for a in added) or '-'} | {engine_s:.0f} |")


if __name__ == "__main__":
    main()


# With a TTFT target tighter than the bound (issue 30): the signal sizes the fleet for the target.
TARGET_S = 0.5


def targeted(n: int, arrivals: list[Arrival]) -> tuple[list[Timeline], Front]:
    hosts = [Host(f"h{i}", Engine(CFG)) for i in range(n)]
    spec = ClassSpec("interactive", rank=0, max_queue_wait_s=BOUND_S, slo=Slo(ttft_s=TARGET_S))
    front = Front(FrontParams(classes=[spec], backends=[BackendSpec(h.name, max_concurrency=SLOTS, continues=True)
                                                        for h in hosts]))
    return run_fleet(hosts, arrivals, VirtualClock(), front), front


def within_target(timelines: list[Timeline]) -> float:
    return sum(1 for t in timelines if t.first_token_at is not None
               and t.first_token_at - t.arrived_at <= TARGET_S) / len(timelines)


def test_with_a_ttft_target_the_signal_asks_for_a_fleet_that_holds_it_for_99_percent() -> None:
    """From a run of two engines (most chats refused), the signal (Erlang C on the slots, the wait
    budget the target less the TTFT from a start the front's latency fit measured) asks for a fleet
    where 99% of chats get their first token within 0.5 s; two fewer engines miss that."""
    load = chats(rate=30.0, seconds=60.0)
    short, front = targeted(2, load)
    capacity = Capacity(window_s=3600.0)
    for tl in sorted(short, key=lambda t: t.finished_at if t.finished_at is not None else t.arrived_at):
        ran = tl.outcome is Outcome.SUCCESS and tl.dispatched_at is not None and tl.finished_at is not None
        end = tl.finished_at if tl.finished_at is not None else tl.arrived_at
        capacity.ended(tl.backend, tl.cls, end, tl.finished_at - tl.dispatched_at if ran else None)  # type: ignore[operator]
    last = max(t.finished_at if t.finished_at is not None else t.arrived_at for t in short)
    n = capacity.measure(front, last)["default"].needed
    assert n > needed(short)  # the target asks for more than the queue bound does
    assert within_target(targeted(n, load)[0]) >= 0.99
    assert within_target(targeted(n - 2, load)[0]) < 0.99
