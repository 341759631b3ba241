"""One slow instance in a fleet (issue 16, benchmark b): four simulators behind one gateway, one of
them 5x slower (its clock runs at a fifth of the others' speed), chats arriving open loop; chat
TTFT with and without the gateway's slow-host handling and hedging, against the same fleet all
healthy, side by side in one run.

Arms, each on fresh engines:
- `healthy`: four equal simulators, the default routing (the reference);
- `slow, round-robin`: one 5x slower, spread evenly (no slow-host handling);
- `slow, default`: the default routing, which weighs each backend's measured speed;
- `slow, default + hedging`: and hedging on for chats (quantile 0.95).

Per arm: chat TTFT P50/P99 and mean (wall ms), failures, and for hedging the share of requests
sent twice (`tailguard_hedges_total{outcome="sent"}` over the requests).

Target: chat P99 TTFT with the slow instance within 1.3x of the healthy fleet's.

    .venv/bin/python benchmarks/fleet_slow.py [--rate 24] [--seconds 20]

Writes benchmarks/results/fleet_slow.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import random
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tailguard.cli.experiment import free_port, spawned

sys.path.insert(0, str(Path(__file__).resolve().parent))
from open_loop import first_token  # noqa: E402  beside this script
from sim_des_speed import pct  # noqa: E402  one nearest-rank percentile for all

RESULTS = Path(__file__).resolve().parent / "results"
INSTANCES = 4
SLOTS = 8
TIME_SCALE = 0.5  # the healthy ones; the slow one runs at 5x this
SLOWDOWN = 5.0
PROMPT_CHARS = 2_000
MAX_TOKENS = 64
ARMS: dict[str, dict[str, Any]] = {
    "healthy": {"slow": False, "config": {}},
    "slow, round-robin": {"slow": True, "config": {"routing": {"policy": "round-robin"}}},
    "slow, default": {"slow": True, "config": {}},
    "slow, default + hedging": {"slow": True, "config": {"hedging": {"enabled": True}}},
}


@dataclass
class Sent:
    ttft: float | None = None
    error: str | None = None


async def one(session: aiohttp.ClientSession, url: str, prompt: str, at: float, t0: float, out: Sent) -> None:
    body = {"model": "tailguard-sim", "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS, "stream": True}
    out.ttft, out.error = await first_token(session, url, body, at, t0)


async def load(url: str, rate: float, seconds: float, seed: int) -> list[Sent]:
    rng = random.Random(seed)
    schedule, at = [], 0.0
    while at < seconds:
        at += rng.expovariate(rate)
        schedule.append(at)
    prompts = ["".join(rng.choice("abcdefgh ") for _ in range(PROMPT_CHARS)) for _ in schedule]
    out = [Sent() for _ in schedule]
    t0 = time.perf_counter() + 0.3
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(one(session, url, p, a, t0, s) for p, a, s in zip(prompts, schedule, out)))
    return out


@contextlib.asynccontextmanager
async def fleet(slow: bool, logs: Path) -> AsyncIterator[list[str]]:
    async with contextlib.AsyncExitStack() as stack:
        urls = []
        for i in range(INSTANCES):
            port = free_port()
            scale = TIME_SCALE * (SLOWDOWN if slow and i == INSTANCES - 1 else 1.0)
            args = ["sim", "--port", str(port), "--preset", "h100-llama8b", "--max-num-seqs", str(SLOTS),
                    "--time-scale", str(scale)]
            await stack.enter_async_context(spawned(args, f"http://127.0.0.1:{port}/health", logs / f"sim{i}.log"))
            urls.append(f"http://127.0.0.1:{port}")
        yield urls


async def hedges_sent(url: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("tailguard_hedges_total{") and 'outcome="sent"' in line)


async def run_arm(name: str, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    arm = ARMS[name]
    async with fleet(arm["slow"], logs) as urls:
        port = free_port()
        cfg = {"port": port, "access_log": False, **arm["config"],
               "backends": [{"name": f"sim{i}", "url": u, "max_concurrency": SLOTS} for i, u in enumerate(urls)]}
        path = logs / f"{name.replace(' ', '_').replace(',', '').replace('+', 'and')}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        url = f"http://127.0.0.1:{port}"
        async with spawned(["serve", "--config", str(path)], url + "/health", logs / f"{path.stem}.log"):
            await asyncio.sleep(1.0)
            sent = await load(url, args.rate, args.seconds, args.seed)
            hedges = await hedges_sent(url)
    ttft = [s.ttft for s in sent if s.ttft is not None and s.error is None]
    return {"requests": len(sent), "failed": sum(1 for s in sent if s.error is not None or s.ttft is None),
            "ttft_p50_ms": pct(ttft, 0.5) * 1000, "ttft_p99_ms": pct(ttft, 0.99) * 1000,
            "ttft_mean_ms": sum(ttft) / len(ttft) * 1000, "hedged_share": hedges / len(sent)}


async def main(args: argparse.Namespace) -> None:
    logs = RESULTS / "logs" / "fleet_slow"
    logs.mkdir(parents=True, exist_ok=True)
    runs = {}
    for name in ARMS:
        runs[name] = await run_arm(name, args, logs)
        print(name, json.dumps(runs[name]), flush=True)
    ref = runs["healthy"]["ttft_p99_ms"]
    verdicts = [f"{name}: chat P99 TTFT {r['ttft_p99_ms'] / ref:.2f}x the healthy fleet's (target <= 1.3x)"
                for name, r in runs.items() if name != "healthy"]
    lines = ["# One slow instance in a fleet", "",
             f"`.venv/bin/python benchmarks/fleet_slow.py --rate {args.rate} --seconds {args.seconds}` on "
             f"{platform.platform()}: {INSTANCES} simulators (h100-llama8b, {SLOTS} slots, time scale {TIME_SCALE}; "
             f"the slow one {SLOWDOWN:g}x slower), chats of ~{PROMPT_CHARS // 4} prompt and {MAX_TOKENS} output "
             "tokens, Poisson; TTFT in wall ms.", "",
             "| arm | TTFT P50 | P99 | mean | sent twice | failed |", "|---|---:|---:|---:|---:|---:|"]
    for name, r in runs.items():
        lines.append(f"| {name} | {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['ttft_mean_ms']:.0f} | "
                     f"{r['hedged_share']:.1%} | {r['failed']} of {r['requests']} |")
    lines += ["", *verdicts, ""]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fleet_slow.json").write_text(json.dumps({"machine": platform.platform(), "args": vars(args),
                                                         "runs": runs, "verdicts": verdicts}, indent=2))
    (RESULTS / "fleet_slow.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=24.0, help="chats per wall second, Poisson")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=11)
    asyncio.run(main(p.parse_args()))
