"""The front under long seeded walks of random events, live reloads that add and remove backends
among them, driven as the gateway drives it; after every event the driver's view and the front's
ledger must agree.

What each walk checks: a `Start` only ever names a configured backend (never one a reload
removed), every running request holds exactly one slot where the front says it runs, a removed
backend leaves the ledger (`Retired`, once) exactly when its last request has ended, and every
request leaves once. The examples elsewhere pin each rule down; the walks look for the
sequences nobody wrote down (a retry, a suspension and a reload in one step's decisions)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from tailguard.front.events import (
    Arrive, Drop, Ejected, Failed, Finished, FirstContent, GiveUp, HealthChanged, Opened, Probed, Readmitted,
    Reconfigure, Reject, Retired, Start, StartMode, Suspend, Tick, Wait,
)
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams, HedgeParams, PreemptionParams
from tailguard.types import FailureKind, Outcome

CLASSES = (ClassSpec(name="interactive", rank=0, max_queue_wait_s=2.0),
           ClassSpec(name="batch", rank=1, max_queue_wait_s=30.0, preemptible=True))
NAMES = ("a", "b", "c")
KINDS = tuple(FailureKind)
OUTCOMES = (Outcome.SUCCESS, Outcome.UPSTREAM_ERROR, Outcome.TIMEOUT, Outcome.CLIENT_GONE)
STEPS = 400


def fleet(rng: random.Random) -> FrontParams:
    names = rng.sample(NAMES, rng.randint(1, len(NAMES)))
    return FrontParams(classes=CLASSES,
                       backends=[BackendSpec(n, max_concurrency=rng.randint(1, 3), continues=rng.random() < 0.7)
                                 for n in names],
                       preemption=PreemptionParams(enabled=True),
                       hedging=HedgeParams(enabled=True, min_samples=1, min_delay_s=0.01, max_share=1.0))


@dataclass
class Driver:
    """What the gateway knows of each request from the decisions alone."""

    front: Front
    configured: set[str]
    running: dict[str, str] = field(default_factory=dict)  # id -> backend
    hedged: dict[str, str] = field(default_factory=dict)  # id -> its second attempt's backend
    waiting: set[str] = field(default_factory=set)  # queued or suspended
    given_up: set[str] = field(default_factory=set)  # a GiveUp came: the driver must end it
    retired: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # started at least once

    def apply(self, decisions: object) -> None:
        for d in decisions:  # type: ignore[attr-defined]
            if isinstance(d, Start) and d.mode is StartMode.HEDGE:
                assert d.backend in self.configured and d.id in self.running and d.id not in self.hedged, d
                assert d.backend != self.running[d.id], d
                self.hedged[d.id] = d.backend
            elif isinstance(d, Start):
                assert d.backend in self.configured, f"{d} names a backend the config no longer has"
                assert d.id not in self.hedged, f"{d} starts a request that is hedged"
                assert (d.mode is StartMode.FRESH) == (d.id not in self.running and d.id in self.waiting
                                                       and d.id not in self.seen), d
                self.seen.add(d.id)
                self.waiting.discard(d.id)
                self.running[d.id] = d.backend
            elif isinstance(d, Drop):
                other = self.hedged.pop(d.id)
                assert {d.loser, d.winner} == {other, self.running[d.id]}, d
                self.running[d.id] = d.winner
            elif isinstance(d, GiveUp):
                assert d.id in self.running and d.id not in self.hedged and d.backend == self.running[d.id], d
                self.given_up.add(d.id)
            elif isinstance(d, Suspend):
                assert self.running.pop(d.id) == d.backend
                self.waiting.add(d.id)
            elif isinstance(d, Wait):
                assert d.id in self.running and d.id not in self.hedged, d
                del self.running[d.id]
                self.waiting.add(d.id)
            elif isinstance(d, Reject):
                self.waiting.discard(d.id)
                assert d.id not in self.running, f"{d} rejects a running request"
            elif isinstance(d, Retired):
                assert d.backend not in self.configured and d.backend not in self.running.values(), d
                assert d.backend not in self.hedged.values(), d
                self.retired.append(d.backend)
            else:
                assert isinstance(d, (HealthChanged, Ejected, Readmitted))

    def check(self) -> None:
        backends = {b.name: b for b in self.front.backends()}
        draining = (set(self.running.values()) | set(self.hedged.values())) - self.configured
        assert set(backends) == self.configured | draining
        for name, b in backends.items():
            held = sum(1 for r in self.running.values() if r == name) + sum(1 for r in self.hedged.values() if r == name)
            assert b.in_flight == held
            assert all(n >= 0 for n in self.front._slots[name].by_class.values())  # the ledger's own books
            assert b.retiring == (name not in self.configured)
        assert len(self.front) == len(self.waiting)


def step(rng: random.Random, drv: Driver, n: int, now: float) -> None:
    f, roll = drv.front, rng.random()
    if roll < 0.35:
        cls = rng.choice(("interactive", "batch"))
        drv.waiting.add(f"r{n}")
        drv.apply(f.handle(Arrive(f"r{n}", cls, rng.randint(10, 4000), resumable=cls == "batch", max_tokens=500), now))
        if f"r{n}" not in f:
            drv.waiting.discard(f"r{n}")  # refused on arrival
    elif roll < 0.55 and (drv.running or drv.waiting):
        req_id = rng.choice(sorted(drv.running.keys() | drv.waiting))
        drv.running.pop(req_id, None)
        drv.hedged.pop(req_id, None)
        drv.waiting.discard(req_id)
        drv.given_up.discard(req_id)
        drv.apply(f.handle(Finished(req_id, rng.choice(OUTCOMES)), now))
    elif roll < 0.65 and drv.running:
        req_id = rng.choice(sorted(drv.running))
        if req_id in drv.given_up:
            return  # its attempt has failed already: only its end may come
        hedge = drv.hedged.get(req_id)
        if hedge is not None:  # one of its two attempts fails: the other goes on alone (a Drop of it)
            failed = rng.choice((hedge, drv.running[req_id]))
            decisions = list(f.handle(Failed(req_id, rng.choice(KINDS), answered=rng.random() < 0.5, backend=failed),
                                      now))
            assert Drop(req_id, failed, hedge if failed != hedge else drv.running[req_id], failed=True) in decisions
            drv.apply(decisions)
            return
        decisions = list(f.handle(Failed(req_id, rng.choice(KINDS), answered=rng.random() < 0.5), now))
        drv.apply(decisions)
        assert any(isinstance(d, (Start, Wait, GiveUp)) and d.id == req_id for d in decisions), decisions
        if req_id in drv.given_up:  # the driver ends it
            drv.given_up.discard(req_id)
            drv.running.pop(req_id)
            drv.apply(f.handle(Finished(req_id, Outcome.UPSTREAM_ERROR), now))
    elif roll < 0.72 and drv.running.keys() - drv.given_up:
        req_id = rng.choice(sorted(drv.running.keys() - drv.given_up))
        drv.apply(f.handle(FirstContent(req_id, rng.choice((drv.running[req_id], drv.hedged.get(req_id) or
                                                            drv.running[req_id]))), now))
    elif roll < 0.76 and drv.running.keys() - drv.given_up:
        drv.apply(f.handle(Opened(rng.choice(sorted(drv.running.keys() - drv.given_up))), now))
    elif roll < 0.82:
        drv.apply(f.handle(Probed(rng.choice(NAMES), rng.random() < 0.6, busy=rng.random() < 0.2), now))
    elif roll < 0.9:
        params = fleet(rng)
        drv.configured = {b.name for b in params.backends}
        drv.apply(f.handle(Reconfigure(params), now))
    else:
        drv.apply(f.handle(Tick(), now))


def walk(seed: int, make: Callable[[FrontParams], Front] = Front) -> tuple[Driver, float]:
    """One seeded walk of STEPS events on a front `make` builds, the ledger checked after each;
    the driver and the last instant."""
    rng = random.Random(seed)
    params = fleet(rng)
    drv = Driver(make(params), {b.name for b in params.backends})
    now = 0.0
    for n in range(STEPS):
        now += rng.expovariate(10.0)
        step(rng, drv, n, now)
        drv.check()
    return drv, now


@pytest.mark.parametrize("seed", range(40))
def test_random_walks_with_reloads_keep_the_ledger_true(seed: int) -> None:
    drv, now = walk(seed)
    for req_id in sorted(drv.running.keys() | drv.waiting):  # every request still in leaves once
        drv.running.pop(req_id, None)
        drv.hedged.pop(req_id, None)
        drv.waiting.discard(req_id)
        drv.apply(drv.front.handle(Finished(req_id, Outcome.SUCCESS), now))
        drv.check()
    assert all(not b.retiring for b in drv.front.backends())
