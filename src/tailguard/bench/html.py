"""Self-contained HTML pages (report.html, compare.html): jinja2 templates kept here as strings so
they ship inside the package; plots are embedded as base64 PNGs and nothing is fetched on view.
"""

from __future__ import annotations

from typing import Any, Sequence

from jinja2 import DictLoader, Environment, select_autoescape
from markupsafe import Markup, escape

from tailguard.bench.attribution import tail_parts
from tailguard.bench.recorder import RequestRecord
from tailguard.bench.stats import measured
from tailguard.bench.compare_table import RATE_LABELS, fmt_ci, fmt_side, headline, significant_change, verdict_parts
from tailguard.bench.table import (
    LENGTH_LABELS, METRIC_LABELS, METRIC_NOTE, fmt_ratio, fmt_s, fmt_tokens, interrupted_line, num, trace_line,
)
from tailguard.bench.throughput import N_SLICES
from tailguard.bench.validity import verdict_line

_BASE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{% block title %}{% endblock %}</title>
<style>
 body { font: 14px/1.45 -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #222;
        max-width: 1280px; margin: 24px auto; padding: 0 20px; }
 h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
 .meta { color: #555; margin-bottom: 14px; } .meta b { color: #222; }
 .banner { padding: 10px 14px; border-radius: 6px; font-weight: 600; margin: 12px 0; }
 .valid { background: #e7f6ea; color: #17612a; border: 1px solid #a9dcb4; }
 .invalid { background: #fde8e8; color: #8a1111; border: 1px solid #f2a7a7; }
 .clock { background: #eef3fb; color: #1d3a66; border: 1px solid #b9cbe8; }
 table { border-collapse: collapse; margin: 6px 0 10px; font-variant-numeric: tabular-nums; }
 th, td { padding: 3px 10px; text-align: right; border-bottom: 1px solid #eee; white-space: nowrap; }
 th { background: #f5f5f5; font-weight: 600; } td.l, th.l { text-align: left; }
 tr.sep td { border-bottom: 2px solid #ccc; } tr.overall td { font-weight: 600; }
 .fail { color: #b00; font-weight: 600; } .good { color: #17612a; font-weight: 600; } .bad { color: #b00; font-weight: 600; }
 .muted { color: #888; } .name { font-weight: 600; } img { max-width: 100%; display: block; margin: 6px 0 18px; }
 .note { color: #555; font-size: 13px; max-width: 980px; }
 ul.verdict { list-style: none; padding-left: 0; } ul.verdict li { margin: 4px 0; }
</style></head><body>
{% block body %}{% endblock %}
</body></html>
"""

_REPORT = """{% extends "base.html" %}
{% block title %}tailguard bench: {{ run.workload }}{% endblock %}
{% block body %}
<h1>tailguard bench: {{ run.workload }}</h1>
<div class="meta">
 <b>{{ run.mode }} loop</b>{% if run.mode == "closed" %}, {{ run.concurrency }} clients{% elif trace %}, the arrivals of the trace <code>{{ trace.file }}</code>{% elif run.rate %}, {{ run.rate }} req/s {{ run.arrival }}{% if run.arrival == "gamma" %} (burstiness {{ run.burstiness }}){% endif %}{% else %}, per-class arrivals{% endif %}
 &middot; target <code>{{ run.url }}</code> &middot; model <code>{{ run.model }}</code>
 &middot; seed {{ run.seed }} &middot; started {{ when(run.started_at) }}
 &middot; {{ run.measured_requests }} requests measured ({{ run.warmup_requests_excluded }} warm-up excluded) over {{ fmt_s(run.window_s) }}
 {% if run.time_scale and run.time_scale != 1.0 %}&middot; <b>times in simulated seconds</b> (wall seconds / {{ run.time_scale }}){% endif %}
</div>
<div class="banner {{ "valid" if validity.valid else "invalid" }}">{{ verdict_line(validity) }}</div>
{% if interrupted %}<div class="banner invalid">{{ interrupted_line(interrupted) }}</div>{% endif %}

<h2>Requests</h2>
<table>
<tr><th class="l">class</th><th>count</th><th>ok</th><th>errors</th><th>timeouts</th><th>req/s</th><th>output tok/s</th>
<th>goodput</th><th>E2E P99/P50 [95% CI]</th><th>TTFT P99/P50</th></tr>
{% for name, g in groups %}
<tr class="{{ 'overall' if name == 'overall' else '' }}"><td class="l">{{ name }}</td><td>{{ g.count }}</td><td>{{ g.ok }}</td>
<td class="{{ 'fail' if g.errors else '' }}">{{ g.errors }}</td><td class="{{ 'fail' if g.timeouts else '' }}">{{ g.timeouts }}</td>
<td>{{ num(g.throughput.requests_per_s) }}</td><td>{{ num(g.throughput.output_tokens_per_s) }}</td>
<td>{% if g.goodput %}{{ "%.1f"|format(g.goodput.fraction * 100) }}% ({{ num(g.goodput.requests_per_s) }}/s){% else %}<span class="muted">no SLO</span>{% endif %}</td>
<td>{{ fmt_ratio(g.tail_ratio.e2e_s.p99_over_p50) }}{% if g.tail_ratio.e2e_s.ci95 and g.tail_ratio.e2e_s.ci95[0] is not none and g.tail_ratio.e2e_s.ci95[1] is not none %} <span class="muted">[{{ fmt_ratio(g.tail_ratio.e2e_s.ci95[0]) }} - {{ fmt_ratio(g.tail_ratio.e2e_s.ci95[1]) }}]</span>{% endif %}</td>
<td>{{ fmt_ratio(g.tail_ratio.ttft_s.p99_over_p50) }}</td></tr>
{% endfor %}
</table>
{% if errors %}<p class="note">Failures by kind: {% for name, kinds in errors %}<b>{{ name }}</b> {% for k, n in kinds.items() %}{{ k }} {{ n }}{% if not loop.last %}, {% endif %}{% endfor %}{% if not loop.last %}; {% endif %}{% endfor %}.</p>{% endif %}

{% if programs %}<h2>Programs</h2>
<table>
<tr><th class="l">class</th><th>programs</th><th>ok</th><th>failed</th><th>calls</th><th>E2E P50</th><th>P90</th><th>P99</th><th>max</th><th>mean</th></tr>
{% for name, g in programs %}<tr class="{{ 'overall' if name == 'overall' else '' }}"><td class="l">{{ name }}</td><td>{{ g.count }}</td><td>{{ g.ok }}</td>
<td class="{{ 'fail' if g.failed else '' }}">{{ g.failed }}</td><td>{{ "%.1f"|format(g.calls_mean) }}</td>
{% for k in ("p50", "p90", "p99", "max", "mean") %}{% set v = g.e2e_s[k] %}<td class="{{ 'fail' if v is none else '' }}">{{ fmt_s(v) }}</td>{% endfor %}</tr>
{% endfor %}
</table>
<p class="note">An agent program's E2E runs from its due start to its last answer; a program whose call
failed ranks as worse than every success (docs/agents.md).</p>
{% endif %}

<h2>Latency</h2>
<table>
<tr><th class="l">class</th><th class="l">metric</th>{% for _, label in pcts %}<th>{{ label }}</th>{% endfor %}</tr>
{% for name, g in groups %}{% set rows = metric_rows(g) %}{% for m in rows %}
<tr class="{{ 'sep' if loop.last else '' }} {{ 'overall' if name == 'overall' else '' }}"><td class="l">{{ name if loop.first else '' }}</td><td class="l">{{ labels[m] }}</td>
{% for key, _ in pcts %}{% set v = g[m][key] %}<td class="{{ 'fail' if v is none else '' }}">{{ fmt_s(v) }}</td>{% endfor %}</tr>
{% endfor %}{% endfor %}
</table>
<p class="note">E2E and TTFT are measured from the time each request was due to be sent, so queueing in
the client and the generator counts. TTFT is the first chunk with generated content. {{ metric_note }}
A failed request ranks as worse than every success ("fail": the percentile lands on a failure); a
timed-out request counts at the time the client gave up; mean and std are over the finite values.
Queue wait comes from the gateway's X-Tailguard-Queue-Ms header when present.</p>

<h2>Lengths</h2>
<table>
<tr><th class="l">class</th><th class="l">tokens</th>{% for _, label in length_cols %}<th>{{ label }}</th>{% endfor %}</tr>
{% for name, g in groups %}{% for key, label in length_labels.items() %}
<tr class="{{ 'sep' if loop.last else '' }} {{ 'overall' if name == 'overall' else '' }}"><td class="l">{{ name if loop.first else '' }}</td><td class="l">{{ label }}</td>
{% for k, _ in length_cols %}<td>{{ fmt_tokens(g.lengths[key][k]) }}</td>{% endfor %}</tr>
{% endfor %}{% endfor %}
</table>
<p class="note">Input and output sequence lengths (AIPerf's ISL and OSL) of the requests that succeeded: the
prompt as the server's <code>usage</code> counted it (as the bench sized it where no usage came back), the
output tokens from <code>usage</code>, else the content chunks counted.</p>
{% if trace %}<h2>Trace</h2>
<p class="note">{% for line in trace_line(trace).splitlines() %}{{ line }}<br>{% endfor %}</p>
<img alt="arrival rate and TTFT over time" src="data:image/png;base64,{{ img.arrivals }}">{% endif %}

<h2>Latency CDFs</h2>
<img alt="latency CDFs" src="data:image/png;base64,{{ img.cdf }}">
<h2>Latency over time</h2>
<img alt="latency over time" src="data:image/png;base64,{{ img.time }}">
<h2>In flight</h2>
<img alt="in-flight requests" src="data:image/png;base64,{{ img.inflight }}">
{% if img.tail %}<h2>Where the slowest 1% spent their time</h2>
<img alt="tail attribution" src="data:image/png;base64,{{ img.tail }}">
<p class="note">Each request's E2E split into dispatch lag, gateway queue, engine queue, prefill, decode and stalls
(gaps above 5x the request's own median ITL); prefill is the fastest time to first token seen in this run for a
prompt of that size, and the rest of the time to first token is counted as engine queue. Per request in
requests.jsonl (<code>attribution</code>).</p>{% endif %}
{% if doctor is not none %}<h2>Doctor</h2>
{% if not doctor.findings %}<p class="good">No problem found.</p>{% endif %}
{% for f in doctor.findings %}<div class="note"><p><b>{{ f.severity }}: {{ f.kind }}</b>: {{ f.symptom }}</p><ul>
<li>likely cause: {{ f.cause }}</li>
{% for e in f.evidence.for %}<li>for: {{ e }}</li>{% endfor %}{% for e in f.evidence.against %}<li>against: {{ e }}</li>{% endfor %}
<li>next: {{ f.next_step }}</li><li>check: <code>{{ f.check }}</code></li></ul></div>{% endfor %}
{% endif %}
{% if img.itl %}<h2>Inter-token latency</h2>
<img alt="ITL distribution" src="data:image/png;base64,{{ img.itl }}">{% endif %}
<h2>Load generator</h2>
<img alt="dispatch lag" src="data:image/png;base64,{{ img.lag }}">
<p class="muted">tailguard {{ version }}</p>
{% endblock %}
"""

_COMPARE = """{% extends "base.html" %}
{% block title %}tailguard bench compare{% endblock %}
{% block body %}
<h1>Before / after</h1>
{% if scales %}<div class="banner clock">Times are in simulated seconds: {{ scales }}</div>{% endif %}
<div class="meta">
{% for side in ("before", "after") %}{% set r = cmp[side] %}
<div><b>{{ side }}</b>: <code>{{ r.label or "" }}</code> &middot; {{ r.workload }}, {{ r.mode }} loop{% if r.concurrency %} ({{ r.concurrency }} clients){% endif %}{% if r.rate %} ({{ r.rate }} req/s){% endif %} &middot; <code>{{ r.url }}</code> &middot; {{ when(r.started_at) }}
{% if not r.validity.valid %}<span class="fail">INVALID: {{ r.validity.reason }}</span>{% endif %}</div>
{% endfor %}
</div>
{% if cmp.before.validity.valid and cmp.after.validity.valid %}
<div class="banner valid">Both runs valid (dispatch lag P99 {{ "%.2f"|format((cmp.before.validity.dispatch_lag_p99_s or 0) * 1000) }} ms and {{ "%.2f"|format((cmp.after.validity.dispatch_lag_p99_s or 0) * 1000) }} ms).</div>
{% else %}<div class="banner invalid">At least one run is invalid: its generator fell behind schedule; read the comparison with care.</div>{% endif %}

<h2>Headline</h2>
<table>
<tr>{% for col in headline[0] %}<th class="{{ 'l' if loop.first else '' }}">{{ col }}</th>{% endfor %}</tr>
{% for row in headline[1] %}<tr>{% for cell in row %}<td class="{{ 'l' if loop.first else '' }}">{{ cell }}</td>{% endfor %}</tr>
{% endfor %}</table>
{% if cmp.config %}
<h2>Gateway config</h2>
<p><code>{{ cmp.config.before or "no gateway" }}</code> &rarr; <code>{{ cmp.config.after or "no gateway" }}</code></p>
{% if cmp.config.changes %}<ul>{% for c in cmp.config.changes %}<li><code>{{ c }}</code></li>{% endfor %}</ul>{% endif %}
{% for w in cmp.config.warnings %}<div class="banner invalid">{{ w }}</div>{% endfor %}
{% endif %}

<h2>Verdict (E2E, per class)</h2>
<ul class="verdict">
{% for name, g in groups %}<li>{{ verdict_html(name, g) }}</li>
{% endfor %}
</ul>

<h2>Throughput</h2>
<table>
<tr><th class="l">class</th><th class="l">rate</th><th>before</th><th>after</th><th>after/before</th><th>95% CI</th></tr>
{% for name, g in groups %}{% for key, label in rate_labels.items() %}{% set c = g.throughput.get(key) %}{% if c %}
<tr class="{{ 'sep' if loop.last else '' }}"><td class="l">{{ name if loop.first else '' }}</td><td class="l">{{ label }}</td>
<td>{{ num(c.before) }}</td><td>{{ num(c.after) }}</td><td class="{{ ratio_class(c.ci95, True) }}">{{ fmt_ratio(c.ratio) }}</td>
<td>{{ fmt_ci(c.ci95) }}</td></tr>{% endif %}{% endfor %}{% endfor %}
</table>
<p class="note">Above 1 is more. Each run's window is cut into {{ n_slices }} equal time slices; the interval is a
bootstrap over slices. A streamed request's tokens count in the slices they arrived in.</p>

<h2>Per class and metric</h2>
<table>
<tr><th class="l">class</th><th class="l">metric</th><th class="l">pct</th><th>before</th><th>after</th><th>after/before</th><th>95% CI</th></tr>
{% for name, g in groups if not g.verdict.pooled %}{% for m, row in g.metrics.items() %}{% set outer = loop %}{% for key in ("p50", "p95", "p99") %}{% set c = row[key] %}
<tr class="{{ 'sep' if outer.last and loop.last else '' }}"><td class="l">{{ name if outer.first and loop.first else '' }}</td>
<td class="l">{{ labels[m] if loop.first else '' }}</td><td class="l">{{ key|upper }}</td>
<td>{{ fmt_side(c, "before") }}</td><td>{{ fmt_side(c, "after") }}</td>
<td class="{{ ratio_class(c.ci95) }}">{{ fmt_ratio(c.ratio) }}</td>
<td>{% if c.ci95 and c.ci95[0] is not none and c.ci95[1] is not none %}{{ fmt_ratio(c.ci95[0]) }} - {{ fmt_ratio(c.ci95[1]) }}{% else %}-{% endif %}</td></tr>
{% endfor %}{% endfor %}{% endfor %}
</table>
<p class="note">Ratios are after / before: below 1 is better ("overall" is left out on a mixed workload:
percentiles over classes of very different sizes describe the mix, not a request). The 95% interval is a bootstrap over both runs'
requests (each run resampled independently); green when the whole interval is below 0.95, red when it is above 1.05.</p>

<h2>Counts</h2>
<table><tr><th class="l">class</th><th>before: count</th><th>ok</th><th>errors</th><th>timeouts</th><th>after: count</th><th>ok</th><th>errors</th><th>timeouts</th></tr>
{% for name, g in groups %}<tr><td class="l">{{ name }}</td>
{% for side in ("before", "after") %}{% set c = g[side] %}<td>{{ c.count }}</td><td>{{ c.ok }}</td><td class="{{ 'fail' if c.errors else '' }}">{{ c.errors }}</td><td class="{{ 'fail' if c.timeouts else '' }}">{{ c.timeouts }}</td>{% endfor %}</tr>
{% endfor %}</table>

<h2>Latency CDFs</h2>
<img alt="before and after CDFs" src="data:image/png;base64,{{ img.cdf }}">
<p class="muted">tailguard {{ version }}</p>
{% endblock %}
"""

_PCTS = (("min", "min"), ("p1", "P1"), ("p5", "P5"), ("p10", "P10"), ("p25", "P25"), ("p50", "P50"), ("p90", "P90"),
         ("p95", "P95"), ("p99", "P99"), ("p999", "P99.9"), ("max", "max"), ("mean", "mean"), ("std", "std"))
_LENGTH_COLS = (("mean", "mean"), ("std", "std"), ("min", "min"), ("p1", "P1"), ("p25", "P25"), ("p50", "P50"),
                ("p90", "P90"), ("p99", "P99"), ("max", "max"))


def _env() -> Environment:
    env = Environment(loader=DictLoader({"base.html": _BASE, "report.html": _REPORT, "compare.html": _COMPARE}),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    env.globals.update(fmt_s=fmt_s, fmt_side=fmt_side, fmt_ratio=fmt_ratio, fmt_ci=fmt_ci, num=num,
                       labels=METRIC_LABELS, pcts=_PCTS, ratio_class=_ratio_class, metric_rows=_metric_rows,
                       when=_when, verdict_html=_verdict_html, rate_labels=RATE_LABELS, n_slices=N_SLICES,
                       verdict_line=verdict_line, interrupted_line=interrupted_line, metric_note=METRIC_NOTE,
                       length_cols=_LENGTH_COLS, length_labels=LENGTH_LABELS, fmt_tokens=fmt_tokens,
                       trace_line=trace_line)
    return env


def _when(iso: str | None) -> str:
    """ISO 8601 from run.json, shown to the second."""
    if not iso:
        return "-"
    return iso[:19].replace("T", " ") + (" UTC" if iso.endswith("+00:00") else "")


def _verdict_html(name: str, g: dict[str, Any]) -> Markup:
    """The terminal's verdict parts as spans: the page says what the terminal says."""
    css = {"green": "good", "red": "bad", "dim": "muted", "bold": "name"}
    return Markup("").join(Markup(f'<span class="{css.get(style, "")}">{escape(text)}</span>')
                           for text, style in verdict_parts(name, g))


def _ratio_class(ci: list[float | None] | None, higher_is_better: bool = False) -> str:
    return {True: "good", False: "bad", None: ""}[significant_change(ci, higher_is_better)]


def _metric_rows(g: dict[str, Any]) -> list[str]:
    return [m for m in METRIC_LABELS if m in ("e2e_s", "ttft_s") or any(g[m][k] is not None for k, _ in _PCTS)]


def _class_names(summary_or_cmp: dict[str, Any]) -> list[str]:
    return list(summary_or_cmp["classes"].keys())


def render_report(summary: dict[str, Any], records: Sequence[RequestRecord], version: str,
                  doctor: dict[str, Any] | None = None) -> str:
    """The run's page; `doctor` is what `tailguard doctor` found (doctor.json), shown when given."""
    from tailguard.bench import plots  # matplotlib, imported only to draw a page (about 0.7 s)

    rec = measured(records)
    names = _class_names(summary)
    groups = [*summary["classes"].items(), ("overall", summary["overall"])]
    img = {
        "cdf": plots.latency_cdfs(rec, names),
        "time": plots.over_time(rec, names),
        "inflight": plots.in_flight(records, names),
        "itl": plots.itl_distribution(rec, names),
        "lag": plots.dispatch_lag(records, summary["validity"]["threshold_s"]),
        "tail": plots.tail_attribution(tail_parts(rec)),
        "arrivals": plots.arrivals_and_ttft(rec, names) if summary.get("trace") else None,
    }
    errors = [(n, g["error_kinds"]) for n, g in summary["classes"].items() if g["error_kinds"]]
    return _env().get_template("report.html").render(
        run=summary["run"], validity=summary["validity"], interrupted=summary.get("interrupted"), groups=groups,
        img=img, errors=errors, version=version, trace=summary.get("trace"),
        doctor=doctor, programs=_program_groups(summary.get("programs")))


def _program_groups(programs: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
    """An agent run's program classes and overall, for the programs table (none for other runs)."""
    return [] if programs is None else [*programs["classes"].items(), ("overall", programs["overall"])]


def render_compare(cmp: dict[str, Any], before: Sequence[RequestRecord], after: Sequence[RequestRecord],
                   version: str) -> str:
    from tailguard.bench import plots

    names = _class_names(cmp)
    groups = [*cmp["classes"].items(), ("overall", cmp["overall"])]
    img = {"cdf": plots.compare_cdfs(measured(before), measured(after), names)}
    return _env().get_template("compare.html").render(cmp=cmp, groups=groups, img=img, version=version,
                                                       headline=headline(cmp), scales=_scales(cmp))


def _scales(cmp: dict[str, Any]) -> str | None:
    """What the times mean when a run was on a simulator's scaled clock (None: wall seconds), so a
    page read away from the terminal that made it does not pass a simulated P99 for a real one."""
    scales = {side: float(cmp[side].get("time_scale") or 1.0) for side in ("before", "after")}
    if set(scales.values()) == {1.0}:
        return None
    if scales["before"] == scales["after"]:
        ts = scales["before"]
        return (f"the simulator ran at time scale {ts:g}, so 1 wall second is {1 / ts:g} simulated seconds "
                f"(a 10 s figure here took {10 * ts:g} s of wall time).")
    return ("before at time scale " + f"{scales['before']:g}, after at {scales['after']:g} (wall seconds per "
            "simulated second; a run at scale 1 is in wall seconds): the two sides' seconds differ.")
