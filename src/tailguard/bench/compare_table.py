"""The comparison in the terminal: latency ratios, throughput and goodput ratios, and the verdict
in words. The verdict is built as (text, style) parts, so report.html says exactly what the
terminal says (`html.py` turns the same parts into spans).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from tailguard.bench.program_stats import program_comparison_table
from tailguard.bench.table import METRIC_LABELS, fit, fmt_ratio, fmt_s, num, table
from tailguard.bench.throughput import N_SLICES

Parts = list[tuple[str, str]]
RATE_LABELS = {"requests_per_s": "requests/s", "output_tokens_per_s": "output tok/s", "goodput_per_s": "goodput/s"}
# Colour only changes that matter: the whole CI beyond 5% either way. Pooled ITL samples are so
# large that a 0.5% shift is "significant" and not worth a red cell.
MATERIAL_CHANGE = 0.05


def fmt_side(cell: dict[str, Any], side: str) -> str:
    """One side of a compared percentile: "-" where that run had no sample of the metric."""
    return "-" if cell.get(f"n_{side}") == 0 else fmt_s(cell[side])


def fmt_ci(ci: list[float | None] | None) -> str:
    return "-" if not ci or None in ci else f"{fmt_ratio(ci[0])} - {fmt_ratio(ci[1])}"


def groups(cmp: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [*cmp["classes"].items(), ("overall", cmp["overall"])]


def significant_change(ci: list[float | None] | None, higher_is_better: bool = False) -> bool | None:
    """True: better beyond doubt (for latency, CI below 0.95); False: worse beyond doubt; None: neither."""
    if not ci or ci[0] is None or ci[1] is None:
        return None
    lower, higher = ci[1] < 1.0 - MATERIAL_CHANGE, ci[0] > 1.0 + MATERIAL_CHANGE
    if lower or higher:
        return higher if higher_is_better else lower
    return None


def _styled_ratio(r: float | None, ci: list[float | None] | None, higher_is_better: bool = False) -> Text:
    flag = significant_change(ci, higher_is_better)
    return Text(fmt_ratio(r), style={True: "green", False: "red", None: ""}[flag])


def latency_table(cmp: dict[str, Any]) -> Table:
    t = table("Latency, after / before (below 1 is better; 95% bootstrap CI)",
              ("class", "metric", "pct", "before", "after", "ratio", "95% CI"), left=3)
    for name, g in groups(cmp):
        if g["verdict"].get("pooled"):
            continue  # percentiles over classes of different sizes: see POOLED_WHY
        first = True
        for m in METRIC_LABELS:
            row = g["metrics"].get(m)
            if row is None:
                continue
            for key in ("p50", "p95", "p99"):
                c = row[key]
                t.add_row(name if first else "", METRIC_LABELS[m] if key == "p50" else "", key.upper(),
                          fmt_side(c, "before"), fmt_side(c, "after"), _styled_ratio(c["ratio"], c["ci95"]),
                          fmt_ci(c["ci95"]))
                first = False
        if t.rows:
            t.rows[-1].end_section = True
    return fit(t)


def throughput_table(cmp: dict[str, Any]) -> Table:
    t = table(f"Throughput, after / before (above 1 is more; 95% CI over {N_SLICES} time slices)",
              ("class", "rate", "before", "after", "ratio", "95% CI"), left=2)
    for name, g in groups(cmp):
        first = True
        for key, label in RATE_LABELS.items():
            c = g.get("throughput", {}).get(key)
            if c is None:
                continue
            t.add_row(name if first else "", label, num(c["before"]), num(c["after"]),
                      _styled_ratio(c["ratio"], c["ci95"], higher_is_better=True), fmt_ci(c["ci95"]))
            first = False
        if t.rows:
            t.rows[-1].end_section = True
    return fit(t)


def verdict_parts(name: str, g: dict[str, Any]) -> Parts:
    """One group's verdict as (text, style) parts; style is "", "green", "red" or "dim"."""
    v = g["verdict"]
    parts: Parts = [(f"{name}: ", "bold")]
    if v.get("pooled"):
        return parts + _pooled_parts(g)
    row = g["metrics"].get("e2e_s")
    if row is None:
        return parts + [("no requests in one of the runs", "dim")]
    p99, tr = row["p99"], row["tail_ratio"]
    parts += [(f"P99 {fmt_s(p99['before'])} -> {fmt_s(p99['after'])} ", ""), p99_word(v),
              (f"; P99/P50 {fmt_ratio(tr['before'])} -> {fmt_ratio(tr['after'])} ", ""),
              _yes_no(v["gap_narrowed"], "narrowed", "did not narrow"), ("; ", "")]
    return parts + _rate_parts(g, "timeout_rate", "timeouts", v["timeout_rate_fell"])


def _pooled_parts(g: dict[str, Any]) -> Parts:
    parts: Parts = []
    for key in ("requests_per_s", "output_tokens_per_s"):
        c = g.get("throughput", {}).get(key)
        if c is not None:
            flag = significant_change(c["ci95"], higher_is_better=True)
            word = {True: "rose", False: "fell", None: "no clear change"}[flag]
            parts += [(f"{RATE_LABELS[key]} {num(c['before'])} -> {num(c['after'])} ({fmt_ratio(c['ratio'])}) ", ""),
                      (word, {True: "green", False: "red", None: "dim"}[flag]), ("; ", "")]
    v = g["verdict"]
    parts += _rate_parts(g, "error_rate", "errors", v["error_rate_fell"]) + [("; ", "")]
    parts += _rate_parts(g, "timeout_rate", "timeouts", v["timeout_rate_fell"])
    return parts + [(f" (no latency verdict: {v['why']})", "dim")]


def _rate_parts(g: dict[str, Any], key: str, label: str, fell: bool | None) -> Parts:
    return [(f"{label} {_pct(g['before'][key])} -> {_pct(g['after'][key])} ", ""),
            _yes_no(fell, "fell", "did not fall", none="none in either run")]


def p99_word(v: dict[str, Any]) -> tuple[str, str]:
    """The P99 verdict in words: a fall counts only when its 95% CI excludes 1."""
    if v["p99_fell"] is None:
        return "n/a", "dim"
    if v["p99_fell"] and v["p99_fell_significantly"]:
        return "fell", "green"
    if v["p99_fell"]:
        return "no clear change (95% CI includes 1)", "dim"
    return "did not fall", "red"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def _yes_no(flag: bool | None, yes: str, no: str, none: str = "n/a") -> tuple[str, str]:
    if flag is None:
        return none, "dim"
    return (yes, "green") if flag else (no, "red")


def compare_tables(cmp: dict[str, Any]) -> Group:
    lines = [Text.assemble(("  ", ""), *verdict_parts(name, g)) for name, g in groups(cmp)]
    warn = [Text(f"{side} run is INVALID: {cmp[side]['validity']['reason']}", style="bold white on red")
            for side in ("before", "after") if not cmp[side]["validity"]["valid"]]
    return Group(latency_table(cmp), throughput_table(cmp), Text("Verdict (E2E, per class):", style="bold"),
                 *lines, *warn)


def print_comparison(cmp: dict[str, Any], console: Console) -> None:
    console.print(compare_tables(cmp))
    if cmp.get("programs"):
        console.print(program_comparison_table(cmp["programs"]))


def headline(cmp: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The few figures a before/after is read by (the README's table; `tailguard demo` prints it,
    compare.html opens with it): the first class's TTFT P99, E2E P50, E2E P99 and P99/P50, each
    other class's E2E P99, and output tokens/s (after: with its share of before's). Columns, then
    the rows `before` and `after`."""
    names = list(cmp["classes"])
    cells = [(f"{c} {label}", c, metric, stat) for c in names[:1] for label, metric, stat in (
        ("TTFT P99", "ttft_s", "p99"), ("E2E P50", "e2e_s", "p50"), ("E2E P99", "e2e_s", "p99"),
        ("P99/P50", "e2e_s", "tail_ratio"))] + [(f"{c} E2E P99", c, "e2e_s", "p99") for c in names[1:]]
    tokens = cmp["overall"]["throughput"]["output_tokens_per_s"]
    rows = []
    for side in ("before", "after"):
        row = [side]
        for _, cls, metric, stat in cells:
            m = cmp["classes"][cls].get("metrics", {}).get(metric)
            row.append("-" if m is None else fmt_ratio(m[stat][side]) if stat == "tail_ratio" else fmt_s(m[stat][side]))
        kept = f" ({tokens['after'] / tokens['before']:.0%})" if side == "after" and tokens["before"] else ""
        row.append(f"{tokens[side]:.0f}{kept}")
        rows.append(row)
    return ["", *(col for col, *_ in cells), "output tokens/s"], rows


def headline_table(cmp: dict[str, Any], title: str) -> Table:
    columns, rows = headline(cmp)
    t = table(title, tuple(columns))
    for row in rows:
        t.add_row(*row)
    return fit(t)
