"""The adaptive cap on the discrete-event run (the DES telling the front each ended request's
latency, as the gateway does: `front.samples`): from a low start and from a high one it settles near the knee of the same engine's
throughput curve, found here by a sweep of fixed caps over the same overload, on an engine of 64
sequences and on one of 8."""

from __future__ import annotations

from dataclasses import replace

import functools
import random
from dataclasses import dataclass

import pytest

from tailguard.clock import VirtualClock
from tailguard.front.adaptive import AdaptiveParams
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, FrontParams, default_classes
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import run
from tailguard.sim.scenario import Arrival
from tailguard.sim.engine import Engine
from tailguard.sweep.caps import CapHistory

SECONDS = 60.0


@dataclass(frozen=True)
class Case:
    """An H100-class engine of `seqs` sequences under `rate` chats/s, several times what it serves
    (so the gateway's queue never empties and the cap is what decides), and the fixed caps swept."""

    seqs: int
    rate: float
    caps: tuple[int, ...]

    @property
    def engine(self) -> EngineConfig:
        return EngineConfig.from_preset("h100-llama8b", max_num_seqs=self.seqs)

    def arrivals(self) -> list[Arrival]:
        rng = random.Random(1)
        out: list[Arrival] = []
        t = 0.0
        while (t := t + rng.expovariate(self.rate)) < SECONDS:
            out.append(Arrival(f"r{len(out)}", t, rng.randint(100, 1500), rng.randint(50, 500)))
        return out


# 64 sequences at 60/s: three times the 19-20 a second it serves; 8 at 30/s: about ten times.
BIG = Case(64, 60.0, (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 128))
SMALL = Case(8, 30.0, (2, 4, 6, 8, 10, 12, 16, 24, 32))


def spec(cap: int, adaptive: AdaptiveParams | None = None) -> FrontParams:
    # No TTFT target: at 3x and 10x overload a target would shed the costliest requests (the
    # longest answers) for goodput, and the measure here is the engine's tokens per second.
    return FrontParams(classes=[replace(c, slo=None) for c in default_classes()],
                       backends=[BackendSpec("engine", max_concurrency=cap, continues=True, adaptive=adaptive)])


def tokens_per_s(case: Case, front: Front, caps: CapHistory | None = None) -> float:
    """Output tokens finished within the arrivals' window, per second."""
    tls = run(Engine(case.engine), case.arrivals(), VirtualClock(), front, watch=None if caps is None else caps.watch)
    return sum(t.output_tokens for t in tls if t.finished_at is not None and t.finished_at <= SECONDS) / SECONDS


@functools.cache
def knee(case: Case) -> tuple[int, float]:
    """The smallest fixed cap that reaches 90% of the best throughput of the sweep, and that best."""
    rates = [tokens_per_s(case, Front(spec(c))) for c in case.caps]
    best = max(rates)
    return next(c for c, r in zip(case.caps, rates) if r >= 0.9 * best), best


@pytest.mark.parametrize(("case", "k", "start"), [(BIG, 56, 2), (BIG, 56, 160), (SMALL, 8, 2), (SMALL, 8, 32)],
                         ids=["64-from-2", "64-from-160", "8-from-2", "8-from-32"])
def test_the_cap_settles_near_the_knee_from_a_low_start_and_a_high_one(case: Case, k: int, start: int) -> None:
    assert knee(case)[0] == k
    caps = CapHistory("engine")
    rate = tokens_per_s(case, Front(spec(start, AdaptiveParams(min_cap=1, max_cap=4 * max(case.caps)))), caps)
    level = caps.mean(SECONDS / 2, SECONDS)  # the second half: settled
    assert 0.8 * k <= level <= 1.3 * k, level
    assert rate >= 0.85 * knee(case)[1]  # from 2, the climb is in it too
