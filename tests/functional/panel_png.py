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
    """`series[(panel title, query index)]` is the range query's result for that query. Three
    panels a line; a series that stayed at 0 all along is left out (said in the panel when all did),
    so a legend lists what moved."""
    cols = min(len(panels), 3)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.0 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, panels):
        for i, q in enumerate(panel.queries):
            for s in series.get((panel.title, i), []):
                ys = [float(v) for _, v in s["values"]]
                if not any(ys):
                    continue
                xs = [float(t) - start for t, _ in s["values"]]
                ax.plot(xs, ys, label=legend(q.legend, s["metric"])[:32], linewidth=1.2)
        ax.set_title(f"{panel.title} ({panel.unit})", fontsize=9)
        ax.set_xlabel("seconds", fontsize=7)
        ax.tick_params(labelsize=7)
        if ax.lines:
            ax.legend(fontsize=6, loc="upper left")
        else:
            ax.text(0.5, 0.5, "every series at 0", ha="center", va="center", transform=ax.transAxes, fontsize=8)
    fig.suptitle(row, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
