"""The gateway's checks around the intake: authentication, and the service tier an answer reports."""

from __future__ import annotations

import pytest

from tailguard.errors import APIError
from tailguard.front.intake import Asked
from tailguard.config import GatewayConfig
from tailguard.gateway.classes import ClassTable


def table(**kw: object) -> ClassTable:
    return ClassTable(GatewayConfig.model_validate(kw))


def test_the_table_classifies_by_the_config() -> None:
    t = table(default_class="batch", auth={"api_keys": {"k": {"name": "ops", "default_class": "interactive"}}})
    asked = Asked("chat", {"messages": []}, 1, None, api_key="k")
    assert t.intake.classify(asked).name == "interactive" and t.intake.caller("k") == "ops"
    assert t.intake.classify(Asked("chat", {}, 1, None)).name == "batch"


def test_auth_off_without_keys_and_401_with_them() -> None:
    table().authenticate(None)
    t = table(auth={"api_keys": {"k": {}}})
    t.authenticate("k")
    for key, code in ((None, "missing_api_key"), ("wrong", "invalid_api_key")):
        with pytest.raises(APIError) as info:
            t.authenticate(key)
        assert info.value.status == 401 and info.value.code == code


@pytest.mark.parametrize("requested,served,reported", [
    (None, "interactive", None), ("priority", "interactive", "priority"), ("auto", "batch", "flex"),
    ("flex", "batch", "flex"), ("flex", "interactive", "default"), ("auto", "interactive", "default"),
])
def test_the_tier_reported_is_the_one_asked_when_it_was_served(requested: str | None, served: str,
                                                                reported: str | None) -> None:
    t = table()
    cls = t.intake.classify(Asked("chat", {}, 1, None, class_header=served))
    assert t.served_tier(requested, cls) == reported
