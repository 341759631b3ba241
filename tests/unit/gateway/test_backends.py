"""Backend pool: slot shares by rank, acquire/release, health flips, per-kind body translation."""

from __future__ import annotations

import pytest

from tailguard.gateway.backends import BackendPool, prepare_body, translate_body
from tailguard.gateway.config import BackendConfig, ClassConfig, HealthConfig

THREE = [
    ClassConfig(name="interactive", rank=0),
    ClassConfig(name="standard", rank=1, max_share=0.75),
    ClassConfig(name="batch", rank=2, max_share=0.5),
]


def pool(max_concurrency: int = 8, classes: list[ClassConfig] = THREE, **health: int) -> BackendPool:
    return BackendPool(
        [BackendConfig(name="a", url="http://127.0.0.1:1", max_concurrency=max_concurrency)], classes,
        HealthConfig(**health),  # type: ignore[arg-type]
    )


def fill(p: BackendPool, cls: str) -> int:
    n = 0
    while p.has_capacity("a", cls):
        p.acquire("a", cls)
        n += 1
    return n


def test_shares_are_rounded_down_with_at_least_one_slot() -> None:
    assert pool(8).slots_for("a", "batch") == 4
    assert pool(7).slots_for("a", "standard") == 5  # floor(5.25)
    assert pool(1).slots_for("a", "batch") == 1  # a class is never locked out entirely
    assert pool(8).slots_for("a", "interactive") == 8


def test_lower_ranks_share_one_budget_and_leave_the_rest_to_higher_ranks() -> None:
    p = pool(8)
    assert fill(p, "batch") == 4
    # standard and batch together may hold 6: two more for standard.
    assert fill(p, "standard") == 2
    assert fill(p, "interactive") == 2
    assert p.in_flight("a") == 8 and p.in_flight("a", "batch") == 4


def test_release_frees_a_slot_for_that_class() -> None:
    p = pool(8)
    fill(p, "batch")
    assert not p.has_capacity("a", "batch")
    p.release("a", "batch")
    assert p.has_capacity("a", "batch")


def test_acquire_without_capacity_and_release_without_acquire_are_errors() -> None:
    p = pool(1)
    p.acquire("a", "batch")
    with pytest.raises(RuntimeError, match="no free slot"):
        p.acquire("a", "interactive")
    p.release("a", "batch")
    with pytest.raises(RuntimeError, match="release without acquire"):
        p.release("a", "batch")


def test_unhealthy_after_consecutive_failures_and_back_after_successes() -> None:
    p = pool(unhealthy_after=3, healthy_after=2)
    assert p.is_healthy("a")
    assert p.mark_failure("a") is False
    assert p.mark_failure("a") is False
    p.mark_success("a")  # resets the streak
    assert p.mark_failure("a") is False and p.mark_failure("a") is False
    assert p.mark_failure("a") is True and not p.is_healthy("a") and not p.any_healthy()
    assert p.mark_failure("a") is False  # already unhealthy: no second flip
    assert p.mark_success("a") is False
    assert p.mark_success("a") is True and p.is_healthy("a")


def test_vllm_gets_priority_from_the_class_rank_whatever_the_client_sent() -> None:
    body = {"model": "m", "prompt": "x"}
    assert translate_body("vllm", body, 2) == {"model": "m", "prompt": "x", "priority": 2}
    assert "priority" not in body
    assert translate_body("vllm", body, 0) is None  # 0 is vLLM's default: no rewrite needed
    # The class decides, not the client: a batch client cannot jump the engine's queue.
    assert translate_body("vllm", {**body, "priority": -5}, 2) == {"model": "m", "prompt": "x", "priority": 2}
    assert translate_body("vllm", {**body, "priority": -5}, 0) == {"model": "m", "prompt": "x", "priority": 0}
    assert translate_body("vllm", {**body, "priority": 2}, 2) is None


def test_sglang_gets_the_rank_negated_because_it_serves_higher_values_first() -> None:
    assert translate_body("sglang", {"model": "m"}, 1) == {"model": "m", "priority": -1}
    assert translate_body("sglang", {"model": "m"}, 0) is None


@pytest.mark.parametrize("kind", ["llamacpp", "tgi", "openai", "sim"])
def test_other_kinds_are_sent_unchanged(kind: str) -> None:
    assert translate_body(kind, {"model": "m"}, 3) is None


def test_unknown_kind_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown backend kind 'triton' .known: vllm, llamacpp, sglang, tgi, openai, sim."):
        translate_body("triton", {}, 0)


def test_prepare_body_rewrites_the_model_when_configured() -> None:
    b = BackendConfig(name="a", url="http://h:1", kind="vllm", model="llama-3-8b")
    assert prepare_body(b, {"model": "gpt-4o", "prompt": "x"}, 1) == {"model": "llama-3-8b", "prompt": "x", "priority": 1}
    assert prepare_body(b, {"model": "llama-3-8b"}, 0) is None
    assert prepare_body(BackendConfig(name="a", url="http://h:1"), {"model": "x"}, 1) is None
