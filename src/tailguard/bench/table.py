"""Terminal output: the live progress bar and the per-class summary tables (rich). The comparison
is in `compare_table.py`.

Tables fold a cell that does not fit rather than cut it with an ellipsis: at 80 columns a figure
or an interval wraps onto a second line, and no digit is lost."""

from __future__ import annotations

import math
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.progress import BarColumn, Progress as RichProgress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from tailguard.bench.load import LoadProgress
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


def table(title: str, columns: tuple[str, ...], left: int = 1) -> Table:
    """A table whose first `left` columns are left-aligned, the rest right-aligned, every cell folding.
    No vertical rules and one space between columns: a nine-column table of figures fits 80 columns."""
    t = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD,
              collapse_padding=True, pad_edge=False)
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i < left else "right", overflow="fold")
    return t


def fit(t: Table) -> Table:
    """Give each column at least the width of its longest figure and header word: rich would
    otherwise fold `80.7ms` into `80.7m`/`s` to make room it does not need. Call once the rows are in."""
    for col in t.columns:
        words = [len(w) for w in str(col.header).split()]
        lines = [len(line) for c in col.cells for line in (c.plain if isinstance(c, Text) else str(c)).splitlines()]
        col.min_width = max(words + lines or [1])
    return t


def summary_tables(summary: dict[str, Any]) -> Group:
    counts = table("Requests", ("class", "count", "ok", "errors", "timeouts", "req/s", "out tok/s", "goodput",
                                "E2E P99/P50 and 95% CI"))
    for name, g in _groups(summary):
        gp = g.get("goodput")
        tr = g["tail_ratio"]["e2e_s"]
        ci = tr.get("ci95")
        ratio = fmt_ratio(tr["p99_over_p50"])
        if ci and None not in ci:
            ratio += f"\n{fmt_ratio(ci[0])}-{fmt_ratio(ci[1])}"  # under the ratio: the table fits 80 columns
        counts.add_row(
            Text(name, style="bold" if name == "overall" else ""), str(g["count"]), str(g["ok"]),
            _red_if(g["errors"]), _red_if(g["timeouts"]),
            num(g["throughput"]["requests_per_s"]), num(g["throughput"]["output_tokens_per_s"]),
            "-" if not gp else f"{gp['fraction'] * 100:.1f}%", ratio,  # goodput/s: in summary.json
        )
    lat = table("Latency (from the scheduled send time; failures rank as worst)",
                ("class", "metric", *(label for _, label in _PCT_COLS)), left=2)
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
    return Group(fit(counts), fit(lat), *lines)


def validity_text(v: dict[str, Any]) -> Text:
    return Text(verdict_line(v), style="green" if v["valid"] else "bold white on red")


def interrupted_line(info: dict[str, Any]) -> str:
    """What an interrupted run holds: the statistics cover the requests that ended on their own."""
    return (f"INTERRUPTED after {fmt_s(info['after_s'])}: {info['sent']} requests sent, {info['done']} ended, "
            f"{info['cut']} cut after the {info['grace_s']:g} s grace; the statistics cover the ones that ended")


def num(v: float | None) -> str:
    """A rate for people: one decimal below 1000."""
    if v is None:
        return "-"
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def _red_if(n: int) -> Text:
    return Text(str(n), style="red" if n else "")


def print_summary(summary: dict[str, Any], console: Console) -> None:
    console.print(summary_tables(summary))


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

    def __call__(self, p: LoadProgress) -> None:
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
