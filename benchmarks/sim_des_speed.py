"""How fast the discrete-event run simulates: 100,000 requests of the seed mix through the engine model.

The seed mix is the head-of-line problem tailguard exists for: chats (32-token prompts, 64 output
tokens) interleaved with summaries (2048-token prompts, 256 output tokens), Poisson arrivals.
Prints and writes benchmarks/results/sim_des_speed.{json,md}.

    .venv/bin/python benchmarks/sim_des_speed.py [--requests 100000] [--rate 20] [--preset h100-llama8b]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

from tailguard.clock import VirtualClock
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import run
from tailguard.sim.scenario import Arrival
from tailguard.sim.engine import Engine

RESULTS = Path(__file__).resolve().parent / "results"


def seed_mix(n: int, rate_per_s: float, summary_share: float, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    t = 0.0
    out: list[Arrival] = []
    for i in range(n):
        t += rng.expovariate(rate_per_s)
        if rng.random() < summary_share:
            out.append(Arrival(f"s{i}", t, 2048, 256, cls="batch"))
        else:
            out.append(Arrival(f"c{i}", t, 32, 64, cls="interactive"))
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=20.0, help="arrivals per simulated second")
    ap.add_argument("--summary-share", type=float, default=0.25)
    ap.add_argument("--preset", default="h100-llama8b")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    arrivals = seed_mix(args.requests, args.rate, args.summary_share, args.seed)
    walls: list[float] = []
    timelines = []
    steps = 0
    for _ in range(args.repeats):
        engine = Engine(EngineConfig.from_preset(args.preset))
        t0 = time.perf_counter()
        timelines = run(engine, arrivals, VirtualClock())
        walls.append(time.perf_counter() - t0)
        steps = engine.steps_total
    wall = statistics.median(walls)
    chats = [tl for tl in timelines if tl.cls == "interactive"]
    ttft = [tl.ttft_s for tl in chats if tl.ttft_s is not None]
    e2e = [tl.e2e_s for tl in chats if tl.e2e_s is not None]
    result = {
        "benchmark": "sim_des_speed",
        "preset": args.preset,
        "requests": args.requests,
        "arrival_rate_per_s": args.rate,
        "summary_share": args.summary_share,
        "engine_steps": steps,
        "simulated_s": max(tl.finished_at or 0.0 for tl in timelines),
        "wall_s_median": round(wall, 3),
        "wall_s_all": [round(w, 3) for w in walls],
        "requests_per_wall_s": round(args.requests / wall),
        "steps_per_wall_s": round(steps / wall),
        "ok": sum(1 for tl in timelines if tl.outcome is not None and tl.outcome.value == "success"),
        "chat_ttft_s": {"p50": pct(ttft, 0.5), "p99": pct(ttft, 0.99)},
        "chat_e2e_s": {"p50": pct(e2e, 0.5), "p99": pct(e2e, 0.99)},
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sim_des_speed.json").write_text(json.dumps(result, indent=2) + "\n")
    md = (
        "# Discrete-event run speed\n\n"
        f"`.venv/bin/python benchmarks/sim_des_speed.py --requests {args.requests} --rate {args.rate} "
        f"--preset {args.preset}` (median of {args.repeats} runs, one core, Python {result['python']})\n\n"
        "| requests | engine steps | simulated s | wall s | requests / wall s | steps / wall s |\n"
        "|---:|---:|---:|---:|---:|---:|\n"
        f"| {args.requests} | {steps} | {result['simulated_s']:.0f} | {wall:.2f} | "
        f"{result['requests_per_wall_s']} | {result['steps_per_wall_s']} |\n\n"
        f"Chats (32-token prompt, 64 tokens out) in this run: TTFT p50 {result['chat_ttft_s']['p50'] * 1000:.1f} ms, "
        f"p99 {result['chat_ttft_s']['p99'] * 1000:.1f} ms; E2E p50 {result['chat_e2e_s']['p50']:.2f} s, "
        f"p99 {result['chat_e2e_s']['p99']:.2f} s.\n"
    )
    (RESULTS / "sim_des_speed.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
