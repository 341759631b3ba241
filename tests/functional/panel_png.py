"""Draw the dashboard's panels from a real Prometheus's range queries, one PNG per dashboard row,
so a reviewer sees what an operator would (docs/observability.md shows them: `make observe`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tailguard.gateway.ops.panels import Panel  # noqa: E402

_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's `{{label}}` legend filled from a series' labels."""
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), template)


def draw_row(row: str, panels: list[Panel], series: dict[tuple[str, int], list[dict[str, Any]]],
             start: float, path: Path) -> None:
    """`series[(panel title, query index)]` is the range query's result for that query."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.0), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for i, q in enumerate(panel.queries):
            for s in series.get((panel.title, i), []):
                xs = [float(t) - start for t, _ in s["values"]]
                ys = [float(v) for _, v in s["values"]]
                ax.plot(xs, ys, label=legend(q.legend, s["metric"])[:32], linewidth=1.2)
        ax.set_title(f"{panel.title} ({panel.unit})", fontsize=9)
        ax.set_xlabel("seconds", fontsize=7)
        ax.tick_params(labelsize=7)
        if ax.lines:
            ax.legend(fontsize=6, loc="upper left")
    fig.suptitle(row, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
