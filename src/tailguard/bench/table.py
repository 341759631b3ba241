"""Terminal output: the live progress bar, the per-class summary table and the comparison table (rich)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console, Group
from rich.progress import BarColumn, Progress as RichProgress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from tailguard.bench.load import Progress
from tailguard.bench.validity import verdict_line

METRIC_LABELS = {"e2e_s": "E2E", "ttft_s": "TTFT", "itl_s": "ITL", "tpot_s": "TPOT", "queue_s": "queue"}
_PCT_COLS = (("p50", "P50"), ("p90", "P90"), ("p95", "P95"), ("p99", "P99"), ("p999", "P99.9"), ("max", "max"), ("mean", "mean"))


def fmt_s(v: float | None) -> str:
    """Seconds for people: 850us, 12.3ms, 4.56s; None (a percentile on failed requests) is "fail"."""
    if v is None:
        return "fail"
    if isinstance(v, float) and math.isnan(v):
        return "-"
    if v < 0.001:
        return f"{v * 1e6:.0f}us"
    if v < 1.0:
        return f"{v * 1000:.1f}ms" if v < 0.1 else f"{v * 1000:.0f}ms"
    return f"{v:.2f}s" if v < 100 else f"{v:.0f}s"


def fmt_ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x" if v < 10 else f"{v:.1f}x"


def _groups(summary: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [*summary["classes"].items(), ("overall", summary["overall"])]


def summary_tables(summary: dict[str, Any]) -> Group:
    counts = Table(title="Requests", title_justify="left", header_style="bold")
    for col in ("class", "count", "ok", "errors", "timeouts", "req/s", "out tok/s", "goodput", "E2E P99/P50"):
        counts.add_column(col, justify="left" if col == "class" else "right")
    for name, g in _groups(summary):
        gp = g.get("goodput")
        tr = g["tail_ratio"]["e2e_s"]
        ci = tr.get("ci95")
        shown_ci = ci and ci[0] is not None and ci[1] is not None
        ratio = fmt_ratio(tr["p99_over_p50"]) + (f" [{fmt_ratio(ci[0])}-{fmt_ratio(ci[1])}]" if shown_ci else "")
        counts.add_row(
            Text(name, style="bold" if name == "overall" else ""), str(g["count"]), str(g["ok"]),
            _red_if(g["errors"]), _red_if(g["timeouts"]),
            _num(g["throughput"]["requests_per_s"]), _num(g["throughput"]["output_tokens_per_s"]),
            "-" if not gp else f"{gp['fraction'] * 100:.1f}% ({_num(gp['requests_per_s'])}/s)", ratio,
        )
    lat = Table(title="Latency (from the scheduled send time; failures rank as worst)", title_justify="left",
                header_style="bold")
    lat.add_column("class")
    lat.add_column("metric")
    for _, label in _PCT_COLS:
        lat.add_column(label, justify="right")
    for name, g in _groups(summary):
        first = True
        for m, label in METRIC_LABELS.items():
            st = g[m]
            if g.get("samples", {}).get(m) == 0 or (all(st[k] is None for k, _ in _PCT_COLS) and g["count"]
                                                    and m in ("itl_s", "tpot_s", "queue_s")):
                continue
            lat.add_row(name if first else "", label, *(fmt_s(st[k]) for k, _ in _PCT_COLS),
                        end_section=False)
            first = False
        if lat.rows:  # an interrupted run can end with nothing measured
            lat.rows[-1].end_section = True
    lines = [validity_text(summary["validity"])]
    if summary.get("interrupted"):
        lines.append(Text(interrupted_line(summary["interrupted"]), style="bold yellow"))
    return Group(counts, lat, *lines)


def validity_text(v: dict[str, Any]) -> Text:
    return Text(verdict_line(v), style="green" if v["valid"] else "bold white on red")


def interrupted_line(info: dict[str, Any]) -> str:
    """What an interrupted run holds: the statistics cover the requests that ended on their own."""
    return (f"INTERRUPTED after {fmt_s(info['after_s'])}: {info['sent']} requests sent, {info['done']} ended, "
            f"{info['cut']} cut after the {info['grace_s']:g} s grace; the statistics cover the ones that ended")


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def _red_if(n: int) -> Text:
    return Text(str(n), style="red" if n else "")


def print_summary(summary: dict[str, Any], console: Console) -> None:
    console.print(summary_tables(summary))


# --- compare ------------------------------------------------------------------------------------

def fmt_side(cell: dict[str, Any], side: str) -> str:
    """One side of a compared percentile: "-" where that run had no sample of the metric."""
    return "-" if cell.get(f"n_{side}") == 0 else fmt_s(cell[side])


def compare_tables(cmp: dict[str, Any]) -> Group:
    t = Table(title="After / before (ratio < 1 is better; 95% bootstrap CI)", title_justify="left", header_style="bold")
    for col in ("class", "metric", "pct", "before", "after", "ratio", "95% CI"):
        t.add_column(col, justify="left" if col in ("class", "metric", "pct") else "right")
    for name, g in [*cmp["classes"].items(), ("overall", cmp["overall"])]:
        first = True
        for m in ("e2e_s", "ttft_s", "itl_s", "tpot_s", "queue_s"):
            row = g["metrics"].get(m)
            if row is None:
                continue
            for key in ("p50", "p95", "p99"):
                c = row[key]
                ci = c["ci95"]
                t.add_row(name if first else "", METRIC_LABELS[m] if key == "p50" else "", key.upper(),
                          fmt_side(c, "before"), fmt_side(c, "after"), _ratio_text(c["ratio"], ci),
                          "-" if ci is None or None in ci else f"{fmt_ratio(ci[0])} - {fmt_ratio(ci[1])}")
                first = False
        if t.rows:
            t.rows[-1].end_section = True
    lines = [verdict_text(name, g) for name, g in [*cmp["classes"].items(), ("overall", cmp["overall"])]]
    warn = []
    for side in ("before", "after"):
        v = cmp[side]["validity"]
        if not v["valid"]:
            warn.append(Text(f"{side} run is INVALID: {v['reason']}", style="bold white on red"))
    return Group(t, Text("Verdict (E2E):", style="bold"), *lines, *warn)


# Colour only changes that matter: the whole CI beyond 5% either way. Pooled ITL samples are so
# large that a 0.5% shift is "significant" and not worth a red cell.
MATERIAL_CHANGE = 0.05


def significant_change(ci: list[float | None] | None) -> bool | None:
    """True: better beyond doubt (CI below 0.95); False: worse (CI above 1.05); None: neither."""
    if not ci or ci[0] is None or ci[1] is None:
        return None
    if ci[1] < 1.0 - MATERIAL_CHANGE:
        return True
    if ci[0] > 1.0 + MATERIAL_CHANGE:
        return False
    return None


def _ratio_text(r: float | None, ci: list[float | None] | None) -> Text:
    flag = significant_change(ci)
    return Text(fmt_ratio(r), style={True: "green", False: "red", None: ""}[flag])


def verdict_text(name: str, g: dict[str, Any]) -> Text:
    v = g["verdict"]
    row = g["metrics"].get("e2e_s")
    t = Text(f"  {name}: ")
    if row is None:
        return t + Text("no requests in one of the runs")
    p99 = row["p99"]
    t += Text(f"P99 {fmt_s(p99['before'])} -> {fmt_s(p99['after'])} ")
    word, style = p99_word(v)
    t += Text(word, style=style)
    tr = row["tail_ratio"]
    t += Text(f"; P99/P50 {fmt_ratio(tr['before'])} -> {fmt_ratio(tr['after'])} ")
    t += _yes_no(v["gap_narrowed"], "narrowed", "did not narrow")
    tb, ta = g["before"]["timeout_rate"], g["after"]["timeout_rate"]
    t += Text(f"; timeouts {_pct(tb)} -> {_pct(ta)} ")
    t += _yes_no(v["timeout_rate_fell"], "fell", "did not fall", none="none in either run")
    return t


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


def _yes_no(flag: bool | None, yes: str, no: str, none: str = "n/a") -> Text:
    if flag is None:
        return Text(none, style="dim")
    return Text(yes, style="green") if flag else Text(no, style="red")


def print_comparison(cmp: dict[str, Any], console: Console) -> None:
    console.print(compare_tables(cmp))


# --- live progress ----------------------------------------------------------------------------------

class ProgressDisplay:
    """A rich progress bar fed by `run_bench`'s progress callback. It redraws only when called
    (auto_refresh off), on the event loop, so no background thread competes with the sender.

        with ProgressDisplay(console) as show:
            result = await run_bench(config, progress=show)
    """

    def __init__(self, console: Console | None = None) -> None:
        self._bar = RichProgress(TextColumn("[bold]bench"), BarColumn(), TextColumn("{task.description}"),
                                 TimeElapsedColumn(), console=console, auto_refresh=False, transient=False)
        self._task: TaskID | None = None

    def __enter__(self) -> ProgressDisplay:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._bar.refresh()
            self._bar.stop()

    def __call__(self, p: Progress) -> None:
        # Started by the first report, once the load begins: a target that fails its start-up
        # check prints its one line with no empty bar above it.
        if self._task is None:
            self._bar.start()
            self._task = self._bar.add_task("", total=None)
        if p.total is not None:
            total, done = float(p.total), float(p.done)
            desc = f"{p.done}/{p.total} done"
        else:
            total, done = p.horizon_s or 1.0, min(p.elapsed_s, p.horizon_s or p.elapsed_s)
            desc = f"{p.done} done"
        desc += f", {p.in_flight} in flight" + (f", [red]{p.failed} failed[/]" if p.failed else "")
        self._bar.update(self._task, total=total, completed=done, description=desc)
        self._bar.refresh()
