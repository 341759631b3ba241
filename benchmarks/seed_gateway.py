"""The seed experiment through real processes: `seed-mixed` straight to the simulator against the
same load through `tailguard serve`, side by side in one run, closed loop (16 clients) and open loop
(Poisson at a fraction of the engine's capacity), with issue 4's four targets checked per arm.

Each arm gets a fresh simulator process (h100-llama8b, max_num_seqs 8, time-scaled) and, for a
gateway arm, a gateway process in front of it; the load generator runs in this process. Figures are
simulated seconds (wall / time_scale).

    .venv/bin/python benchmarks/seed_gateway.py [--duration 60] [--time-scale 0.25] [--load 0.85]

Writes benchmarks/results/seed_gateway.{json,md}; every arm's bench folder under
benchmarks/results/seed_gateway/. With `--prefix-caching` the simulator runs with its prefix cache
on (vLLM V1's default), and everything is written under the name seed_gateway_prefix_caching.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import uvloop

from tailguard.cli.experiment import Arm, SimSpec, run_arms

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from seed_des import (  # noqa: E402  (same capacity, run labels and closed-loop analysis as the DES run)
    ClosedLoopFlow, gateway_config, littles_law_lines, measure_capacity, parse_label)

TARGETS = {
    "a": ("interactive P99 TTFT, times lower than straight", ">= 5"),
    "b": ("interactive P99/P50 E2E", "<= 3"),
    "c": ("output tokens/s vs straight", ">= 90%"),
    "d": ("batch P99 E2E vs straight", "<= 1.25x"),
}


def targets(straight: dict[str, Any], arm: dict[str, Any]) -> dict[str, tuple[float, bool]]:
    sc, ac = straight["classes"]["chat"], arm["classes"]["chat"]
    sb, ab = straight["classes"]["summary"], arm["classes"]["summary"]
    a = _div(sc["ttft_s"]["p99"], ac["ttft_s"]["p99"])
    b = _div(ac["e2e_s"]["p99"], ac["e2e_s"]["p50"])
    c = _div(arm["throughput"]["output_tokens_per_s"], straight["throughput"]["output_tokens_per_s"])
    d = _div(ab["e2e_s"]["p99"], sb["e2e_s"]["p99"])
    return {"a": (a, a >= 5), "b": (b, b <= 3), "c": (c, c >= 0.9), "d": (d, d <= 1.25)}


def _div(x: float | None, y: float | None) -> float:
    """A failure-dominated percentile is null in summary.json: a ratio with it is infinite."""
    if x is None or y is None or y == 0:
        return float("inf")
    return x / y


def row(label: str, s: dict[str, Any]) -> str:
    c, b = s["classes"]["chat"], s["classes"]["summary"]

    def f(v: float | None) -> str:
        return "fail" if v is None else f"{v:.3f}"

    return (f"| {label} | {s['throughput']['output_tokens_per_s']:.0f} | {f(c['ttft_s']['p50'])} / {f(c['ttft_s']['p99'])} "
            f"| {f(c['e2e_s']['p50'])} / {f(c['e2e_s']['p99'])} | {f(b['e2e_s']['p50'])} / {f(b['e2e_s']['p99'])} "
            f"| {c['errors'] + b['errors']} / {c['timeouts'] + b['timeouts']} | {'yes' if s['validity']['valid'] else 'NO'} |")


def section(title: str, runs: dict[str, Any]) -> list[str]:
    lines = [f"## {title}", "",
             "| arm | output tok/s | chat TTFT p50 / p99 s | chat E2E p50 / p99 s | summary E2E p50 / p99 s | errors / timeouts | valid |",
             "|---|---:|---|---|---|---|---|"]
    lines += [row(k, v) for k, v in runs.items()]
    lines += ["", "| arm | " + " | ".join(f"({k}) {d} {t}" for k, (d, t) in TARGETS.items()) + " |",
              "|---|" + "---|" * len(TARGETS)]
    for k, v in runs.items():
        if k == "straight":
            continue
        t = targets(runs["straight"], v)
        cells = []
        for key, (val, ok) in t.items():
            shown = f"{val:.0%}" if key == "c" else f"{val:.2f}"
            cells.append(f"{shown} {'met' if ok else 'missed'}")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return lines + [""]


def make_arm(label: str) -> Arm:
    """`straight`, or a gateway run labelled as in seed_des.py: `policy[:nopreempt][@max_share[/min_share]]`."""
    if label == "straight":
        return Arm(label)
    policy, preempt, max_share, min_share = parse_label(label)
    if preempt and max_share is None and min_share is None:
        return Arm(label, gateway=True, policy=policy)
    gw = gateway_config(max_share, min_share)
    config = {"classes": [c.model_dump(exclude_defaults=True) for c in gw.classes],
              "scheduler": {"preemption": preempt}}
    return Arm(label, gateway=True, policy=policy, config=config)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--duration", type=float, default=60.0, help="wall seconds of load per arm")
    ap.add_argument("--warmup", type=float, default=6.0, help="wall seconds excluded at the start of each arm")
    ap.add_argument("--time-scale", type=float, default=0.25)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--load", type=float, default=0.85, help="open-loop rate as a fraction of capacity (0: skip)")
    ap.add_argument("--arms", default="straight,fcfs,ranked-sjf", help="straight and gateway runs: policy[:nopreempt][@batch max_share[/min_share]]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefix-caching", action="store_true",
                    help="simulator prefix cache on: a resumed request finds what its suspended run left cached")
    ap.add_argument("--render", action="store_true", help="only rewrite the .md from the saved .json")
    args = ap.parse_args()
    name = results_name(vars(args))
    if args.render:
        render(json.loads((RESULTS / f"{name}.json").read_text()))
        return

    sim = SimSpec(time_scale=args.time_scale, extra=("--enable-prefix-caching",) if args.prefix_caching else ())
    arms = [make_arm(a) for a in args.arms.split(",")]
    out = RESULTS / name
    started = time.time()
    closed_load = {"workload": "seed-mixed", "concurrency": args.clients, "duration_s": args.duration,
                   "warmup_s": args.warmup, "seed": args.seed}
    result: dict[str, Any] = {"closed": uvloop.run(run_arms(arms, sim, closed_load, out / "closed"))}
    capacity = None
    if args.load > 0:
        cap_args = argparse.Namespace(preset=sim.preset, max_num_seqs=sim.max_num_seqs, capacity_requests=4000, seed=1)
        capacity = measure_capacity(cap_args)
        rate_wall = args.load * capacity / args.time_scale
        open_load = {"workload": "seed-mixed", "rate": rate_wall, "arrival": "poisson", "duration_s": args.duration,
                     "warmup_s": args.warmup, "seed": args.seed}
        result["open"] = uvloop.run(run_arms(arms, sim, open_load, out / "open"))
    result["args"] = vars(args)
    result["capacity_requests_per_s"] = capacity
    result["machine"] = f"{platform.machine()}, Python {platform.python_version()}"
    result["wall_s"] = round(time.time() - started, 1)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2, default=str))
    render(result)


def flows(runs: dict[str, Any]) -> dict[str, ClosedLoopFlow]:
    """Completions per simulated second and mean E2E by class, from each arm's summary.json."""
    def flow(s: dict[str, Any]) -> ClosedLoopFlow:
        c, b = s["classes"]["chat"], s["classes"]["summary"]
        return ClosedLoopFlow(c["throughput"]["requests_per_s"], c["e2e_s"]["mean"],
                              b["throughput"]["requests_per_s"], b["e2e_s"]["mean"])
    return {k: flow(v) for k, v in runs.items()}


def results_name(args: dict[str, Any]) -> str:
    return "seed_gateway_prefix_caching" if args.get("prefix_caching") else "seed_gateway"


def render(result: dict[str, Any]) -> None:
    """Write the results page from a run's results (also `--render`: from the saved .json,
    without running again)."""
    args = argparse.Namespace(**{"prefix_caching": False, **result["args"]})
    capacity = result["capacity_requests_per_s"]
    cmd = (f"`.venv/bin/python benchmarks/seed_gateway.py --duration {args.duration:g} --warmup {args.warmup:g} "
           f"--arms {args.arms}{' --prefix-caching' if args.prefix_caching else ''}`")
    md = ["# The seed experiment: straight vs through the gateway (real processes)", "", cmd, "",
          f"Simulator h100-llama8b, max_num_seqs {SimSpec().max_num_seqs}, prefix cache "
          f"{'on' if args.prefix_caching else 'off'}, time scale {args.time_scale} (figures in "
          f"simulated seconds); gateway max_concurrency {SimSpec().max_num_seqs}, default classes; {args.duration:g} "
          f"wall s per arm, first {args.warmup:g} s excluded; {result['machine']}, 2 cores shared by simulator, "
          f"gateway and generator; whole run {result['wall_s']} s.", ""]
    md += section(f"Closed loop: {args.clients} clients", result["closed"])
    if "straight" in result["closed"]:
        md += littles_law_lines(flows(result["closed"]), args.clients) + [""]
    if "open" in result:
        md += section(f"Open loop: Poisson at {args.load:.0%} of capacity ({capacity:.2f} req/s simulated)", result["open"])
    text = "\n".join(md)
    (RESULTS / f"{results_name(result['args'])}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
