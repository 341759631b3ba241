"""The sweep's figures and page: throughput and P99 against the value (with the knee and the
recommendation marked), the Pareto front of throughput against P99, and sweep.html holding both
(self-contained, like report.html). Renders only: the caller writes the files."""

from __future__ import annotations

import base64
from typing import Any

from jinja2 import Environment, select_autoescape
from matplotlib.figure import Figure

from tailguard.bench.plots import to_png_b64


def watched(res: dict[str, Any]) -> tuple[str, str, float | None]:
    """(class, metric, bound) the page plots: the first SLO, else the first class's E2E."""
    if res["slo"]:
        s = res["slo"][0]
        return s["cls"], s["metric"], s["bound_s"]
    classes = next((list(p["p99"]) for p in res["points"] if p["p99"]), ["overall"])
    return classes[0], "e2e_s", None


def _p99(point: dict[str, Any], cls: str, metric: str) -> float | None:
    v = point["p99"].get(cls, {}).get(metric, {}).get("mean")
    return float(v) if v is not None else None


def knee_figure(res: dict[str, Any]) -> Figure:
    cls, metric, bound = watched(res)
    labels = [str(p["value"]) for p in res["points"]]
    fig = Figure(figsize=(10, 4))
    ax = fig.subplots()
    ax.plot(labels, [p["throughput_tokens_per_s"] for p in res["points"]], "o-", color="#1f77b4", label="output tokens/s")
    ax.set_xlabel(res["setting"])
    ax.set_ylabel("output tokens/s", color="#1f77b4")
    right = ax.twinx()
    right.plot(labels, [v if (v := _p99(p, cls, metric)) is not None else float("nan") for p in res["points"]], "s--", color="#d62728", label=f"{cls} P99 {metric}")
    right.set_ylabel(f"{cls} P99 {metric} (s)", color="#d62728")
    if bound is not None:
        right.axhline(bound, color="#d62728", alpha=0.4, linestyle=":")
    for key, mark in (("knee", "knee"), ("recommended", "recommended")):
        if res[key] is not None:
            ax.axvline(labels.index(str(res[key])), color="#555", alpha=0.5, linestyle="-." if key == "knee" else "-")
            ax.annotate(mark, (labels.index(str(res[key])), ax.get_ylim()[1]), fontsize=9, va="top")
    ax.grid(True, alpha=0.3)
    return fig


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both (lower P99, higher throughput)."""
    return [i for i, (l, t) in enumerate(points)
            if not any(l2 <= l and t2 >= t and (l2, t2) != (l, t) for l2, t2 in points)]


def pareto_figure(res: dict[str, Any]) -> Figure:
    cls, metric, bound = watched(res)
    pts = [(p, _p99(p, cls, metric)) for p in res["points"]]
    xy = [(lat, p["throughput_tokens_per_s"]) for p, lat in pts if lat is not None]
    names = [str(p["value"]) for p, lat in pts if lat is not None]
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    ax.scatter([x for x, _ in xy], [y for _, y in xy], color="#1f77b4")
    for (x, y), n in zip(xy, names):
        ax.annotate(n, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    front = sorted((xy[i] for i in pareto_front(xy)))
    ax.plot([x for x, _ in front], [y for _, y in front], color="#2ca02c", label="Pareto front")
    if bound is not None:
        ax.axvline(bound, color="#d62728", alpha=0.5, linestyle=":", label="SLO")
    ax.set_xlabel(f"{cls} P99 {metric} (s, mean over repeats)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{res['setting']}: throughput against tail latency")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9)
    return fig


_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>tailguard sweep: {{ r.setting }}</title>
<style>body{font:14px/1.45 sans-serif;max-width:1100px;margin:24px auto;padding:0 20px}table{border-collapse:collapse}
th,td{padding:3px 10px;border-bottom:1px solid #eee;text-align:right}th{background:#f5f5f5}.l{text-align:left}
.rec{font-weight:600;background:#e7f6ea}img{max-width:100%;display:block;margin:8px 0 18px}</style></head><body>
<h1>tailguard sweep: {{ r.setting }}</h1>
<p>{{ how }}</p>
<p><b>Recommended: {{ r.recommended if r.recommended is not none else "none" }}</b>: {{ r.reason }}.
Knee of the throughput curve: {{ r.knee if r.knee is not none else "none found" }}.</p>
<img alt="throughput and P99 against the value" src="data:image/png;base64,{{ knee_png }}">
<img alt="Pareto front" src="data:image/png;base64,{{ pareto_png }}">
<table><tr><th class="l">value</th><th>runs</th><th>output tokens/s</th>{% for c in classes %}<th>{{ c }} P99 E2E</th><th>{{ c }} P99 TTFT</th>{% endfor %}<th>meets SLO</th></tr>
{% for p in r.points %}<tr class="{{ 'rec' if p.value == r.recommended else '' }}"><td class="l">{{ p.value }}</td><td>{{ p.runs }}</td><td>{{ "%.0f"|format(p.throughput_tokens_per_s) }}</td>
{% for c in classes %}{% for m in ("e2e_s", "ttft_s") %}{% set v = p.p99.get(c, {}).get(m, {}) %}<td>{% if v.get("mean") is not none %}{{ "%.3f"|format(v.mean) }}{% if v.get("ci95_half") is not none %} &plusmn; {{ "%.3f"|format(v.ci95_half) }}{% endif %}{% else %}-{% endif %}</td>{% endfor %}{% endfor %}
<td>{{ "yes" if p.meets_slo else "no" }}</td></tr>{% endfor %}</table>
<p>Each value was measured with new seeds until the 95% interval of the watched P99 was within the tolerance of its
mean, or the repeat limit. Every run's folder (requests.jsonl, summary.json) is beside this page.</p>
</body></html>"""


def render(res: dict[str, Any], how: str) -> tuple[str, bytes]:
    """sweep.html, and the Pareto plot as a PNG file's bytes; `how` says how the runs were made."""
    env = Environment(autoescape=select_autoescape(default=True))
    classes = sorted({c for p in res["points"] for c in p["p99"]})
    pareto = to_png_b64(pareto_figure(res))
    page = env.from_string(_PAGE).render(r=res, how=how, classes=classes, knee_png=to_png_b64(knee_figure(res)),
                                         pareto_png=pareto)
    return page, base64.b64decode(pareto)
