"""How much a running batch adds to chat TTFT at the engine itself, on virtual time (issue 20's
"interactive P99 TTFT with the batch running within 1.1x of chats alone"): no CPU, no sockets,
so what is left is what the engine's steps and the front's decisions cost a chat.

The same setup as `batch_capacity.py`: engine `h100-llama8b` with 16 sequences, the gateway's
front with its default classes (batch preemptible) and 16 slots. Chats: Poisson arrivals of
`chat-only` requests (64-192 prompt tokens, max_tokens 32, class interactive). The batch: lines
of ~136 prompt and 64 output tokens in class `batch`, kept coming as the batch runner keeps them
(a line ends, the next is sent; `ahead` more wait in the front's queue). Runs: chats alone, then
with the batch allowed every slot, then with `classes[batch].max_share` leaving slots free, then
with `classes[batch].start_interval_s` spacing the lines' starts (`--paces`, simulated ms). Last,
the floor: what a chat's TTFT cannot go below while a batch keeps the engine busy, from the
engine's cost model alone (`floor`).

    .venv/bin/python benchmarks/batch_interference_des.py [--chats 20000] [--rate 4] [--seed 0]

Writes benchmarks/results/batch_interference_des.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from tailguard.bench.workload import Workload
from tailguard.clock import VirtualClock
from tailguard.front.front import Front
from tailguard.config import BackendConfig, GatewayConfig
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import run
from tailguard.sim.scenario import Arrival, Timeline
from tailguard.sim.engine import Engine
from tailguard.sweep.virtual import IntakeGate, plan
from tailguard.types import Outcome

RESULTS = Path(__file__).resolve().parent / "results"
SEQS = 16
AHEAD = 2  # `batches.ahead`: lines waiting in the front's queue besides those running
WORKLOAD = Workload.model_validate({"name": "batch-interference", "classes": [
    {"name": "chat", "weight": 1.0, "prompt_tokens": {"dist": "uniform", "low": 64, "high": 192}, "max_tokens": 32,
     "headers": {"X-Tailguard-Class": "interactive"}},
    {"name": "line", "weight": 0.0, "prompt_tokens": 136, "max_tokens": 64, "headers": {"X-Tailguard-Class": "batch"}},
]})
CHAT, LINE = WORKLOAD.classes


def gateway(batch_share: float, pace_s: float = 0.0) -> GatewayConfig:
    base = GatewayConfig()
    classes = [c.model_copy(update={"max_share": batch_share, "start_interval_s": pace_s}) if c.name == "batch" else c
               for c in base.classes]
    backend = BackendConfig(name="engine", url="http://127.0.0.1:1", kind="sim", max_concurrency=SEQS)
    return GatewayConfig(classes=classes, backends=[backend])


class Lines:
    """The batch's lines as the runner sends them: the next one the moment one ends."""

    def __init__(self, gate: IntakeGate) -> None:
        self.gate, self.sent = gate, 0

    def __call__(self, at: float) -> Arrival:
        self.sent += 1
        return self.gate.arrival(plan(f"line-{self.sent}", at, "chat", LINE, 136, 64), at)


def one_run(chats: int, rate: float, seed: int, batch_share: float | None, pace_s: float = 0.0) -> dict[str, Any]:
    """`chats` Poisson chats; with `batch_share`, a batch that never runs out of lines, allowed
    that share of the slots (None: no batch)."""
    cfg = EngineConfig.from_preset("h100-llama8b", max_num_seqs=SEQS)
    gw = gateway(batch_share if batch_share is not None else 1.0, pace_s)
    front = Front(gw.front_params({"engine": True}))
    gate = IntakeGate(cfg, gw)
    rng = random.Random(seed)
    arrivals, t = [], 1.0
    for i in range(chats):
        t += rng.expovariate(rate)
        arrivals.append(gate.arrival(plan(f"chat-{i}", t, "chat", CHAT, CHAT.prompt_tokens.sample(rng), 32)))
    end = t
    line = Lines(gate)

    def follow_up(tl: Timeline, now: float) -> Arrival | None:
        return line(now) if tl.cls == "batch" and now < end else None

    if batch_share is not None:
        arrivals = [line(0.0) for _ in range(SEQS + AHEAD)] + arrivals
    t0 = time.perf_counter()
    timelines = run(Engine(cfg), arrivals, VirtualClock(), front, follow_up=follow_up, gate=gate)
    wall = time.perf_counter() - t0
    chat = [tl for tl in timelines if tl.id.startswith("chat-")]
    ok = [tl.ttft_s for tl in chat if tl.outcome is Outcome.SUCCESS and tl.ttft_s is not None]
    lines = [tl for tl in timelines if tl.id.startswith("line-") and tl.outcome is Outcome.SUCCESS
             and tl.finished_at is not None and 1.0 <= tl.finished_at <= end]
    ms = [x * 1000 for x in ok]
    return {"batch_share": batch_share, "pace_s": pace_s, "batch_slots": None if batch_share is None else int(SEQS * batch_share),
            "chats": len(chat), "chat_errors": len(chat) - len(ok),
            "chat_ttft_ms": {"p50": float(np.percentile(ms, 50)), "p90": float(np.percentile(ms, 90)),
                             "p99": float(np.percentile(ms, 99)), "max": max(ms)},
            "batch_output_tokens_per_s": sum(tl.output_tokens for tl in lines) / (end - 1.0),
            "suspensions": sum(tl.suspensions for tl in timelines), "wall_s": round(wall, 1)}


def floor(share: float, n: int = 1_000_000, seed: int = 0) -> dict[str, float]:
    """Chat TTFT (ms) on an engine a batch keeps busy at `share` of its output, with the best
    placement of the lines' prefills any front could make: one line's prefill (136 tokens) in a
    step at most, and never in the chat's own step. The batch needs `share * SEQS / 64` line
    starts per step; a chat arriving at a random instant (Poisson) lands in a step chosen by its
    length, waits for its rest, then runs its own prefill step beside the batch's decodes. Other
    chats are left out (they add the same with the batch or without), so this is a lower bound
    for what the discrete-event runs can show."""
    c = EngineConfig.from_preset("h100-llama8b", max_num_seqs=SEQS).cost
    rng = np.random.default_rng(seed)
    decodes = SEQS * share
    kv = decodes * (136 + 64 // 2)  # each line's context, halfway through its output
    decode_s = c.step_time(0, decodes, kv)
    prefill_s = decode_s + c.b_s_per_prefill_token * 136
    starts = share * SEQS / 64  # line starts per step
    in_prefill = starts * prefill_s / (starts * prefill_s + (1 - starts) * decode_s)  # length-biased
    step = np.where(rng.random(n) < in_prefill, prefill_s, decode_s)
    prompt = rng.integers(64, 193, n)
    own = c.step_time(0, decodes, kv) + c.b_s_per_prefill_token * prompt  # the chat's own prefill step
    ms = 1000 * (rng.random(n) * step + own)
    return {"share": share, "decode_step_ms": 1000 * decode_s, "prefill_step_ms": 1000 * prefill_s,
            "in_prefill_step": in_prefill, "p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99))}


def engine_alone_tokens_per_s(seconds: float) -> float:
    """Output tokens/s of the engine kept full of lines with no front: what 100% is."""
    cfg = EngineConfig.from_preset("h100-llama8b", max_num_seqs=SEQS)
    line = Lines(IntakeGate(cfg, None))
    tls = run(Engine(cfg), [line(0.0) for _ in range(SEQS)], VirtualClock(),
              follow_up=lambda tl, now: line(now) if now < seconds else None, gate=line.gate)
    return sum(tl.output_tokens for tl in tls if tl.finished_at is not None and tl.finished_at <= seconds) / seconds


def markdown(res: dict[str, Any]) -> str:
    alone = res["runs"][0]["chat_ttft_ms"]
    rows = []
    for r in res["runs"]:
        c = r["chat_ttft_ms"]
        what = "chats alone" if r["batch_share"] is None else f"batch on {r['batch_slots']} of {SEQS} slots"
        if r["pace_s"]:
            what += f", one start per {1000 * r['pace_s']:g} ms"
        share = "" if r["batch_share"] is None else f"{r['batch_output_tokens_per_s'] / res['engine_tokens_per_s']:.0%}"
        rows.append(f"| {what} | {c['p50']:.1f} | {c['p99']:.1f} | {c['p99'] / alone['p99']:.2f}x | "
                    f"{c['p50'] / alone['p50']:.2f}x | {share} | {r['suspensions']:,} |")
    return "\n".join([
        "# A running batch and chat TTFT, at the engine (discrete-event, virtual time)", "",
        f"`{res['command']}`: engine h100-llama8b with {SEQS} sequences, the gateway's front (default classes, batch "
        f"preemptible, {SEQS} slots); {res['chats']:,} Poisson chats at {res['rate']}/s (simulated) per run; the batch "
        f"never runs out of lines (136 prompt + 64 output tokens each, {AHEAD} waiting ahead). Batch share: its output "
        f"tokens/s over the engine kept full of lines alone ({res['engine_tokens_per_s']:,.0f}/s).", "",
        "| run | chat TTFT P50 ms | P99 ms | P99 vs alone | P50 vs alone | batch share of engine | suspensions |",
        "|---|---|---|---|---|---|---|", *rows, "",
        "The floor (`floor()`: the engine's cost model alone, each line's prefill in a step of its own, none in a chat's "
        "own step, other chats left out), against the chats-alone P99 above:", "",
        "| batch share of engine | decode step ms | step with a line prefill ms | a chat lands in such a step | "
        "floor P50 ms | floor P99 ms | P99 vs alone |", "|---|---|---|---|---|---|---|",
        *(f"| {f['share']:.0%} | {f['decode_step_ms']:.2f} | {f['prefill_step_ms']:.2f} | {f['in_prefill_step']:.0%} | "
          f"{f['p50']:.1f} | {f['p99']:.1f} | {f['p99'] / alone['p99']:.2f}x |" for f in res["floor"]), ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chats", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=4.0, help="chats per simulated second")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shares", default="1,0.75,0.5,0.25,0.125,0.0625")
    ap.add_argument("--paces", default="1:6.5,1:13,1:26,1:52,1:104,1:208,0.5:6.5",
                    help="share:ms runs with classes[batch].start_interval_s (simulated ms)")
    a = ap.parse_args()
    shares: list[tuple[float | None, float]] = [(None, 0.0), *((float(s), 0.0) for s in a.shares.split(","))]
    for run_ in filter(None, a.paces.split(",")):
        share, pace = run_.split(":")
        shares.append((float(share), float(pace) / 1000))
    res: dict[str, Any] = {"chats": a.chats, "rate": a.rate, "seed": a.seed,
                           "engine_tokens_per_s": engine_alone_tokens_per_s(a.chats / a.rate),
                           "runs": [one_run(a.chats, a.rate, a.seed, s, p) for s, p in shares],
                           "floor": [floor(s) for s in (1.0, 0.93, 0.8, 0.5, 0.25)]}
    res["command"] = "python benchmarks/batch_interference_des.py " + " ".join(
        f"--{k} {v}" for k, v in (("chats", a.chats), ("rate", a.rate), ("seed", a.seed)))
    res["machine"] = {"python": platform.python_version()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "batch_interference_des.json").write_text(json.dumps(res, indent=2) + "\n")
    md = markdown(res)
    (RESULTS / "batch_interference_des.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
