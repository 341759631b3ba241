"""The report's plots as base64 PNGs (matplotlib's object API, no pyplot state, no display):
latency CDFs per class, TTFT and E2E over time, in-flight requests over time, the ITL
distribution, dispatch lag over time, and the before/after CDF overlay for compare.
"""

from __future__ import annotations

import base64
import io
import math
from typing import Callable, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from tailguard.bench.recorder import RequestRecord
from tailguard.bench.stats import Array, e2e_sample, ttft_sample

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
FAIL_COLOR = "#d62728"
TIMEOUT_COLOR = "#e6550d"
ITL_FLOOR_S = 1e-5  # chunks read together have a 0 gap; drawn at 10 us on the log axis
_DPI = 100


def to_png_b64(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _seconds_label(v: float, _pos: object = None) -> str:
    if v >= 1:
        return f"{v:.3g}s"
    if v >= 1e-3:
        return f"{v * 1e3:.3g}ms"
    return f"{v * 1e6:.3g}us"


def log_seconds(axis: Axis) -> None:
    """Log axis in seconds labelled 1ms, 10ms, 1s: decades, plus 2 and 5 when the data spans
    under three decades (so a narrow range still gets labels), never so many that they collide.
    Call after plotting: it reads the axis's data range."""
    lo, hi = axis.get_view_interval()
    narrow = lo > 0 and hi / lo < 1000
    axis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 5.0) if narrow else (1.0,), numticks=12))
    axis.set_major_formatter(FuncFormatter(_seconds_label))
    axis.set_minor_formatter(NullFormatter())


def class_colors(names: Sequence[str]) -> dict[str, str]:
    return {n: COLORS[i % len(COLORS)] for i, n in enumerate(names)}


def _by_class(records: Sequence[RequestRecord], names: Sequence[str]) -> dict[str, list[RequestRecord]]:
    return {n: [r for r in records if r.cls == n] for n in names}


def _cdf(ax: Axes, values: Array, label: str, color: str, linestyle: str = "-") -> None:
    """Empirical CDF over all requests: failures (+inf) are never reached, so the curve tops out
    at the success share instead of hiding them."""
    n = len(values)
    if n == 0:
        return
    finite = np.sort(values[np.isfinite(values)])
    finite = np.maximum(finite, 1e-4)
    if len(finite) == 0:
        return
    y = np.arange(1, len(finite) + 1) / n
    ax.step(finite, y, where="post", label=label, color=color, linestyle=linestyle, linewidth=1.6)


def _style_cdf(ax: Axes, title: str) -> None:
    ax.set_xscale("log")
    log_seconds(ax.xaxis)
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.set_xlabel("latency (log scale)")
    ax.set_ylabel("fraction of requests")
    for y in (0.5, 0.9, 0.99):
        ax.axhline(y, color="#999999", linewidth=0.6, linestyle=":")
    ax.grid(True, which="major", alpha=0.3)


def _ok_only(recs: Sequence[RequestRecord], metric: Callable[[RequestRecord], float]) -> Array:
    """Successes' values, failures and timeouts as +inf: the CDF of what users got, over all requests."""
    return np.asarray([metric(r) if r.ok else math.inf for r in recs], dtype=np.float64)


def latency_cdfs(records: Sequence[RequestRecord], names: Sequence[str]) -> str:
    colors = class_colors(names)
    fig = Figure(figsize=(12, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    for n, recs in _by_class(records, names).items():
        ok = sum(r.ok for r in recs)
        label = f"{n} ({len(recs)})" if ok == len(recs) else f"{n} ({ok} of {len(recs)} ok)"
        _cdf(ax1, _ok_only(recs, e2e_sample), label, colors[n])
        _cdf(ax2, _ok_only(recs, ttft_sample), n, colors[n])
    _style_cdf(ax1, "E2E latency CDF per class (successes; tops out at the success share)")
    _style_cdf(ax2, "TTFT CDF per class")
    ax1.legend(loc="lower right", fontsize=9)
    return to_png_b64(fig)


def over_time(records: Sequence[RequestRecord], names: Sequence[str]) -> str:
    colors = class_colors(names)
    fig = Figure(figsize=(12, 6.5))
    axes = fig.subplots(2, 1, sharex=True)
    for ax, metric, title in ((axes[0], e2e_sample, "E2E"), (axes[1], ttft_sample, "TTFT")):
        finite_max = 0.0
        fails_x: list[float] = []
        timeouts: list[tuple[float, float]] = []
        for n, recs in _by_class(records, names).items():
            good = [r for r in recs if r.ok]
            x = np.asarray([r.scheduled_at for r in good])
            y = np.asarray([metric(r) for r in good])
            if len(y):
                finite_max = max(finite_max, float(y.max()))
            if len(y):
                ax.scatter(x, np.maximum(y, 1e-4), s=9, alpha=0.7, color=colors[n], label=n, linewidths=0)
            for r in recs:
                if r.timed_out:
                    timeouts.append((r.scheduled_at, metric(r)))
                elif not r.ok:
                    fails_x.append(r.scheduled_at)
        if timeouts:
            finite_max = max(finite_max, max(y for _, y in timeouts))
            ax.scatter([t for t, _ in timeouts], [max(y, 1e-4) for _, y in timeouts], marker="v", s=20,
                       color=TIMEOUT_COLOR, label=f"timed out ({len(timeouts)}), at give-up")
        if fails_x:
            top = max(finite_max, 1e-3) * 1.6
            ax.scatter(fails_x, [top] * len(fails_x), marker="x", s=22, color=FAIL_COLOR,
                       label=f"failed ({len(fails_x)})")
        ax.set_yscale("log")
        log_seconds(ax.yaxis)
        ax.set_ylabel(f"{title} (log scale)")
        ax.set_title(f"{title} by scheduled send time")
        ax.grid(True, alpha=0.3)
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=9, markerscale=2)
    axes[1].set_xlabel("scheduled send time (s since start)")
    return to_png_b64(fig)


def arrival_bins(due: Array, n_max: int = 120) -> tuple[Array, float]:
    """Requests due per bin over the run, and the bin's width: whole seconds (or a round fraction
    of one), at most `n_max` bins, so a burst shows as the rate it was and not averaged away."""
    span = float(due.max()) if len(due) else 0.0
    width = 1.0
    for w in (0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600):
        width = float(w)
        if span / w <= n_max:
            break
    edges = np.arange(0.0, span + width, width)
    counts, _ = np.histogram(due, bins=edges if len(edges) > 1 else np.asarray([0.0, width]))
    return counts.astype(np.float64), width


def arrivals_and_ttft(records: Sequence[RequestRecord], names: Sequence[str]) -> str:
    """A trace's arrival rate over time above TTFT over time, on one time axis: where the trace
    bursts, what the bursts did to the first token."""
    colors = class_colors(names)
    fig = Figure(figsize=(12, 6.0))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": (1, 1.6)})
    due = np.asarray([r.scheduled_at for r in records], dtype=np.float64)
    counts, width = arrival_bins(due)
    top.bar(np.arange(len(counts)) * width, counts / width, width=width, align="edge", color="#7f7f7f",
            linewidth=0)
    top.set_ylabel("requests/s")
    top.set_title(f"Arrival rate of the trace (per {width:g} s) and TTFT of the requests due then")
    top.grid(True, alpha=0.3)
    for n, recs in _by_class(records, names).items():
        good = [r for r in recs if r.ok]
        if good:
            ax_y = np.maximum(np.asarray([ttft_sample(r) for r in good]), 1e-4)
            bottom.scatter([r.scheduled_at for r in good], ax_y, s=9, alpha=0.7, color=colors[n], label=n, linewidths=0)
        failed = [r.scheduled_at for r in recs if not r.ok]
        if failed:
            bottom.scatter(failed, [bottom.get_ylim()[1]] * len(failed), marker="x", s=22, color=FAIL_COLOR,
                           label=f"{n}: failed ({len(failed)})")
    bottom.set_yscale("log")
    log_seconds(bottom.yaxis)
    bottom.set_ylabel("TTFT (log scale)")
    bottom.set_xlabel("scheduled send time (s since start)")
    bottom.grid(True, alpha=0.3)
    bottom.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=9, markerscale=2)
    return to_png_b64(fig)


def in_flight(records: Sequence[RequestRecord], names: Sequence[str]) -> str:
    colors = class_colors(names)
    fig = Figure(figsize=(12, 3.6))
    ax = fig.subplots()
    groups = [("all", list(records), "#888888")] + [(n, rs, colors[n]) for n, rs in _by_class(records, names).items()]
    for label, recs, color in groups:
        if not recs:
            continue
        t = np.concatenate([[r.sent_at for r in recs], [r.ended_at for r in recs]])
        d = np.concatenate([np.ones(len(recs)), -np.ones(len(recs))])
        order = np.lexsort((d, t))  # at equal times an end comes before a start
        ax.step(t[order], np.cumsum(d[order]), where="post", label=label, color=color, linewidth=1.0)
    ax.set_title("Requests in flight (sent, not yet ended)")
    ax.set_xlabel("time (s since start)")
    ax.set_ylabel("requests")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=9)
    return to_png_b64(fig)


def itl_distribution(records: Sequence[RequestRecord], names: Sequence[str]) -> str | None:
    colors = class_colors(names)
    gaps = {n: np.concatenate([np.diff(np.asarray(r.chunk_at)) for r in rs if len(r.chunk_at) > 1] or [np.empty(0)])
            for n, rs in _by_class(records, names).items()}
    if not any(len(g) for g in gaps.values()):
        return None
    hi = max(float(g.max()) for g in gaps.values() if len(g))
    positive = [float(g[g > 0].min()) for g in gaps.values() if (g > 0).any()]
    has_zero = any((g <= 0).any() for g in gaps.values())
    lo = ITL_FLOOR_S if has_zero or not positive else max(ITL_FLOOR_S, min(positive) / 1.5)
    bins = np.logspace(math.log10(lo), math.log10(max(hi, lo * 10) * 1.2), 60)
    fig = Figure(figsize=(12, 3.8))
    ax = fig.subplots()
    for n, g in gaps.items():
        if len(g):
            ax.hist(np.maximum(g, ITL_FLOOR_S), bins=bins.tolist(), histtype="step", linewidth=1.5, color=colors[n],
                    label=f"{n} ({len(g)} gaps)", density=False)
    ax.set_xscale("log")
    log_seconds(ax.xaxis)
    ax.set_yscale("log")
    ax.set_title("Inter-token latency, pooled per chunk (a stall shows as a bar far to the right)")
    ax.set_xlabel("gap between content chunks (log scale; gaps of 0, chunks read together, drawn at 10us)"
                  if has_zero else "gap between content chunks (log scale)")
    ax.set_ylabel("chunks (log)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=9)
    return to_png_b64(fig)


def dispatch_lag(records: Sequence[RequestRecord], threshold_s: float) -> str:
    fig = Figure(figsize=(12, 2.8))
    ax = fig.subplots()
    x = np.asarray([r.scheduled_at for r in records])
    y = np.asarray([r.dispatch_lag_s * 1000 for r in records])
    ax.scatter(x, y, s=5, alpha=0.6, color="#555555", linewidths=0)
    ax.axhline(threshold_s * 1000, color=FAIL_COLOR, linewidth=1, linestyle="--", label="validity threshold")
    ax.set_title("Dispatch lag: actual minus scheduled send")
    ax.set_xlabel("scheduled send time (s since start)")
    ax.set_ylabel("ms")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)
    return to_png_b64(fig)


def compare_cdfs(before: Sequence[RequestRecord], after: Sequence[RequestRecord], names: Sequence[str]) -> str:
    colors = class_colors(names)
    fig = Figure(figsize=(12, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    for n in names:
        b = [r for r in before if r.cls == n]
        a = [r for r in after if r.cls == n]
        for ax, metric in ((ax1, e2e_sample), (ax2, ttft_sample)):
            _cdf(ax, _ok_only(b, metric), f"{n} before", colors[n], ":")
            _cdf(ax, _ok_only(a, metric), f"{n} after", colors[n], "-")
    _style_cdf(ax1, "E2E CDF of successes: before (dotted), after (solid)")
    _style_cdf(ax2, "TTFT CDF: before (dotted) vs after (solid)")
    ax1.legend(loc="lower right", fontsize=9)
    return to_png_b64(fig)


PART_COLORS = {"dispatch_s": "#7f7f7f", "gateway_queue_s": "#9467bd", "engine_queue_s": "#d62728",
               "prefill_s": "#ff7f0e", "decode_s": "#1f77b4", "stall_s": "#8c564b"}


def tail_attribution(parts_by_class: dict[str, dict[str, float]]) -> str | None:
    """One horizontal stacked bar per class: where the slowest 1% spent their time, on average."""
    if not parts_by_class:
        return None
    fig = Figure(figsize=(12, 0.6 + 0.55 * len(parts_by_class)))
    ax = fig.subplots()
    names = list(parts_by_class)
    left = np.zeros(len(names))
    for part, color in PART_COLORS.items():
        widths = np.asarray([parts_by_class[n].get(part, 0.0) for n in names])
        ax.barh(names, widths, left=left, color=color, label=part.removesuffix("_s").replace("_", " "))
        left += widths
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(FuncFormatter(_seconds_label))
    ax.set_xlabel("mean seconds per request among the class's slowest 1% (by E2E)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=9)
    return to_png_b64(fig)
