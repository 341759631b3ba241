"""The seed's head-of-line blocking, reproduced with `tailguard bench` straight at the simulator.

16 closed-loop clients (the seed's thread pool) send the built-in `seed-mixed` workload (mostly
32-token chats, some 2048-token summaries) to `tailguard sim --preset h100-llama8b
--max-num-seqs 8`, run in its own process and time-scaled so the whole run takes about a minute.
Latencies are simulated seconds (wall seconds / time scale): what a user of an H100 would see.

    .venv/bin/python benchmarks/seed_hol.py [--requests 1500] [--time-scale 0.2] [--clients 16]

Writes the bench folder benchmarks/results/seed_hol/ (summary.json, requests.jsonl, report.html)
and benchmarks/results/seed_hol.md, and prints the chats' P50 and P99 end-to-end latency.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from tailguard.bench.load import BenchConfig, Timeouts

from tailguard.bench.run import run_bench
from tailguard.bench.report import write_outputs
from tailguard.bench.table import ProgressDisplay
from tailguard.cli.experiment import free_port, stop_process, wait_healthy

RESULTS = Path(__file__).resolve().parent / "results"
TAILGUARD = str(Path(sys.executable).with_name("tailguard"))


async def main(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [TAILGUARD, "sim", "--port", str(port), "--preset", "h100-llama8b", "--max-num-seqs", "8",
           "--time-scale", str(args.time_scale)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    console = Console()
    try:
        await wait_healthy(url + "/health", proc)
        config = BenchConfig(url=url, workload=args.workload, concurrency=args.clients, requests=args.requests,
                             warmup_requests=args.warmup, seed=args.seed, time_scale=args.time_scale,
                             timeouts=Timeouts(first_token_s=600, total_s=600))
        t0 = time.perf_counter()
        console.print(f"[bold]seed_hol[/]: {' '.join(cmd[1:])}; {args.clients} clients, {args.requests} requests")
        with ProgressDisplay(console) as show:
            result = await run_bench(config, progress=show)
        wall_s = time.perf_counter() - t0
    finally:
        stop_process(proc)
    out = RESULTS / "seed_hol"
    summary = write_outputs(result, out, console=console)
    chat = summary["classes"]["chat"]["e2e_s"]
    md = markdown(args, summary, wall_s, cmd)
    (RESULTS / "seed_hol.md").write_text(md)
    console.print(f"chat E2E P50 {chat['p50']:.3f} s, P99 {chat['p99']:.3f} s "
                  f"(P99/P50 {chat['p99'] / chat['p50']:.1f}x), simulated seconds; wall {wall_s:.0f} s")
    console.print(f"wrote {RESULTS / 'seed_hol.md'} and {out}/")
    return summary


def _f(v: float | None, digits: int = 3) -> str:
    return "fail" if v is None else f"{v:.{digits}f}"


def markdown(args: argparse.Namespace, s: dict[str, Any], wall_s: float, cmd: list[str]) -> str:
    lines = [
        "# The seed's head-of-line blocking, measured with `tailguard bench`",
        "",
        f"`.venv/bin/python benchmarks/seed_hol.py --requests {args.requests} --time-scale {args.time_scale} "
        f"--clients {args.clients}`",
        "",
        f"Simulator: `{' '.join(['tailguard', *cmd[1:]])}` (own process). Bench: `seed-mixed`, closed loop, "
        f"{args.clients} clients, {args.requests} measured requests after {args.warmup} warm-up, seed {args.seed}. "
        f"Times are simulated seconds (wall / {args.time_scale}); the run took {wall_s:.0f} s of wall time on "
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}, Python {platform.python_version()}), "
        f"shared with other work (1-minute load average {os.getloadavg()[0]:.1f} at the end).",
        "",
        "| class | count | ok | E2E p50 s | E2E p90 s | E2E p99 s | E2E max s | E2E p99/p50 | TTFT p50 s | TTFT p99 s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, g in [*s["classes"].items(), ("overall", s["overall"])]:
        e, t = g["e2e_s"], g["ttft_s"]
        ratio = g["tail_ratio"]["e2e_s"]
        ci = ratio["ci95"]
        lines.append(
            f"| {name} | {g['count']} | {g['ok']} | {_f(e['p50'])} | {_f(e['p90'])} | {_f(e['p99'])} | {_f(e['max'])} "
            f"| {_f(ratio['p99_over_p50'], 1)} ({_f(ci[0], 1)}-{_f(ci[1], 1)}) | {_f(t['p50'])} | {_f(t['p99'])} |"
            if ci else
            f"| {name} | {g['count']} | {g['ok']} | {_f(e['p50'])} | {_f(e['p90'])} | {_f(e['p99'])} | {_f(e['max'])} "
            f"| {_f(ratio['p99_over_p50'], 1)} | {_f(t['p50'])} | {_f(t['p99'])} |"
        )
    v = s["validity"]
    lines += [
        "",
        f"Throughput: {_f(s['throughput']['requests_per_s'], 2)} requests/s, "
        f"{_f(s['throughput']['output_tokens_per_s'], 0)} output tokens/s (simulated). "
        f"Run {'valid' if v['valid'] else 'INVALID'}: dispatch lag P99 {(v['dispatch_lag_p99_s'] or 0) * args.time_scale * 1000:.2f} ms wall.",
        "",
        "A chat that finds a free slot among the 8 finishes in a few hundred milliseconds; one that arrives while "
        "summaries hold every slot waits for a summary to finish, many seconds. The P99/P50 ratio (with its bootstrap "
        "95% interval) is that head-of-line blocking. Report: `benchmarks/results/seed_hol/report.html`.",
        "",
    ]
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=1500)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--time-scale", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workload", default="seed-mixed", help="a built-in name or a YAML file (to try other mixes)")
    return p.parse_args()


if __name__ == "__main__":
    import uvloop

    uvloop.run(main(parse_args()))
