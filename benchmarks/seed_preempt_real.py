"""The seed experiment on real processes, with and without preemption: the simulator
(`h100-llama8b`, max_num_seqs 8, time_scale 0.25) straight, through the gateway with its defaults
(batch preemptible, every slot open to it), and through the gateway without preemption (batch
max_share 0.875, min_share 0.75: the reservation that was the default before). Closed loop,
`seed-mixed`, 16 clients; the arms run one after another in one go, on the same seed.

    .venv/bin/python benchmarks/seed_preempt_real.py [--duration-s 40] [--clients 16]

Writes benchmarks/results/seed_preempt_real.{json,md}. Times are simulated seconds (the bench
converts them). The machine is shared: compare arms within one run, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from tailguard.bench.workload import load_workload
from tailguard.cli.experiment import Arm, SimSpec, run_arms

RESULTS = Path(__file__).resolve().parent / "results"
NO_PREEMPT = {
    "scheduler": {"preemption": False},
    "classes": [
        {"name": "interactive", "rank": 0},
        {"name": "batch", "rank": 1, "max_tokens_cap": 4096, "max_queue_len": 10000, "max_queue_wait_s": 600,
         "max_share": 0.875, "min_share": 0.75},
    ],
}


def figures(summary: dict[str, Any], chat: str, batch: str) -> dict[str, float | None]:
    c, b = summary["classes"][chat], summary["classes"][batch]
    return {
        "chat_ttft_p99_s": c["ttft_s"]["p99"], "chat_e2e_p50_s": c["e2e_s"]["p50"], "chat_e2e_p99_s": c["e2e_s"]["p99"],
        "chat_p99_over_p50": c["tail_ratio"]["e2e_s"]["p99_over_p50"],
        "batch_e2e_p99_s": b["e2e_s"]["p99"],
        "output_tokens_per_s": summary["overall"]["throughput"]["output_tokens_per_s"],
        "errors": summary["overall"]["errors"] + summary["overall"]["timeouts"],
    }


def verdict(st: dict[str, Any], g: dict[str, Any]) -> dict[str, tuple[float, bool]]:
    a = st["chat_ttft_p99_s"] / g["chat_ttft_p99_s"]
    b = g["chat_p99_over_p50"]
    c = g["output_tokens_per_s"] / st["output_tokens_per_s"]
    d = g["batch_e2e_p99_s"] / st["batch_e2e_p99_s"]
    return {"a": (a, a >= 5), "b": (b, b <= 3), "c": (c, c >= 0.9), "d": (d, d <= 1.25)}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=40.0)
    ap.add_argument("--warmup-s", type=float, default=4.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--time-scale", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "seed_preempt_real"))
    ap.add_argument("--runs-dir", default="/tmp/seed_preempt_real-runs", help="per-arm bench output (large)")
    args = ap.parse_args()
    workload, _ = load_workload("seed-mixed")
    by_cls = {c.headers["X-Tailguard-Class"]: c.name for c in workload.classes}
    chat, batch = by_cls["interactive"], by_cls["batch"]
    arms = [
        Arm("straight"),
        Arm("preempt", gateway=True, config={}),
        Arm("no-preempt", gateway=True, config=NO_PREEMPT),
    ]
    sim = SimSpec(time_scale=args.time_scale)
    load = {"workload": "seed-mixed", "concurrency": args.clients, "duration_s": args.duration_s,
            "warmup_s": args.warmup_s, "seed": args.seed}
    out = Path(args.out)
    summaries = asyncio.run(run_arms(arms, sim, load, Path(args.runs_dir)))
    res = {label: figures(s, chat, batch) for label, s in summaries.items()}
    lines = [
        "# Seed experiment on real processes: preemption on and off",
        "",
        f"`.venv/bin/python benchmarks/seed_preempt_real.py --duration-s {args.duration_s:g} --clients {args.clients}`",
        "",
        f"Simulator `h100-llama8b`, max_num_seqs 8, time_scale {args.time_scale}; closed loop, {args.clients} clients, "
        f"`seed-mixed`, {args.duration_s:g} s wall per arm ({args.warmup_s:g} s warm-up), seed {args.seed}; "
        f"{os.cpu_count()} CPUs, shared. Latencies as `tailguard bench` reports them for the simulator (`time_scale`)."
        "",
        "| arm | chat TTFT p99 s | chat E2E p50 s | chat E2E p99 s | chat p99/p50 | batch E2E p99 s | output tok/s | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, f in res.items():
        lines.append(f"| {label} | {f['chat_ttft_p99_s']:.3f} | {f['chat_e2e_p50_s']:.3f} | {f['chat_e2e_p99_s']:.3f} | "
                     f"{f['chat_p99_over_p50']:.2f} | {f['batch_e2e_p99_s']:.2f} | {f['output_tokens_per_s']:.0f} | "
                     f"{f['errors']} |")
    lines += ["", "| arm | a: TTFT P99 lower by | b: P99/P50 | c: tokens/s | d: batch P99 | met |",
              "|---|---:|---:|---:|---:|---:|"]
    for label in ("preempt", "no-preempt"):
        v = verdict(res["straight"], res[label])
        lines.append(f"| {label} | {v['a'][0]:.1f}x | {v['b'][0]:.2f} | {v['c'][0]:.0%} | {v['d'][0]:.2f}x | "
                     f"{''.join(k for k, (_, ok) in v.items() if ok) or '-'} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps({"args": vars(args), "arms": res}, indent=2) + "\n")
    Path(f"{out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
