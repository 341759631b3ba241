"""The Grafana dashboard, built from the panel table (`gateway.ops.panels`) with Grafana's own
`grafana-foundation-sdk` rather than string templates, so the JSON has the shape Grafana's schema
gives it. `deploy/generate.py` writes it to deploy/grafana/tailguard.json; a test checks the
committed file is what this builds.

The SDK is needed only to generate (the `test` extra has it); the gateway never imports this.
"""

from __future__ import annotations

import json
from itertools import count, groupby
from typing import Any

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from tailguard.gateway.ops.panels import PANELS, REPEATS, VARIABLES, Panel

UID = "tailguard-gateway"
_DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
_COLUMNS = 3  # panels per grid row, each 8 of Grafana's 24 columns wide


def _panel(p: Panel, id: int) -> timeseries.Panel:
    panel = (timeseries.Panel().id(id).title(p.title).description(p.description).unit(p.unit).datasource(_DS)
             .height(8).span(24 // _COLUMNS))
    for i, q in enumerate(p.queries):
        panel.with_target(prometheus.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(chr(ord("A") + i)))
    return panel


def _variable(name: str, family: str, label: str) -> gd.QueryVariable:
    return (gd.QueryVariable(name).label(name).datasource(_DS).query(f"label_values({family}, {label})")
            .multi(True).include_all(True).all_value(".*").refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED))


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    board = (gd.Dashboard("tailguard gateway").uid(UID).tags(["tailguard", "llm"]).refresh("10s")
             .time("now-1h", "now").tooltip(dm.DashboardCursorSync.CROSSHAIR)
             .description("Generated from tailguard's metric catalog (deploy/generate.py): do not edit by hand.")
             .with_variable(gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus")))
    for name, (family, label) in VARIABLES.items():
        board.with_variable(_variable(name, family, label))
    ids = count(1)
    for row, panels in groupby(PANELS, key=lambda p: p.row):
        r = gd.Row(row).id(next(ids))
        board.with_row(r.repeat(REPEATS[row]) if row in REPEATS else r)
        for p in panels:
            board.with_panel(_panel(p, next(ids)))
    doc: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return doc


def render() -> str:
    """The file's text: stable key order and a final newline, so a regenerated file diffs clean."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"
