"""The rules that read the GPUs and hosts (pure, no I/O): the seed article's first question in
9.3 (is the GPU already full, or is the tail the queue's?) and its 7.5 row (tokens still uneven
at low concurrency: the GPU's power and clocks, the host's CPU and swap).

They run after `rules.RULES`, with what those found: `queue_bound` cites the queue findings as
its evidence, and `compute_bound` names the queue findings whose change would only move the wait.
Each reads `pages.Evidence`; without a GPU or host page each stays silent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tailguard.bench.stats import measurement_window_s
from tailguard.doctor.facts import ClassFacts, RunFacts
from tailguard.doctor.finding import Finding
from tailguard.doctor.hardware import GpuEvidence, HostEvidence
from tailguard.doctor.pages import Evidence
from tailguard.doctor.rules import QUEUED, TAIL_RATIO, bench_command, compare_command, lighter_command
from tailguard.doctor.words import pct, secs, times
from tailguard.wire import dcgm

SATURATED = 0.8  # the GPU's best activity signal at 80% or more of the run: full
MIDDLING = 0.6  # at or under 60%: headroom (the article's "only 30% to 50%", with a margin)
# One request in a hundred decoding 1.5x slower per token than the median: its steps were not
# steady. TPOT (a request's decode time per token) and not ITL: a client that reads two chunks at
# once sees one gap of zero and one of two steps, so per-chunk gaps wobble on a healthy server.
TPOT_UNSTABLE = 1.5
CLOCK_DROP = 0.15  # the SM clock 15% under its reference while busy: held down, not boost's own wobble
POWER_AT_LIMIT = 0.97
CPU_SATURATED = 0.9
# The findings that say requests wait on one another: the queue's order or a wait outside the engine.
QUEUE_KINDS = ("head_of_line", "queueing", "cap_above_engine", "hidden_queue", "starvation")

HardwareRule = Callable[[RunFacts, Evidence, Sequence[Finding]], "Finding | None"]


def _busiest(gpus: Sequence[GpuEvidence]) -> GpuEvidence | None:
    seen = [g for g in gpus if g.activity is not None]
    return max(seen, key=lambda g: g.activity or 0.0) if seen else None


def _activity_line(g: GpuEvidence) -> str:
    model = f" ({g.model})" if g.model else ""
    return (f"{g.name}{model}: {g.activity_of} {pct(g.activity or 0.0)} on average over the {g.snapshots} "
            f"snapshots taken during the run")


def _tail(c: ClassFacts) -> float:
    return max(c.ratio("e2e") or 0.0, c.ratio("ttft") or 0.0)


def _slow(c: ClassFacts) -> bool:
    """Its E2E tail is past the healthy band, or its median request queued for most of its time (a
    TTFT of a few steps at P50 makes its P99/P50 large on a healthy run: not read here)."""
    return (c.ratio("e2e") or 0.0) > TAIL_RATIO or c.median_queue_share >= QUEUED


def _class_line(c: ClassFacts) -> str:
    return (f"{c.name} E2E P99 {secs(c.e2e_p99)} (P50 {secs(c.e2e_p50)}, P99/P50 {times(c.ratio('e2e'))}), "
            f"its median request {pct(c.median_queue_share)} queued")


def compute_bound(f: RunFacts, ev: Evidence, found: Sequence[Finding]) -> Finding | None:
    """The GPU is full and no class is served well: more order cannot help, more capacity can.
    A busy-time signal alone (GPU_UTIL, GR_ENGINE_ACTIVE: 100% whenever a kernel runs) needs the
    engine's own queue to say its batch was full."""
    g = _busiest(ev.gpus)
    cs = [c for c in f.classes.values() if c.count]
    if g is None or (g.activity or 0.0) < SATURATED or not cs or not all(_slow(c) for c in cs):
        return None
    engine = ev.engine
    queued_in_engine = engine is not None and (engine.waiting_max or 0.0) >= 1
    if g.busy_time_only and not queued_in_engine:
        return None
    evid = [_activity_line(g)]
    if g.fb_share is not None:
        evid.append(f"GPU memory used at most {pct(g.fb_share)} of {g.fb_total_mib or 0:.0f} MiB")
    if engine is not None and engine.running_max is not None:
        evid.append(f"the engine ran up to {engine.running_max:.0f} requests at once and queued up to "
                    f"{engine.waiting_max or 0:.0f} itself")
    evid += [f"{x.kind} also fired: its change would move the wait between requests, not shorten it"
             for x in found if x.kind in QUEUE_KINDS]
    against = []
    if g.busy_time_only:
        against.append(f"{g.activity_of} counts the time a kernel runs, not how full the SMs are; the engine's own "
                       f"queue says its batch was full (add {dcgm.SM_ACTIVE} to the exporter's counters to see it)")
    if (g.clock_drop or 0.0) >= CLOCK_DROP:
        against.append(f"its SM clock fell {pct(g.clock_drop or 0.0)} below {g.clock_ref_mhz or 0:.0f} MHz while busy: "
                       "a card held down is full sooner (see throttled)")
    slots = f" (it ran {engine.running_max:.0f} at once)" if engine is not None and engine.running_max else ""
    return Finding(
        "compute_bound", "high",
        symptom="the GPU is full and every class is slow: " + "; ".join(_class_line(c) for c in cs),
        cause=("the engine's GPU is at its capacity: requests wait for compute whatever their order "
               "(the article, 9.3: with utilization high and P99 high, scheduling can do little)"),
        next_step=("add capacity (another engine instance behind the gateway), or ask less of each step: a smaller "
                   f"`max_num_seqs`{slots} or `max_model_len`; not a queue change, which would move the wait "
                   "between requests without shortening it"),
        check=f"{lighter_command(f)}  # the same at 70% of the load: back within 3-5x of P50 means capacity; "
              f"then {compare_command(f)}",
        evidence_for=tuple(evid), evidence_against=tuple(against),
    )


def queue_bound(f: RunFacts, ev: Evidence, found: Sequence[Finding]) -> Finding | None:
    """P99 is high while the GPU has headroom, and the queue findings say where requests waited."""
    g = _busiest(ev.gpus)
    queue = [x for x in found if x.kind in QUEUE_KINDS]
    slow = [c for c in f.classes.values() if c.count and _tail(c) > TAIL_RATIO]
    if g is None or (g.activity or 0.0) > MIDDLING or not queue or not slow:
        return None
    c = max(slow, key=_tail)
    first = queue[0]
    against = []
    if (g.fb_share or 0.0) >= 0.95:
        against.append(f"GPU memory was {pct(g.fb_share or 0.0)} full: the KV cache may bind before the compute does")
    return Finding(
        "queue_bound", "medium",
        symptom=(f"{c.name} E2E P99 {secs(c.e2e_p99)} against P50 {secs(c.e2e_p50)} ({times(c.ratio('e2e'))}; TTFT "
                 f"P99 {secs(c.ttft_p99)}) while the GPU was {pct(g.activity or 0.0)} active"),
        cause=("requests wait on one another (the queue's order, or a wait outside the engine), not on the GPU (the "
               "article, 9.3: at 30-50% utilization with a high P99, check the queue before scaling out)"),
        next_step=f"do not add GPUs for this tail; first: {first.next_step}",
        check=first.check,
        evidence_for=(_activity_line(g), *(f"{x.kind}: {x.symptom}" for x in queue)),
        evidence_against=tuple(against),
    )


def _gpu_signs(g: GpuEvidence) -> list[str]:
    signs = []
    if (g.clock_drop or 0.0) >= CLOCK_DROP:
        signs.append(f"{g.name}: its SM clock fell to {g.clock_min_mhz or 0:.0f} MHz while busy, {pct(g.clock_drop or 0.0)} "
                     f"under {g.clock_ref_mhz or 0:.0f} MHz ({g.clock_ref_of})")
    if g.violations:
        signs.append(f"{g.name}: {dcgm.POWER_VIOLATION}/{dcgm.THERMAL_VIOLATION} grew during the run (time held down)")
    if (g.power_share or 0.0) >= POWER_AT_LIMIT and (g.activity or 0.0) < SATURATED:
        signs.append(f"{g.name}: at its power limit ({g.power_w or 0:.0f} W of {g.power_limit_w or 0:.0f} W) while only "
                     f"{pct(g.activity or 0.0)} active")
    return signs


def _host_signs(h: HostEvidence) -> list[str]:
    signs = []
    if (h.swapped_pages or 0.0) > 0:
        signs.append(f"host {h.name}: {h.swapped_pages:.0f} pages swapped in and out during the run")
    if (h.cpu_busy or 0.0) >= CPU_SATURATED:
        signs.append(f"host {h.name}: its {h.cpus} CPUs {pct(h.cpu_busy or 0.0)} busy over the run")
    return signs


def _remedy(ev: Evidence) -> str:
    """The one change for the first kind of sign: the GPU's clocks, else the host's swap, else its CPUs."""
    if any(_gpu_signs(g) for g in ev.gpus):
        return ("find why the card is held down (`nvidia-smi -q -d PERFORMANCE` names the clock event reasons: power "
                "cap, thermal slowdown) and restore its power limit (`nvidia-smi -pl`) or its cooling")
    if any((h.swapped_pages or 0.0) > 0 for h in ev.hosts):
        return "stop the host swapping: keep the engine's memory resident (more RAM, fewer processes beside it, no swap)"
    return "give the engine's host CPU time back (its scheduler and tokenizer run there): move other work off it"


def _in_flight(f: RunFacts) -> float:
    recs = [r for c in f.classes.values() for r in c.records]
    window = measurement_window_s(recs)
    return sum(r.e2e_s for r in recs) / window if window > 0 else 0.0


def throttled(f: RunFacts, ev: Evidence, found: Sequence[Finding]) -> Finding | None:
    """Requests decode unevenly, and the GPU or host says it was held back: clocks down while busy,
    its throttle counters growing, its power at the limit while not full, the host's CPUs saturated
    or its memory swapping (the article, 7.5: TPOT still unstable after lowering concurrency)."""
    streams = [c for c in f.classes.values() if c.tpot_p50 and c.tpot_p99 is not None]
    if not streams:
        return None
    c = max(streams, key=lambda c: c.ratio("tpot") or 0.0)
    tpot = c.ratio("tpot") or 0.0
    signs = [s for g in ev.gpus for s in _gpu_signs(g)] + [s for h in ev.hosts for s in _host_signs(h)]
    if tpot < TPOT_UNSTABLE or not signs:
        return None
    against = []
    if any(x.kind == "kv_pressure" for x in found):
        against.append("the engine also preempted: recomputed sequences stall their tokens too (kv_pressure)")
    lag = f.summary.get("validity", {}).get("loop_lag_p99_s")
    if isinstance(lag, (int, float)) and lag > (c.tpot_p50 or 0.0):
        against.append(f"the bench's own event loop lagged {secs(lag)} at P99, more than a token's median time: "
                       "the client measured some of the unevenness itself")
    prompts = sorted(r.prompt_tokens for r in c.records)
    if prompts and prompts[-1] >= 1024:
        against.append(f"prompts of up to {prompts[-1]} tokens share steps with decodes: a prefill stretches a step too")
    return Finding(
        "throttled", "high",
        symptom=(f"{c.name} TPOT P99 {secs(c.tpot_p99)} against P50 {secs(c.tpot_p50)} ({times(tpot)}; ITL P99 "
                 f"{secs(c.itl_p99)}) with {_in_flight(f):.1f} requests in flight on average"),
        cause="the hardware slows some steps: a GPU held down by its power or temperature, or a host short of CPU or memory",
        next_step=_remedy(ev),
        check=f"{bench_command(f)}  # after the change, scraping the same pages; then {compare_command(f)}",
        evidence_for=tuple(signs), evidence_against=tuple(against),
    )


HARDWARE_RULES: dict[str, HardwareRule] = {
    "throttled": throttled, "compute_bound": compute_bound, "queue_bound": queue_bound,
}
