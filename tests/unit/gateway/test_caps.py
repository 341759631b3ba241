"""Caps: default, clamp or reject max_tokens; bound the prompt; size the job."""

from __future__ import annotations

import orjson
import pytest

from tailguard.errors import BadRequest
from tailguard.gateway.caps import OutputEstimator, apply_caps
from tailguard.gateway.config import ClassConfig, OutputEstimateConfig
from tailguard.wire.openai import ParsedRequest, parse_request


def chat(**extra: object) -> ParsedRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 40}], **extra}
    return parse_request(orjson.dumps(body), "chat")  # 4 + 10 = 14 prompt tokens


def completion(**extra: object) -> ParsedRequest:
    return parse_request(orjson.dumps({"model": "m", "prompt": "y" * 400, **extra}), "completions")  # 100


def test_request_within_cap_is_untouched() -> None:
    p = chat(max_tokens=32)
    c = apply_caps(p, ClassConfig(name="batch", max_tokens_cap=4096), output_estimate_tokens=999)
    assert (c.max_tokens, c.est_tokens, c.body_changed) == (32, 14 + 32, False)
    assert c.body is p.body


def test_clamp_lowers_max_tokens_to_the_cap() -> None:
    p = completion(max_tokens=8000)
    c = apply_caps(p, ClassConfig(name="batch", max_tokens_cap=4096), 0)
    assert (c.max_tokens, c.est_tokens, c.body_changed) == (4096, 100 + 4096, True)
    assert c.body["max_tokens"] == 4096 and p.body["max_tokens"] == 8000  # the original is left alone


def test_clamp_caps_max_completion_tokens_and_a_larger_max_tokens_too() -> None:
    p = chat(max_completion_tokens=5000, max_tokens=6000)
    c = apply_caps(p, ClassConfig(name="batch", max_tokens_cap=100), 0)
    assert c.max_tokens == 100 and c.body["max_completion_tokens"] == 100 and c.body["max_tokens"] == 100


def test_a_small_max_completion_tokens_does_not_hide_a_large_max_tokens() -> None:
    # Engines differ in which of the two wins, so the larger one is capped and sizes the job.
    p = chat(max_completion_tokens=10, max_tokens=6000)
    c = apply_caps(p, ClassConfig(name="batch", max_tokens_cap=100), 0)
    assert c.max_tokens == 100 and c.body["max_tokens"] == 100 and c.body["max_completion_tokens"] == 10
    assert apply_caps(p, ClassConfig(name="batch"), 0).est_tokens == 14 + 6000
    with pytest.raises(BadRequest) as info:
        apply_caps(p, ClassConfig(name="batch", max_tokens_cap=100, cap_mode="reject"), 0)
    assert info.value.param == "max_tokens"


def test_each_of_n_choices_counts_in_the_job_size() -> None:
    # n choices are n generations: sized as one, n=128 would pass every single-choice request in SJF.
    c = apply_caps(chat(max_tokens=32, n=4), ClassConfig(name="batch", max_tokens_cap=4096), 0)
    assert (c.max_tokens, c.est_tokens) == (32, 14 + 4 * 32)
    c = apply_caps(chat(n=3), ClassConfig(name="interactive"), output_estimate_tokens=50)
    assert c.est_tokens == 14 + 3 * 50


def test_reject_mode_is_a_400_naming_the_field() -> None:
    cls = ClassConfig(name="batch", max_tokens_cap=100, cap_mode="reject")
    with pytest.raises(BadRequest) as info:
        apply_caps(chat(max_completion_tokens=101), cls, 0)
    e = info.value
    assert e.status == 400 and e.param == "max_completion_tokens" and e.code == "max_tokens_over_cap"
    assert "101" in e.message and "cap of 100" in e.message and "'batch'" in e.message
    assert apply_caps(chat(max_tokens=100), cls, 0).max_tokens == 100


def test_missing_max_tokens_gets_the_class_default() -> None:
    c = apply_caps(chat(), ClassConfig(name="i", default_max_tokens=256, max_tokens_cap=1000), 0)
    assert (c.max_tokens, c.est_tokens, c.body_changed, c.body["max_tokens"]) == (256, 14 + 256, True, 256)


def test_missing_max_tokens_without_default_gets_the_cap() -> None:
    c = apply_caps(completion(), ClassConfig(name="batch", max_tokens_cap=4096), 0)
    assert (c.max_tokens, c.body["max_tokens"]) == (4096, 4096)


def test_missing_max_tokens_without_limits_uses_the_output_estimate() -> None:
    p = chat()
    c = apply_caps(p, ClassConfig(name="i"), output_estimate_tokens=300)
    assert (c.max_tokens, c.est_tokens, c.body_changed) == (None, 14 + 300, False)
    assert "max_tokens" not in c.body


def test_prompt_over_the_class_limit_is_a_400() -> None:
    with pytest.raises(BadRequest) as info:
        apply_caps(completion(), ClassConfig(name="i", max_prompt_tokens=99), 0)
    assert info.value.param == "prompt" and info.value.code == "prompt_too_long"
    assert "100 tokens" in info.value.message and "limit of 99" in info.value.message
    with pytest.raises(BadRequest) as info:
        apply_caps(chat(), ClassConfig(name="i", max_prompt_tokens=13), 0)
    assert info.value.param == "messages"
    assert apply_caps(chat(), ClassConfig(name="i", max_prompt_tokens=14), 0).est_tokens == 14 + 0


def test_output_estimator_tracks_each_class() -> None:
    est = OutputEstimator(OutputEstimateConfig(initial_tokens=256, ewma_weight=0.5))
    assert est.estimate("chat") == 256
    est.observe("chat", 100)  # first observation replaces the prior
    assert est.estimate("chat") == 100
    est.observe("chat", 200)
    assert est.estimate("chat") == 150
    assert est.estimate("summary") == 256
    with pytest.raises(ValueError):
        est.observe("chat", -1)
