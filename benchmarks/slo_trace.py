"""Goodput at a TTFT SLO on a production trace (issue 30): Azure's conversation trace (arrival
times, prompt and output lengths kept; benchmarks/data/README.md for its CC-BY 4.0 attribution)
over four simulated engines at 1.5x and 2x their capacity, side by side in one run:

- `round-robin`: straight to the engines, each request to the next one (no gateway);
- `smg`: SGLang's model gateway (`smg launch`, its default `cache_aware` policy; HTTP only);
- `today`: tailguard as it was before SLOs (git revision `--baseline-rev` over HTTP; on the DES this
  tree with `classes[].slo` off, which orders and refuses exactly as that revision did), its
  quick form: four backends, `max_concurrency` the engines' sequences;
- `tailguard`: this tree's quick form: the default interactive TTFT target (2 s), deadline
  admission, EDF, shedding by cost (docs/slo.md).

The measure is the share of all requests sent whose first token came within 2 s of their
scheduled send (refused and failed requests count as missed): goodput at the SLO, DistServe's
measure with the issue's target. Also the refused share and the TTFT percentiles of the requests
that got a first token.

Engines: the simulator's A100 Llama-8B preset, 16 sequences each, context 16,384. Capacity is the
fleet's: the requests per second four engines complete for this trace's mix when every request
arrives at once (read between the 10th and 90th percentile of completions, on the DES), and the
trace is replayed at the speed that offers 1.5x and 2x that rate. The DES runs the same arms on
virtual time (smg aside); over HTTP the engines run `--time-scale` times slower than real time, and
the gateways' bounds and targets are stretched by the same factor, so every figure is in the
engines' seconds.

    .venv/bin/python benchmarks/slo_trace.py [--trace PATH] [--limit 2000] [--factors 1.5,2] [--http]

`--trace` reads a published file (default: Azure's conversation hour in benchmarks/data, of which
`--limit` keeps the first 2,000 requests, about 7 minutes), read as `tailguard bench --trace`
reads it (`bench/trace/`). Writes benchmarks/results/slo_trace.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tailguard.bench.trace.formats import read_trace
from tailguard.cli.experiment import free_port, spawned, stop_process, wait_healthy
from tailguard.clock import VirtualClock
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams, RoutingParams, default_classes
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import run_fleet
from tailguard.sim.engine import Engine
from tailguard.sim.scenario import Arrival, Host, Timeline
from tailguard.types import Outcome

sys.path.insert(0, str(Path(__file__).resolve().parent))
from open_loop import Result, send  # noqa: E402  beside this script
from revisions import baseline_tree  # noqa: E402
from sim_des_speed import pct  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TRACE = HERE / "data" / "azure_llm_2023_conv.csv"  # the whole hour; the first 2,000 by default
ENGINES = 4
SEQS = 16
PRESET = "a100-llama8b"
MAX_MODEL_LEN = 16384
SLO_S = 2.0  # the TTFT target, and the default interactive one
MODEL = "tailguard-sim"  # what the engines serve and the requests name (smg routes by it; `send` names it)
WAIT_S = 10.0  # the interactive queue bound (both gateways)


@dataclass(frozen=True, slots=True)
class Request:
    at: float  # seconds from the trace's first request
    prompt_tokens: int
    output_tokens: int


def load_trace(path: Path, limit: int | None) -> list[Request]:
    """Azure's LLM inference trace CSV through the bench's own reader (`bench.trace.read_trace`:
    sorted by arrival, each instant from the first): the first `limit` requests, their prompt and
    output lengths (an output of 0 made 1)."""
    rows = read_trace(path, "azure").requests[:limit]
    return [Request(r.at, max(1, r.input_tokens), max(1, r.output_tokens)) for r in rows]


def engine_config() -> EngineConfig:
    return EngineConfig.from_preset(PRESET, max_num_seqs=SEQS, max_model_len=MAX_MODEL_LEN)


# --- the DES ----------------------------------------------------------------------------------------

def des_front(arm: str) -> Front:
    """The front of `arm`, as its gateway would build it (`round-robin`: no cap that ever binds,
    no bound: the DES's twin of sending straight to the engines in turn)."""
    backends = [BackendSpec(f"sim{i}", max_concurrency=SEQS if arm != "round-robin" else 1 << 30)
                for i in range(ENGINES)]
    if arm == "round-robin":
        patient = ClassSpec("interactive", max_queue_wait_s=1e9, max_queue_len=1 << 30)
        return Front(FrontParams([patient], backends, routing=RoutingParams(policy="round-robin")))
    classes = default_classes()
    if arm == "today":
        classes = [replace(c, slo=None) for c in classes]
    return Front(FrontParams(classes, backends))


def des_run(trace: list[Request], speed: float, arm: str) -> list[Timeline]:
    arrivals = [Arrival(f"r{i}", r.at / speed, r.prompt_tokens, r.output_tokens) for i, r in enumerate(trace)]
    hosts = [Host(f"sim{i}", Engine(engine_config())) for i in range(ENGINES)]
    return run_fleet(hosts, arrivals, VirtualClock(), des_front(arm))


def capacity(trace: list[Request]) -> float:
    """Requests per second the fleet completes for this mix with every request there at once."""
    burst = [replace(r, at=0.0) for r in trace]
    done = sorted(tl.finished_at for tl in des_run(burst, 1.0, "round-robin") if tl.finished_at is not None)
    lo, hi = int(0.1 * len(done)), int(0.9 * len(done))
    return (hi - lo) / (done[hi] - done[lo])


def des_figures(timelines: list[Timeline], wall_s: float) -> dict[str, Any]:
    ttft = [tl.first_token_at - tl.arrived_at for tl in timelines if tl.first_token_at is not None]
    refused = sum(1 for tl in timelines if tl.outcome is Outcome.REJECTED)
    reasons: dict[str, int] = {}
    for tl in timelines:
        if tl.outcome is Outcome.REJECTED:
            reasons[str(tl.reject_reason)] = reasons.get(str(tl.reject_reason), 0) + 1
    return summary(len(timelines), ttft, sum(1 for t in ttft if t <= SLO_S), refused, reasons) | {"wall_s": wall_s}


def summary(sent: int, ttft: list[float], good: int, refused: int, reasons: dict[str, int]) -> dict[str, Any]:
    return {"sent": sent, "within_slo": good, "within_slo_share": good / sent, "refused": refused,
            "refused_share": refused / sent, "refused_by_reason": reasons,
            "ttft_p50_s": pct(ttft, 0.5) if ttft else None, "ttft_p99_s": pct(ttft, 0.99) if ttft else None}


# --- over HTTP --------------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def simulators(logs: Path, label: str, time_scale: float) -> AsyncIterator[list[str]]:
    async with contextlib.AsyncExitStack() as stack:
        urls = []
        for i in range(ENGINES):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            await stack.enter_async_context(spawned(
                ["sim", "--port", str(port), "--preset", PRESET, "--max-num-seqs", str(SEQS),
                 "--max-model-len", str(MAX_MODEL_LEN), "--time-scale", str(time_scale), "--model-name", MODEL],
                f"{url}/health", logs / f"{label}-sim{i}.log"))
            urls.append(url)
        yield urls


def gateway_yaml(urls: list[str], port: int, time_scale: float, targets: bool) -> dict[str, Any]:
    """The quick form's config, its interactive bound (and target) in wall seconds."""
    interactive: dict[str, Any] = {"name": "interactive", "rank": 0, "max_queue_wait_s": WAIT_S * time_scale}
    if targets:
        interactive["slo"] = {"ttft_s": SLO_S * time_scale}
    return {"port": port, "access_log": False,
            "classes": [interactive, {"name": "batch", "rank": 1, "max_queue_len": 10000, "max_queue_wait_s": 600.0,
                                      "preemptible": True, "max_tokens_cap": 4096}],
            "backends": [{"name": f"sim{i}", "url": u, "kind": "sim", "max_concurrency": SEQS}
                         for i, u in enumerate(urls)]}


@contextlib.asynccontextmanager
async def router(arm: str, urls: list[str], logs: Path, time_scale: float, old_src: Path) -> AsyncIterator[list[str]]:
    """Where `arm` sends: the engines themselves, smg, or a tailguard gateway (today's or this one)."""
    if arm == "round-robin":
        yield urls
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if arm == "smg":
        exe = Path(sys.executable).with_name("smg")
        # Its metrics on a port of its own (29000 by default: another smg on the machine may hold it).
        argv = [str(exe), "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", "cache_aware",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--worker-urls", *urls]
        with open(logs / "smg.log", "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                await wait_healthy(f"{url}/health", proc, timeout_s=60)
                await workers_known(url)
                yield [url]
            finally:
                stop_process(proc)
        return
    path = logs / f"{arm}.yaml"
    path.write_text(yaml.safe_dump(gateway_yaml(urls, port, time_scale, targets=arm == "tailguard")))
    env = {"PYTHONPATH": str(old_src)} if arm == "today" else None
    async with spawned(["serve", "--config", str(path)], f"{url}/health", logs / f"{arm}-gateway.log", env):
        await asyncio.sleep(1.0)  # the first probes: kinds and models known
        yield [url]


async def workers_known(url: str) -> None:
    """Until smg lists the engines' model (it finds its workers' models after its health check)."""
    async with aiohttp.ClientSession() as s:
        for _ in range(120):
            with contextlib.suppress(aiohttp.ClientError):
                async with s.get(url + "/v1/models") as r:
                    if r.status == 200 and MODEL in await r.text():
                        return
            await asyncio.sleep(0.5)
    raise RuntimeError("smg never listed the engines' model")


async def offer(targets: list[str], trace: list[Request], speed: float, time_scale: float) -> list[Result]:
    """Every request of `trace` at its instant (over `speed`, stretched by `time_scale`), open loop,
    streamed; request i goes to targets[i % len(targets)]."""
    out: list[Result] = []
    t0 = time.perf_counter() + 0.5
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600.0)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        await asyncio.gather(*(
            send(session, targets[i % len(targets)], "interactive", r.output_tokens, r.at / speed * time_scale, t0,
                 out, prompt="x" * (4 * max(1, r.prompt_tokens - 4)))
            for i, r in enumerate(trace)))
    return out


def http_figures(results: list[Result], time_scale: float) -> dict[str, Any]:
    ttft = [r.ttft / time_scale for r in results if r.ttft is not None and r.error is None]
    refused = [r for r in results if r.status in (429, 503)]
    reasons: dict[str, int] = {}
    for r in refused:
        reasons[r.reason or "?"] = reasons.get(r.reason or "?", 0) + 1
    out = summary(len(results), ttft, sum(1 for t in ttft if t <= SLO_S), len(refused), reasons)
    lags = [r.lag for r in results if r.lag is not None]
    out["failed"] = sum(1 for r in results if r.error is not None and r.status not in (429, 503))
    out["dispatch_lag_p99_ms"] = 1000 * pct(lags, 0.99) if lags else None
    return out


async def http_arms(args: argparse.Namespace, trace: list[Request], cap: float, rate: float,
                    arms: list[str]) -> dict[str, Any]:
    logs = RESULTS / "logs" / "slo_trace"
    logs.mkdir(parents=True, exist_ok=True)
    runs: dict[str, Any] = {}
    with baseline_tree(args.baseline_rev) as old_src:
        for factor in args.factors:
            speed = factor * cap / rate
            for arm in arms:
                async with simulators(logs, arm, args.time_scale) as urls:
                    async with router(arm, urls, logs, args.time_scale, old_src) as targets:
                        results = await offer(targets, trace, speed, args.time_scale)
                key = f"{arm}@{factor:g}x"
                runs[key] = http_figures(results, args.time_scale)
                print("http", key, json.dumps(runs[key]), flush=True)
    return runs


# --- the run ----------------------------------------------------------------------------------------

def ratios(runs: dict[str, Any], factors: list[float], arms: list[str]) -> dict[str, Any]:
    """tailguard's goodput over each other arm's, per factor."""
    out: dict[str, Any] = {}
    for f in factors:
        ours = runs.get(f"tailguard@{f:g}x")
        if ours is None:
            continue
        for arm in arms:
            theirs = runs.get(f"{arm}@{f:g}x")
            if arm != "tailguard" and theirs is not None and theirs["within_slo_share"] > 0:
                out[f"tailguard/{arm}@{f:g}x"] = ours["within_slo_share"] / theirs["within_slo_share"]
    return out


def main() -> None:
    args = parse_args()
    trace = load_trace(Path(args.trace), args.limit or None)
    rate = len(trace) / (trace[-1].at - trace[0].at)
    cap = capacity(trace)
    print(f"{len(trace)} requests at {rate:.2f}/s; the fleet's capacity {cap:.2f}/s", flush=True)
    des_arms = ["round-robin", "today", "tailguard"]
    des: dict[str, Any] = {}
    for factor in args.factors:
        for arm in des_arms:
            t = time.perf_counter()
            timelines = des_run(trace, factor * cap / rate, arm)
            des[f"{arm}@{factor:g}x"] = des_figures(timelines, round(time.perf_counter() - t, 1))
            print("des", f"{arm}@{factor:g}x", json.dumps(des[f"{arm}@{factor:g}x"]), flush=True)
    http_arm_names = ["round-robin", "smg", "today", "tailguard"]
    http = asyncio.run(http_arms(args, trace, cap, rate, http_arm_names)) if args.http else {}
    doc = {"benchmark": "slo_trace", "command": " ".join(["benchmarks/slo_trace.py", *sys.argv[1:]]),
           "trace": str(args.trace), "requests": len(trace), "trace_rate_per_s": rate, "capacity_per_s": cap,
           "slo_s": SLO_S, "engines": ENGINES, "seqs": SEQS, "preset": PRESET, "time_scale": args.time_scale,
           "baseline_rev": args.baseline_rev, "des": des, "des_ratios": ratios(des, args.factors, des_arms),
           "http": http, "http_ratios": ratios(http, args.factors, http_arm_names),
           "python": platform.python_version()}
    write(doc, args)


def write(doc: dict[str, Any], args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = ["# Goodput at a 2 s TTFT target on Azure's conversation trace", "",
             f"`.venv/bin/python {doc['command']}`", "",
             f"{doc['requests']} requests of `{Path(doc['trace']).name}` (trace rate {doc['trace_rate_per_s']:.2f}/s) "
             f"over {ENGINES} simulated engines ({PRESET}, {SEQS} sequences each); the fleet completes "
             f"{doc['capacity_per_s']:.2f} requests/s of this mix, and the trace is replayed at the factors below of "
             f"that rate. `within 2 s`: the share of all requests sent whose first token came within 2 s of their "
             f"scheduled send (refused ones missed). Over HTTP the engines ran at time scale {doc['time_scale']:g}, "
             f"figures in the engines' seconds; `today` is revision {doc['baseline_rev']}.", ""]
    for part in ("des", "http"):
        runs = doc[part]
        if not runs:
            continue
        lines += [f"## {'Discrete-event simulator' if part == 'des' else 'Over HTTP'}", "",
                  "| arm | within 2 s | refused | TTFT P50 | TTFT P99 | refused by reason |",
                  "|---|---:|---:|---:|---:|---|"]
        for key, r in runs.items():
            lines.append(f"| {key} | {100 * r['within_slo_share']:.1f}% | {100 * r['refused_share']:.1f}% | "
                         f"{_f(r['ttft_p50_s'])} s | {_f(r['ttft_p99_s'])} s | "
                         f"{', '.join(f'{k} {v}' for k, v in sorted(r['refused_by_reason'].items())) or '-'} |")
        lines += ["", "Ratios of the share within 2 s: " + ", ".join(
            f"{k} {v:.2f}x" for k, v in doc[f"{part}_ratios"].items()), ""]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default=str(TRACE), help="an Azure LLM inference trace CSV (default: the one in benchmarks/data)")
    p.add_argument("--limit", type=int, default=2000, help="replay only the first N requests (0: all of them)")
    p.add_argument("--factors", type=lambda s: [float(x) for x in s.split(",")], default=[1.5, 2.0])
    p.add_argument("--http", action="store_true", help="also over HTTP (four simulators, smg, two gateways)")
    p.add_argument("--time-scale", type=float, default=2.0, help="the simulators' wall seconds per second (HTTP)")
    p.add_argument("--baseline-rev", default="81317f0", help="`today`: main before SLOs (git revision)")
    p.add_argument("--out", default=str(RESULTS / "slo_trace"), help="output path without extension")
    return p.parse_args()


if __name__ == "__main__":
    main()
