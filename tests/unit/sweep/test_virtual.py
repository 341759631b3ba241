"""The DES run lets each request in as the configured gateway would (its intake: class, refusals,
caps, job size from the output estimate of that instant), as the bench would have recorded it."""

from __future__ import annotations

from typing import Any

from tailguard.bench.workload import RequestClass, parse_workload
from tailguard.config import GatewayConfig
from tailguard.sim.cost import EngineConfig
from tailguard.sim.scenario import Timeline
from tailguard.sweep.virtual import IntakeGate, VirtualRun, plan, run_virtual

ENGINE = EngineConfig.from_preset("h100-llama8b", max_num_seqs=4, max_model_len=2048, output_length="exact")
GATEWAY: dict[str, Any] = {
    "backends": [{"name": "e", "url": "http://127.0.0.1:1", "kind": "sim"}],
    "classes": [{"name": "interactive", "rank": 0},
                {"name": "batch", "rank": 1, "max_tokens_cap": 8, "cap_mode": "reject"},
                {"name": "filled", "rank": 2, "default_max_tokens": 6, "max_prompt_tokens": 100}],
}


def run(*classes: dict[str, Any], gateway: dict[str, Any] | None = GATEWAY) -> dict[str, list[Any]]:
    """Each workload class's records: five requests a class, drawn by weight, sent one at a time."""
    wl = parse_workload({"name": "w", "classes": [{"weight": 1.0, "prompt_tokens": 50, **c} for c in classes]})
    gw = GatewayConfig.model_validate(gateway) if gateway is not None else None
    records, _, _ = run_virtual(VirtualRun(ENGINE, wl, 5 * len(classes), gw, concurrency=1, seed=1))
    out: dict[str, list[Any]] = {}
    for r in records:
        out.setdefault(r.cls, []).append(r)
    return out


def test_an_unknown_class_is_a_400_as_the_gateway_answers_it() -> None:
    recs = run({"name": "typo", "headers": {"X-Tailguard-Class": "gold"}, "max_tokens": 4})["typo"]
    assert {(r.status, r.error, r.server_class) for r in recs} == {(400, "unknown_class", None)}


def test_every_cap_applies_and_refuses_with_the_class_named() -> None:
    by = run({"name": "over", "headers": {"X-Tailguard-Class": "batch"}, "max_tokens": 9},
             {"name": "within", "headers": {"X-Tailguard-Class": "batch"}, "max_tokens": 8},
             {"name": "unlimited", "headers": {"X-Tailguard-Class": "filled"}, "body": {"max_tokens": None}},
             {"name": "long", "headers": {"X-Tailguard-Class": "filled"}, "prompt_tokens": 101})
    assert {(r.status, r.error, r.server_class) for r in by["over"]} == {(400, "max_tokens_over_cap", "batch")}
    assert {(r.status, r.output_tokens) for r in by["within"]} == {(200, 8)}
    assert {(r.status, r.output_tokens, r.server_class) for r in by["unlimited"]} == {(200, 6, "filled")}
    assert {(r.status, r.error) for r in by["long"]} == {(400, "prompt_too_long")}


def test_straight_to_the_engine_nothing_classifies_or_caps() -> None:
    recs = run({"name": "typo", "headers": {"X-Tailguard-Class": "gold"}, "max_tokens": 9}, gateway=None)["typo"]
    assert {(r.status, r.output_tokens, r.server_class) for r in recs} == {(200, 9, None)}


def test_a_request_without_a_limit_is_sized_by_what_its_class_has_generated_so_far() -> None:
    gate = IntakeGate(ENGINE, GatewayConfig.model_validate(GATEWAY))
    wc = RequestClass(name="chat", body={"max_tokens": None})

    def size(i: int) -> int | None:
        a = gate.admit(gate.arrival(plan(f"r{i}", float(i), "chat", wc, 50, 256)))
        assert a.accepted is not None and a.accepted.max_tokens is None and a.max_tokens == 2048 - 50
        return a.accepted.est_tokens

    assert size(0) == 50 + 256  # the initial estimate
    gate.finished(Timeline("r0", "interactive", 0.0, 50, 1998, output_tokens=100))
    assert size(1) == 50 + 100  # the first request's real output replaces it
