"""The seed experiment on virtual time: the engine alone (FCFS) against the gateway's own scheduler
in front of it, through the discrete-event simulator: open loop for 100,000 requests, and closed loop.

Workload: the built-in `seed-mixed` (chats: short prompt, max_tokens 32, class interactive;
summaries: short prompt, max_tokens 2048, class batch). Open loop: Poisson arrivals at a fraction
(default 85%) of the engine's measured capacity for this mix. Closed loop: 16 clients, each sending
its next request when the last ends (the bench's `--concurrency`). Engine: the `h100-llama8b`
preset with `max_num_seqs` 8. In front: the gateway's `RankedSjfScheduler` with the default
classes (batch preemptible, max_share 1) and its preemption policy, at most 8 requests in the
engine, exactly as `tailguard serve` runs it (the same policy objects: the intake that classifies,
caps and sizes each request, scheduler, preemption policy, backend pool and its slot shares).
Also the gateway with its `fcfs` policy, to separate "holding requests back" from "choosing who
goes next", and ranked-sjf without preemption and with
other batch shares (`ranked-sjf:nopreempt@0.75/0`: max_share 0.75, no guarantee), to show the
trade-off the shares set.

    .venv/bin/python benchmarks/seed_des.py [--requests 100000] [--load 0.85] [--clients 16] \
        [--runs straight,fcfs,ranked-sjf,ranked-sjf:nopreempt,ranked-sjf:nopreempt@0.875/0.75,...]

`:nopreempt` turns the gateway's preemption off (the default classes make batch preemptible).

Writes benchmarks/results/seed_des.{json,md}. Latencies are from arrival (the scheduled send
time); TTFT is to the first output token; rejected requests are counted per class, not hidden.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tailguard.bench.workload import load_workload
from tailguard.clock import VirtualClock
from tailguard.front.front import Front
from tailguard.front.intake import NO_CLASS
from tailguard.wire.headers import CLASS_HEADER
from tailguard.config import BackendConfig, GatewayConfig, SchedulerConfig
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import run
from tailguard.sim.scenario import Arrival, Timeline
from tailguard.sim.engine import Engine
from tailguard.sweep.virtual import IntakeGate, Planned, plan
from tailguard.types import Outcome

RESULTS = Path(__file__).resolve().parent / "results"
ENGINE_NAME = "engine"


def seed_requests(n: int, rate_per_s: float, seed: int) -> list[Planned]:
    """`seed-mixed` as timed requests, as the bench sends them: each class's prompt and max_tokens
    drawn as the bench does."""
    workload, _ = load_workload("seed-mixed")
    rng = random.Random(seed)
    weights = [c.weight for c in workload.classes]
    out: list[Planned] = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(rate_per_s)
        wc = rng.choices(workload.classes, weights)[0]
        assert wc.max_tokens is not None
        prompt_tokens = wc.prompt_tokens.sample(rng)
        out.append(plan(f"{wc.name}-{i}", t, workload.endpoint, wc, prompt_tokens, wc.max_tokens.sample(rng)))
    return out


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig.from_preset(args.preset, max_num_seqs=args.max_num_seqs,
                                    enable_prefix_caching=getattr(args, "prefix_caching", None) or None)


def measure_capacity(args: argparse.Namespace) -> float:
    """Requests/s the engine completes for this mix when it is never idle: everything arrives at
    once, and the rate is read between the 10th and 90th percentile of completions (no ramp-up or
    drain-out)."""
    cfg = engine_config(args)
    gate = IntakeGate(cfg, None)
    burst = [gate.arrival(p, 0.0) for p in seed_requests(args.capacity_requests, 1.0, args.seed + 1)]
    done = sorted(tl.finished_at for tl in run(Engine(cfg), burst, VirtualClock(), gate=gate)
                  if tl.finished_at is not None)
    lo, hi = int(0.1 * len(done)), int(0.9 * len(done))
    return (hi - lo) / (done[hi] - done[lo])


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


# The class each workload class names in `X-Tailguard-Class`.
NAMED_CLASS = {c.name: c.headers[CLASS_HEADER] for c in load_workload("seed-mixed")[0].classes}


def class_of(tl: Timeline) -> str:
    """The class `tl` is counted in: the gateway's, or straight to the engine (nothing classifies
    it there) the one its request names (its id is `<workload class>-<n>`)."""
    return tl.cls if tl.cls != NO_CLASS else NAMED_CLASS[tl.id.rpartition("-")[0]]


def summarize(timelines: list[Timeline], wall_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {"wall_s": round(wall_s, 2), "classes": {}}
    first = min(tl.arrived_at for tl in timelines)
    last = max(tl.finished_at or tl.arrived_at for tl in timelines)
    ok_all = [tl for tl in timelines if tl.outcome is Outcome.SUCCESS]
    out["output_tokens_per_s"] = sum(tl.output_tokens for tl in ok_all) / (last - first)
    out["requests_per_s"] = len(ok_all) / (last - first)
    out["makespan_s"] = last - first
    out["suspensions_per_s"] = sum(tl.suspensions for tl in timelines) / (last - first)
    by_class: dict[str, list[Timeline]] = {}
    for tl in timelines:
        by_class.setdefault(class_of(tl), []).append(tl)
    for cls, mine in sorted(by_class.items()):
        ok = [tl for tl in mine if tl.outcome is Outcome.SUCCESS]
        rejected: dict[str, int] = {}
        for tl in mine:
            if tl.outcome is Outcome.REJECTED:
                reason = tl.reject_reason or "?"
                rejected[reason] = rejected.get(reason, 0) + 1
        ttft = [tl.ttft_s for tl in ok if tl.ttft_s is not None]
        e2e = [tl.e2e_s for tl in ok if tl.e2e_s is not None]
        front = [tl.front_queue_s for tl in ok if tl.front_queue_s is not None]
        held = sum(tl.finished_at - tl.admitted_at for tl in ok
                   if tl.finished_at is not None and tl.admitted_at is not None)
        row: dict[str, Any] = {
            "count": len(mine), "ok": len(ok), "rejected": rejected,
            "ttft_s": {"p50": pct(ttft, 50), "p99": pct(ttft, 99), "max": max(ttft) if ttft else None},
            "e2e_s": {"p50": pct(e2e, 50), "p99": pct(e2e, 99), "max": max(e2e) if e2e else None},
            "front_queue_s": {"p50": pct(front, 50), "p99": pct(front, 99)},
            "engine_slots_mean": held / (last - first),  # time-average of this class's requests running in the engine
            "e2e_mean_s": sum(e2e) / len(e2e) if e2e else None,
            "ok_per_s": len(ok) / (last - first),
        }
        p50, p99 = row["e2e_s"]["p50"], row["e2e_s"]["p99"]
        row["e2e_p99_over_p50"] = p99 / p50 if p50 and p99 else None
        out["classes"][cls] = row
    return out


def parse_label(label: str) -> tuple[str, bool, float | None, float | None]:
    """`policy[:nopreempt][@max_share[/min_share]]` for the batch class, e.g.
    `ranked-sjf:nopreempt@0.875/0.75` (the shares without preemption)."""
    head, _, shares = label.partition("@")
    policy, _, flag = head.partition(":")
    if flag not in ("", "nopreempt"):
        raise ValueError(f"unknown run flag {flag!r} in {label!r}")
    max_s, _, min_s = shares.partition("/")
    return policy, flag != "nopreempt", float(max_s) if max_s else None, float(min_s) if min_s else None


def make_front(label: str, args: argparse.Namespace, patient: bool = False) -> tuple[Front | None, GatewayConfig]:
    """The gateway's front for run `label` (None: straight to the engine), built from the same
    config `tailguard serve` would run with one backend of kind `sim`, the engine. `patient`:
    no class sheds (the closed loop measures the order, and a client never gives up)."""
    policy, preempt, max_share, min_share = parse_label(label)
    gw = gateway_config(max_share, min_share, preempt, patient, targets=args.slo)
    if policy == "straight":
        return None, gw
    backend = BackendConfig(name=ENGINE_NAME, url="http://127.0.0.1:1", kind="sim", max_concurrency=args.front_max_inflight)
    gw = gw.model_copy(update={"scheduler": gw.scheduler.model_copy(update={"policy": policy}), "backends": [backend]})
    return Front(gw.front_params({ENGINE_NAME: True})), gw


def run_one(label: str, requests: list[Planned], args: argparse.Namespace) -> dict[str, Any]:
    """Open loop: `straight`, or a gateway policy with optional batch shares (`parse_label`)."""
    front, gw = make_front(label, args)
    cfg = engine_config(args)
    engine = Engine(cfg)
    gate = IntakeGate(cfg, gw if front is not None else None)
    t0 = time.perf_counter()
    timelines = run(engine, [gate.arrival(p) for p in requests], VirtualClock(), front, gate=gate)
    res = summarize(timelines, time.perf_counter() - t0)
    res["engine_steps"] = engine.steps_total
    res["batch_shares"] = batch_shares(gw) if front is not None else None
    return res


def run_closed(label: str, args: argparse.Namespace) -> dict[str, Any]:
    """Closed loop, as the bench's clients do it: `args.clients` clients, each sending its next
    `seed-mixed` request the moment the previous one ends, until `args.closed_s`. Counted: the
    requests sent after `args.closed_warmup_s` (the clients start in step) and finished by
    `args.closed_s`."""
    front, gw = make_front(label, args, patient=True)
    cfg = engine_config(args)
    engine = Engine(cfg)
    gate = IntakeGate(cfg, gw if front is not None else None)
    workload, _ = load_workload("seed-mixed")
    rng = random.Random(args.seed)
    weights = [c.weight for c in workload.classes]
    sent = 0

    def make(t: float) -> Arrival:
        nonlocal sent
        wc = rng.choices(workload.classes, weights)[0]
        assert wc.max_tokens is not None
        prompt_tokens = wc.prompt_tokens.sample(rng)
        p = plan(f"{wc.name}-{sent}", t, workload.endpoint, wc, prompt_tokens, wc.max_tokens.sample(rng))
        sent += 1
        return gate.arrival(p)

    def follow_up(tl: Timeline, t: float) -> Arrival | None:
        if tl.outcome is not Outcome.SUCCESS:
            raise RuntimeError("a closed-loop request was rejected; raise the class queue bounds")
        return make(t) if t < args.closed_s else None

    t0 = time.perf_counter()
    first = [make(0.0) for _ in range(args.clients)]
    timelines = run(engine, first, VirtualClock(), front, follow_up=follow_up, gate=gate)
    counted = [tl for tl in timelines if tl.arrived_at >= args.closed_warmup_s
               and tl.finished_at is not None and tl.finished_at <= args.closed_s]
    res = summarize(counted, time.perf_counter() - t0)
    res["batch_shares"] = batch_shares(gw) if front is not None else None
    return res


def gateway_config(
    batch_max_share: float | None = None, batch_min_share: float | None = None, preemption: bool = True,
    patient: bool = False, targets: bool = False,
) -> GatewayConfig:
    """The gateway's defaults, optionally with other batch shares (min_share is lowered to fit
    a smaller max_share unless given), preemption off, or queue bounds no request reaches. Without
    `targets`, no class has a TTFT target (the default interactive one off): the seed experiment
    measures the class-and-size order as it was built, which every change must leave as it was;
    `--slo` keeps the default target (docs/slo.md), and a patient closed loop never has one."""
    base = GatewayConfig()
    classes = []
    for c in base.classes:
        if not targets or patient:
            c = c.model_copy(update={"slo": None})
        if patient:
            c = c.model_copy(update={"max_queue_wait_s": 86400.0})
        if c.name == "batch":
            hi = c.max_share if batch_max_share is None else batch_max_share
            lo = min(c.min_share, hi) if batch_min_share is None else batch_min_share
            c = c.model_copy(update={"max_share": hi, "min_share": lo})
        classes.append(c)
    return GatewayConfig(classes=classes, scheduler=SchedulerConfig(preemption=preemption))


def batch_shares(gw: GatewayConfig) -> dict[str, float]:
    c = next(c for c in gw.classes if c.name == "batch")
    return {"max_share": c.max_share, "min_share": c.min_share}


def fmt(v: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if v is None else f"{v * scale:.{digits}f}"


def table(runs: dict[str, Any]) -> list[str]:
    lines = [
        "| run | class | ok | rejected | TTFT p50 ms | TTFT p99 ms | E2E p50 s | E2E p99 s | E2E p99/p50 | gateway queue p99 s | engine slots held |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, run_res in runs.items():
        for cls, row in run_res["classes"].items():
            rej = sum(row["rejected"].values())
            lines.append(
                f"| {name} | {cls} | {row['ok']} | {rej} | {fmt(row['ttft_s']['p50'], 1000, 1)} | "
                f"{fmt(row['ttft_s']['p99'], 1000, 1)} | {fmt(row['e2e_s']['p50'])} | {fmt(row['e2e_s']['p99'])} | "
                f"{fmt(row['e2e_p99_over_p50'], 1, 1)} | {fmt(row['front_queue_s']['p99'])} | {row['engine_slots_mean']:.2f} |"
            )
    lines += ["", "| run | output tokens/s | requests/s | preemptions/s | simulated s | wall s |",
              "|---|---:|---:|---:|---:|---:|"]
    for name, run_res in runs.items():
        lines.append(
            f"| {name} | {run_res['output_tokens_per_s']:.0f} | {run_res['requests_per_s']:.2f} | "
            f"{run_res['suspensions_per_s']:.2f} | {run_res['makespan_s']:.0f} | {run_res['wall_s']:.1f} |"
        )
    return lines


def verdict_lines(runs: dict[str, Any]) -> list[str]:
    out = ["", "Targets of issue 4 for each gateway run against `straight` (a: interactive P99 TTFT >= 5x lower, "
           "b: interactive P99/P50 E2E <= 3, c: output tokens/s >= 90%, d: batch P99 E2E <= 1.25x):", "",
           "| run | a: TTFT P99 lower by | b: P99/P50 | c: tokens/s | d: batch P99 | met |", "|---|---:|---:|---:|---:|---:|"]
    for name in runs:
        if name == "straight":
            continue
        v = verdict(runs, name)
        out.append(f"| {name} | {v['a'][0]:.1f}x | {v['b'][0]:.2f} | {v['c'][0]:.0%} | {v['d'][0]:.2f}x | "
                   f"{''.join(k for k, (_, ok) in v.items() if ok) or '-'} |")
    return out


@dataclass(frozen=True)
class ClosedLoopFlow:
    """One closed-loop run by class: completions per second and mean E2E (same time unit)."""

    chat_x: float
    chat_e2e: float
    summary_x: float
    summary_e2e: float


def littles_law_lines(flows: dict[str, ClosedLoopFlow], clients: int) -> list[str]:
    """Why target d cannot hold in a closed loop together with a: every client is always waiting on
    either a chat or a summary, so (Little's law, per class) clients = X_chat * E2E_chat +
    X_summary * E2E_summary. Faster chats leave more clients waiting on summaries, and the engine
    completes summaries no faster, so their E2E grows by the same factor."""
    out = ["Little's law on the closed loop (X = completions per second, E2E = mean; clients waiting "
           "on each class = X x E2E; the two add up to the clients, up to the run's edges):", "",
           "| run | chat X | chat E2E s | clients on chats | summary X | summary E2E s | clients on summaries |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for name, f in flows.items():
        out.append(f"| {name} | {f.chat_x:.3f} | {f.chat_e2e:.2f} | {f.chat_x * f.chat_e2e:.2f} | "
                   f"{f.summary_x:.3f} | {f.summary_e2e:.2f} | {f.summary_x * f.summary_e2e:.2f} |")
    st = flows["straight"]
    on_summaries = st.summary_x * st.summary_e2e
    # With summaries completed at the same rate, a summary E2E at most 1.25x straight's leaves at most
    # 1.25x as many clients on summaries, so the rest must be kept busy by chats.
    chat_clients = clients - 1.25 * on_summaries
    kept = min(f.summary_x for f in flows.values()) / st.summary_x
    out += ["", f"Straight, {on_summaries:.1f} of the {clients} clients wait on summaries. For summaries' mean "
            f"E2E to stay within 1.25x while the engine completes them at the same rate, at most "
            f"{1.25 * on_summaries:.1f} clients may wait on them, so chats must hold the other "
            f"{chat_clients:.1f}: a chat mean E2E of at least {chat_clients / st.chat_x:.2f} s "
            f"(straight: {st.chat_e2e:.2f} s). Only a gateway that holds chats back on purpose "
            "(about that long each) could meet d here; the summaries' throughput (and tokens/s, c) is what "
            f"a policy can keep, and every run keeps at least {kept:.0%} of it."]
    return out


def des_flows(closed: dict[str, Any]) -> dict[str, ClosedLoopFlow]:
    return {name: ClosedLoopFlow(run["classes"]["interactive"]["ok_per_s"], run["classes"]["interactive"]["e2e_mean_s"],
                                 run["classes"]["batch"]["ok_per_s"], run["classes"]["batch"]["e2e_mean_s"])
            for name, run in closed.items()}


def markdown(result: dict[str, Any]) -> str:
    a = result["args"]
    shares = result["batch_shares"]
    lines = [
        "# The seed experiment on the discrete-event simulator",
        "",
        f"`.venv/bin/python benchmarks/seed_des.py --requests {a['requests']} --load {a['load']} "
        f"--clients {a['clients']} --closed-s {a['closed_s']:g} --runs {','.join(a['runs'])}"
        f"{' --prefix-caching' if a['prefix_caching'] else ''}`",
        "",
        f"Engine `{a['preset']}` with max_num_seqs {a['max_num_seqs']} (FCFS, prefix cache "
        f"{'on' if a['prefix_caching'] else 'off'}); gateway in front with at most "
        f"{a['front_max_inflight']} in flight and the default classes (batch preemptible, max_share "
        f"{shares['max_share']}, min_share {shares['min_share']}) and scheduler (preemption on, at most "
        f"{SchedulerConfig().max_preemptions_per_request} suspensions per request); `:nopreempt` runs turn "
        "preemption off, `@x/y` runs set batch max_share x and min_share y. Workload `seed-mixed`. Times are "
        "simulated seconds; a preemption in the simulation happens at the end of the engine step during "
        "which the chat arrived (at most one step later than the gateway does it).",
        "",
        f"## Open loop: Poisson at {a['load']:.0%} of the measured capacity "
        f"({result['capacity_requests_per_s']:.2f} req/s) = {result['rate_per_s']:.2f} req/s, "
        f"{a['requests']} requests, seed {a['seed']}",
        "",
        *table(result["runs"]),
    ]
    if "straight" in result["runs"]:
        lines += verdict_lines(result["runs"])
        st = result["runs"]["straight"]["classes"]
        inter, batch = st["interactive"]["engine_slots_mean"], st["batch"]["engine_slots_mean"]
        n = a["max_num_seqs"]
        lines += [
            "",
            f"Without preemption b and d trade: interactive requests keep {inter:.1f} of the {n} slots busy on "
            f"average and batch requests {batch:.1f}, each for about 14 s. With a single slot left to chats "
            f"(max_share {(n - 1) / n:g}) they queue for seconds whenever batch holds the other {n - 1} (b fails); "
            f"with two kept free, batch has {n - 2} slots for a load of {batch:.1f} and its P99 doubles (d fails). "
            "With preemption (`ranked-sjf`, batch max_share 1) a chat that finds every slot taken suspends the "
            "batch request with the most work left, which resumes from its text when a slot frees: chats wait "
            "for no batch job, and batch keeps every slot it is not displaced from; what batch pays is the "
            "re-prefill of prompt + text so far at each resume and the slot-time chats take. "
            + ("With the prefix cache on, a resumed request finds the blocks its suspended run left cached "
               "(unless evicted meanwhile) and re-prefills only the rest, as vLLM's prefix cache does."
               if a["prefix_caching"] else
               "With the prefix cache off (this run) nothing of a suspended run's KV is kept; "
               "`--prefix-caching` (vLLM V1's default) writes seed_des_prefix_caching.md."),
        ]
    if result.get("closed"):
        lines += [
            "",
            f"## Closed loop: {a['clients']} clients, each sending its next request when the last ends, "
            f"{a['closed_s']:g} simulated s (the first {a['closed_warmup_s']:g} s not counted), seed {a['seed']}",
            "",
            *table(result["closed"]),
        ]
        if "straight" in result["closed"]:
            lines += verdict_lines(result["closed"])
            lines += ["", *littles_law_lines(des_flows(result["closed"]), a["clients"])]
    lines.append("")
    return "\n".join(lines)


def verdict(runs: dict[str, Any], name: str = "ranked-sjf") -> dict[str, tuple[float, bool]]:
    """Issue 4's targets for run `name` against `straight`: (figure, met) per target a-d."""
    s, g = runs["straight"], runs[name]
    si, gi = s["classes"]["interactive"], g["classes"]["interactive"]
    sb, gb = s["classes"]["batch"], g["classes"]["batch"]
    ttft_x = si["ttft_s"]["p99"] / gi["ttft_s"]["p99"]
    ratio = gi["e2e_p99_over_p50"]
    tput = g["output_tokens_per_s"] / s["output_tokens_per_s"]
    batch = gb["e2e_s"]["p99"] / sb["e2e_s"]["p99"]
    return {"a": (ttft_x, ttft_x >= 5), "b": (ratio, ratio <= 3), "c": (tput, tput >= 0.9), "d": (batch, batch <= 1.25)}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--load", type=float, default=0.85, help="arrival rate as a fraction of measured capacity")
    ap.add_argument("--runs", default="straight,fcfs,ranked-sjf,ranked-sjf:nopreempt,ranked-sjf:nopreempt@0.875/0.75,"
                    "ranked-sjf:nopreempt@0.75/0",
                    help="comma list: straight (engine alone) and gateway policies (ranked-sjf, fcfs), each "
                    "optionally :nopreempt (preemption off) and @<batch max_share>[/<batch min_share>]")
    ap.add_argument("--clients", type=int, default=16, help="closed-loop clients (0: no closed-loop runs)")
    ap.add_argument("--closed-s", type=float, default=4000.0, help="simulated seconds of each closed-loop run")
    ap.add_argument("--closed-warmup-s", type=float, default=60.0)
    ap.add_argument("--preset", default="h100-llama8b")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--front-max-inflight", type=int, default=8)
    ap.add_argument("--capacity-requests", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prefix-caching", action="store_true",
                    help="engine prefix cache on (vLLM V1's default): a resumed request finds the blocks its "
                    "suspended run left cached")
    ap.add_argument("--slo", action="store_true", help="keep the default interactive TTFT target (2 s) in the "
                    "open-loop gateway runs (without it, no class has one: the order as it was built)")
    ap.add_argument("--out", default=None, help="output path without extension (default: results/seed_des, "
                    "or seed_des_prefix_caching with --prefix-caching)")
    args = ap.parse_args()
    if args.out is None:
        args.out = str(RESULTS / ("seed_des_prefix_caching" if args.prefix_caching else "seed_des"))
    labels = [r for r in args.runs.split(",") if r]

    gw = gateway_config()
    capacity = measure_capacity(args)
    rate = args.load * capacity
    requests = seed_requests(args.requests, rate, args.seed)
    runs: dict[str, Any] = {}
    for label in labels:
        runs[label] = run_one(label, requests, args)
        print(f"open {label}: done in {runs[label]['wall_s']} s", flush=True)
    closed: dict[str, Any] = {}
    if args.clients > 0:
        for label in labels:
            closed[label] = run_closed(label, args)
            print(f"closed {label}: done in {closed[label]['wall_s']} s", flush=True)
    result: dict[str, Any] = {
        "benchmark": "seed_des",
        # `slo` only when given: a run without it writes the arguments runs before the flag wrote.
        "args": {**{k: v for k, v in vars(args).items() if k != "out" and (k != "slo" or v)}, "runs": labels},
        "batch_shares": batch_shares(gw),
        "capacity_requests_per_s": capacity,
        "rate_per_s": rate,
        "runs": runs,
        "closed": closed,
        "python": platform.python_version(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    Path(f"{out}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
