"""compute_bound, queue_bound and throttled on recorded exporter pages (`pages.py`), each beside a
run that shows (or does not show) the symptom: seeded discrete-event runs read as doctor reads a
bench run, so each rule is seen true and false on the same pages."""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

from tailguard.bench.recorder import RequestRecord
from tailguard.doctor.diagnosis import diagnose, facts_of
from tailguard.doctor.facts import RunFacts
from tailguard.doctor.finding import Finding
from tailguard.doctor.hardware_rules import compute_bound, queue_bound, throttled
from tailguard.doctor.pages import Evidence
from tailguard.sweep.virtual import VirtualRun, run_virtual
from tailguard.wire import dcgm
from tests.unit.doctor.pages import DEFAULT_COUNTERS, evidence_of
from tests.unit.doctor.test_diagnosis import engine, wl

RUNS = {
    "full": VirtualRun(engine(), wl("chat-only"), 1500, rate=60.0, seed=3),  # 1.6x what 8 slots serve
    "half": VirtualRun(engine(), wl("chat-only"), 1500, rate=20.0, seed=3),
    "head_of_line": VirtualRun(engine(), wl("seed-mixed"), 1500, rate=3.4, seed=3),  # summaries block chats
}


@cache
def run(name: str) -> tuple[list[RequestRecord], dict[str, Any], Any]:
    return run_virtual(RUNS[name])


def facts(name: str) -> RunFacts:
    records, meta, _ = run(name)
    return facts_of(records, meta)


def unsteady(f: RunFacts) -> RunFacts:
    """The same run with its requests' decode time per token twice the median for the slowest 1%."""
    return dataclasses.replace(f, classes={n: dataclasses.replace(c, tpot_p99=2 * (c.tpot_p50 or 0.0))
                                           for n, c in f.classes.items()})


def found(name: str, ev: Evidence) -> list[Finding]:
    records, meta, engine_ev = run(name)
    return diagnose(records, meta, evidence=dataclasses.replace(ev, engine=engine_ev))


def test_compute_bound_when_the_gpu_is_full_and_every_class_slow() -> None:
    first = found("full", evidence_of("sim-saturated"))[0]
    assert first.kind == "compute_bound", first
    assert "SM_ACTIVE" in first.evidence_for[0] and "max_num_seqs" in first.next_step
    assert "not a queue change" in first.next_step and "--rate 42" in first.check


def test_no_compute_bound_on_a_gpu_with_room_or_classes_served_well() -> None:
    assert compute_bound(facts("full"), evidence_of("sim-calm"), []) is None
    assert compute_bound(facts("half"), evidence_of("sim-saturated"), []) is None
    assert compute_bound(facts("full"), Evidence(), []) is None  # no GPU page: nothing to say


def test_busy_time_alone_needs_the_engines_own_queue() -> None:
    busy = evidence_of("sim-saturated", only=DEFAULT_COUNTERS)
    assert compute_bound(facts("full"), busy, []) is None
    engine_ev = run("full")[2]
    assert engine_ev.waiting_max >= 1
    f = compute_bound(facts("full"), dataclasses.replace(busy, engine=engine_ev), [])
    assert f is not None and dcgm.SM_ACTIVE in f.evidence_against[0] and dcgm.GR_ENGINE_ACTIVE in f.evidence_for[0]


def test_queue_bound_cites_the_queue_findings_when_the_gpu_has_room() -> None:
    kinds = {f.kind: f for f in found("head_of_line", evidence_of("sim-calm"))}
    assert "queue_bound" in kinds and "head_of_line" in kinds, list(kinds)
    q = kinds["queue_bound"]
    assert any(line.startswith("head_of_line: ") for line in q.evidence_for)
    assert q.next_step.startswith("do not add GPUs") and q.check == kinds["head_of_line"].check


def test_no_queue_bound_on_a_full_gpu_or_a_healthy_tail() -> None:
    assert "queue_bound" not in [f.kind for f in found("head_of_line", evidence_of("sim-saturated"))]
    assert queue_bound(facts("half"), evidence_of("sim-calm"), []) is None


def test_throttled_when_decoding_is_uneven_and_the_clocks_fell() -> None:
    f = throttled(unsteady(facts("half")), evidence_of("sim-throttled"), [])
    assert f is not None and "TPOT P99" in f.symptom and "2.0x" in f.symptom
    assert "SM clock fell" in f.evidence_for[0] and "nvidia-smi" in f.next_step


def test_no_throttle_without_a_sign_or_without_uneven_decoding() -> None:
    assert throttled(unsteady(facts("half")), evidence_of("sim-calm"), []) is None
    assert throttled(facts("half"), evidence_of("sim-throttled"), []) is None
    assert throttled(unsteady(facts("half")), evidence_of("node-calm"), []) is None


def test_throttled_by_the_host() -> None:
    cpu = throttled(unsteady(facts("half")), evidence_of("node-busy"), [])
    assert cpu is not None and "CPUs 100% busy" in cpu.evidence_for[0] and "host CPU" in cpu.next_step
    swap = throttled(unsteady(facts("half")), evidence_of("node-swapping"), [])
    assert swap is not None and "36000 pages swapped" in swap.evidence_for[0] and "swapping" in swap.next_step
