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
    marks = [(key, labels.index(str(res[key]))) for key in ("knee", "recommended") if res[key] is not None]
    for key, x in marks:
        ax.axvline(x, color="#555", alpha=0.5, linestyle="-." if key == "knee" else "-")
    # One label per line, and one for both when the knee is the recommendation: two at the same
    # place would print over each other.
    at: dict[int, list[str]] = {}
    for key, x in marks:
        at.setdefault(x, []).append(key)
    for row, (x, keys) in enumerate(sorted(at.items())):
        ax.annotate(" and ".join(keys), (x, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -12 * (row + 1)),
                    textcoords="offset points", fontsize=9)
    ax.grid(True, alpha=0.3)
    return fig


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both (lower P99, higher throughput)."""
    return [i for i, (l, t) in enumerate(points)
            if not any(l2 <= l and t2 >= t and (l2, t2) != (l, t) for l2, t2 in points)]


def _labelled(res: dict[str, Any], cls: str, metric: str) -> tuple[list[tuple[float, float]], list[str]]:
    """The points to plot and their labels, values that measured the same (a cap that never
    binds) joined in one label at one point, with the knee and the recommendation named."""
    by_xy: dict[tuple[float, float], list[str]] = {}
    for p in res["points"]:
        lat = _p99(p, cls, metric)
        if lat is not None:
            marks = [key for key in ("knee", "recommended") if res[key] == p["value"]]
            name = str(p["value"]) + (f" ({', '.join(marks)})" if marks else "")
            by_xy.setdefault((round(lat, 6), round(p["throughput_tokens_per_s"], 3)), []).append(name)
    return list(by_xy), [", ".join(names) for names in by_xy.values()]


def pareto_figure(res: dict[str, Any]) -> Figure:
    cls, metric, bound = watched(res)
    xy, names = _labelled(res, cls, metric)
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    ax.scatter([x for x, _ in xy], [y for _, y in xy], color="#1f77b4")
    for k, ((x, y), n) in enumerate(sorted(zip(xy, names))):
        # Neighbours along the latency axis take turns above and below their point.
        ax.annotate(n, (x, y), textcoords="offset points", xytext=(4, 5 if k % 2 == 0 else -12), fontsize=8)
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
{% if r.knee is not none %}Knee of the throughput curve: {{ r.knee }}.{% else %}No knee: {{ r.no_knee }}.{% endif %}</p>
{% for w in r.warnings %}<p><b>Warning:</b> {{ w }}.</p>{% endfor %}
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
