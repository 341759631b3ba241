"""Sustained overload: chats at 5x and 10x what one simulated engine completes, for 60 s each,
through the gateway as it sheds today (the default interactive TTFT target of 2 s: refused when
predicted to miss it, docs/slo.md; interactive bound 10 s) and through the gateway as it was
before (git revision `--baseline-rev`: by default the one before TTFT targets, which shed by
expected wait against the 10 s bound), side by side; first the same on the discrete-event
simulator (`now` and `before`: this tree with and without the default target), in simulated seconds.

For each: the share admitted and served, the admitted chats' TTFT (from the scheduled send), how
fast and with what a refusal came back (status, `Retry-After`), how many expired in the queue
after waiting, whether anything hung, and the gateway's resident memory over the run.

Processes on loopback: `tailguard sim` (H100 preset, 8 sequences, time scale 2: the engine runs
at half speed so the load generator can offer 10x on a shared 2-core machine), one gateway at a
time in front of it (quick form, `--max-concurrency 8`), and this open-loop generator. Capacity
is measured first with 8 closed-loop clients straight to the engine.

    .venv/bin/python benchmarks/overload.py [--seconds 60] [--factors 5,10] [--baseline-rev 81317f0]

Writes benchmarks/results/overload.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from tailguard.cli.experiment import free_port, spawned
from tailguard.clock import VirtualClock
from tailguard.config import BackendConfig, GatewayConfig
from tailguard.front.front import Front
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import run
from tailguard.sim.engine import Engine
from tailguard.sim.scenario import Arrival, Timeline
from tailguard.types import Outcome

sys.path.insert(0, str(Path(__file__).resolve().parent))
from open_loop import Result, send  # noqa: E402  beside this script
from revisions import baseline_tree  # noqa: E402
from sim_des_speed import pct  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CHAT_TOKENS = 32
SLOTS = 8
TIME_SCALE = 2.0


async def capacity(url: str, seconds: float) -> float:
    """Chats per wall second the engine completes with every slot busy (8 closed-loop clients)."""
    done = 0
    stop_at = time.perf_counter() + seconds
    async with aiohttp.ClientSession() as s:
        async def client() -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                out: list[Result] = []
                await send(s, url, "interactive", CHAT_TOKENS, 0.0, time.perf_counter(), out)
                done += out[0].error is None
        await asyncio.gather(*(client() for _ in range(SLOTS)))
    return done / seconds


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def offer(url: str, rate: float, seconds: float, pid: int, bound_s: float) -> dict[str, Any]:
    """`rate` chats/s for `seconds`, open loop; the gateway's RSS sampled every second."""
    out: list[Result] = []
    rss: list[int] = []
    t0 = time.perf_counter() + 0.2
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=bound_s * 4 + 30)) as s:
        tasks: list[asyncio.Task[None]] = []
        n = int(rate * seconds)
        next_rss = 0.0
        for i in range(n):
            at = i / rate
            tasks.append(asyncio.create_task(send(s, url, "interactive", CHAT_TOKENS, at, t0, out)))
            if at >= next_rss:
                rss.append(rss_kib(pid))
                next_rss += 1.0
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        await asyncio.gather(*tasks)
        rss.append(rss_kib(pid))
    return figures(out, rss, seconds)


def figures(out: list[Result], rss: list[int], seconds: float) -> dict[str, Any]:
    ok = [r for r in out if r.status == 200 and r.error is None and r.end is not None]
    refused = [r for r in out if r.status in (429, 503) and r.reason not in LATER]
    expired = [r for r in out if r.status == 503 and r.reason == "queue_timeout"]
    shed = [r for r in out if r.status == 503 and r.reason == "shed"]
    late = [r for r in out if r.status == 503 and r.reason == "late"]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    # From the instant each was really sent: without the generator's own lateness on this machine.
    sent_ttft = [r.ttft - r.lag for r in ok if r.ttft is not None and r.lag is not None]
    lag = [r.lag for r in out if r.lag is not None]
    refusal = [r.end for r in refused if r.end is not None]
    return {
        "sent": len(out), "served": len(ok), "served_share": len(ok) / len(out),
        "served_per_s": len(ok) / seconds,
        "refused_at_once": len(refused), "refused_with_retry_after": sum(1 for r in refused if r.retry_after),
        "expired_in_queue": len(expired), "shed_from_queue": len(shed),
        "shed_wait_max_s": max(r.end for r in shed if r.end is not None) if shed else None,
        "late_from_queue": len(late), "late_wait_max_s": max(r.end for r in late if r.end is not None) if late else None,
        "within_target_share": sum(1 for t in ttft if t <= TARGET_S) / len(out),
        "other_failures": len(out) - len(ok) - len(refused) - len(expired) - len(shed) - len(late),
        "unfinished": sum(1 for r in out if r.end is None and r.error is None),
        "admitted_ttft_p50_s": pct(ttft, 0.5) if ttft else None,
        "admitted_ttft_p99_s": pct(ttft, 0.99) if ttft else None,
        "admitted_ttft_max_s": max(ttft) if ttft else None,
        "admitted_ttft_p99_from_send_s": pct(sent_ttft, 0.99) if sent_ttft else None,
        "send_lag_p99_ms": 1000 * pct(lag, 0.99) if lag else None,
        "refusal_latency_p50_ms": 1000 * pct(refusal, 0.5) if refusal else None,
        "refusal_latency_p99_ms": 1000 * pct(refusal, 0.99) if refusal else None,
        "expired_wait_p50_s": pct([r.end for r in expired if r.end is not None], 0.5) if expired else None,
        "rss_mib": {"start": rss[0] / 1024, "max": max(rss) / 1024, "end": rss[-1] / 1024},
    }


@contextlib.asynccontextmanager
async def gateway(engine_url: str, logs: Path, label: str, src: Path | None) -> AsyncIterator[tuple[str, int]]:
    """The quick-form gateway in front of `engine_url`: this tree's, or (`src`) another revision's."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["serve", "--port", str(port), "--backend", engine_url, "--max-concurrency", str(SLOTS)]
    env = {"PYTHONPATH": str(src)} if src is not None else None
    async with spawned(args, url + "/health", logs / f"{label}-gateway.log", env) as proc:
        yield url, proc.pid


# --- the same on the discrete-event simulator ------------------------------------------------------

PROMPT_TOKENS = 7  # "Hello there." as the simulator counts it (bytes / 4 + 4 for the message)
# Refusals that come after a wait in the queue, not at once: past the bound, shed for others, or
# left once they could no longer make their target.
LATER = ("queue_timeout", "shed", "late")
TARGET_S = 2.0  # the quick form's interactive TTFT target


def des_front(targets: bool) -> Front:
    """The quick form's front (one backend of kind `sim`, `--max-concurrency 8`); without `targets`
    the classes carry no TTFT target (the gateway before them)."""
    gw = GatewayConfig(backends=[BackendConfig(name="engine", url="http://127.0.0.1:1", kind="sim",
                                               max_concurrency=SLOTS)])
    if not targets:
        gw = gw.model_copy(update={"classes": [c.model_copy(update={"slo": None}) for c in gw.classes]})
    return Front(gw.front_params({"engine": True}))


def des_capacity(cfg: EngineConfig) -> float:
    """Chats per simulated second the engine completes with every slot busy (a burst of 4,000)."""
    done = sorted(tl.finished_at for tl in run(Engine(cfg), [Arrival(f"c{i}", 0.0, PROMPT_TOKENS, CHAT_TOKENS)
                                                             for i in range(4000)], VirtualClock())
                  if tl.finished_at is not None)
    lo, hi = int(0.1 * len(done)), int(0.9 * len(done))
    return (hi - lo) / (done[hi] - done[lo])


def des_figures(timelines: list[Timeline], seconds: float) -> dict[str, Any]:
    ok = [tl for tl in timelines if tl.outcome is Outcome.SUCCESS]
    refused = [tl for tl in timelines if tl.outcome is Outcome.REJECTED and tl.reject_reason not in LATER]
    expired = [tl for tl in timelines if tl.reject_reason == "queue_timeout"]
    shed = [tl for tl in timelines if tl.reject_reason == "shed"]
    late = [tl for tl in timelines if tl.reject_reason == "late"]
    ttft = [tl.first_token_at - tl.arrived_at for tl in ok if tl.first_token_at is not None]
    refusal = [tl.finished_at - tl.arrived_at for tl in refused if tl.finished_at is not None]
    reasons: dict[str, int] = {}
    for tl in refused:
        reasons[str(tl.reject_reason)] = reasons.get(str(tl.reject_reason), 0) + 1
    return {"sent": len(timelines), "served": len(ok), "served_share": len(ok) / len(timelines),
            "served_per_s": len(ok) / seconds, "refused_at_once": len(refused), "refused_by_reason": reasons,
            "refused_with_retry_after": sum(1 for tl in refused if tl.retry_after_s),
            "refusal_latency_max_s": max(refusal) if refusal else None, "expired_in_queue": len(expired),
            "shed_from_queue": len(shed),
            "shed_wait_max_s": max(tl.finished_at - tl.arrived_at for tl in shed if tl.finished_at is not None)
            if shed else None,
            "late_from_queue": len(late),
            "late_wait_max_s": max(tl.finished_at - tl.arrived_at for tl in late if tl.finished_at is not None)
            if late else None,
            "within_target_share": sum(1 for t in ttft if t <= TARGET_S) / len(timelines),
            "admitted_ttft_p50_s": pct(ttft, 0.5) if ttft else None,
            "admitted_ttft_p99_s": pct(ttft, 0.99) if ttft else None,
            "admitted_ttft_max_s": max(ttft) if ttft else None}


def des_runs(factors: list[float], seconds: float) -> tuple[float, dict[str, Any]]:
    cfg = EngineConfig.from_preset("h100-llama8b", max_num_seqs=SLOTS)
    cap = des_capacity(cfg)
    runs: dict[str, Any] = {}
    for factor in factors:
        rate = cap * factor
        chats = [Arrival(f"c{i}", i / rate, PROMPT_TOKENS, CHAT_TOKENS) for i in range(int(rate * seconds))]
        for label, targets in (("now", True), ("before", False)):
            runs[f"{label}@{factor:g}x"] = des_figures(run(Engine(cfg), chats, VirtualClock(), des_front(targets)),
                                                       seconds)
            print("des", f"{label}@{factor:g}x", json.dumps(runs[f"{label}@{factor:g}x"]), flush=True)
    return cap, runs


async def main(args: argparse.Namespace) -> None:
    logs = RESULTS / "logs" / "overload"
    logs.mkdir(parents=True, exist_ok=True)
    factors = [float(f) for f in args.factors.split(",")]
    des_cap, des = des_runs(factors, args.seconds)
    sim_port = free_port()
    sim_url = f"http://127.0.0.1:{sim_port}"
    sim = ["sim", "--port", str(sim_port), "--preset", "h100-llama8b", "--max-num-seqs", str(SLOTS),
           "--time-scale", str(TIME_SCALE)]
    runs: dict[str, Any] = {}
    with baseline_tree(args.baseline_rev) as old_src:
        async with spawned(sim, sim_url + "/health", logs / "sim.log"):
            cap = await capacity(sim_url, args.capacity_seconds)
            print(f"capacity {cap:.1f} chats/s", flush=True)
            for factor in factors:
                for label, src, bound in (("now", None, 10.0), ("before", old_src, 10.0)):
                    async with gateway(sim_url, logs, label, src) as (url, pid):
                        key = f"{label}@{factor:g}x"
                        runs[key] = await offer(url, cap * factor, args.seconds, pid, bound)
                        print(key, json.dumps(runs[key]), flush=True)
    write(args, cap, runs, des_cap, des)


def write(args: argparse.Namespace, cap: float, runs: dict[str, Any], des_cap: float, des: dict[str, Any]) -> None:
    doc = {"benchmark": "overload", "command": " ".join(["benchmarks/overload.py", *sys.argv[1:]]),
           "capacity_per_s": cap, "seconds": args.seconds, "baseline_rev": args.baseline_rev,
           "time_scale": TIME_SCALE, "runs": runs, "des_capacity_per_s": des_cap, "des": des,
           "python": platform.python_version()}
    (RESULTS / "overload.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = ["# Sustained overload: shedding by the TTFT target against shedding by the queue bound alone", "",
             f"`.venv/bin/python {doc['command']}`", "",
             f"## Discrete-event simulator: one engine completing {des_cap:.1f} chats/s (8 sequences), {args.seconds:g} "
             "simulated s at each factor; `now`: the quick form's defaults (interactive TTFT target 2 s, bound 10 s), "
             "`before`: the same without the target. Simulated seconds.", "",
             "| run | sent | served | admitted TTFT P50 | P99 | max | refused at once | with Retry-After | "
             "slowest refusal | shed from the queue (longest wait) | left late (longest wait) | expired in queue | "
             "first token within 2 s, of all sent |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, r in des.items():
        lines.append(f"| {key} | {r['sent']} | {r['served']} ({100 * r['served_share']:.0f}%) | "
                     f"{_f(r['admitted_ttft_p50_s'])} | {_f(r['admitted_ttft_p99_s'])} | {_f(r['admitted_ttft_max_s'])} | "
                     f"{r['refused_at_once']} | {r['refused_with_retry_after']} | "
                     f"{_f(r['refusal_latency_max_s'], 3)} s | {r['shed_from_queue']} ({_f(r['shed_wait_max_s'])} s) | "
                     f"{r['late_from_queue']} ({_f(r['late_wait_max_s'])} s) | {r['expired_in_queue']} | "
                     f"{100 * r['within_target_share']:.1f}% |")
    lines += ["", "## Over HTTP", "",
             f"One simulated engine completing {cap:.1f} chats/s (wall; 8 sequences, time scale {TIME_SCALE:g}); "
             f"chats of {CHAT_TOKENS} tokens offered open loop for {args.seconds:g} s at each factor. `now`: this "
             f"gateway (interactive TTFT target 2 s, bound 10 s); `before`: revision {args.baseline_rev}. TTFT from the "
             "scheduled send, in wall seconds.", "",
             "| run | sent | served | admitted TTFT P50 | P99 | max | refused at once | with Retry-After | "
             "refusal P50 / P99 | shed from the queue (longest wait) | left late (longest wait) | expired in queue | "
             "other | first token within 2 s, of all sent | RSS start / max / end | P99 from the real send | "
             "generator lag P99 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, r in runs.items():
        m = r["rss_mib"]
        lines.append(
            f"| {key} | {r['sent']} | {r['served']} ({100 * r['served_share']:.0f}%) | {_f(r['admitted_ttft_p50_s'])} | "
            f"{_f(r['admitted_ttft_p99_s'])} | {_f(r['admitted_ttft_max_s'])} | {r['refused_at_once']} | "
            f"{r['refused_with_retry_after']} | {_f(r['refusal_latency_p50_ms'], 1)} / {_f(r['refusal_latency_p99_ms'], 1)} ms | "
            f"{r['shed_from_queue']} ({_f(r['shed_wait_max_s'])} s) | "
            f"{r['late_from_queue']} ({_f(r['late_wait_max_s'])} s) | {r['expired_in_queue']} | "
            f"{r['other_failures'] + r['unfinished']} | {100 * r['within_target_share']:.1f}% | "
            f"{m['start']:.0f} / {m['max']:.0f} / {m['end']:.0f} MiB | {_f(r['admitted_ttft_p99_from_send_s'])} | "
            f"{_f(r['send_lag_p99_ms'], 1)} ms |")
    (RESULTS / "overload.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--factors", default="5,10")
    p.add_argument("--capacity-seconds", type=float, default=10.0)
    p.add_argument("--baseline-rev", default="81317f0", help="the gateway to compare with (git revision: main before SLOs)")
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
