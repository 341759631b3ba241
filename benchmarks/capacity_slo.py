"""Capacity at an SLO on the seed mix (issue 30): the highest request rate at which chats get their
first token within 1 s for at least 99% of them (refused and failed chats count as misses), for
the engine alone and through the gateway, side by side, on the discrete-event simulator and over
HTTP (`tailguard bench --find-capacity interactive --capacity-slo ttft_s=1`, each a search of
open-loop runs: doubling to a bracket, then bisection to 5%).

Workload: the built-in `seed-mixed` (chats: short prompt, 32 tokens, class interactive; summaries:
2,048 tokens, class batch; Poisson). Engine: the simulator's H100 preset with 8 sequences. The
gateway: its defaults (batch preemptible, every slot open to it) with the operator's chat target
(`classes[].slo.ttft_s: 1`) and at most 8 requests on the engine. Over HTTP the simulator runs
`--time-scale` times slower than real time and the gateway's target and bounds are stretched by the
same factor; the bench reports in the simulator's seconds, so rates are simulated requests per
second on both parts, and their ratio is the figure.

Target: through the gateway at least 2x the engine alone.

    .venv/bin/python benchmarks/capacity_slo.py [--http] [--seconds 60] [--time-scale 4]

Writes benchmarks/results/capacity_slo.{json,md}; the HTTP searches' folders under
benchmarks/results/capacity_slo/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tailguard.bench.capacity import CapacitySearch
from tailguard.bench.workload import load_workload
from tailguard.cli.experiment import free_port, spawned
from tailguard.clock import VirtualClock
from tailguard.config import BackendConfig, GatewayConfig, SloConfig
from tailguard.front.front import Front
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import run
from tailguard.sim.engine import Engine
from tailguard.sim.scenario import Timeline
from tailguard.sweep.virtual import IntakeGate, Planned, plan
from tailguard.types import Outcome

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SLOTS = 8
PRESET = "h100-llama8b"
TTFT_S = 1.0
SHARE = 0.99
ENGINE = "engine"


def gateway_config(time_scale: float = 1.0, url: str = "http://127.0.0.1:1") -> GatewayConfig:
    """The gateway's defaults with chats held to a 1 s TTFT target, bounds stretched by `time_scale`."""
    base = GatewayConfig()
    classes = []
    for c in base.classes:
        update: dict[str, Any] = {"max_queue_wait_s": c.max_queue_wait_s * time_scale}
        if c.name == "interactive":
            update["slo"] = SloConfig(ttft_s=TTFT_S * time_scale)
        classes.append(c.model_copy(update=update))
    return GatewayConfig(classes=classes, backends=[BackendConfig(name=ENGINE, url=url, kind="sim",
                                                                  max_concurrency=SLOTS)])


# --- the DES ----------------------------------------------------------------------------------------

def requests(n: int, rate: float, seed: int) -> list[Planned]:
    workload, _ = load_workload("seed-mixed")
    rng = random.Random(seed)
    weights = [c.weight for c in workload.classes]
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        wc = rng.choices(workload.classes, weights)[0]
        assert wc.max_tokens is not None
        out.append(plan(f"{wc.name}-{i}", t, workload.endpoint, wc, wc.prompt_tokens.sample(rng), wc.max_tokens.sample(rng)))
    return out


def des_share(rate: float, through_gateway: bool, n: int, seed: int) -> tuple[float, float]:
    """Chats' share with a first token within 1 s, at `rate` requests/s of the mix, and the share
    of summaries that ended well (what holding chats to their target costs batch work)."""
    cfg = EngineConfig.from_preset(PRESET, max_num_seqs=SLOTS)
    gw = gateway_config()
    gate = IntakeGate(cfg, gw if through_gateway else None)
    front = Front(gw.front_params({ENGINE: True})) if through_gateway else None
    timelines = run(Engine(cfg), [gate.arrival(p) for p in requests(n, rate, seed)], VirtualClock(), front, gate=gate)
    chats = [tl for tl in timelines if tl.id.startswith("chat")]
    summaries = [tl for tl in timelines if not tl.id.startswith("chat")]
    return (sum(1 for tl in chats if _good(tl)) / len(chats),
            sum(1 for tl in summaries if tl.outcome is Outcome.SUCCESS) / max(1, len(summaries)))


def _good(tl: Timeline) -> bool:
    return (tl.outcome is Outcome.SUCCESS and tl.first_token_at is not None
            and tl.first_token_at - tl.arrived_at <= TTFT_S)


def des_search(through_gateway: bool, n: int, seed: int, start: float) -> dict[str, Any]:
    search = CapacitySearch(start, precision=0.02)
    batch: dict[float, float] = {}
    while (rate := search.next_rate()) is not None:
        share, batch[rate] = des_share(rate, through_gateway, n, seed)
        search.add(rate, share >= SHARE, valid=True, share=share)
        print("des", "gateway" if through_gateway else "straight", f"{rate:.3f}/s", f"{100 * share:.2f}%", flush=True)
    result = search.result()
    result["batch_ok_share_at_capacity"] = batch.get(result["capacity_per_s"])
    return result


# --- over HTTP --------------------------------------------------------------------------------------

async def http_search(label: str, args: argparse.Namespace, start: float) -> dict[str, Any]:
    logs = RESULTS / "logs" / "capacity_slo"
    logs.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "capacity_slo" / label
    sim_port = free_port()
    sim_url = f"http://127.0.0.1:{sim_port}"
    sim = ["sim", "--port", str(sim_port), "--preset", PRESET, "--max-num-seqs", str(SLOTS),
           "--time-scale", str(args.time_scale)]
    async with spawned(sim, sim_url + "/health", logs / f"{label}-sim.log"):
        url = sim_url
        if label == "gateway":
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            cfg = gateway_config(args.time_scale, sim_url).model_dump(mode="json", exclude_defaults=True)
            path = logs / "gateway.yaml"
            path.write_text(yaml.safe_dump({**cfg, "port": port, "access_log": False}))
            async with spawned(["serve", "--config", str(path)], url + "/health", logs / "gateway.log"):
                await asyncio.sleep(1.0)
                await _bench(url, out, args, start)
        else:
            await _bench(url, out, args, start)
    result: dict[str, Any] = json.loads((out / "capacity.json").read_text())
    return result


async def _bench(url: str, out: Path, args: argparse.Namespace, start: float) -> None:
    argv = [sys.executable, "-m", "tailguard", "bench", "--url", url, "--workload", "seed-mixed", "--out", str(out),
            "--rate", f"{start:.4g}", "--duration", str(args.seconds), "--time-scale", str(args.time_scale),
            "--find-capacity", "chat", "--capacity-slo", f"ttft_s={TTFT_S}", "--capacity-share", str(SHARE),
            "--seed", str(args.seed), "--max-dispatch-lag-ms", "20", "--quiet"]
    proc = await asyncio.create_subprocess_exec(*argv)
    await proc.wait()


def main() -> None:
    args = parse_args()
    des = {label: des_search(label == "gateway", args.des_requests, args.seed, 1.0) for label in ("straight", "gateway")}
    doc: dict[str, Any] = {"benchmark": "capacity_slo", "command": " ".join(["benchmarks/capacity_slo.py", *sys.argv[1:]]),
                           "slo": {"ttft_s": TTFT_S, "share": SHARE}, "preset": PRESET, "slots": SLOTS, "des": des,
                           "des_ratio": _ratio(des), "time_scale": args.time_scale, "python": platform.python_version()}
    if args.http:
        # The bench's rates are the simulator's (requests per simulated second); the search starts
        # low, at a quarter of the engine's DES capacity, and doubles to a bracket.
        start = des["straight"]["capacity_per_s"] / 4
        http = {label: asyncio.run(http_search(label, args, start)) for label in ("straight", "gateway")}
        doc["http"] = http
        doc["http_ratio"] = _ratio(http)
    write(doc)


def _ratio(runs: dict[str, Any]) -> dict[str, Any]:
    (sp, sf), (gp, gf) = runs["straight"]["bracket"], runs["gateway"]["bracket"]
    return {"ratio": gp / sp if gp and sp else None,
            "interval": [gp / sf if gp and sf else None, gf / sp if gf and sp else None]}


def write(doc: dict[str, Any]) -> None:
    (RESULTS / "capacity_slo.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = ["# Capacity at a chat TTFT target of 1 s for 99%, on the seed mix", "",
             f"`.venv/bin/python {doc['command']}`", "",
             f"One simulated engine ({PRESET}, {SLOTS} sequences); `seed-mixed` open loop. Capacity: the highest rate "
             "(requests/s of the whole mix) at which at least 99% of chats got a first token within 1 s, refused ones "
             "counting as misses; the bracket is [highest passing, lowest failing] rate.", ""]
    for part in ("des", "http"):
        runs = doc.get(part)
        if not runs:
            continue
        unit = "simulated" if part == "des" else f"simulated (time scale {doc['time_scale']:g})"
        lines += [f"## {'Discrete-event simulator' if part == 'des' else 'Over HTTP (tailguard bench --find-capacity)'}",
                  "", f"| path | capacity ({unit} requests/s) | bracket | steps | stopped |", "|---|---:|---|---:|---|"]
        for label, r in runs.items():
            lo, hi = r["bracket"]
            lines.append(f"| {label} | {r['capacity_per_s']:.3f} | [{_f(lo)}, {_f(hi)}] | {len(r['steps'])} | "
                         f"{r['stopped']} |")
        if part == "des":
            lines += ["", "Summaries that ended well at each path's capacity (the rest still queued at the end of the "
                      "run, or refused): " + ", ".join(f"{label} {100 * (r['batch_ok_share_at_capacity'] or 0):.0f}%"
                                                      for label, r in runs.items()) + "."]
        ratio = doc[f"{part}_ratio"]
        low, high = ratio["interval"]
        lines += ["", f"Through the gateway / the engine alone: {_f(ratio['ratio'])}x (between {_f(low)}x and "
                  f"{_f(high)}x by the brackets).", ""]
    (RESULTS / "capacity_slo.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--http", action="store_true", help="also over HTTP (bench --find-capacity, straight and through)")
    p.add_argument("--seconds", type=float, default=60.0, help="each HTTP step's sending time (wall)")
    p.add_argument("--time-scale", type=float, default=4.0, help="the simulator's wall seconds per second (HTTP)")
    p.add_argument("--des-requests", type=int, default=20000, help="requests of each DES step")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


if __name__ == "__main__":
    main()
