"""Per-kind body translation: the class as the engine's own priority, the model rewrite."""

from __future__ import annotations

import pytest

from tailguard.config import BackendConfig
from tailguard.gateway.upstream.backends import prepare_body, translate_body


def test_vllm_gets_priority_from_the_class_rank_whatever_the_client_sent() -> None:
    body = {"model": "m", "prompt": "x"}
    assert translate_body("vllm", body, 2) == {"model": "m", "prompt": "x", "priority": 2}
    assert "priority" not in body
    assert translate_body("vllm", body, 0) is None  # 0 is vLLM's default: no rewrite needed
    # The class decides, not the client: a batch client cannot jump the engine's queue.
    assert translate_body("vllm", {**body, "priority": -5}, 2) == {"model": "m", "prompt": "x", "priority": 2}
    assert translate_body("vllm", {**body, "priority": -5}, 0) == {"model": "m", "prompt": "x", "priority": 0}
    assert translate_body("vllm", {**body, "priority": 2}, 2) is None
    # A key that may set it (`allow_priority`) keeps its own; one the engine refused is still not sent.
    assert translate_body("vllm", {**body, "priority": -5}, 2, own_priority=True) is None
    assert translate_body("vllm", {**body, "priority": -5}, 2, frozenset({"priority"}), own_priority=True) == body


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
