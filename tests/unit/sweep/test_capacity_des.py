"""The autoscaler's signal checked on virtual time (issue 21, point 6): a fleet run short of
engines tells `tailguard_capacity_needed`'s arithmetic (`gateway.ops.capacity`) how many engines
the load needs; a fleet of that many keeps every chat inside its class's queue bound, with none
refused, and one fewer does not."""

from __future__ import annotations

import random

from tailguard.clock import VirtualClock
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams
from tailguard.gateway.ops.capacity import CapacitySignal
from tailguard.sim.cost import CostModel, EngineConfig
from tailguard.sim.des import Arrival, Host, Timeline, run_fleet
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


def fleet(n: int, arrivals: list[Arrival]) -> list[Timeline]:
    hosts = [Host(f"h{i}", Engine(CFG)) for i in range(n)]
    front = Front(FrontParams(classes=[ClassSpec("interactive", rank=0, max_queue_wait_s=BOUND_S)],
                              backends=[BackendSpec(h.name, max_concurrency=SLOTS, continues=True) for h in hosts]))
    return run_fleet(hosts, arrivals, VirtualClock(), front)


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
