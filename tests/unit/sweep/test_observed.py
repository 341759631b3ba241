"""The adaptive cap on the discrete-event run (sweep/observed.py feeding the front its engine's
latency): from a low start and from a high one it settles near the knee of the same engine's
throughput curve, found here by a sweep of fixed caps over the same overload."""

from __future__ import annotations

import functools
import random
import pytest

from tailguard.clock import VirtualClock
from tailguard.front.adaptive import AdaptiveParams
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, FrontParams, default_classes
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import Arrival, run
from tailguard.sweep.observed import ObservedFront, ObservingEngine

# An H100-class engine that runs 64 sequences at once, under 60 chats/s: three times the 19-20 a
# second it serves, so the gateway's queue never empties and the cap is what decides.
ENGINE = EngineConfig.from_preset("h100-llama8b", max_num_seqs=64)
RATE, SECONDS = 60.0, 60.0


def arrivals() -> list[Arrival]:
    rng = random.Random(1)
    out, t = [], 0.0
    while (t := t + rng.expovariate(RATE)) < SECONDS:
        out.append(Arrival(f"r{len(out)}", t, rng.randint(100, 1500), rng.randint(50, 500)))
    return out


def spec(cap: int, adaptive: AdaptiveParams | None = None) -> FrontParams:
    return FrontParams(classes=default_classes(),
                       backends=[BackendSpec("engine", max_concurrency=cap, continues=True, adaptive=adaptive)])


def tokens_per_s(front: Front, engine: ObservingEngine) -> float:
    """Output tokens finished within the arrivals' window, per second."""
    tls = run(engine, arrivals(), VirtualClock(), front)
    return sum(t.output_tokens for t in tls if t.finished_at is not None and t.finished_at <= SECONDS) / SECONDS


@functools.cache
def knee() -> tuple[int, float]:
    """The smallest fixed cap that reaches 90% of the best throughput of the sweep, and that best."""
    caps = [8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 128]
    rates = [tokens_per_s(Front(spec(c)), ObservingEngine(ENGINE)) for c in caps]
    best = max(rates)
    return next(c for c, r in zip(caps, rates) if r >= 0.9 * best), best


@pytest.mark.parametrize("start", [2, 160])
def test_the_cap_settles_near_the_knee_from_a_low_start_and_a_high_one(start: int) -> None:
    k, best = knee()
    assert k == 56
    engine = ObservingEngine(ENGINE)
    front = ObservedFront(spec(start, AdaptiveParams(min_cap=1, max_cap=256)), engine)
    rate = tokens_per_s(front, engine)
    level = front.mean_cap(SECONDS / 2, SECONDS)  # the second half: settled
    assert 0.8 * k <= level <= 1.25 * k, level
    assert rate >= 0.85 * best  # from 2, the climb is in it too
