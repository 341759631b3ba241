"""What a live reload applies and what it refuses: every setting is live (named in `LIVE`) or
needs a restart, the list of those is the one documented, and a config that weakens the
gateway's guard is refused unless forced, saying why. Pure: configs compared, no gateway."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tailguard.config import GatewayConfig
from tailguard.gateway.ops.reload import LIVE, live, restart_needed, weakened
from tailguard.settings import flatten

ADMIN = "adm-0123456789abcdef"


def everything(**extra: Any) -> GatewayConfig:
    """A config with every section set, so every setting has a name."""
    return GatewayConfig.model_validate({
        "backends": [{"name": "a", "url": "http://127.0.0.1:9"}], "state": {"url": "redis://127.0.0.1:1"},
        "telemetry": {"otlp_endpoint": "http://127.0.0.1:4318"}, "batches": {"dir": "/tmp/b"},
        "aliases": {"fast": "m"}, "service_tier_map": {"flex": "batch"}, "hedging": {"classes": ["interactive"]},
        "auth": {"api_keys": {f"key-{i}": {"name": f"c{i}"} for i in range(4)}, "admin_keys": [ADMIN]}, **extra})


def _generic(name: str) -> str:
    return re.sub(r"\[[^]]*\]", "[]", name)


def test_what_needs_a_restart_is_what_only_a_start_reads() -> None:
    """The settings a reload refuses, by name: a new setting lands here (refused, so never shown
    by /config while not in force) until it is made live and named in `LIVE`."""
    names = flatten(everything().settings())
    restart = sorted({_generic(n).split(".", 1)[0] if n.startswith(("batches.", "telemetry.")) else _generic(n)
                      for n in names if not live(n, {"a"})})
    assert restart == ["access_log", "backends[].kind", "backends[].models", "backends[].pool", "batches", "host",
                       "log_format", "log_prompts", "max_body_bytes", "port", "scheduler.output_estimate.ewma_weight",
                       "scheduler.output_estimate.initial_tokens", "state.lease_s", "state.timeout_s", "state.url",
                       "telemetry"]
    for k in LIVE:  # each entry of the table names settings that exist
        assert any(n == k.rstrip(".[") or n.startswith(k) for n in names), k


@pytest.mark.parametrize(("change", "refused"), [
    ({"state": {"url": "redis://127.0.0.1:1", "on_unavailable": "closed", "replicas": 3}}, []),
    ({"state": {"url": "redis://127.0.0.1:2"}}, ["state.url"]),
    ({"state": {"url": "redis://127.0.0.1:1", "lease_s": 9.0}}, ["state.lease_s"]),
    ({"log_format": "text"}, ["log_format"]),
    ({"telemetry": {"otlp_endpoint": "http://127.0.0.1:4319"}}, ["telemetry.otlp_endpoint"]),
    ({"batches": {"dir": "/tmp/c"}}, ["batches.dir"]),
    ({"limits": {"max_tokens_margin": 4, "max_connections": 64}}, []),
])
def test_a_reload_names_each_setting_it_cannot_apply(change: dict[str, Any], refused: list[str]) -> None:
    assert [c.name for c in restart_needed(everything(), everything(**change))] == refused


def _auth(n_keys: int, admin: list[str], **extra: Any) -> dict[str, Any]:
    return {"auth": {"api_keys": {f"key-{i}": {"name": f"c{i}"} for i in range(n_keys)}, "admin_keys": admin, **extra}}


@pytest.mark.parametrize(("new", "why"), [
    (_auth(4, [ADMIN]), None),
    (_auth(2, [ADMIN]), None),  # half of them: a cleanup, not a cut-off file
    (_auth(1, [ADMIN]), "removes 3 of the 4 client keys"),
    (_auth(0, [ADMIN]), "no auth.api_keys"),
    (_auth(0, [ADMIN], allow_keyless=True), None),  # the file says it means it
    (_auth(4, []), "removes every admin key in force (1)"),
    (_auth(4, ["adm-fedcba9876543210"]), "removes every admin key in force (1)"),  # swapped in one go
    (_auth(4, [ADMIN, "adm-fedcba9876543210"]), None),
    (_auth(4, [ADMIN], open_metrics="always"), "opens /metrics to every client"),
    (_auth(4, [ADMIN], open_metrics="keys"), None),
])
def test_a_reload_that_weakens_the_guard_says_why(new: dict[str, Any], why: str | None) -> None:
    said = weakened(everything(), everything(**new))
    assert (why is None and said == []) or (why is not None and len(said) == 1 and why in said[0]), said
