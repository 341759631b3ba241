"""The seed experiment on virtual time: the engine alone (FCFS) against the gateway's own scheduler
in front of it, through the discrete-event simulator, for 100,000 requests.

Workload: the built-in `seed-mixed` (chats: short prompt, max_tokens 32, class interactive;
summaries: short prompt, max_tokens 2048, class batch), open-loop Poisson arrivals at a fraction
(default 85%) of the engine's measured capacity for this mix. Engine: the `h100-llama8b` preset
with `max_num_seqs` 8. In front: the gateway's `RankedSjfScheduler` with the default classes
(batch may hold 6 of 8 slots), at most 8 requests in the engine, exactly as `tailguard serve` runs
it (the same policy objects: scheduler, backend pool and its slot shares). Also the gateway with
its `fcfs` policy, to separate "holding requests back" from "choosing who goes next", and
ranked-sjf with other batch shares (`ranked-sjf@0.875`), to show the trade-off the share sets.

    .venv/bin/python benchmarks/seed_des.py [--requests 100000] [--load 0.85] \
        [--runs straight,fcfs,ranked-sjf,ranked-sjf@0.875,ranked-sjf@0.625]

Writes benchmarks/results/seed_des.{json,md}. Latencies are from arrival (the scheduled send
time); TTFT is to the first output token; rejected requests are counted per class, not hidden.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tailguard.bench.workload import load_workload
from tailguard.clock import VirtualClock
from tailguard.gateway.backends import BackendPool
from tailguard.gateway.config import BackendConfig, GatewayConfig, SchedulerConfig
from tailguard.gateway.scheduler import BaseScheduler, Pending, Reject, make_scheduler
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import Arrival, Timeline, run
from tailguard.sim.engine import Engine
from tailguard.types import Outcome

RESULTS = Path(__file__).resolve().parent / "results"
ENGINE_NAME = "engine"


class PooledFront:
    """A scheduler plus the gateway's slot bookkeeping, as the gateway's dispatcher drives them:
    `pop` asks for a request some slot may take (the class shares), a finish frees the slot.
    The discrete-event run pops without an admissibility check, so this adds the gateway's."""

    def __init__(self, sched: BaseScheduler, pool: BackendPool) -> None:
        self.sched = sched
        self.pool = pool
        self.cls_of: dict[str, str] = {}
        self._admissible: Callable[[Pending], bool] = lambda p: pool.has_capacity(ENGINE_NAME, p.cls)

    def push(self, req: Pending, now: float) -> Reject | None:
        return self.sched.push(req, now)

    def pop(self, now: float, admissible: Callable[[Pending], bool] | None = None) -> Pending | None:
        p = self.sched.pop(now, self._admissible)
        if p is not None:
            self.pool.acquire(ENGINE_NAME, p.cls)
            self.cls_of[p.id] = p.cls
        return p

    def remove(self, req_id: str, now: float) -> bool:
        return self.sched.remove(req_id, now)

    def expire(self, now: float) -> list[Pending]:
        return self.sched.expire(now)

    def on_finish(self, req_id: str, outcome: Outcome, now: float) -> None:
        self.pool.release(ENGINE_NAME, self.cls_of.pop(req_id))
        self.sched.on_finish(req_id, outcome, now)

    def next_wakeup(self) -> float | None:
        return self.sched.next_wakeup()

    def __len__(self) -> int:
        return len(self.sched)


def seed_arrivals(n: int, rate_per_s: float, gw: GatewayConfig, seed: int) -> list[Arrival]:
    """`seed-mixed` as timed requests: each class's prompt and max_tokens drawn as the bench does."""
    workload, _ = load_workload("seed-mixed")
    rng = random.Random(seed)
    weights = [c.weight for c in workload.classes]
    classes = {c.name: c for c in gw.classes}
    out: list[Arrival] = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(rate_per_s)
        wc = rng.choices(workload.classes, weights)[0]
        gw_cls = classes[wc.headers["X-Tailguard-Class"]]
        assert wc.max_tokens is not None
        out.append(Arrival(
            f"{wc.name}-{i}", t, wc.prompt_tokens.sample(rng), wc.max_tokens.sample(rng),
            cls=gw_cls.name, rank=gw_cls.rank, wait_bound_s=gw_cls.max_queue_wait_s,
        ))
    return out


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig.from_preset(args.preset, max_num_seqs=args.max_num_seqs)


def measure_capacity(args: argparse.Namespace, gw: GatewayConfig) -> float:
    """Requests/s the engine completes for this mix when it is never idle: everything arrives at
    once, and the rate is read between the 10th and 90th percentile of completions (no ramp-up or
    drain-out)."""
    burst = [
        Arrival(a.id, 0.0, a.prompt_tokens, a.max_tokens, cls=a.cls, rank=a.rank)
        for a in seed_arrivals(args.capacity_requests, 1.0, gw, args.seed + 1)
    ]
    done = sorted(tl.finished_at for tl in run(Engine(engine_config(args)), burst, VirtualClock())
                  if tl.finished_at is not None)
    lo, hi = int(0.1 * len(done)), int(0.9 * len(done))
    return (hi - lo) / (done[hi] - done[lo])


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(timelines: list[Timeline], wall_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {"wall_s": round(wall_s, 2), "classes": {}}
    first = min(tl.arrived_at for tl in timelines)
    last = max(tl.finished_at or tl.arrived_at for tl in timelines)
    ok_all = [tl for tl in timelines if tl.outcome is Outcome.SUCCESS]
    out["output_tokens_per_s"] = sum(tl.output_tokens for tl in ok_all) / (last - first)
    out["requests_per_s"] = len(ok_all) / (last - first)
    out["makespan_s"] = last - first
    for cls in sorted({tl.cls for tl in timelines}):
        mine = [tl for tl in timelines if tl.cls == cls]
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
        }
        p50, p99 = row["e2e_s"]["p50"], row["e2e_s"]["p99"]
        row["e2e_p99_over_p50"] = p99 / p50 if p50 and p99 else None
        out["classes"][cls] = row
    return out


def run_one(label: str, arrivals: list[Arrival], args: argparse.Namespace) -> dict[str, Any]:
    """`straight`, or a gateway policy name with an optional `@<batch max_share>`."""
    policy, _, share = label.partition("@")
    gw = gateway_config(float(share) if share else None)
    engine = Engine(engine_config(args))
    front: PooledFront | None = None
    if policy != "straight":
        backend = BackendConfig(name=ENGINE_NAME, url="http://127.0.0.1:1", kind="sim", max_concurrency=args.front_max_inflight)
        sched = make_scheduler(gw.scheduler.model_copy(update={"policy": policy}), gw.classes)
        front = PooledFront(sched, BackendPool([backend], gw.classes, gw.health))
    t0 = time.perf_counter()
    timelines = run(engine, arrivals, VirtualClock(), front=front,
                    front_max_inflight=args.front_max_inflight if front is not None else None)
    res = summarize(timelines, time.perf_counter() - t0)
    res["engine_steps"] = engine.steps_total
    res["batch_max_share"] = batch_share(gw) if front is not None else None
    return res


def gateway_config(batch_max_share: float | None = None) -> GatewayConfig:
    """The gateway's defaults, optionally with another batch share."""
    base = GatewayConfig()
    if batch_max_share is None:
        return base
    classes = [c.model_copy(update={"max_share": batch_max_share}) if c.name == "batch" else c for c in base.classes]
    return GatewayConfig(classes=classes, scheduler=SchedulerConfig())


def batch_share(gw: GatewayConfig) -> float:
    return next(c.max_share for c in gw.classes if c.name == "batch")


def fmt(v: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if v is None else f"{v * scale:.{digits}f}"


def markdown(result: dict[str, Any]) -> str:
    a = result["args"]
    lines = [
        "# The seed experiment on the discrete-event simulator",
        "",
        f"`.venv/bin/python benchmarks/seed_des.py --requests {a['requests']} --load {a['load']} "
        f"--runs {','.join(a['runs'])}`",
        "",
        f"Engine `{a['preset']}` with max_num_seqs {a['max_num_seqs']} (FCFS); gateway in front with at most "
        f"{a['front_max_inflight']} in flight, default classes (batch max_share {result['batch_max_share']}; "
        "`@x` runs use batch max_share x). "
        f"Workload `seed-mixed`, open-loop Poisson at {a['load']:.0%} of the measured capacity "
        f"({result['capacity_requests_per_s']:.2f} req/s) = {result['rate_per_s']:.2f} req/s, "
        f"{a['requests']} requests, seed {a['seed']}.",
        "",
        "| run | class | ok | rejected | TTFT p50 ms | TTFT p99 ms | E2E p50 s | E2E p99 s | E2E p99/p50 | gateway queue p99 s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, run_res in result["runs"].items():
        for cls, row in run_res["classes"].items():
            rej = sum(row["rejected"].values())
            lines.append(
                f"| {name} | {cls} | {row['ok']} | {rej} | {fmt(row['ttft_s']['p50'], 1000, 1)} | "
                f"{fmt(row['ttft_s']['p99'], 1000, 1)} | {fmt(row['e2e_s']['p50'])} | {fmt(row['e2e_s']['p99'])} | "
                f"{fmt(row['e2e_p99_over_p50'], 1, 1)} | {fmt(row['front_queue_s']['p99'])} |"
            )
    lines += ["", "| run | output tokens/s | requests/s | simulated s | wall s |", "|---|---:|---:|---:|---:|"]
    for name, run_res in result["runs"].items():
        lines.append(
            f"| {name} | {run_res['output_tokens_per_s']:.0f} | {run_res['requests_per_s']:.2f} | "
            f"{run_res['makespan_s']:.0f} | {run_res['wall_s']:.1f} |"
        )
    if "verdict" in result:
        lines += ["", "Against the issue's targets (gateway `ranked-sjf` with the default config vs straight):", ""]
        lines += [f"- {k}: {v}" for k, v in result["verdict"].items()]
        classes = result["runs"]["straight"]["classes"]
        inter, batch = classes["interactive"]["engine_slots_mean"], classes["batch"]["engine_slots_mean"]
        lines += [
            "",
            f"Why the share decides: in the engine, interactive requests keep {inter:.1f} of the "
            f"{a['max_num_seqs']} slots busy on average and batch requests {batch:.1f}, each batch request for "
            "about 14 s. Batch needs more than "
            f"{batch:.1f} slots to keep up, and chats stay fast only while about {math.ceil(inter) + 1} slots are free for "
            "them (their mean plus room for bursts), "
            "so every slot reserved for chats is one batch must queue for: the `@x` runs trace that trade.",
        ]
    lines.append("")
    return "\n".join(lines)


def verdict(runs: dict[str, Any]) -> dict[str, str]:
    s, g = runs["straight"], runs["ranked-sjf"]
    si, gi = s["classes"]["interactive"], g["classes"]["interactive"]
    sb, gb = s["classes"]["batch"], g["classes"]["batch"]
    ttft_x = si["ttft_s"]["p99"] / gi["ttft_s"]["p99"]
    ratio = gi["e2e_p99_over_p50"]
    tput = g["output_tokens_per_s"] / s["output_tokens_per_s"]
    batch = gb["e2e_s"]["p99"] / sb["e2e_s"]["p99"] - 1
    return {
        "interactive P99 TTFT at least 5x lower": f"{ttft_x:.1f}x lower ({'met' if ttft_x >= 5 else 'NOT met'})",
        "interactive P99/P50 E2E at most 3": f"{ratio:.2f} ({'met' if ratio <= 3 else 'NOT met'})",
        "output tokens/s at least 90% of straight": f"{tput:.1%} ({'met' if tput >= 0.9 else 'NOT met'})",
        "batch P99 E2E no more than 25% worse": f"{batch:+.1%} ({'met' if batch <= 0.25 else 'NOT met'})",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--load", type=float, default=0.85, help="arrival rate as a fraction of measured capacity")
    ap.add_argument("--runs", default="straight,fcfs,ranked-sjf,ranked-sjf@0.875,ranked-sjf@0.625",
                    help="comma list: straight (engine alone) and gateway policies (ranked-sjf, fcfs), "
                    "each optionally @<batch max_share>")
    ap.add_argument("--preset", default="h100-llama8b")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--front-max-inflight", type=int, default=8)
    ap.add_argument("--capacity-requests", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(RESULTS / "seed_des"), help="output path without extension")
    args = ap.parse_args()
    labels = [r for r in args.runs.split(",") if r]

    gw = gateway_config()
    capacity = measure_capacity(args, gw)
    rate = args.load * capacity
    arrivals = seed_arrivals(args.requests, rate, gw, args.seed)
    runs: dict[str, Any] = {}
    for label in labels:
        runs[label] = run_one(label, arrivals, args)
        print(f"{label}: done in {runs[label]['wall_s']} s", flush=True)
    result: dict[str, Any] = {
        "benchmark": "seed_des",
        "args": {**{k: v for k, v in vars(args).items() if k != "out"}, "runs": labels},
        "batch_max_share": batch_share(gw),
        "capacity_requests_per_s": capacity,
        "rate_per_s": rate,
        "runs": runs,
        "python": platform.python_version(),
    }
    if "straight" in runs and "ranked-sjf" in runs:
        result["verdict"] = verdict(runs)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    Path(f"{out}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
