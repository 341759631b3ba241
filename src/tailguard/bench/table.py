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

# "ITL" means two things among the tools: vllm bench's pools every gap between chunks (ours), AIPerf's
# and GuideLLM's is per request, (E2E - TTFT) / (output tokens - 1), our TPOT. So ours says "chunk".
METRIC_LABELS = {"e2e_s": "E2E", "ttft_s": "TTFT", "itl_s": "ITL/chunk", "tpot_s": "TPOT", "queue_s": "queue"}
METRIC_NOTE = ("ITL/chunk: every gap between content chunks, pooled over requests (AIPerf's inter-chunk latency, "
               "vllm bench's ITL). TPOT: (E2E - TTFT) / (output tokens - 1) per request (AIPerf's and "
               "GuideLLM's ITL). docs/bench.md has every tool's names.")
_PCT_COLS = (("p50", "P50"), ("p90", "P90"), ("p95", "P95"), ("p99", "P99"), ("p999", "P99.9"), ("max", "max"), ("mean", "mean"))
_LOW_COLS = (("min", "min"), ("p1", "P1"), ("p5", "P5"), ("p10", "P10"), ("p25", "P25"), ("std", "std"))
_LENGTH_COLS = (("mean", "mean"), ("std", "std"), ("min", "min"), ("p50", "P50"), ("p90", "P90"), ("p99", "P99"),
                ("max", "max"))
LENGTH_LABELS = {"input_tokens": "input", "output_tokens": "output"}


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
    lat = _latency(summary, "Latency (from the scheduled send time; failures rank as worst)", _PCT_COLS)
    low = _latency(summary, "Latency, the low end and the spread", _LOW_COLS)
    lines: list[Text | Table] = [Text(METRIC_NOTE, style="dim"), fit(low), fit(_lengths(summary))]
    if summary.get("trace"):
        lines.append(Text(trace_line(summary["trace"])))
    lines.append(validity_text(summary["validity"]))
    if summary.get("interrupted"):
        lines.append(Text(interrupted_line(summary["interrupted"]), style="bold yellow"))
    return Group(fit(counts), fit(lat), *lines)


def shown_metrics(g: dict[str, Any]) -> list[str]:
    """The metrics a group has figures for: E2E and TTFT always; ITL, TPOT and queue when measured."""
    out = []
    for m in METRIC_LABELS:
        st = g[m]
        if g.get("samples", {}).get(m) == 0 or (all(st[k] is None for k, _ in _PCT_COLS) and g["count"]
                                                and m in ("itl_s", "tpot_s", "queue_s")):
            continue
        out.append(m)
    return out


def _latency(summary: dict[str, Any], title: str, cols: tuple[tuple[str, str], ...]) -> Table:
    lat = table(title, ("class", "metric", *(label for _, label in cols)), left=2)
    for name, g in _groups(summary):
        for i, m in enumerate(shown_metrics(g)):
            lat.add_row(name if i == 0 else "", METRIC_LABELS[m], *(fmt_s(g[m][k]) for k, _ in cols),
                        end_section=False)
        if lat.rows:  # an interrupted run can end with nothing measured
            lat.rows[-1].end_section = True
    return lat


def _lengths(summary: dict[str, Any]) -> Table:
    """Input and output sequence lengths (AIPerf's ISL and OSL) of the requests that succeeded."""
    t = table("Lengths in tokens (requests that succeeded)",
              ("class", "tokens", *(label for _, label in _LENGTH_COLS)), left=2)
    for name, g in _groups(summary):
        for i, (key, label) in enumerate(LENGTH_LABELS.items()):
            st = g["lengths"][key]
            t.add_row(name if i == 0 else "", label, *(fmt_tokens(st[k]) for k, _ in _LENGTH_COLS),
                      end_section=i == len(LENGTH_LABELS) - 1)
    return t


def fmt_tokens(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "-"
    return f"{v:.0f}" if v == int(v) or v >= 100 else f"{v:.1f}"


def trace_line(t: dict[str, Any]) -> str:
    """What a trace replay sent: the file, its part, its classes and its prefix reuse."""
    part = []
    if t.get("window"):
        part.append(f"window {t['window']}")
    if t.get("limit"):
        part.append(f"first {t['limit']}")
    if t.get("speed", 1.0) != 1.0:
        part.append(f"at {t['speed']:g}x its rate")
    classes = ", ".join(f"{n} {c}" for n, c in t["classes"].items())
    reuse = f"; prefix blocks reused: {t['block_reuse'] * 100:.1f}% of prompt tokens" if t.get("block_reuse") else ""
    sessions = f"; {t['sessions']} sessions" if t.get("sessions") else ""
    notes = "".join(f"\nnote: {n}" for n in t.get("notes") or [])
    return (f"trace {t['file']} ({t['format']}): {t['requests']} of its {t['requests_in_file']} requests "
            f"over {fmt_s(t['span_s'])}{' (' + ', '.join(part) + ')' if part else ''}; per class: {classes}"
            f"{sessions}{reuse}{notes}")


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
