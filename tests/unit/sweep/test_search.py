"""The sweep's pure parts: values, settings in the gateway's YAML, the repeat rule, the knee."""

from __future__ import annotations

from typing import Any

import pytest

from tailguard.errors import ConfigError
from tailguard.config import GatewayConfig
from tailguard.sweep.search import Setting, Slo, Sweep, apply, knee, knee_or_why, parse_values, result


def test_values() -> None:
    mc = Setting.parse("max_concurrency")
    assert parse_values(mc, "2..6") == [2, 3, 4, 5, 6]
    assert parse_values(mc, "2..32:x2") == [2, 4, 8, 16, 32]
    assert parse_values(mc, "2..10:4") == [2, 6, 10]
    assert parse_values(Setting.parse("preemption"), "on,off") == [True, False]
    assert parse_values(Setting.parse("fair_share"), "off,on") == [False, True]
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
                        ("aging_s", 5.0), ("preemption", False), ("fair_share", True)):
        gw, eng = apply(Setting.parse(text), value, base, {})
        cfg = GatewayConfig.model_validate(gw)
        assert eng == {}
        assert {"max_concurrency": lambda: cfg.backends[0].max_concurrency,
                "max_tokens_cap:batch": lambda: next(c for c in cfg.classes if c.name == "batch").max_tokens_cap,
                "policy": lambda: cfg.scheduler.policy, "aging_s": lambda: cfg.scheduler.aging_s,
                "preemption": lambda: cfg.scheduler.preemption,
                "fair_share": lambda: cfg.scheduler.fair_share}[text]() == value
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
    assert knee_or_why(xs, [1.0] * 7) == (
        None, "throughput is the same at every value: this setting does not limit it under this load")
    assert "sweep larger values" in knee_or_why(xs, [1, 2, 3, 4, 5, 6, 8])[1]
    assert knee_or_why(xs[:2], [1, 2]) == (None, "a knee needs three values or more (2 measured)")
    with pytest.raises(ConfigError):
        Slo.parse("chat:latency=1")


def test_values_at_or_above_the_clients_sent_are_named_and_the_table_keeps_what_an_slo_judges() -> None:
    sw = Sweep(Setting.parse("max_concurrency"), [4, 8, 16], [Slo.parse("chat:tpot_s=0.05")], min_repeats=2,
               max_repeats=2, clients=8)
    assert sw.runs_left() == 6
    for i in (0, 1, 2):
        sw.add(i, {**summary(1.0, 100.0), "classes": {"chat": {"e2e_s": {"p99": 1.0}, "tpot_s": {"p99": 0.04}}}})
    assert sw.runs_left() == 3
    res = result(sw)
    assert res["points"][0]["p99"]["chat"]["tpot_s"]["mean"] == 0.04
    assert res["knee"] is None and res["no_knee"].startswith("throughput is the same at every value")
    assert res["warnings"] == ["max_concurrency 8, 16: at or above the 8 clients sent, such a cap never binds, so "
                               "these values measure the same thing as no cap; send more clients than the largest "
                               "value (--concurrency) or sweep values below 8"]
    open_loop = Sweep(Setting.parse("max_concurrency"), [4, 8], [])
    assert result(open_loop)["warnings"] == []
    assert result(Sweep(Setting.parse("policy"), ["fcfs", "ranked-sjf"], []))["no_knee"] == (
        "policy is not a number: its values have no knee")


def test_errors_and_warnings_name_the_thing_and_the_next_step() -> None:
    with pytest.raises(ConfigError, match=r"no class 'chats' in the gateway config \(its classes: interactive, batch, embeddings\)"):
        apply(Setting.parse("max_tokens_cap:chats"), 512, {}, {})
    with pytest.raises(ConfigError, match=r"--min-repeats 3 and --max-repeats 2: give 1 <= min <= max"):
        Sweep(Setting.parse("max_concurrency"), [4], [], min_repeats=3, max_repeats=2)
    sw = Sweep(Setting.parse("max_concurrency"), [4], [Slo.parse("interactive:e2e_s=1")], min_repeats=1, max_repeats=1)
    sw.add(0, summary(1.0, 100.0))
    assert result(sw)["warnings"] == [
        "--slo interactive:e2e_s=1 judges class 'interactive', which the workload does not send (its classes: chat): "
        "no value can meet it; name one of those"]
