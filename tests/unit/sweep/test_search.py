"""The sweep's pure parts: values, settings in the gateway's YAML, the repeat rule, the knee."""

from __future__ import annotations

from typing import Any

import pytest

from tailguard.errors import ConfigError
from tailguard.gateway.config import GatewayConfig
from tailguard.sweep.search import Setting, Slo, Sweep, apply, knee, parse_values, result


def test_values() -> None:
    mc = Setting.parse("max_concurrency")
    assert parse_values(mc, "2..6") == [2, 3, 4, 5, 6]
    assert parse_values(mc, "2..32:x2") == [2, 4, 8, 16, 32]
    assert parse_values(mc, "2..10:4") == [2, 6, 10]
    assert parse_values(Setting.parse("preemption"), "on,off") == [True, False]
    assert parse_values(Setting.parse("aging_s"), "1,2.5") == [1.0, 2.5]
    with pytest.raises(ConfigError):
        parse_values(mc, "two")
    with pytest.raises(ConfigError, match="known settings"):
        Setting.parse("temperature")
    with pytest.raises(ConfigError, match="its class"):
        Setting.parse("max_tokens_cap")


def test_each_setting_lands_where_the_gateway_config_takes_it() -> None:
    base: dict[str, Any] = {"backends": [{"name": "e", "url": "http://127.0.0.1:1", "max_concurrency": 8}]}
    for text, value in (("max_concurrency", 4), ("max_tokens_cap:batch", 512), ("policy", "fcfs"),
                        ("aging_s", 5.0), ("preemption", False)):
        gw, eng = apply(Setting.parse(text), value, base, {})
        cfg = GatewayConfig.model_validate(gw)
        assert eng == {}
        assert {"max_concurrency": lambda: cfg.backends[0].max_concurrency,
                "max_tokens_cap:batch": lambda: next(c for c in cfg.classes if c.name == "batch").max_tokens_cap,
                "policy": lambda: cfg.scheduler.policy, "aging_s": lambda: cfg.scheduler.aging_s,
                "preemption": lambda: cfg.scheduler.preemption}[text]() == value
    assert base["backends"][0]["max_concurrency"] == 8  # the base is not changed
    assert apply(Setting.parse("prefix_caching"), True, base, {})[1] == {"enable_prefix_caching": True}


def summary(p99_s: float, tokens_per_s: float) -> dict[str, Any]:
    return {"classes": {"chat": {"e2e_s": {"p99": p99_s}, "ttft_s": {"p99": p99_s / 2}}},
            "overall": {"e2e_s": {"p99": p99_s}}, "throughput": {"output_tokens_per_s": tokens_per_s}}


def test_a_value_is_repeated_until_its_p99_settles_or_the_limit() -> None:
    sw = Sweep(Setting.parse("max_concurrency"), [4, 8], [Slo.parse("chat:e2e_s=1.0")], seed=10,
               min_repeats=2, max_repeats=4, tolerance=0.05)
    seen = []
    p99s = {4: iter([0.5, 0.9, 0.6, 0.8]), 8: iter([2.0, 2.01])}
    while (nxt := sw.next_run()) is not None:
        i, value, seed = nxt
        seen.append((value, seed))
        sw.add(i, summary(next(p99s[value]), 100.0 * value))
    assert seen == [(4, 10), (4, 11), (4, 12), (4, 13), (8, 10), (8, 11)]
    res = result(sw)
    assert [p["meets_slo"] for p in res["points"]] == [True, False]
    assert res["recommended"] == 4 and "chat P99 e2e_s <= 1 s" in res["reason"]


def test_knee_of_a_rising_then_flat_curve() -> None:
    xs = [2.0, 4, 6, 8, 10, 12, 16]
    assert knee(xs, [2, 4, 6, 8, 8, 8, 8]) == 3
    assert knee(xs, [1.0] * 7) is None
    with pytest.raises(ConfigError):
        Slo.parse("chat:latency=1")
