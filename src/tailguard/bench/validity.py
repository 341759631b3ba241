"""Did a run measure the server, or the load generator? The dispatch-lag verdict, which requests
lagged and by how much, the likely cause and the advice that fits it. Pure: records in, a dict out.

Dispatch lag is how late a request left against its schedule; latencies are measured from the
schedule, so a late generator inflates them. The threshold is a property of the generator's wall
clock. A run reported in simulated seconds (`time_scale` X: X wall seconds per simulated second)
has every time divided by X, the lags and the threshold alike, so the verdict is unchanged and the
figures it prints are in the run's own units; it says so.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from numpy.typing import NDArray

from tailguard.bench.recorder import RequestRecord

# Above this dispatch-lag P99 the generator, not the server, shaped the latencies. 5 ms is well
# under any TTFT worth measuring and well over the 1 ms granularity of uvloop's timers.
DEFAULT_MAX_DISPATCH_LAG_S = 0.005
WORST_SHOWN = 3
# Lagging requests all among the first 5% (at least the first one) are the generator's start.
START_FRACTION = 0.05
BURST = 10  # requests due within one threshold's time: a burst the generator sends one after another
# The loop's stalls were starved (or the generator's own work) when at least this share of them was spent so.
MOST = 0.5


def _per_worker(ordered: Sequence[RequestRecord], n: int, threshold: float) -> list[dict[str, Any]]:
    """A run spread over `n` processes (`bench --workers`): each one's own dispatch-lag check
    (worker w sent the requests whose index is w modulo n)."""
    if n <= 1:
        return []
    out = []
    for w in range(n):
        lags = np.asarray([r.dispatch_lag_s for r in ordered if r.index % n == w], dtype=np.float64)
        p99 = float(np.percentile(lags, 99.0)) if len(lags) else 0.0
        out.append({"worker": w, "count": len(lags), "dispatch_lag_p99_s": round(p99, 6), "valid": p99 <= threshold})
    return out


def validity(records: Sequence[RequestRecord], meta: dict[str, Any]) -> dict[str, Any]:
    """The `validity` object of summary.json for the measured `records` of the run `meta` describes.

    Dispatch lag decides; event-loop lag explains (its max shows a stall that P99, taken over
    10 ms ticks, would average away)."""
    threshold = float(meta.get("max_dispatch_lag_s", DEFAULT_MAX_DISPATCH_LAG_S))
    scale = float(meta.get("time_scale") or 1.0)
    loop = meta.get("loop_lag_s") or {}
    ordered = sorted(records, key=lambda r: r.index)
    lags = np.asarray([r.dispatch_lag_s for r in ordered], dtype=np.float64)
    p99 = float(np.percentile(lags, 99.0)) if len(lags) else 0.0  # lags are finite: numpy's own will do
    late = sorted(((pos, r) for pos, r in enumerate(ordered) if r.dispatch_lag_s > threshold),
                  key=lambda pr: -pr[1].dispatch_lag_s)
    valid = bool(p99 <= threshold)
    workers = _per_worker(ordered, int(meta.get("workers") or 1), threshold)
    valid = valid and all(w["valid"] for w in workers)
    out: dict[str, Any] = {
        "dispatch_lag_p99_s": round(p99, 6),
        "valid": valid,
        "dispatch_lag_max_s": round(float(lags.max()) if len(lags) else 0.0, 6),
        "loop_lag_p99_s": None if loop.get("p99") is None else round(loop["p99"], 6),
        "loop_lag_max_s": None if loop.get("max") is None else round(loop["max"], 6),
        "threshold_s": threshold,
        "time_scale": scale,
        "threshold_wall_s": round(threshold * scale, 6),
        "late": {"count": len(late), "of": len(ordered),
                 "worst": [{"index": r.index, "lag_s": round(r.dispatch_lag_s, 6)} for _, r in late[:WORST_SHOWN]]},
        "cause": None, "reason": None, "advice": None,
    }
    if workers:
        out["workers"] = workers
    if meta.get("loop_stalls") is not None:
        out["loop_stalls"] = meta["loop_stalls"]  # bench.stalls: where the loop's stalls went (wall seconds)
    if meta.get("trace"):
        out["bursts"] = bursts(ordered, threshold)
    if not valid:
        cause, advice = _cause(late, ordered, meta, threshold)
        out["cause"], out["advice"] = cause, advice
        worst = max(workers, key=lambda w: w["dispatch_lag_p99_s"]) if workers else None
        said = (f"dispatch lag P99 {ms(p99, scale)}" if p99 > threshold or worst is None else
                f"worker {worst['worker']}'s dispatch lag P99 {ms(worst['dispatch_lag_p99_s'], scale)}")
        out["reason"] = (f"{said} is above the {threshold_text(threshold, scale)}: "
                         f"{_late_text(late, len(ordered), scale)}; these latencies partly measure the generator")
    return out


def _crowd(due: NDArray[np.float64], window_s: float) -> NDArray[np.int64]:
    """For each instant of the ascending `due`, how many are due in the `window_s` up to it."""
    crowd: NDArray[np.int64] = np.arange(1, len(due) + 1) - np.searchsorted(due, due - window_s, side="left")
    return crowd


def bursts(ordered: Sequence[RequestRecord], threshold: float) -> dict[str, Any]:
    """The generator on a trace's bursts: the most requests due within one threshold's time (the
    lag budget: a generator that sends one every ~0.1-0.3 ms falls behind on a burst of tens),
    and the dispatch lag of the requests due in a crowd of 10 or more against everyone's."""
    by_due = sorted(ordered, key=lambda r: r.scheduled_at)
    due = np.asarray([r.scheduled_at for r in by_due], dtype=np.float64)
    crowd = _crowd(due, threshold) if len(due) else np.zeros(0, dtype=np.int64)
    in_burst = [r.dispatch_lag_s for r, c in zip(by_due, crowd) if c >= BURST]
    return {"window_s": threshold, "most_due_in_window": int(crowd.max()) if len(crowd) else 0,
            "requests_in_bursts": len(in_burst),
            "dispatch_lag_p99_s": round(float(np.percentile(in_burst, 99.0)), 6) if in_burst else None}


def ms(seconds: float, scale: float) -> str:
    """A lag in the run's units: `6.9 ms`, or `27.6 ms simulated` in a time-scaled run."""
    return f"{seconds * 1000:.1f} ms" + (" simulated" if scale != 1.0 else "")


def threshold_text(threshold_s: float, scale: float) -> str:
    """The threshold in the run's units, and why it is not the 5 ms the flag says when scaled."""
    if scale == 1.0:
        return f"threshold {threshold_s * 1000:.1f} ms"
    return (f"threshold {threshold_s * 1000:.1f} ms simulated ({threshold_s * scale * 1000:g} ms wall / "
            f"time scale {scale:g}: this run's times are simulated seconds)")


def _late_text(late: list[tuple[int, RequestRecord]], n: int, scale: float) -> str:
    worst = ", ".join(f"#{r.index} by {ms(r.dispatch_lag_s, scale)}" for _, r in late[:WORST_SHOWN])
    more = f" and {len(late) - WORST_SHOWN} more" if len(late) > WORST_SHOWN else ""
    return f"{len(late)} of {n} requests were sent late ({worst}{more})"


def _cause(late: list[tuple[int, RequestRecord]], ordered: list[RequestRecord], meta: dict[str, Any],
           threshold: float) -> tuple[str, str]:
    """The likely cause of the lag, and what to do about it: (cause, advice)."""
    n = len(ordered)
    first = max(1, math.ceil(n * START_FRACTION))
    loop_max = (meta.get("loop_lag_s") or {}).get("max") or 0.0
    if late and max(pos for pos, _ in late) < first:
        k = max(pos for pos, _ in late) + 1
        return "start", (f"only the first {k} request(s) lagged: the generator's start, not its pace; "
                         f"exclude them with --warmup {k}")
    if late and meta.get("mode") == "open":
        by_due = sorted(ordered, key=lambda r: r.scheduled_at)
        due = np.asarray([r.scheduled_at for r in by_due], dtype=np.float64)
        crowd = dict(zip((r.index for r in by_due), _crowd(due, threshold).tolist()))
        crowded = [crowd[r.index] for _, r in late]
        if float(np.median(crowded)) >= BURST:
            within = ms(threshold, float(meta.get("time_scale") or 1.0))
            return "burst", (f"the arrivals' bursts: up to {max(crowded)} requests due within {within}, sent one "
                             "after another; spread the sending over processes (--workers N), or replay slower "
                             "(--speed below 1)")
    if meta.get("mode") == "open":
        tail = [r.dispatch_lag_s for r in ordered[-max(1, n // 4):]]
        if float(np.median(tail)) > threshold:
            return "rate", ("the generator fell ever further behind its schedule: it cannot send at this rate; "
                            "lower --rate, or give the generator a core of its own")
    if loop_max > threshold:
        # Where the stalls' time went, when the kernel said; else the guess.
        return _stall_cause(meta.get("loop_stalls"), meta.get("host")) or (
            "stall", "the generator's event loop stalled (another process took its CPU, or the servers share its "
                     "core): run the servers elsewhere or give the generator a core of its own (taskset)")
    return "busy", ("the generator's CPU was too busy to send on time: fewer --concurrency, or give the "
                    "generator a core of its own")


def _stall_cause(stalls: dict[str, Any] | None, host_info: dict[str, Any] | None) -> tuple[str, str] | None:
    """(cause, advice) from where the loop's stalls spent their time (`bench.stalls`: the kernel's
    scheduler statistics, wall seconds), or None where nothing was measured."""
    if not stalls or not stalls.get("count") or stalls["late_s"] <= 0:
        return None
    late = stalls["late_s"]
    waiting, running = min(1.0, stalls["waiting_s"] / late), min(1.0, stalls["running_s"] / late)
    said = (f"the generator's event loop was late {stalls['count']} times ({late:.2f} s past due in all, wall); "
            f"its thread waited for a CPU {waiting:.0%} of that and ran its own code {running:.0%}")
    load = (host_info or {}).get("load_average")
    if load:
        said += f" (load average {load[0]:g} on {(host_info or {}).get('cpus')} CPUs at the end)"
    if waiting >= MOST:
        return "starved", (f"{said}: other processes held the CPUs; run the servers and other work elsewhere, "
                           "or give the generator a core of its own (taskset)")
    if running >= MOST:
        return "own-work", (f"{said}: the generator's own work (reading answers, garbage collection) was "
                            "too much for one process; spread the sending over processes (--workers N)")
    return "blocked", (f"{said}: neither, so a call blocked its loop (disk, swap, a synchronous call "
                       "in a plugin); look at what else the generator's process does")


def verdict_line(v: dict[str, Any]) -> str:
    """The banner of a run's `validity`, for the terminal and report.html alike."""
    scale = float(v.get("time_scale") or 1.0)
    loop = v.get("loop_lag_p99_s")
    loop_text = f"; event-loop lag P99 {ms(loop, scale)}" if loop is not None else ""
    if v["valid"]:
        lag = v.get("dispatch_lag_p99_s") or 0.0
        return f"VALID run: dispatch lag P99 {ms(lag, scale)}, {threshold_text(v['threshold_s'], scale)}{loop_text}"
    advice = f". What to do: {v['advice']}" if v.get("advice") else ""
    return f"INVALID run: {v['reason']}{loop_text}{advice}"
