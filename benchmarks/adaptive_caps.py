"""Adaptive against fixed in-flight caps across loads (issue 16, point 7), in the discrete-event run
and over HTTP.

The load mixes chats (`interactive`) with long batch jobs (`batch`, preemptible): what the gateway
protects. A cap too low loses throughput; one above what the engine runs at once hands the order
to the engine's FCFS queue, where a chat waits behind batch jobs. Arms: fixed caps below, at and
above the engine's batch size, and `adaptive` started low and started high.

- DES: an H100-class engine of 64 sequences (`sim.des` behind the front, which it tells each ended
  request's latency as the gateway does: `front.samples`), 60 simulated seconds of Poisson
  arrivals per offered rate; the cap's history read after every event (`sweep.caps`).
- HTTP: `tailguard sim` (8 sequences, time scale 2: the engine at half speed, so that two shared
  cores can offer it more than it serves) behind `tailguard serve --config` with each arm,
  open-loop Poisson load for `--seconds` wall seconds per offered rate; the cap read from /health.

Per arm and offered rate: requests served and output tokens per second within the arrivals'
window, chat TTFT P50/P99 (from the scheduled send), refusals, and for adaptive arms the cap's
mean and range over the second half of the run (DES) or the cap at its end (HTTP).

    .venv/bin/python benchmarks/adaptive_caps.py [--seconds 15] [--skip-http]

Writes benchmarks/results/adaptive_caps.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from tailguard.cli.experiment import free_port, spawned
from tailguard.clock import VirtualClock
from tailguard.front.adaptive import AdaptiveParams
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, FrontParams, default_classes
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import run
from tailguard.sim.engine import Engine
from tailguard.sim.scenario import Arrival, Timeline
from tailguard.sweep.caps import CapHistory

sys.path.insert(0, str(Path(__file__).resolve().parent))
from open_loop import Result, send  # noqa: E402  beside this script
from sim_des_speed import pct  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BATCH_SHARE = 0.2  # of requests

# --- DES --------------------------------------------------------------------------------------

DES_ENGINE = EngineConfig.from_preset("h100-llama8b", max_num_seqs=64)
DES_SECONDS = 60.0
DES_RATES = (7.5, 15.0, 30.0, 60.0)  # offered requests/s
# arm -> (the cap it starts at, adaptive or not)
DES_ARMS = {"fixed 16": (16, False), "fixed 64": (64, False), "fixed 128": (128, False),
            "adaptive from 4": (4, True), "adaptive from 128": (128, True)}


def des_arrivals(rate: float) -> list[Arrival]:
    rng = random.Random(7)
    out: list[Arrival] = []
    t = 0.0
    while (t := t + rng.expovariate(rate)) < DES_SECONDS:
        batch = rng.random() < BATCH_SHARE
        out.append(Arrival(f"r{len(out)}", t, rng.randint(100, 1500), rng.randint(500, 1500) if batch
                           else rng.randint(50, 300), cls="batch" if batch else "interactive"))
    return out


def des_run(start: int, adaptive: bool, rate: float) -> dict[str, Any]:
    spec = BackendSpec("engine", max_concurrency=start, continues=True,
                       adaptive=AdaptiveParams(min_cap=1, max_cap=256) if adaptive else None)
    front = Front(FrontParams(classes=default_classes(), backends=[spec]))
    caps = CapHistory("engine")
    tls = run(Engine(DES_ENGINE), des_arrivals(rate), VirtualClock(), front, watch=caps.watch)
    out = des_figures(tls)
    if adaptive:
        out["cap_mean_2nd_half"] = caps.mean(DES_SECONDS / 2, DES_SECONDS)
        out["cap_range_2nd_half"] = caps.range(DES_SECONDS / 2, DES_SECONDS)
    return out


def des_figures(tls: list[Timeline]) -> dict[str, Any]:
    done = [t for t in tls if t.finished_at is not None and t.output_tokens]
    chat_ttft = [t.ttft_s for t in done if t.cls == "interactive" and t.ttft_s is not None]
    within = [t for t in done if t.finished_at is not None and t.finished_at <= DES_SECONDS]
    return {"served_per_s": len(within) / DES_SECONDS,
            "output_tokens_per_s": sum(t.output_tokens for t in within) / DES_SECONDS,
            "chat_ttft_p50_s": pct(chat_ttft, 0.5) if chat_ttft else None,
            "chat_ttft_p99_s": pct(chat_ttft, 0.99) if chat_ttft else None,
            "chats_served": len(chat_ttft), "batch_served": sum(1 for t in done if t.cls == "batch"),
            "refused": sum(1 for t in tls if t.reject_reason is not None)}


def des_part() -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for rate in DES_RATES:
        for arm, (start, adaptive) in DES_ARMS.items():
            key = f"{arm} @ {rate:g}/s"
            runs[key] = des_run(start, adaptive, rate)
            print("des", key, json.dumps(runs[key]), flush=True)
    return runs


# --- HTTP -------------------------------------------------------------------------------------

HTTP_SLOTS = 8
HTTP_SCALE = 2.0
HTTP_RATES = (5.0, 15.0, 30.0)  # offered requests/s
HTTP_ARMS = {"fixed 4": (4, False), "fixed 8": (8, False), "fixed 32": (32, False),
             "adaptive from 2": (2, True), "adaptive from 32": (32, True)}
CHAT_TOKENS, BATCH_TOKENS = 32, 256


def gateway_yaml(sim_url: str, port: int, start: int, adaptive: bool) -> str:
    lines = [f"port: {port}", "backends:", "  - name: sim", f"    url: {sim_url}", "    kind: sim",
             f"    max_concurrency: {start}"]
    if adaptive:
        lines.append("    adaptive: {min: 1, max: 64}")
    return "\n".join(lines) + "\n"


async def http_offer(url: str, rate: float, seconds: float) -> dict[str, Any]:
    rng = random.Random(7)
    out: list[Result] = []
    t0 = time.perf_counter() + 0.2
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=seconds + 120)) as s:
        tasks, at = [], 0.0
        while (at := at + rng.expovariate(rate)) < seconds:
            batch = rng.random() < BATCH_SHARE
            tasks.append(asyncio.create_task(send(s, url, "batch" if batch else "interactive",
                                                  BATCH_TOKENS if batch else CHAT_TOKENS, at, t0, out)))
        await asyncio.gather(*tasks)
        async with s.get(url + "/health") as r:
            cap = (await r.json())["backends"]["sim"]["cap"]
    ok = [r for r in out if r.status == 200 and r.error is None]
    within = [r for r in ok if r.end is not None and r.scheduled + r.end <= seconds]
    chat_ttft = [r.ttft for r in ok if r.cls == "interactive" and r.ttft is not None]
    return {"served_per_s": len(within) / seconds, "output_tokens_per_s": sum(r.tokens for r in within) / seconds,
            "chat_ttft_p50_s": pct(chat_ttft, 0.5) if chat_ttft else None,
            "chat_ttft_p99_s": pct(chat_ttft, 0.99) if chat_ttft else None,
            "chats_served": len(chat_ttft), "batch_served": sum(1 for r in ok if r.cls == "batch"),
            "refused": sum(1 for r in out if r.status in (429, 503)), "cap_at_end": cap}


async def http_part(seconds: float) -> dict[str, Any]:
    logs = RESULTS / "logs" / "adaptive_caps"
    logs.mkdir(parents=True, exist_ok=True)
    sim_port = free_port()
    sim_url = f"http://127.0.0.1:{sim_port}"
    sim = ["sim", "--port", str(sim_port), "--preset", "h100-llama8b", "--max-num-seqs", str(HTTP_SLOTS),
           "--time-scale", str(HTTP_SCALE)]
    runs: dict[str, Any] = {}
    async with spawned(sim, sim_url + "/health", logs / "sim.log"):
        for rate in HTTP_RATES:
            for arm, (start, adaptive) in HTTP_ARMS.items():
                port = free_port()
                cfg = logs / f"{arm.replace(' ', '-')}.yaml"
                cfg.write_text(gateway_yaml(sim_url, port, start, adaptive))
                url = f"http://127.0.0.1:{port}"
                args = ["serve", "--config", str(cfg), "--state-dir", str(logs / "state")]
                async with spawned(args, url + "/health", logs / f"{arm.replace(' ', '-')}-gateway.log"):
                    key = f"{arm} @ {rate:g}/s"
                    runs[key] = await http_offer(url, rate, seconds)
                    print("http", key, json.dumps(runs[key]), flush=True)
    return runs


# --- the report -------------------------------------------------------------------------------

def write(args: argparse.Namespace, des: dict[str, Any], http: dict[str, Any]) -> None:
    doc = {"benchmark": "adaptive_caps", "command": " ".join(["benchmarks/adaptive_caps.py", *sys.argv[1:]]),
           "des": des, "http": http, "python": platform.python_version()}
    (RESULTS / "adaptive_caps.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = ["# Adaptive against fixed in-flight caps", "", f"`.venv/bin/python {doc['command']}`", "",
             f"Chats ({100 * (1 - BATCH_SHARE):.0f}%) and preemptible batch jobs, Poisson arrivals at the offered "
             "rate (arm @ requests/s). Served/s and tokens/s: what finished within the arrivals' window; chats and "
             "batch jobs: how many were served in all (the queue drains after the window); chat TTFT from the "
             "scheduled send.", "",
             f"## DES: an H100-class engine of 64 sequences, {DES_SECONDS:g} simulated s per rate", "",
             *table(des, "cap (2nd half: mean, range)"), "",
             f"## HTTP: `tailguard sim` of {HTTP_SLOTS} sequences at time scale {HTTP_SCALE:g}, "
             f"{args.seconds:g} wall s per rate", "",
             *(table(http, "cap at the end") if http else ["(skipped)"])]
    (RESULTS / "adaptive_caps.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def table(runs: dict[str, Any], cap_head: str) -> list[str]:
    out = [f"| arm @ offered | served/s | tokens/s | chat TTFT P50 | chat TTFT P99 | chats | batch jobs | refused | "
           f"{cap_head} |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, r in runs.items():
        cap = "-"
        if "cap_mean_2nd_half" in r:
            lo, hi = r["cap_range_2nd_half"]
            cap = f"{r['cap_mean_2nd_half']:.1f} ({lo}-{hi})"
        elif "cap_at_end" in r and key.startswith("adaptive"):
            cap = str(r["cap_at_end"])
        out.append(f"| {key} | {r['served_per_s']:.1f} | {r['output_tokens_per_s']:.0f} | {_f(r['chat_ttft_p50_s'])} | "
                   f"{_f(r['chat_ttft_p99_s'])} | {r['chats_served']} | {r['batch_served']} | {r['refused']} | {cap} |")
    return out


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=15.0, help="wall seconds per HTTP rate")
    p.add_argument("--skip-http", action="store_true")
    return p.parse_args()


def main(args: argparse.Namespace) -> None:
    des = des_part()
    http = {} if args.skip_http else asyncio.run(http_part(args.seconds))
    write(args, des, http)


if __name__ == "__main__":
    main(parse_args())
