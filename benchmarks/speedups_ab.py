"""What the relay's C step (`tailguard._speedups`) saves in CPU time, side by side: two gateways
behind one simulator, one with the step and one on the Python fallback
(`TAILGUARD_NO_EXTENSIONS=1`), taking alternate requests of one open-loop Poisson load of
streamed 64-token chats. Both see the same moments of a shared machine, so their difference is
the step's; instruction counts (`gateway_profile.py`) say what it removes, this says what that
is worth in time.

    .venv/bin/python benchmarks/speedups_ab.py [--requests 4000] [--rate 130] [--rounds 2]

Writes benchmarks/results/speedups_ab.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from tailguard.cli.experiment import free_port, wait_healthy
from tailguard.speedups import speedups

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import RESULTS, TOKENS, cpu_seconds  # noqa: E402  beside this script

MODES = ("c", "python")
CONFIG = """\
port: {port}
backends:
  - {{name: sim, url: '{sim}', kind: sim, max_concurrency: 4096}}
classes:
  - {{name: interactive, rank: 0, max_queue_len: 100000}}
  - {{name: batch, rank: 1}}
"""


def start_gateway(tmp: Path, mode: str, sim_url: str) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    path = tmp / f"{mode}.yaml"
    path.write_text(CONFIG.format(port=port, sim=sim_url))
    env = dict(os.environ)
    if mode == "python":
        env["TAILGUARD_NO_EXTENSIONS"] = "1"
    proc = subprocess.Popen([sys.executable, "-m", "tailguard", "serve", "--config", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return f"http://127.0.0.1:{port}", proc


async def stream(session: aiohttp.ClientSession, url: str) -> None:
    body = {"model": "tailguard-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS, "stream": True}
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for _ in r.content.iter_any():
            pass


async def round_(session: aiohttp.ClientSession, urls: dict[str, str], pids: dict[str, int], n: int,
                 rate: float, seed: int) -> dict[str, dict[str, float]]:
    """`n` requests at `rate`, alternating between the two gateways; each one's CPU per request."""
    before = {m: cpu_seconds([pids[m]]) for m in MODES}
    rnd, start, at, tasks = random.Random(seed), time.perf_counter(), 0.0, []
    for i in range(n):
        at += rnd.expovariate(rate)
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(stream(session, urls[MODES[i % 2]])))
    await asyncio.gather(*tasks)
    out = {}
    for m in MODES:
        user, kernel = (a - b for a, b in zip(cpu_seconds([pids[m]]), before[m]))
        per = n / len(MODES)
        out[m] = {"user_ms": user / per * 1000, "kernel_ms": kernel / per * 1000,
                  "total_ms": (user + kernel) / per * 1000}
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="tg-speedups-"))
    sim_port = free_port()
    sim_url = f"http://127.0.0.1:{sim_port}"
    procs = [subprocess.Popen([sys.executable, "-m", "tailguard", "sim", "--port", str(sim_port), "--preset",
                               "h100-llama8b", "--max-num-seqs", "4096", "--time-scale", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        gateways = {m: start_gateway(tmp, m, sim_url) for m in MODES}
        procs += [p for _, p in gateways.values()]
        urls = {m: url for m, (url, _) in gateways.items()}
        for url, proc in ((sim_url, procs[0]), *gateways.values()):
            await wait_healthy(url + "/health", proc, 60)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await asyncio.gather(*(stream(session, urls[m]) for m in MODES for _ in range(20)))  # warm-up
            rounds = [await round_(session, urls, {m: p.pid for m, (_, p) in gateways.items()}, args.requests,
                                   args.rate, seed) for seed in range(args.rounds)]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
    return {"benchmark": "speedups_ab", "command": " ".join(["benchmarks/speedups_ab.py", *sys.argv[1:]]),
            "requests": args.requests, "rate": args.rate, "tokens": TOKENS, "load_average_1m": os.getloadavg()[0],
            "rounds": rounds}


def markdown(res: dict[str, Any]) -> str:
    lines = ["# The relay's C step in CPU time", "",
             f"`{res['command']}`: {res['requests']} streamed {res['tokens']}-token chats per round at "
             f"{res['rate']:g}/s, alternating between a gateway with the C step and one on the Python fallback, "
             f"behind one simulator; load average {res['load_average_1m']:.1f} at the end.", "",
             "| round | gateway | user ms/request | kernel ms/request | total ms/request | vs Python |",
             "|---:|---|---:|---:|---:|---:|"]
    for i, r in enumerate(res["rounds"], 1):
        for m in MODES:
            lines.append(f"| {i} | {m} | {r[m]['user_ms']:.3f} | {r[m]['kernel_ms']:.3f} | {r[m]['total_ms']:.3f} | "
                         f"{r[m]['total_ms'] / r['python']['total_ms']:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--rate", type=float, default=130.0)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    if speedups is None:
        sys.exit("tailguard._speedups is not built here (no compiler at install, or TAILGUARD_NO_EXTENSIONS set)")
    res = asyncio.run(run(args))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "speedups_ab.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / "speedups_ab.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
