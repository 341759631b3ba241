"""Routing by predicted TTFT against prefix affinity and least tokens (issue 30, point 4), on the
discrete-event simulator: four A100 engines (16 sequences, prefix cache on), one of them three
times slower in half the runs, chats whose prompts share one of twelve 3,000-token system prompts
(`shared`) or share nothing (`unique`), Poisson at 6 and 10 requests/s. The front is the gateway's
(`routing.policy`: `prefix-affinity`, the default; `predicted-ttft`; `least-tokens`), each engine's
cap its sequences, no target or bound that refuses anything: only where requests go differs.

    .venv/bin/python benchmarks/slo_routing.py [--requests 4000]

Writes benchmarks/results/slo_routing.{json,md}. TTFT in simulated seconds, from arrival.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
from pathlib import Path
from typing import Any

from tailguard.clock import VirtualClock
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams, RoutingParams
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import run_fleet
from tailguard.sim.engine import Engine
from tailguard.sim.kv import prefix_block_hashes
from tailguard.sim.scenario import Arrival, Host

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_des_speed import pct  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
POLICIES = ("prefix-affinity", "predicted-ttft", "least-tokens")
ENGINES = 4
SEQS = 16
SYSTEM_TOKENS = 3000


def arrivals(rate: float, n: int, shared: bool, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        out_tokens = rng.choice((32, 128, 256))
        if shared:
            blocks = prefix_block_hashes(f"system-{rng.randrange(12)}", SYSTEM_TOKENS)
            out.append(Arrival(f"r{i}", t, SYSTEM_TOKENS + rng.randint(50, 400), out_tokens, block_hashes=blocks))
        else:
            out.append(Arrival(f"r{i}", t, rng.randint(200, 3000), out_tokens))
    return out


def one(policy: str, slow: float, shared: bool, rate: float, n: int, seed: int) -> dict[str, Any]:
    cfg = EngineConfig.from_preset("a100-llama8b", max_num_seqs=SEQS, enable_prefix_caching=True,
                                   kv_cache_tokens=120_000)
    hosts = [Host(f"b{i}", Engine(cfg.slowed(slow) if i == 0 else cfg)) for i in range(ENGINES)]
    front = Front(FrontParams([ClassSpec("interactive", max_queue_wait_s=1e6, max_queue_len=1 << 30)],
                              [BackendSpec(h.name, max_concurrency=SEQS) for h in hosts],
                              routing=RoutingParams(policy=policy)))  # type: ignore[arg-type]
    timelines = run_fleet(hosts, arrivals(rate, n, shared, seed), VirtualClock(), front)
    ttft = [tl.first_token_at - tl.arrived_at for tl in timelines if tl.first_token_at is not None]
    cached = sum(tl.cached_tokens or 0 for tl in timelines) / sum(tl.prompt_tokens for tl in timelines)
    return {"ttft_mean_s": sum(ttft) / len(ttft), "ttft_p50_s": pct(ttft, 0.5), "ttft_p99_s": pct(ttft, 0.99),
            "cached_share": cached}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    runs: dict[str, Any] = {}
    for slow in (1.0, 3.0):
        for shared in (True, False):
            for rate in (6.0, 10.0):
                for policy in POLICIES:
                    key = f"{'slow host' if slow != 1.0 else 'even'} {'shared' if shared else 'unique'} {rate:g}/s {policy}"
                    runs[key] = one(policy, slow, shared, rate, args.requests, args.seed)
                    print(key, json.dumps(runs[key]), flush=True)
    doc = {"benchmark": "slo_routing", "command": " ".join(["benchmarks/slo_routing.py", *sys.argv[1:]]),
           "runs": runs, "python": platform.python_version()}
    (RESULTS / "slo_routing.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = ["# Routing by predicted TTFT, on the discrete-event simulator", "", f"`.venv/bin/python {doc['command']}`",
             "", f"{ENGINES} A100 engines ({SEQS} sequences, prefix cache on; `slow host`: one of them 3x slower), "
             f"{args.requests} chats per run. TTFT from arrival, simulated seconds; `cached`: the share of prompt "
             "tokens the engines' prefix caches served.", "",
             "| run | TTFT mean | P50 | P99 | cached |", "|---|---:|---:|---:|---:|"]
    for key, r in runs.items():
        lines.append(f"| {key} | {r['ttft_mean_s']:.3f} | {r['ttft_p50_s']:.3f} | {r['ttft_p99_s']:.3f} | "
                     f"{100 * r['cached_share']:.0f}% |")
    (RESULTS / "slo_routing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
