"""Classification order: header, service_tier, API key default, default_class; and auth."""

from __future__ import annotations

import pytest

from tailguard.errors import APIError, BadRequest
from tailguard.gateway.classes import ClassTable
from tailguard.gateway.config import GatewayConfig


def table(**kw: object) -> ClassTable:
    return ClassTable(GatewayConfig.model_validate(kw))


def test_default_is_the_default_class() -> None:
    assert table().classify({}, {}, None).name == "interactive"
    assert table(default_class="batch").classify({}, {}, None).name == "batch"


def test_header_wins_over_everything() -> None:
    t = table(auth={"api_keys": {"k": {"default_class": "interactive"}}})
    assert t.classify({"X-Tailguard-Class": "batch"}, {"service_tier": "priority"}, "k").name == "batch"
    # Plain dicts are case-sensitive; aiohttp's headers are not. Both spellings are found.
    assert t.classify({"x-tailguard-class": " batch "}, {}, None).name == "batch"


def test_unknown_header_class_is_a_400_listing_the_known_ones() -> None:
    with pytest.raises(BadRequest) as info:
        table().classify({"X-Tailguard-Class": "gold"}, {}, None)
    err = info.value
    assert err.status == 400 and err.code == "unknown_class" and err.param == "X-Tailguard-Class"
    assert "'gold'" in err.message and "known classes: interactive, batch" in err.message


def test_a_long_unknown_header_class_is_named_not_echoed() -> None:
    with pytest.raises(BadRequest) as info:
        table().classify({"X-Tailguard-Class": "g" * 8000}, {}, None)
    assert "'" + "g" * 64 + "...'" in info.value.message and len(info.value.message) < 200


@pytest.mark.parametrize("tier,expected", [
    ("priority", "interactive"), ("default", "interactive"), ("scale", "interactive"), ("flex", "batch"),
])
def test_service_tier_maps_to_the_default_classes(tier: str, expected: str) -> None:
    assert table(default_class="batch").classify({}, {"service_tier": tier}, None).name == expected


def test_service_tier_auto_falls_through_to_key_then_default() -> None:
    t = table(auth={"api_keys": {"k": {"default_class": "batch"}, "j": {}}})
    assert t.classify({}, {"service_tier": "auto"}, "k").name == "batch"
    assert t.classify({}, {"service_tier": "auto"}, "j").name == "interactive"
    assert t.classify({}, {"service_tier": "auto"}, None).name == "interactive"


def test_unknown_service_tier_is_a_400() -> None:
    with pytest.raises(BadRequest) as info:
        table().classify({}, {"service_tier": "turbo"}, None)
    assert info.value.param == "service_tier" and "auto, default, flex, scale, priority" in info.value.message


def test_service_tier_with_custom_class_names_uses_ranks() -> None:
    t = table(
        classes=[{"name": "chat", "rank": 0}, {"name": "mid", "rank": 1}, {"name": "bulk", "rank": 5}],
        default_class="mid",
    )
    assert t.classify({}, {"service_tier": "priority"}, None).name == "chat"
    assert t.classify({}, {"service_tier": "flex"}, None).name == "bulk"
    assert t.classify({}, {"service_tier": "default"}, None).name == "mid"


def test_service_tier_map_overrides() -> None:
    t = table(
        classes=[{"name": "chat", "rank": 0}, {"name": "bulk", "rank": 1}, {"name": "cheap", "rank": 2}],
        default_class="chat", service_tier_map={"flex": "bulk"},
    )
    assert t.classify({}, {"service_tier": "flex"}, None).name == "bulk"


def test_api_key_default_comes_before_default_class() -> None:
    t = table(auth={"api_keys": {"reports": {"default_class": "batch"}}})
    assert t.classify({}, {}, "reports").name == "batch"
    assert t.classify({}, {}, "someone-else").name == "interactive"


def test_auth_off_without_keys_and_401_with_them() -> None:
    table().authenticate(None)
    t = table(auth={"api_keys": {"k": {}}})
    t.authenticate("k")
    for key, code in ((None, "missing_api_key"), ("wrong", "invalid_api_key")):
        with pytest.raises(APIError) as info:
            t.authenticate(key)
        assert info.value.status == 401 and info.value.code == code


def test_table_lookup_and_rank_order() -> None:
    t = table(classes=[{"name": "b", "rank": 3}, {"name": "a", "rank": 1}], default_class="a")
    assert [c.name for c in t] == ["a", "b"] and len(t) == 2
    assert "b" in t and t["b"].rank == 3 and t.get("zz") is None
