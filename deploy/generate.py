"""Write the Grafana dashboard and the Prometheus alert rules from tailguard's metric catalog.

    .venv/bin/python deploy/generate.py                    # deploy/grafana/tailguard.json, deploy/prometheus/alerts.yaml
    .venv/bin/python deploy/generate.py --ttft-slo-s 2.5   # another first-token SLO for the burn-rate alerts

`make deploy` runs it; tests/functional/test_deploy.py fails when the committed files differ from it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tailguard.gateway.ops import alerts, dashboard

HERE = Path(__file__).resolve().parent
DASHBOARD = HERE / "grafana" / "tailguard.json"
ALERTS = HERE / "prometheus" / "alerts.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ttft-slo-s", type=float, default=alerts.DEFAULT_TTFT_SLO_S,
                    help="first-token SLO of the burn-rate alerts (a bucket bound of tailguard_ttft_seconds)")
    args = ap.parse_args()
    DASHBOARD.write_text(dashboard.render())
    ALERTS.write_text(alerts.render(args.ttft_slo_s))
    print(f"wrote {DASHBOARD.relative_to(HERE.parent)} and {ALERTS.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
