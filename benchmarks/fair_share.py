"""One caller flooding at 5x its share against three well-behaved callers, with and without
token-fair sharing (`scheduler.fair_share`, VTC), in the discrete-event simulator and over HTTP
(the real gateway in front of the real simulator, in process, on loopback).

What fair sharing (on by default once two callers are named) costs when nobody floods: the
three alone with it on (`solo, fair_share`), and one caller alone sending what the three send
together, with and without it (`one caller`: its TTFT and E2E, suspensions, and the DES's own run
time, which is the front's CPU).

Each well-behaved caller sends `rate` chats a second (Poisson), the flood `5 x rate`; one
preemptible class, one engine of `slots` sequences behind a gateway cap of `slots`. Runs: the
three alone (their baseline), then with the flood under plain ranked-sjf, under VTC as the paper
has it (no credit, no preemption), and under fair_share's defaults (a returning caller's credit,
fair-share preemption). What is compared: the well-behaved callers' TTFT (P50, P99) against their
baseline, what the flood is served, and how many requests were suspended. Prints and writes
benchmarks/results/fair_share.{json,md}.

    cd benchmarks && ../.venv/bin/python fair_share.py [--seconds 600] [--http-seconds 60] [--rate 1.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from tailguard.clock import VirtualClock
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, CallerSpec, ClassSpec, FrontParams, QueueParams
from tailguard.config import GatewayConfig
from tailguard.gateway.http.app import create_app, gateway_runner
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import run
from tailguard.sim.scenario import Arrival
from tailguard.sim.engine import Engine
from tailguard.sim.server import running_sim
from tailguard.wire.sse import SSEDecoder

from sim_des_speed import pct  # beside this script: one nearest-rank percentile for all benchmarks

RESULTS = Path(__file__).resolve().parent / "results"
CALLERS = ("w1", "w2", "w3")
FLOOD = "flood"
PROMPT, OUTPUT = 512, 128
WAIT_S = 1e5  # the class's queue bound: long enough that the flood queues rather than is refused
VTC = {"fair_share": True, "fair_credit": 0.0, "fair_preempt_gap": None}  # as the paper has it
# (label, with the flood, scheduler settings)
RUNS: tuple[tuple[str, bool, dict[str, Any]], ...] = (
    ("solo", False, {}), ("solo, fair_share", False, {"fair_share": True}), ("flood, ranked-sjf", True, {}),
    ("flood, fair_share as VTC", True, VTC), ("flood, fair_share", True, {"fair_share": True}))


def load(seconds: float, rate: float, flood: bool, seed: int,
         callers: tuple[str, ...] = CALLERS) -> list[tuple[float, str]]:
    """(instant, caller) of every request, Poisson per caller, seeded."""
    rng = random.Random(seed)
    out: list[tuple[float, str]] = []
    for caller, r in [(c, rate) for c in callers] + ([(FLOOD, 5 * rate)] if flood else []):
        t = rng.expovariate(r)
        while t < seconds:
            out.append((t, caller))
            t += rng.expovariate(r)
    return sorted(out)


def engine_cfg(slots: int) -> EngineConfig:
    return EngineConfig.from_preset("h100-llama8b", max_num_seqs=slots, max_model_len=4096, kv_cache_tokens=262144)


def summary(ttft: dict[str, list[float]], seconds: float, suspended: int, last_end: float) -> dict[str, Any]:
    """`last_end`: when the last request ended (engine seconds), what suspensions cost in all."""
    good = [v for c in CALLERS for v in ttft.get(c, [])]
    return {"well_behaved_ttft_p50_s": pct(good, 0.5), "well_behaved_ttft_p99_s": pct(good, 0.99),
            "well_behaved_served": len(good), "flood_served_per_s": len(ttft.get(FLOOD, [])) / seconds,
            "suspended": suspended, "last_end_s": last_end}


def des(args: argparse.Namespace, flood: bool, settings: dict[str, Any]) -> dict[str, Any]:
    front = Front(FrontParams(
        classes=[ClassSpec(name="interactive", max_queue_len=100_000, max_queue_wait_s=WAIT_S, preemptible=True)],
        backends=[BackendSpec("engine", max_concurrency=args.slots, continues=True)],
        queue=QueueParams(**settings), callers=[CallerSpec(c) for c in (*CALLERS, FLOOD)]))
    arrivals = [Arrival(f"{c}-{i}", at=t, prompt_tokens=PROMPT, max_tokens=OUTPUT, caller=c)
                for i, (t, c) in enumerate(load(args.seconds, args.rate, flood, args.seed))]
    ttft: dict[str, list[float]] = {}
    waits: list[float] = []  # the well-behaved's TTFT, its part in the gateway's queue ...
    engine: list[float] = []  # ... and its part from dispatch to first token (engine queue, prefill)
    timelines = run(Engine(engine_cfg(args.slots)), arrivals, VirtualClock(), front)
    for tl in timelines:
        if tl.ttft_s is not None and tl.arrived_at >= args.seconds * 0.1:  # past the warm-up
            caller = tl.id.split("-")[0]
            ttft.setdefault(caller, []).append(tl.ttft_s)
            if caller != FLOOD and tl.dispatched_at is not None and tl.first_token_at is not None:
                waits.append(tl.dispatched_at - tl.arrived_at)
                engine.append(tl.first_token_at - tl.dispatched_at)
    out = summary(ttft, args.seconds * 0.9, sum(tl.suspensions for tl in timelines),
                  max(tl.finished_at or 0.0 for tl in timelines))
    return out | {"well_behaved_queue_wait_p99_s": pct(waits, 0.99), "well_behaved_engine_p99_s": pct(engine, 0.99)}


def one_caller(args: argparse.Namespace, settings: dict[str, Any]) -> dict[str, Any]:
    """One caller alone, sending what the three well-behaved send together, in the DES: its TTFT
    and E2E past the warm-up, the suspensions, and the wall time of the run (the front's CPU)."""
    front = Front(FrontParams(
        classes=[ClassSpec(name="interactive", max_queue_len=100_000, max_queue_wait_s=WAIT_S, preemptible=True)],
        backends=[BackendSpec("engine", max_concurrency=args.slots, continues=True)],
        queue=QueueParams(**settings), callers=[CallerSpec(c) for c in (*CALLERS, FLOOD)]))
    arrivals = [Arrival(f"{c}-{i}", at=t, prompt_tokens=PROMPT, max_tokens=OUTPUT, caller=c) for i, (t, c) in
                enumerate(load(args.seconds, args.rate * len(CALLERS), False, args.seed, callers=CALLERS[:1]))]
    started = time.process_time()
    timelines = run(Engine(engine_cfg(args.slots)), arrivals, VirtualClock(), front)
    cpu_s = time.process_time() - started
    kept = [tl for tl in timelines if tl.ttft_s is not None and tl.arrived_at >= args.seconds * 0.1]
    e2e = [tl.finished_at - tl.arrived_at for tl in kept if tl.finished_at is not None]
    return {"ttft_p50_s": pct([tl.ttft_s for tl in kept if tl.ttft_s is not None], 0.5),
            "ttft_p99_s": pct([tl.ttft_s for tl in kept if tl.ttft_s is not None], 0.99),
            "e2e_p99_s": pct(e2e, 0.99), "served": len(kept), "suspended": sum(tl.suspensions for tl in timelines),
            "cpu_s": cpu_s, "cpu_us_per_request": cpu_s / len(arrivals) * 1e6}


def two_clients(settings: dict[str, Any]) -> float:
    """VTC's two-client case (the artifact's): client a at 1.5 requests a second, b at 3, both
    backlogged on an engine that serves about 2 (4 sequences, 256 + 256 tokens each) for 300 s;
    the ratio of service (prompt + 2 x output tokens) given to b and to a, between 30 s and 270 s."""
    front = Front(FrontParams(
        classes=[ClassSpec(name="interactive", max_queue_len=100_000, max_queue_wait_s=WAIT_S, preemptible=True)],
        backends=[BackendSpec("engine", max_concurrency=4, continues=True)],
        queue=QueueParams(**settings), callers=[CallerSpec("a"), CallerSpec("b")]))
    arrivals = sorted([Arrival(f"a-{i}", at=i / 1.5, prompt_tokens=256, max_tokens=256, caller="a") for i in range(450)]
                      + [Arrival(f"b-{i}", at=i / 3.0, prompt_tokens=256, max_tokens=256, caller="b") for i in range(900)],
                      key=lambda a: a.at)
    cfg = EngineConfig.from_preset("h100-llama8b", max_num_seqs=4, max_model_len=4096, kv_cache_tokens=65536)
    served = {"a": 0, "b": 0}
    for tl in run(Engine(cfg), arrivals, VirtualClock(), front):
        if tl.finished_at is not None and 30.0 <= tl.finished_at <= 270.0:
            served[tl.id[0]] += tl.prompt_tokens + 2 * tl.output_tokens
    return served["b"] / served["a"]


async def one(s: aiohttp.ClientSession, url: str, caller: str, due: float, t0: float, scale: float,
              ttft: dict[str, list[float]], warm: float) -> None:
    """One chat sent at `due`; its TTFT kept if it was sent past the warm-up (`warm`)."""
    await asyncio.sleep(max(0.0, t0 + due * scale - time.monotonic()))
    body = {"model": "tailguard-sim", "messages": [{"role": "user", "content": "x " * (PROMPT - 8)}], "max_tokens": OUTPUT,
            "stream": True}
    async with s.post(url, json=body, headers={"Authorization": f"Bearer sk-{caller}"}) as r:
        if r.status != 200:
            await r.read()
            return
        dec = SSEDecoder()
        async for chunk in r.content.iter_any():
            for ev in dec.feed(chunk):
                if b'"content":"' in ev.data and b'"content":""' not in ev.data:
                    if due >= warm:
                        ttft.setdefault(caller, []).append((time.monotonic() - t0) / scale - due)
                    await r.read()
                    return


async def http(args: argparse.Namespace, flood: bool, settings: dict[str, Any]) -> dict[str, Any]:
    scale, seconds = args.time_scale, args.http_seconds
    ttft: dict[str, list[float]] = {}
    async with running_sim(engine_cfg(args.slots), time_scale=scale) as sim:
        cfg = GatewayConfig.model_validate({
            "port": 0, "access_log": False,
            "classes": [{"name": "interactive", "rank": 0, "max_queue_len": 100_000, "max_queue_wait_s": WAIT_S,
                         "preemptible": True}],
            "scheduler": {"fair_share": False, **settings},  # named: four callers would turn it on
            "auth": {"api_keys": {f"sk-{c}": {"name": c} for c in (*CALLERS, FLOOD)}},
            "backends": [{"name": "sim", "url": sim.url, "kind": "sim", "max_concurrency": args.slots}]})
        app = create_app(cfg)
        runner = gateway_runner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        try:
            conn = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=conn) as s:
                t0 = time.monotonic()
                await asyncio.gather(*(one(s, url, c, t, t0, scale, ttft, seconds * 0.1)
                                       for t, c in load(seconds, args.rate, flood, args.seed)
                                       if t >= 0))
                last_end = (time.monotonic() - t0) / scale
                suspended = await preemptions(s, f"http://127.0.0.1:{port}/metrics")
        finally:
            await runner.cleanup()
    return summary(ttft, seconds * 0.9, suspended, last_end)


async def preemptions(s: aiohttp.ClientSession, url: str) -> int:
    """The gateway's own count of suspensions (`tailguard_preemptions_total`, every label)."""
    async with s.get(url, headers={"Authorization": f"Bearer sk-{FLOOD}"}) as r:
        text = await r.text()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("tailguard_preemptions_total")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600.0, help="simulated seconds of the DES runs")
    ap.add_argument("--http-seconds", type=float, default=60.0, help="engine seconds of the HTTP runs (0: none)")
    ap.add_argument("--time-scale", type=float, default=1.0,
                    help="wall seconds per engine second over HTTP (below 1, the one process running gateway, "
                    "engine and clients falls behind on a small machine)")
    ap.add_argument("--rate", type=float, default=1.5, help="chats a second of each well-behaved caller")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    runs: dict[str, Any] = {}
    for label, flood, settings in RUNS:
        runs[f"des: {label}"] = des(args, flood, settings)
        print(f"des: {label}", json.dumps(runs[f"des: {label}"]), flush=True)
    for label, settings in (("ranked-sjf", {}), ("fair_share as VTC", VTC), ("fair_share", {"fair_share": True})):
        runs[f"des: two clients, {label}"] = {"service_ratio": two_clients(settings)}
        print(f"des: two clients, {label}", json.dumps(runs[f"des: two clients, {label}"]), flush=True)
    for label, settings in (("ranked-sjf", {}), ("fair_share", {"fair_share": True})):
        runs[f"des: one caller, {label}"] = one_caller(args, settings)
        print(f"des: one caller, {label}", json.dumps(runs[f"des: one caller, {label}"]), flush=True)
    if args.http_seconds > 0:
        for label, flood, settings in RUNS:
            runs[f"http: {label}"] = asyncio.run(http(args, flood, settings))
            print(f"http: {label}", json.dumps(runs[f"http: {label}"]), flush=True)
    write(args, runs)


def write(args: argparse.Namespace, runs: dict[str, Any]) -> None:
    doc = {"benchmark": "fair_share", "command": " ".join(["benchmarks/fair_share.py", *sys.argv[1:]]),
           "machine": platform.platform(), "load_average": os.getloadavg(), "args": vars(args), "runs": runs}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fair_share.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    lines = [f"# fair_share\n\n`{doc['command']}` ({doc['machine']}, load average at the end "
             f"{' '.join(f'{x:.1f}' for x in doc['load_average'])})\n",
             f"Three callers at {args.rate:g} chats/s each ({PROMPT}-token prompts, {OUTPUT} output tokens), "
             f"a fourth at 5x that; one engine of {args.slots} sequences (h100-llama8b), gateway cap {args.slots}, "
             "one preemptible class. `fair_share as VTC`: `fair_credit: 0`, `fair_preempt_gap: null`; "
             "`fair_share`: its defaults.\n",
             "| run | well-behaved TTFT P50 (s) | P99 (s) | P99 / solo | well-behaved served | flood served / s "
             "| suspended | last request ended (s) |",
             "|---|---|---|---|---|---|---|---|"]
    ratios = [(name, r["service_ratio"]) for name, r in runs.items() if "service_ratio" in r]
    ones = [(name, r) for name, r in runs.items() if "cpu_s" in r]
    for name, r in runs.items():
        if "service_ratio" in r or "cpu_s" in r:
            continue
        solo = runs[name.split(":")[0] + ": solo"]["well_behaved_ttft_p99_s"]
        lines.append(f"| {name} | {r['well_behaved_ttft_p50_s']:.3f} | {r['well_behaved_ttft_p99_s']:.3f} | "
                     f"{r['well_behaved_ttft_p99_s'] / solo:.2f}x | {r['well_behaved_served']} | "
                     f"{r['flood_served_per_s']:.2f} | {r['suspended']} | {r['last_end_s']:.1f} |")
    lines += ["", "Where the well-behaved callers' TTFT goes in the DES (P99 of each part apart): waiting in the "
              "gateway's queue, and from dispatch to the first token (the engine's queue and prefill).", "",
              "| run | queue wait P99 (s) | dispatch to first token P99 (s) |", "|---|---|---|"]
    lines += [f"| {name} | {r['well_behaved_queue_wait_p99_s']:.3f} | {r['well_behaved_engine_p99_s']:.3f} |"
              for name, r in runs.items() if "well_behaved_queue_wait_p99_s" in r]
    lines += ["", "VTC's two-client case (the artifact's: a at 1.5 requests/s, b at 3, both backlogged on an engine "
              "serving about 2; 256 + 256 tokens each): service given to b over that given to a (1: fair).", "",
              "| run | service ratio b / a |", "|---|---|"]
    lines += [f"| {name} | {ratio:.2f} |" for name, ratio in ratios]
    lines += ["", f"One caller alone at {args.rate * len(CALLERS):g} chats/s (the three's load together), in the DES: "
              "what fair sharing costs it. CPU: the process time of the whole DES run (engine model and front).", "",
              "| run | TTFT P50 (s) | TTFT P99 (s) | E2E P99 (s) | served | suspended | CPU (s) | CPU per request (us) |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {name} | {r['ttft_p50_s']:.3f} | {r['ttft_p99_s']:.3f} | {r['e2e_p99_s']:.3f} | {r['served']} | "
              f"{r['suspended']} | {r['cpu_s']:.2f} | {r['cpu_us_per_request']:.0f} |" for name, r in ones]
    (RESULTS / "fair_share.md").write_text("\n".join(lines) + "\n")

if __name__ == "__main__":
    main()
