"""priority_cost from two seeded discrete-event runs behind the gateway's own front: taking
preemption off a chat-heavy mix at full load gives the reports back their tail (they are no
longer suspended) and the chats' median to the reports (they wait behind them again)."""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

from tailguard.bench.recorder import RequestRecord
from tailguard.doctor.diagnosis import diagnose, facts_of
from tailguard.doctor.priority import priority_cost
from tailguard.sweep.virtual import VirtualRun, run_virtual
from tests.unit.doctor.test_diagnosis import CHAT_HEAVY, engine, gateway

Run = tuple[list[RequestRecord], dict[str, Any]]


@cache
def run(preemption: bool, seed: int = 1) -> Run:
    records, meta, _ = run_virtual(VirtualRun(engine(), CHAT_HEAVY, 2000, gateway=gateway(8, preemption=preemption),
                                              rate=37.0, seed=seed))
    return records, meta


def test_p99_down_and_p50_up_names_who_pays_and_reserves_for_it() -> None:
    kinds = {f.kind: f for f in diagnose(*run(False), against=run(True), run_dir="runs/no-preemption")}
    f = kinds["priority_cost"]
    assert f.symptom.startswith("all requests: E2E P99 fell") and "chat's median rose most" in f.symptom
    # chat held 17% of the requests in flight before: 2 slots of 8 kept from the batch class
    assert "`max_share: 0.75` on the batch class" in f.next_step
    assert "max_share: 0.75 on batch" in f.check and "bench compare runs/no-preemption runs/no-preemption-after" in f.check
    assert "95% CI" in f.evidence_for[0] and f.evidence_against == ()


def test_no_cost_the_other_way_or_between_two_seeds_of_one_setting() -> None:
    assert "priority_cost" not in [f.kind for f in diagnose(*run(True), against=run(False))]
    assert "priority_cost" not in [f.kind for f in diagnose(*run(False, seed=2), against=run(False))]


def test_a_class_served_after_another_gets_a_min_share() -> None:
    """The same runs with the ranks turned round (chat's class served after the reports'): the
    class that pays is the later one, so capacity is reserved for it from below."""
    after, before = facts_of(*run(False)), facts_of(*run(True))
    assert after.gateway is not None
    turned = dataclasses.replace(after, gateway=dataclasses.replace(after.gateway, ranks={"interactive": 1, "batch": 0}))
    f = priority_cost(turned, before)
    assert f is not None and "`min_share: 0.125` on the interactive class" in f.next_step, f.next_step
