"""The intake: a request's class (header, service_tier, API key, default), its caps (default,
clamp or reject the output limit; bound the prompt), its job size and whether it is resumable."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest

from tailguard.front.intake import Accepted, Asked, Intake, OutputEstimator, Refused, key_id, resumable
from tailguard.wire.headers import bearer_key, class_header, header
from tailguard.front.params import ClassSpec, IntakeParams, KeySpec, OutputEstimateParams, Slo, default_classes
from tailguard.wire.openai import parse_request


def chat(**extra: object) -> Asked:
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 40}], **extra}
    return Asked.of(parse_request(orjson.dumps(body), "chat"), None, None)  # 4 + 10 = 14 prompt tokens


def completion(**extra: object) -> Asked:
    return Asked.of(parse_request(orjson.dumps({"model": "m", "prompt": "y" * 400, **extra}), "completions"), None, None)


def accept(asked: Asked, cls: ClassSpec, output_estimate_tokens: int = 0) -> Accepted:
    return Intake(IntakeParams(classes=[cls], default_class=cls.name)).accept(asked, cls, output_estimate_tokens)


def intake(classes: list[ClassSpec] | None = None, **kw: Any) -> Intake:
    """An intake whose `keys` are given by the keys themselves (it holds them by digest)."""
    if "keys" in kw:
        kw["keys"] = {key_id(k): spec for k, spec in kw["keys"].items()}
    return Intake(IntakeParams(classes=classes or default_classes(), **kw))


def classify(i: Intake, header_class: str | None = None, api_key: str | None = None, **body: object) -> str:
    return i.classify(replace(chat(**body), class_header=header_class, api_key=api_key)).name


# --- caps and job size -----------------------------------------------------------------------------

def test_request_within_cap_is_untouched() -> None:
    p = chat(max_tokens=32)
    c = accept(p, ClassSpec(name="batch", max_tokens_cap=4096), output_estimate_tokens=999)
    assert (c.max_tokens, c.est_tokens, c.body_changed) == (32, 14 + 32, False)
    assert c.body is p.body


def test_clamp_lowers_max_tokens_to_the_cap() -> None:
    p = completion(max_tokens=8000)
    c = accept(p, ClassSpec(name="batch", max_tokens_cap=4096))
    assert (c.max_tokens, c.est_tokens, c.body_changed) == (4096, 100 + 4096, True)
    assert c.body["max_tokens"] == 4096 and p.body["max_tokens"] == 8000  # the original is left alone


def test_clamp_caps_max_completion_tokens_and_a_larger_max_tokens_too() -> None:
    p = chat(max_completion_tokens=5000, max_tokens=6000)
    c = accept(p, ClassSpec(name="batch", max_tokens_cap=100))
    assert c.max_tokens == 100 and c.body["max_completion_tokens"] == 100 and c.body["max_tokens"] == 100


def test_a_small_max_completion_tokens_does_not_hide_a_large_max_tokens() -> None:
    # Engines differ in which of the two wins, so the larger one is capped and sizes the job.
    p = chat(max_completion_tokens=10, max_tokens=6000)
    c = accept(p, ClassSpec(name="batch", max_tokens_cap=100))
    assert c.max_tokens == 100 and c.body["max_tokens"] == 100 and c.body["max_completion_tokens"] == 10
    assert accept(p, ClassSpec(name="batch")).est_tokens == 14 + 6000
    with pytest.raises(Refused) as info:
        accept(p, ClassSpec(name="batch", max_tokens_cap=100, cap_mode="reject"))
    assert info.value.param == "max_tokens"


def test_each_of_n_choices_counts_in_the_job_size() -> None:
    # n choices are n generations: sized as one, n=128 would pass every single-choice request in SJF.
    c = accept(chat(max_tokens=32, n=4), ClassSpec(name="batch", max_tokens_cap=4096))
    assert (c.max_tokens, c.est_tokens) == (32, 14 + 4 * 32)
    c = accept(chat(n=3), ClassSpec(name="interactive"), output_estimate_tokens=50)
    assert c.est_tokens == 14 + 3 * 50


def test_reject_mode_is_a_400_naming_the_field() -> None:
    cls = ClassSpec(name="batch", max_tokens_cap=100, cap_mode="reject")
    with pytest.raises(Refused) as info:
        accept(chat(max_completion_tokens=101), cls)
    e = info.value
    assert not e.forbidden and e.param == "max_completion_tokens" and e.code == "max_tokens_over_cap"
    assert "101" in e.message and "cap of 100" in e.message and "'batch'" in e.message
    assert accept(chat(max_tokens=100), cls).max_tokens == 100


def test_missing_max_tokens_gets_the_class_default() -> None:
    c = accept(chat(), ClassSpec(name="i", default_max_tokens=256, max_tokens_cap=1000))
    assert (c.max_tokens, c.est_tokens, c.body_changed, c.body["max_tokens"]) == (256, 14 + 256, True, 256)


def test_missing_max_tokens_without_default_gets_the_cap() -> None:
    c = accept(completion(), ClassSpec(name="batch", max_tokens_cap=4096))
    assert (c.max_tokens, c.body["max_tokens"]) == (4096, 4096)


def test_missing_max_tokens_without_limits_uses_the_output_estimate() -> None:
    p = chat()
    c = accept(p, ClassSpec(name="i"), output_estimate_tokens=300)
    assert (c.max_tokens, c.est_tokens, c.body_changed) == (None, 14 + 300, False)
    assert "max_tokens" not in c.body


def test_prompt_over_the_class_limit_is_a_400() -> None:
    with pytest.raises(Refused) as info:
        accept(completion(), ClassSpec(name="i", max_prompt_tokens=99))
    assert info.value.param == "prompt" and info.value.code == "prompt_too_long"
    assert "100 tokens" in info.value.message and "limit of 99" in info.value.message
    with pytest.raises(Refused) as info:
        accept(chat(), ClassSpec(name="i", max_prompt_tokens=13))
    assert info.value.param == "messages"
    assert accept(chat(), ClassSpec(name="i", max_prompt_tokens=14)).est_tokens == 14 + 0


def test_output_estimator_tracks_each_class() -> None:
    est = OutputEstimator(OutputEstimateParams(initial_tokens=256, ewma_weight=0.5))
    assert est.estimate("chat") == 256
    est.observe("chat", 100)  # first observation replaces the prior
    assert est.estimate("chat") == 100
    est.observe("chat", 200)
    assert est.estimate("chat") == 150
    assert est.estimate("summary") == 256
    with pytest.raises(ValueError):
        est.observe("chat", -1)


# --- resumable ---------------------------------------------------------------------------------------

def test_only_plain_text_generations_are_resumable() -> None:
    msgs = [{"role": "user", "content": "q"}]
    assert resumable({"messages": msgs}, "chat")
    assert not resumable({"messages": msgs, "tools": [{"type": "function"}]}, "chat")
    assert not resumable({"messages": msgs, "n": 2}, "chat")
    assert not resumable({"messages": msgs, "response_format": {"type": "json_object"}}, "chat")
    assert not resumable({"prompt": [1, 2, 3]}, "completions")
    assert not resumable({"prompt": "p", "echo": True}, "completions")


def test_the_capped_body_is_what_is_judged_resumable() -> None:
    assert accept(chat(max_tokens=9), ClassSpec(name="batch", max_tokens_cap=4)).resumable
    assert not accept(chat(max_tokens=9, logprobs=True), ClassSpec(name="batch", max_tokens_cap=4)).resumable


# --- classes -----------------------------------------------------------------------------------------

def test_default_is_the_default_class() -> None:
    assert classify(intake()) == "interactive"
    assert classify(intake(default_class="batch")) == "batch"


def test_header_wins_over_everything() -> None:
    i = intake(keys={"k": KeySpec("reports", default_class="interactive")})
    assert classify(i, "batch", "k", service_tier="priority") == "batch"
    assert classify(i, " batch ") == "batch"


def test_the_class_header_is_found_in_any_mapping_of_headers() -> None:
    # Plain dicts are case-sensitive; aiohttp's headers are not. Both spellings are found.
    assert header({"x-tailguard-class": "batch"}, "X-Tailguard-Class") == "batch"
    parsed = parse_request(b'{"prompt": "p"}', "completions")
    assert Asked.of(parsed, class_header({"X-Tailguard-Class": "b"}), None).class_header == "b"
    assert bearer_key({"Authorization": "Bearer  k1 "}) == "k1" and bearer_key({"authorization": "bearer k"}) == "k"
    assert bearer_key({"Authorization": "Basic k"}) is None and bearer_key({"Authorization": "Bearer "}) is None
    assert bearer_key({}) is None


def test_unknown_header_class_is_a_400_listing_the_known_ones() -> None:
    with pytest.raises(Refused) as info:
        classify(intake(), "gold")
    err = info.value
    assert not err.forbidden and err.code == "unknown_class" and err.param == "X-Tailguard-Class"
    assert "'gold'" in err.message and "known classes: interactive, batch" in err.message


def test_a_long_unknown_header_class_is_named_not_echoed() -> None:
    with pytest.raises(Refused) as info:
        classify(intake(), "g" * 8000)
    assert "'" + "g" * 64 + "...'" in info.value.message and len(info.value.message) < 200


@pytest.mark.parametrize("tier,expected", [
    ("priority", "interactive"), ("default", "interactive"), ("scale", "interactive"), ("flex", "batch"),
])
def test_service_tier_maps_to_the_default_classes(tier: str, expected: str) -> None:
    assert classify(intake(default_class="batch"), service_tier=tier) == expected


def test_service_tier_auto_falls_through_to_key_then_default() -> None:
    i = intake(keys={"k": KeySpec("reports", default_class="batch"), "j": KeySpec("j")})
    assert classify(i, None, "k", service_tier="auto") == "batch"
    assert classify(i, None, "j", service_tier="auto") == "interactive"
    assert classify(i, None, None, service_tier="auto") == "interactive"


def test_unknown_service_tier_is_a_400() -> None:
    with pytest.raises(Refused) as info:
        classify(intake(), service_tier="turbo")
    assert info.value.param == "service_tier" and "auto, default, flex, scale, priority" in info.value.message


def test_service_tier_with_custom_class_names_uses_ranks() -> None:
    i = intake([ClassSpec("chat", rank=0), ClassSpec("mid", rank=1), ClassSpec("bulk", rank=5)], default_class="mid")
    assert classify(i, service_tier="priority") == "chat"
    assert classify(i, service_tier="flex") == "bulk"
    assert classify(i, service_tier="default") == "mid"


def test_service_tier_map_overrides() -> None:
    i = intake([ClassSpec("chat", rank=0), ClassSpec("bulk", rank=1), ClassSpec("cheap", rank=2)],
               default_class="chat", service_tier_map={"flex": "bulk"})
    assert classify(i, service_tier="flex") == "bulk"
    assert i.tier_class("auto") is None and i.tier_class("turbo") is None


def test_api_key_default_comes_before_default_class_and_names_the_caller() -> None:
    i = intake(keys={"reports": KeySpec("reporting", default_class="batch")})
    assert classify(i, None, "reports") == "batch"
    assert classify(i, None, "someone-else") == "interactive"
    assert (i.caller("reports"), i.caller("someone-else"), i.caller(None)) == ("reporting", None, None)


# --- what a key may use ----------------------------------------------------------------------------

def test_a_key_restricted_to_batch_is_refused_or_lowered_whichever_way_it_names_interactive() -> None:
    i = intake(keys={"strict": KeySpec("nightly", default_class="batch", allowed_classes=("batch",)),
                     "soft": KeySpec("web", allowed_classes=("batch",), lower=True),
                     "free": KeySpec("free")})
    for named in ({"header_class": "interactive"}, {"service_tier": "priority"}, {"service_tier": "default"}):
        with pytest.raises(Refused) as refused:
            classify(i, api_key="strict", **named)
        assert refused.value.forbidden and refused.value.code == "class_not_allowed"
        assert classify(i, api_key="soft", **named) == "batch"
        assert classify(i, api_key="free", **named) == "interactive"
    assert classify(i, api_key="strict") == "batch"
    assert classify(i, api_key="soft") == "batch"  # the gateway's default is not allowed: the best that is
    assert classify(i, "batch", api_key="strict") == "batch"
    with pytest.raises(Refused):  # an unknown class is still a 400, before any key rule
        classify(i, "nope", api_key="strict")


def test_the_best_allowed_class_is_the_lowest_rank() -> None:
    classes = [ClassSpec(name="interactive", rank=0), ClassSpec(name="standard", rank=1), ClassSpec(name="batch", rank=2)]
    i = intake(classes, keys={"k": KeySpec("k", allowed_classes=("batch", "standard"), lower=True)})
    assert classify(i, "interactive", api_key="k") == "standard"


def test_a_key_is_held_to_its_models_as_the_client_names_them() -> None:
    i = intake(keys={"k": KeySpec("k", allowed_models=frozenset({"small"})), "any": KeySpec("any")},
               aliases={"small": "llama-8b"})
    cls = i.classify(chat())
    assert i.accept(replace(chat(model="small"), api_key="k"), cls, 10).model == "llama-8b"  # through its alias
    for model in ("llama-8b", "m"):
        with pytest.raises(Refused) as refused:
            i.accept(replace(chat(model=model), api_key="k"), cls, 10)
        assert refused.value.forbidden and refused.value.code == "model_not_allowed"
    assert i.accept(replace(chat(model="m"), api_key="any"), cls, 10).model == "m"
    assert i.key("k") is not None and i.key("unknown") is None and i.key(None) is None


# --- a request's own TTFT target (x-tailguard-ttft-slo-ms) ----------------------------------------

def _targeted(ms: str, slo: Slo | None, key: KeySpec | None = None) -> float | None:
    """The request's TTFT target once its class's `slo` and its key's rights have had their say."""
    cls = ClassSpec(name="chat", slo=slo)
    i = intake([cls], default_class="chat", keys={"sk-1": key} if key is not None else {})
    return i.accept(replace(chat(max_tokens=8), ttft_slo_ms=ms, api_key="sk-1" if key else None), cls, 0).ttft_slo_s


def test_a_request_tightens_its_target_down_to_its_class_floor() -> None:
    assert _targeted("500", Slo(ttft_s=2.0, min_ttft_s=0.25)) == 0.5
    assert _targeted("100", Slo(ttft_s=2.0, min_ttft_s=0.25)) == 0.25  # raised to the floor
    assert _targeted("5000", Slo(ttft_s=2.0, min_ttft_s=0.25)) == 2.0  # never looser than its class's


def test_without_a_floor_the_header_changes_nothing() -> None:
    assert _targeted("100", Slo(ttft_s=2.0)) == 2.0
    assert _targeted("100", None) is None


def test_a_key_may_be_allowed_tighter_than_its_class() -> None:
    assert _targeted("100", Slo(ttft_s=2.0, min_ttft_s=0.5), KeySpec("svc", min_ttft_slo_s=0.2)) == 0.2
    assert _targeted("300", Slo(ttft_s=2.0), KeySpec("svc", min_ttft_slo_s=0.2)) == 0.3
    assert _targeted("300", None, KeySpec("svc", min_ttft_slo_s=0.2)) == 0.3  # a target where its class has none


@pytest.mark.parametrize("raw", ["", "abc", "-5", "0", "nan", "inf", "1e400"])
def test_a_target_that_is_not_a_positive_number_is_a_400(raw: str) -> None:
    with pytest.raises(Refused) as e:
        _targeted(raw, Slo(ttft_s=2.0, min_ttft_s=0.1))
    assert e.value.param == "x-tailguard-ttft-slo-ms" and e.value.code == "invalid_ttft_slo"


def test_a_clients_priority_is_dropped_unless_its_key_may_set_it() -> None:
    """The field is the class's to set: a key without `set_priority` (or no key) loses it, and the
    body goes upstream rewritten; a key with it keeps it, marked as its own."""
    i = intake(keys={"k": KeySpec("k"), "ops": KeySpec("ops", set_priority=True)})
    asked = chat(priority=-100)
    cls = i.classify(asked)
    for key in (None, "k"):
        a = i.accept(replace(asked, api_key=key), cls, 10)
        assert "priority" not in a.body and a.body_changed and not a.own_priority
    kept = i.accept(replace(asked, api_key="ops"), cls, 10)
    assert kept.body["priority"] == -100 and kept.own_priority and not kept.body_changed
    plain = i.accept(chat(), cls, 10)
    assert not plain.body_changed and not plain.own_priority
