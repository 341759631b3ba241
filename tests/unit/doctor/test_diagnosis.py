"""Each finding from a seeded discrete-event scenario built to show it, and none on healthy runs:
the simulator's engine (straight, or behind the gateway's own scheduler) on virtual time, read
by doctor exactly as it reads a bench run."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from tailguard.bench.workload import Workload, load_workload, parse_workload
from tailguard.doctor.diagnosis import diagnose
from tailguard.doctor.finding import KINDS, Finding
from tailguard.doctor.pages import Evidence
from tailguard.config import GatewayConfig
from tailguard.sim.cost import EngineConfig
from tailguard.sweep.virtual import VirtualRun, run_virtual

# The h100-llama8b preset with 8 slots serves about 38 chats/s (32 tokens each) and about 3.7
# seed-mixed requests/s; the rates below are fractions of that.
CHAT_HEAVY = parse_workload({"name": "chat-heavy", "classes": [
    {"name": "chat", "weight": 0.9, "prompt_tokens": 64, "max_tokens": 32, "headers": {"X-Tailguard-Class": "interactive"}},
    {"name": "report", "weight": 0.1, "prompt_tokens": 256, "max_tokens": 64, "headers": {"X-Tailguard-Class": "batch"}},
]})
RAG = parse_workload({"name": "rag", "classes": [{"name": "rag", "prompt_tokens": 30000, "max_tokens": 16}]})


def engine(**kw: Any) -> EngineConfig:
    return EngineConfig.from_preset("h100-llama8b", **{"max_num_seqs": 8, **kw})


def gateway(max_concurrency: int, batch_wait_s: float | None = None, **scheduler: Any) -> GatewayConfig:
    """The default classes, with the batch class's wait bound `batch_wait_s` when given."""
    backends = [{"name": "engine", "url": "http://127.0.0.1:1", "kind": "sim", "max_concurrency": max_concurrency}]
    classes = [c.model_dump() for c in GatewayConfig.model_validate({"backends": backends}).classes]
    for c in classes:
        if c["name"] == "batch" and batch_wait_s is not None:
            c["max_queue_wait_s"] = batch_wait_s
    return GatewayConfig.model_validate({"scheduler": scheduler, "classes": classes, "backends": backends})


def wl(name: str) -> Workload:
    return load_workload(name)[0]


def findings(vr: VirtualRun) -> list[Finding]:
    records, meta, engine_ev = run_virtual(vr)
    return diagnose(records, meta, evidence=Evidence(engine=engine_ev))


@cache
def ran(name: str) -> Any:
    """The run of `SCENARIOS[name]` (or of BATCH_WAITS), once: it is seeded, and several tests read it."""
    return run_virtual(BATCH_WAITS if name == "batch_waits" else SCENARIOS[name])


def found(name: str) -> list[Finding]:
    records, meta, engine_ev = ran(name)
    return diagnose(records, meta, evidence=Evidence(engine=engine_ev))


SCENARIOS = {
    # seed-mixed straight to an FCFS engine at 90% load: chats wait behind summaries
    "head_of_line": VirtualRun(engine(), wl("seed-mixed"), 2000, rate=3.4, seed=1),
    # chats only, near capacity: the first token waits for a slot
    "queueing": VirtualRun(engine(), wl("chat-only"), 2000, rate=33.0, seed=1),
    # 30k-token prompts, 16-token answers, at low load: the first token is the prompt's prefill
    "prefill": VirtualRun(engine(max_model_len=32768), RAG, 150, rate=0.15, seed=1),
    # chats at 1.6x capacity: everyone queues, at the median too
    "overload": VirtualRun(engine(), wl("chat-only"), 1500, rate=60.0, seed=1),
    # a KV cache of 6000 tokens for 8 slots of 2048-token summaries: the engine preempts
    "kv_pressure": VirtualRun(engine(kv_cache_tokens=6000, max_model_len=4096), wl("seed-mixed"), 600, rate=3.0, seed=1),
    # the gateway lets 32 through to an engine with 8 slots: the engine queues, in its own order
    "cap_above_engine": VirtualRun(engine(), wl("seed-mixed"), 2000, gateway=gateway(32), rate=3.0, seed=1),
    # ranked-sjf at full load: chats take every slot as it frees, reports wait past their bound and are refused
    "starvation": VirtualRun(engine(), CHAT_HEAVY, 2000, gateway=gateway(8, preemption=False, batch_wait_s=5.0),
                             rate=38.0, seed=1),
}
# the same without the bound: the reports wait, as the gateway was told to make them, and lose nothing
BATCH_WAITS = VirtualRun(engine(), CHAT_HEAVY, 2000, gateway=gateway(8, preemption=False), rate=38.0, seed=1)


@pytest.mark.parametrize("kind", sorted(SCENARIOS))
def test_each_scenario_shows_its_finding(kind: str) -> None:
    seen = found(kind)
    kinds = [f.kind for f in seen]
    assert kind in kinds, kinds
    f = seen[kinds.index(kind)]
    assert f.symptom and f.cause and f.next_step and f.check and f.evidence_for
    assert f.to_json()["kind"] == kind and set(f.to_json()) == {
        "kind", "severity", "symptom", "evidence", "cause", "next_step", "check"}


def test_head_of_line_comes_first_and_proposes_the_gateway() -> None:
    first = found("head_of_line")[0]
    assert first.kind == "head_of_line" and "tailguard serve" in first.next_step


@pytest.mark.parametrize("vr", [
    VirtualRun(engine(), wl("chat-only"), 2000, rate=20.0, seed=2),  # half load, straight
    VirtualRun(engine(), wl("seed-mixed"), 2000, gateway=gateway(8), rate=3.0, seed=2),  # the gateway as `make demo` runs it
], ids=["chat-half-load", "seed-mixed-behind-the-gateway"])
def test_a_healthy_run_has_no_finding(vr: VirtualRun) -> None:
    assert findings(vr) == []


def test_intended_batch_queueing_is_no_fault() -> None:
    seen = found("batch_waits")
    kinds = [f.kind for f in seen]
    assert "starvation" not in kinds and all("report" not in f.symptom for f in seen if f.kind == "queueing"), kinds


def test_commands_are_filled_with_the_runs_own_values() -> None:
    records, meta, engine_ev = ran("cap_above_engine")
    for f in diagnose(records, meta, evidence=Evidence(engine=engine_ev), run_dir="runs/today"):
        assert "<" not in f.check and "URL" not in f.check, f.check
        assert "runs/today" in f.check, f.check
    behind = {f.kind: f for f in diagnose(records, meta, evidence=Evidence(engine=engine_ev))}
    # the gateway had preemption on and its batch class preemptible (the defaults): not proposed again
    assert "preemption" not in behind["head_of_line"].next_step
    assert "a lower `max_concurrency` than 32" in behind["head_of_line"].next_step
    records, meta, engine_ev = ran("head_of_line")
    first = diagnose(records, meta, evidence=Evidence(engine=engine_ev), run_dir="runs/before")[0]
    assert "--max-concurrency 8;" in first.check and "tailguard bench compare runs/before runs/before-after" in first.check


def test_a_closed_loop_sweep_offers_only_caps_that_can_bind() -> None:
    """16 clients: a max_concurrency of 16 or more never binds, so no finding proposes one; about
    seven values, not every integer."""
    records, meta, engine_ev = run_virtual(VirtualRun(engine(), wl("seed-mixed"), 600, gateway=gateway(32),
                                                      concurrency=16, seed=1))
    checks = [f.check for f in diagnose(records, meta, evidence=Evidence(engine=engine_ev)) if "--setting max_concurrency" in f.check]
    assert checks
    for check in checks:
        values = check.split("--values ")[1].split()[0]
        span, _, step = values.partition(":")
        low, high = (int(v) for v in span.split(".."))
        assert high < 16 and len(range(low, high + 1, int(step or 1))) <= 8, check


def test_kinds_are_the_documented_list() -> None:
    assert set(KINDS) >= {"head_of_line", "queueing", "prefill", "overload", "client_timeouts", "kv_pressure",
                          "cap_above_engine", "prefix_misses", "generator_bound", "starvation"}
    with pytest.raises(ValueError, match="unknown finding kind"):
        Finding("slow", "high", "s", "c", "n", "x")


def test_the_commands_doctor_suggests_replay_a_trace_run_s_trace() -> None:
    from tailguard.doctor.facts import RunFacts
    from tailguard.doctor.rules import bench_command, sweep_command

    meta = {"url": "http://gw:8080", "seed": 3, "time_scale": 0.1, "requests": None, "mode": "open",
            "trace": {"file": "gw.log", "format": "tailguard", "window": "10m:5m", "limit": None, "rules": "r.yaml",
                      "speed": 2.0}}
    f = RunFacts({}, None, True, True, None, meta, {}, run_dir="runs/tue")
    assert bench_command(f) == ("tailguard bench --url http://gw:8080 --trace gw.log --trace-format tailguard "
                                "--window 10m:5m --rules r.yaml --speed 2 --seed 3 --time-scale 0.1 "
                                "--out runs/tue-after")
    assert " --trace gw.log --trace-format tailguard --window 10m:5m --rules r.yaml --speed 2 --out runs/tue-sweep" \
        in sweep_command(f, "max_concurrency", "4..32:x2", "interactive:ttft_s=1")
    plain = RunFacts({}, None, False, True, None, {"url": "u", "workload": {"name": "w"}, "concurrency": 4,
                                                   "requests": 100}, {}, run_dir="r")
    assert bench_command(plain) == "tailguard bench --url u --workload w --concurrency 4 --requests 100 --seed 0 --out r-after"
