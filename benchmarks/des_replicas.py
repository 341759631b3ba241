"""Several gateway replicas sharing one engine's `max_concurrency` on virtual time
(`sim.replicas`): one gateway with the whole cap, then N replicas each with its own front sharing
the cap by slot allotments (as `gateway.shared.slots` leases them in Redis), and N replicas each
with the whole cap alone (no `state.url`). Reported: the most requests the engine had at once
(against the cap), TTFT P50 and P99, and the allotment renewals per simulated second. Poisson
arrivals of chats on the H100 preset's cost model; the load balancer sends them in turn.
Writes benchmarks/results/des_replicas.{json,md}.

    .venv/bin/python benchmarks/des_replicas.py [--requests 4000] [--rate 4] [--cap 8]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_des_speed import pct  # noqa: E402  one nearest-rank percentile for all

from tailguard.front.params import BackendSpec, ClassSpec, FrontParams  # noqa: E402
from tailguard.sim.cost import EngineConfig  # noqa: E402
from tailguard.sim.scenario import Arrival  # noqa: E402
from tailguard.sim.engine import Engine  # noqa: E402
from tailguard.sim.replicas import run_replicas  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def arrivals(n: int, rate: float, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        out.append(Arrival(f"r{i}", t, rng.randint(100, 1500), rng.randint(20, 400)))
    return out


def arm(args: argparse.Namespace, replicas: int, shared: bool) -> dict[str, Any]:
    params = FrontParams(classes=[ClassSpec(name="interactive", max_queue_len=100_000, max_queue_wait_s=3600)],
                         backends=[BackendSpec("engine", max_concurrency=args.cap)])
    engine = Engine(EngineConfig.from_preset("h100-llama8b"))
    given = arrivals(args.requests, args.rate, args.seed)
    t0 = time.process_time()
    run = run_replicas(engine, given, params, replicas, shared=shared, lease_s=args.lease_s)
    cpu = time.process_time() - t0
    ttft = [tl.first_token_at - tl.arrived_at for tl in run.timelines if tl.first_token_at is not None]
    span = max(tl.finished_at or 0.0 for tl in run.timelines)
    return {"replicas": replicas, "shared": shared, "most in the engine at once": run.most_in_engine,
            "served": len(ttft), "TTFT p50 (s)": statistics.median(ttft), "TTFT p99 (s)": pct(ttft, 0.99),
            "renewals per simulated second": run.renewals / span, "run CPU (s)": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--rate", type=float, default=4.0, help="arrivals per simulated second, over all replicas")
    ap.add_argument("--cap", type=int, default=8, help="the backend's max_concurrency")
    ap.add_argument("--lease-s", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    arms = [arm(args, 1, False), arm(args, 2, True), arm(args, 3, True), arm(args, 2, False), arm(args, 3, False)]
    doc = {"benchmark": "des_replicas", "command": " ".join(["benchmarks/des_replicas.py", *sys.argv[1:]]),
           "machine": platform.platform(), "args": vars(args), "arms": arms}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "des_replicas.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    lines = [f"# des_replicas\n\n`{doc['command']}`: {args.requests} chats at {args.rate}/s (simulated), "
             f"`max_concurrency: {args.cap}`, lease {args.lease_s} s, H100 preset\n",
             "| replicas | slots | most in the engine | served | TTFT P50 (s) | TTFT P99 (s) | renewals / s |",
             "|---|---|---|---|---|---|---|"]
    for a in arms:
        how = "shared (allotments)" if a["shared"] else ("the whole cap" if a["replicas"] == 1 else "each the whole cap")
        lines.append(f"| {a['replicas']} | {how} | {a['most in the engine at once']} | {a['served']} | "
                     f"{a['TTFT p50 (s)']:.3f} | {a['TTFT p99 (s)']:.3f} | {a['renewals per simulated second']:.1f} |")
    text = "\n".join(lines) + "\n"
    (RESULTS / "des_replicas.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
