"""The dashboard and the alert rules agree with the metric catalog, the committed files are what
deploy/generate.py writes, and promtool accepts the rules and passes their unit tests."""

from __future__ import annotations

import re
import subprocess
import sys
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


def _anchor(heading: str) -> str:
    """A markdown heading's anchor, as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_rule_reads_catalog_metrics_and_links_a_section_that_exists() -> None:
    for rule in alerts.rules():
        named = metrics_of(rule.expr)
        assert named and named <= known(), (rule.alert, sorted(named - known()))
        page, _, anchor = rule.runbook.partition("#")
        headings = [line.lstrip("#") for line in (DEPLOY.parent / "docs" / page).read_text().splitlines()
                    if line.startswith("#")]
        assert anchor in {_anchor(h) for h in headings}, (rule.alert, rule.runbook)
    url = alerts.document(runbook_base="https://wiki.example.com/tg/docs")["groups"]  # type: ignore[index]
    assert url[0]["rules"][0]["annotations"]["runbook_url"].startswith("https://wiki.example.com/tg/docs/tuning.md#")


def test_only_classes_with_a_ttft_target_get_the_burn_rules() -> None:
    def burning(targets: dict[str, float] | None = None) -> list[tuple[str, str]]:
        rules = alerts.rules(targets) if targets is not None else alerts.rules()
        return [(r.alert, r.summary.split(":")[0]) for r in rules if "BudgetBurn" in r.alert]
    assert burning() == [("TailguardTTFTBudgetBurnFast", "interactive"), ("TailguardTTFTBudgetBurnSlow", "interactive")]
    assert not any("batch" in r.expr for r in alerts.rules() if "BudgetBurn" in r.alert)
    two = burning({"chat": 1.0, "agents": 5.0})
    assert sorted(two) == sorted([(a, c) for c in ("chat", "agents")
                                  for a in ("TailguardTTFTBudgetBurnFast", "TailguardTTFTBudgetBurnSlow")])
    assert burning({}) == []


def test_the_committed_files_are_what_the_catalog_generates() -> None:
    assert (DEPLOY / "grafana" / "tailguard.json").read_text() == dashboard.render(), "run make deploy"
    assert (DEPLOY / "prometheus" / "alerts.yaml").read_text() == alerts.render(), "run make deploy"


def test_a_slo_off_the_buckets_is_refused() -> None:
    with pytest.raises(ValueError, match="TTFT SLO of interactive .* bucket bound"):
        alerts.rules({"interactive": 0.3})


def test_the_generator_takes_a_target_per_class() -> None:
    out = subprocess.run([sys.executable, str(DEPLOY / "generate.py"), "--ttft-slo", "interactive=0.3"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "bucket bound" in out.stderr
    assert (DEPLOY / "prometheus" / "alerts.yaml").read_text() == alerts.render(), "a refused run wrote the file"


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
