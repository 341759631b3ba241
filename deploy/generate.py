"""Write the Grafana dashboard and the Prometheus alert rules from tailguard's metric catalog.

    .venv/bin/python deploy/generate.py                               # deploy/grafana/tailguard.json, deploy/prometheus/alerts.yaml
    .venv/bin/python deploy/generate.py --ttft-slo interactive=2.5    # another first-token SLO for the burn-rate alerts
    .venv/bin/python deploy/generate.py --ttft-slo chat=1 --ttft-slo agents=5   # a class each (only these page)
    .venv/bin/python deploy/generate.py --runbook-base https://wiki.example.com/tailguard/docs/

`make deploy` runs it; tests/functional/test_deploy_rules.py fails when the committed files differ from it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tailguard.gateway.ops import alerts, dashboard

HERE = Path(__file__).resolve().parent
DASHBOARD = HERE / "grafana" / "tailguard.json"
ALERTS = HERE / "prometheus" / "alerts.yaml"


def _target(text: str) -> tuple[str, float]:
    cls, sep, seconds = text.partition("=")
    try:
        if not sep or not cls:
            raise ValueError
        return cls, float(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CLASS=SECONDS, e.g. interactive=1, got {text!r}") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ttft-slo", type=_target, action="append", metavar="CLASS=SECONDS",
                    help="a class whose first tokens are held to an SLO (a bucket bound of tailguard_ttft_seconds); "
                    "repeat for several; only these classes get the burn-rate alerts (default: interactive=1)")
    ap.add_argument("--runbook-base", default=alerts.RUNBOOK_BASE,
                    help=f"URL of the docs folder the rules' runbook_url links point into (default: {alerts.RUNBOOK_BASE})")
    args = ap.parse_args()
    targets = dict(args.ttft_slo) if args.ttft_slo else alerts.DEFAULT_TTFT_TARGETS
    try:
        rules = alerts.render(targets, args.runbook_base)
    except ValueError as e:
        ap.error(str(e))
    DASHBOARD.write_text(dashboard.render())
    ALERTS.write_text(rules)
    print(f"wrote {DASHBOARD.relative_to(HERE.parent)} and {ALERTS.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
