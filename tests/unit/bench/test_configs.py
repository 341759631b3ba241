"""Which gateway settings differed between two runs, from records and run descriptions alone."""

from __future__ import annotations

from typing import Any

from tailguard.bench.configs import config_changes, config_lines, run_config, within_run
from tailguard.bench.recorder import RequestRecord


def records(*hashes: str | None) -> list[RequestRecord]:
    return [RequestRecord(index=i, cls="interactive", warmup=False, scheduled_at=float(i), config=h)
            for i, h in enumerate(hashes)]


def meta(h: str, **settings: Any) -> dict[str, Any]:
    return {"gateway_config": {"hash": h, "n": 1, "settings": settings}}


def test_one_setting_changed_is_named_without_a_warning() -> None:
    before = run_config(records("h1", "h1"), meta("h1", scheduler={"aging_s": 10.0}))
    after = run_config(records("h2"), meta("h2", scheduler={"aging_s": 2.0}))
    out = config_changes(before, after)
    assert out == {"before": "h1", "after": "h2", "changes": ["scheduler.aging_s: 10.0 -> 2.0"], "warnings": []}
    assert config_lines(out) == ["gateway config: h1 -> h2", "  scheduler.aging_s: 10.0 -> 2.0"]


def test_more_than_one_setting_changed_is_a_warning() -> None:
    before = run_config(records("h1"), meta("h1", port=1, scheduler={"aging_s": 10.0}))
    after = run_config(records("h2"), meta("h2", port=2, scheduler={"aging_s": 2.0}))
    out = config_changes(before, after)
    assert out is not None and len(out["changes"]) == 2
    assert out["warnings"][0].startswith("2 gateway settings differ between the runs: change one per run")


def test_unrecorded_settings_and_a_config_changed_mid_run_are_said() -> None:
    before = run_config(records("h1", "h3"), {})  # an older run: hashes on its records only
    after = run_config(records("h2"), {})
    out = config_changes(before, after)
    assert out is not None and out["changes"] is None
    assert out["warnings"] == [
        "the gateway's config changed during the before run, its figures mix configs (requests answered by "
        "each: h1: 1, h3: 1)",
        "the gateway configs differ (h1 -> h2) but their settings were not recorded: `tailguard config diff` "
        "on the gateway's state directory names them"]
    mixed = within_run(before)
    assert mixed is not None and mixed["warnings"] == [
        "the gateway's config changed during this run, its figures mix configs (requests answered by each: h1: 1, "
        "h3: 1)"]
    assert config_lines(mixed) == ["warning: " + mixed["warnings"][0]]
    assert within_run(after) is None


def test_runs_straight_to_an_engine_have_nothing_to_compare() -> None:
    assert run_config(records(None), {}) is None
    assert config_changes(None, None) is None
    # before/after of the gateway itself: the one expected difference, said plainly and not warned about
    through = config_changes(None, run_config(records("h2"), {}))
    assert through is not None and through["warnings"] == []
    assert config_lines(through) == ["gateway config: none (straight to the backend) -> h2"]
