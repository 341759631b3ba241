"""The dashboard and the alert rules agree with the metric catalog, the committed files are what
deploy/generate.py writes, and promtool accepts the rules and passes their unit tests."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tailguard.gateway.ops import alerts, dashboard
from tailguard.gateway.ops.catalog import METRICS
from tailguard.gateway.ops.panels import PANELS, known, metrics_of
from tests.functional.prometheus_tools import tool

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_every_metric_has_a_panel_and_every_panel_a_metric() -> None:
    named = {name for p in PANELS for q in p.queries for name in metrics_of(q.expr)}
    assert named <= known(), f"panels read metrics that are not in the catalog: {sorted(named - known())}"
    missing = [m.exposed for m in METRICS if m.exposed not in named]
    assert not missing, f"metrics without a panel: {missing}"
    assert all(metrics_of(q.expr) for p in PANELS for q in p.queries)


def test_every_rule_reads_catalog_metrics() -> None:
    for rule in alerts.rules():
        named = metrics_of(rule.expr)
        assert named and named <= known(), (rule.alert, sorted(named - known()))
        page, _, anchor = rule.runbook.partition("#")
        assert page in ("docs/tuning.md", "docs/security.md") and anchor, rule.runbook
        headings = {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
                    for line in (DEPLOY.parent / page).read_text().splitlines() if line.startswith("#")}
        assert anchor in headings, (rule.alert, rule.runbook)


def test_the_committed_files_are_what_the_catalog_generates() -> None:
    assert (DEPLOY / "grafana" / "tailguard.json").read_text() == dashboard.render(), "run make deploy"
    assert (DEPLOY / "prometheus" / "alerts.yaml").read_text() == alerts.render(), "run make deploy"


def test_a_slo_off_the_buckets_is_refused() -> None:
    with pytest.raises(ValueError, match="bucket bound"):
        alerts.rules(0.3)


@pytest.mark.parametrize("args", [["check", "rules", "alerts.yaml"], ["test", "rules", "alerts_test.yaml"]],
                         ids=["check", "test"])
def test_promtool_accepts_the_rules(args: list[str]) -> None:
    out = subprocess.run([tool("promtool"), *args], cwd=DEPLOY / "prometheus", capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_docs_name_every_metric() -> None:
    docs = (DEPLOY.parent / "docs" / "metrics.md").read_text()
    missing = [m.exposed for m in METRICS if f"`{m.exposed}" not in docs and f" `{m.exposed}`" not in docs]
    assert not missing, f"docs/metrics.md does not describe {missing}"
