"""Agent programs on two engines with prefix caching, saturated (issue 31): per-call round-robin,
tailguard without programs, tailguard with them, and SGLang's model gateway (`smg`, cache_aware),
on the discrete-event simulator and over HTTP, side by side.

The workload is `examples/agents.yaml`: 80% short programs of 1-4 steps and 20% long agents of
12-20, behind one 1,500-token system prompt, each step's prompt the conversation so far (every
earlier answer and tool result), 0.5-3 s of tool time between steps; programs arrive Poisson.
Two simulated H100s (Llama-3-8B class, 16 sequences, 440,000 KV tokens, prefix caching).

- Round-robin: a router that sends each call to the next engine in turn and queues nothing (the
  engines queue, first come first served): on the DES, the front as that router (`fcfs`,
  `round-robin`, no cap that binds); over HTTP, smg with `--policy round_robin`.
- tailguard: `tailguard serve` with a cap of 16 per engine, one class of agent calls (a queue bound
  of 10 minutes: a call refused fails its program) and `aging_s: 30`; programs named by
  `X-Tailguard-Program` (the workload's `named_by: header`). `programs: {plas: false, affinity: false}`
  for the arm without programs; PLAS over 8 levels (Autellix's, least attained service across
  every level) as the alternative the default was chosen over.
- smg cache_aware (HTTP only: it is a Rust binary, not a policy the DES can run).

Per arm: program E2E (from its due start to its last answer) P50, P99 and mean, overall and per
class; call TTFT P50 and P99; the engines' prefix-cache hit ratio (hit over queried tokens); the
programs lost (a call failed or was refused). Targets (issue 31): short programs' P99 E2E at most
0.5x round-robin's, mean program E2E at most 0.75x, long programs' P99 at most 1.1x, prefix hit
ratio at least round-robin's, nothing lost.

    .venv/bin/python benchmarks/agents.py [--des-rate 4] [--des-programs 800] [--http-rate 4] [--http-programs 800]
                                          [--http-arms round-robin,tailguard,...] [--skip-http] [--skip-des]

Writes benchmarks/results/agents.{json,md}; the HTTP runs' bench folders under
benchmarks/results/agents/ (each with summary.json's `programs`, and `bench compare` of
round-robin against tailguard).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import yaml

from tailguard.bench.agents import AgentWorkload, agent_workload, plan_programs
from tailguard.cli.experiment import free_port, spawned
from tailguard.config import GatewayConfig
from tailguard.front.front import Front
from tailguard.front.identity import ProgramFinder
from tailguard.front.params import BackendSpec, FrontParams, ProgramParams, QueueParams, RoutingParams
from tailguard.sim.cost import EngineConfig
from tailguard.sim.engine import Engine
from tailguard.sim.scenario import Host, Timeline
from tailguard.sweep.agents import ProgramRun, simulate_programs
from tailguard.wire.openai import validate_body

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_routing import cache_counters, simulators, smg  # noqa: E402  beside this script: hit counters, sims, smg
from sim_des_speed import pct  # noqa: E402  one nearest-rank percentile for all

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
WORKLOAD = ROOT / "examples" / "agents.yaml"
ENGINES = 2
SLOTS = 16
ENGINE: dict[str, Any] = {"preset": "h100-llama8b", "max_num_seqs": SLOTS, "max_model_len": 65536, "kv_cache_tokens": 440_000}
GATEWAY: dict[str, Any] = {
    "access_log": False,
    "classes": [{"name": "interactive", "rank": 0, "max_queue_wait_s": 600, "max_queue_len": 100_000}],
    "scheduler": {"aging_s": 30},
}
WITHOUT_PROGRAMS = {"plas": False, "affinity": False}
PURE_PLAS = {"levels": 8, "quantum_tokens": 4096}
TARGETS = {"short_p99": 0.5, "mean": 0.75, "long_p99": 1.1}


def gateway_config(programs: dict[str, Any] | None = None, urls: list[str] | None = None) -> GatewayConfig:
    """tailguard's config for both drivers (the DES builds its front from the same file)."""
    backends = [{"name": f"sim{i}", "url": (urls or [])[i] if urls else f"http://127.0.0.1:{i + 1}",
                 "max_concurrency": SLOTS, "kind": "sim"} for i in range(ENGINES)]
    return GatewayConfig.model_validate({**GATEWAY, "backends": backends, "programs": programs or {}})


# --- the discrete-event runs ------------------------------------------------------------------

def des_arms() -> dict[str, FrontParams]:
    continues = {f"sim{i}": True for i in range(ENGINES)}  # the simulator's kind can continue a generation
    tg = gateway_config().front_params(continues)
    rr = FrontParams(classes=tg.classes, backends=[BackendSpec(b.name, max_concurrency=100_000, continues=True)
                                                   for b in tg.backends],
                     queue=QueueParams(policy="fcfs"), routing=RoutingParams(policy="round-robin"),
                     programs=ProgramParams(plas=False, affinity=False))
    return {
        "round-robin": rr,
        "tailguard without programs": gateway_config(WITHOUT_PROGRAMS).front_params(continues),
        "tailguard": tg,
        "tailguard, PLAS over 8 levels": gateway_config(PURE_PLAS).front_params(continues),
    }


def des_run(w: AgentWorkload, params: FrontParams, rate: float, programs: int, seed: int) -> dict[str, Any]:
    cfg = EngineConfig.from_preset(ENGINE["preset"], max_num_seqs=SLOTS, max_model_len=ENGINE["max_model_len"],
                                   kv_cache_tokens=ENGINE["kv_cache_tokens"], enable_prefix_caching=True)
    hosts = [Host(f"sim{i}", Engine(cfg)) for i in range(ENGINES)]
    plans = list(itertools.islice(plan_programs(w, rate, seed), programs))
    t0 = time.perf_counter()
    runs, timelines = simulate_programs(hosts, Front(params), w, plans)
    hits = sum(h.engine.prefix_hit_tokens_total for h in hosts)
    queried = sum(h.engine.prefix_queried_tokens_total for h in hosts)
    out = des_summary(runs, timelines, hits / queried if queried else None)
    out["cpu_s"] = round(time.perf_counter() - t0, 1)
    return out


def des_summary(runs: list[ProgramRun], timelines: list[Timeline], hit: float | None) -> dict[str, Any]:
    ttft = [t.ttft_s for t in timelines if t.ttft_s is not None]
    return {**program_figures([(r.cls, r.e2e_s if r.ok else None) for r in runs]),
            "ttft_p50_s": pct(ttft, 0.5), "ttft_p99_s": pct(ttft, 0.99), "prefix_hit": hit,
            "calls": len(timelines)}


def program_figures(progs: list[tuple[str, float | None]]) -> dict[str, Any]:
    """Program E2E P50, P99 and mean, overall and per class; a lost program ranks as worst."""
    def fig(xs: list[float | None]) -> dict[str, float]:
        ok = [x for x in xs if x is not None]
        ranked = ok + [float("inf")] * (len(xs) - len(ok))
        return {"p50": pct(ranked, 0.5), "p99": pct(ranked, 0.99), "mean": sum(ok) / len(ok) if ok else float("nan")}

    out: dict[str, Any] = {"programs": len(progs), "lost": sum(1 for _, e in progs if e is None),
                           "all": fig([e for _, e in progs])}
    for cls in sorted({c for c, _ in progs}):
        out[cls] = fig([e for c, e in progs if c == cls])
    return out


# --- the HTTP runs ------------------------------------------------------------------------------

def engines(logs: Path) -> contextlib.AbstractAsyncContextManager[list[str]]:
    """Fresh simulators (their caches empty), at real time."""
    return simulators(logs, ENGINES, ["--preset", ENGINE["preset"], "--max-num-seqs", str(SLOTS),
                                      "--max-model-len", str(ENGINE["max_model_len"]),
                                      "--kv-cache-tokens", str(ENGINE["kv_cache_tokens"]),
                                      "--enable-prefix-caching", "--time-scale", "1", "--model-name", "agents-model"])


@contextlib.asynccontextmanager
async def tailguard(urls: list[str], programs: dict[str, Any] | None, logs: Path, name: str) -> AsyncIterator[str]:
    port = free_port()
    cfg = gateway_config(programs, urls).model_dump(mode="json", exclude_defaults=True)
    cfg["port"] = port
    path = logs / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    async with spawned(["serve", "--config", str(path)], f"http://127.0.0.1:{port}/health", logs / f"{name}.log"):
        await asyncio.sleep(1.0)  # the first probes: kinds and models known
        yield f"http://127.0.0.1:{port}"


def http_routers() -> dict[str, Callable[[list[str], Path], contextlib.AbstractAsyncContextManager[str]]]:
    arms: dict[str, Callable[[list[str], Path], contextlib.AbstractAsyncContextManager[str]]] = {}
    has_smg = shutil.which("smg", path=str(Path(sys.executable).parent)) is not None
    if has_smg:
        arms["round-robin"] = lambda urls, logs: smg(urls, logs, "round_robin")
    arms["tailguard without programs"] = lambda urls, logs: tailguard(urls, WITHOUT_PROGRAMS, logs, "without")
    arms["tailguard"] = lambda urls, logs: tailguard(urls, None, logs, "tailguard")
    if has_smg:
        arms["smg cache_aware"] = lambda urls, logs: smg(urls, logs, "cache_aware")
    return arms


async def http_run(name: str, router: Callable[[list[str], Path], contextlib.AbstractAsyncContextManager[str]],
                   args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    out = RESULTS / "agents" / name.replace(" ", "-").replace(",", "")
    async with engines(logs) as urls, router(urls, logs) as url:
        h0, q0 = await cache_counters(urls)
        cmd = [sys.executable, "-m", "tailguard", "bench", "--url", url, "--workload", str(WORKLOAD),
               "--rate", str(args.http_rate), "--requests", str(args.http_programs), "--seed", str(args.seed),
               "--out", str(out), "--first-token-timeout", "900", "--timeout", "1800"]
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=open(logs / f"bench-{out.name}.log", "wb"))
        await proc.wait()
        h1, q1 = await cache_counters(urls)
    summary = json.loads((out / "summary.json").read_text())
    progs = summary["programs"]
    figures: dict[str, Any] = {"programs": progs["overall"]["count"], "lost": progs["overall"]["failed"],
                               "all": _e2e(progs["overall"])}
    for cls, g in progs["classes"].items():
        figures[cls] = _e2e(g)
    ttft = summary["overall"]["ttft_s"]
    figures.update(ttft_p50_s=ttft["p50"], ttft_p99_s=ttft["p99"], prefix_hit=(h1 - h0) / (q1 - q0) if q1 > q0 else None,
                   calls=summary["overall"]["count"], failed_calls=summary["overall"]["count"] - summary["overall"]["ok"],
                   valid=summary["validity"]["valid"], folder=str(out.relative_to(ROOT)))
    return figures


def _e2e(g: dict[str, Any]) -> dict[str, float | None]:
    e = g["e2e_s"]
    return {"p50": e["p50"], "p99": e["p99"], "mean": e["mean"]}


def bench_compare(before: str, after: str) -> None:
    """`tailguard bench compare` of two arms' folders, as a user would run it (compare.json beside them)."""
    b, a = RESULTS / "agents" / before, RESULTS / "agents" / after
    if (b / "summary.json").is_file() and (a / "summary.json").is_file():
        subprocess.run([sys.executable, "-m", "tailguard", "bench", "compare", str(b), str(a)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


# --- what finding a program costs the gateway ----------------------------------------------------

def identity_cost() -> dict[str, float]:
    """Microseconds per `ProgramFinder.find` (what the gateway's lifecycle calls for every request), by case:
    named by a field; a 200-token chat that names nothing (inferred: its text and block hashes);
    a 10,000-token conversation inferred as the last one's continuation."""
    finder = ProgramFinder(ProgramParams())
    chat = [{"role": "user", "content": "hello " * 130}]
    talk = [{"role": "system", "content": "x " * 8000}, {"role": "user", "content": "task " * 1000}]
    cases = {"named (user)": (validate_body({"model": "m", "messages": chat, "user": "u"}, "chat"), 5000),
             "200 tokens, nothing names it": (validate_body({"model": "m", "messages": chat}, "chat"), 5000)}
    finder.find(validate_body({"model": "m", "messages": talk}, "chat"), None, None, None, 0.0)
    talk += [{"role": "assistant", "content": "ok " * 200}, {"role": "user", "content": "tool " * 4000}]
    cases["10,000 tokens, a continuation"] = (validate_body({"model": "m", "messages": talk}, "chat"), 500)
    out = {}
    for name, (parsed, n) in cases.items():
        t0 = time.perf_counter()
        for i in range(n):
            finder.find(parsed, None, None, None, 1.0 + i * 1e-3)
        out[name] = round((time.perf_counter() - t0) / n * 1e6, 1)
    return out


# --- the report -----------------------------------------------------------------------------------

def table(arms: dict[str, dict[str, Any]]) -> str:
    lines = ["| arm | program E2E P50 | P99 | mean | short P99 | long P99 | call TTFT P50 | P99 | prefix hit | lost |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def s(v: float | None) -> str:
        return "-" if v is None else "inf" if v == float("inf") else f"{v:.1f} s" if v >= 1 else f"{v * 1000:.0f} ms"

    for name, a in arms.items():
        hit = "-" if a.get("prefix_hit") is None else f"{a['prefix_hit']:.2f}"
        lines.append(f"| {name} | {s(a['all']['p50'])} | {s(a['all']['p99'])} | {s(a['all']['mean'])} "
                     f"| {s(a.get('short', {}).get('p99'))} | {s(a.get('long', {}).get('p99'))} "
                     f"| {s(a['ttft_p50_s'])} | {s(a['ttft_p99_s'])} | {hit} | {a['lost']} of {a['programs']} |")
    return "\n".join(lines)


def verdicts(arms: dict[str, dict[str, Any]], label: str) -> list[str]:
    rr, tg = arms.get("round-robin"), arms.get("tailguard")
    if rr is None or tg is None:
        return []
    ratios = {"short_p99": tg["short"]["p99"] / rr["short"]["p99"], "mean": tg["all"]["mean"] / rr["all"]["mean"],
              "long_p99": tg["long"]["p99"] / rr["long"]["p99"]}
    out = [f"{label}: tailguard against round-robin: short programs' P99 E2E {ratios['short_p99']:.2f}x (target <= 0.5), "
           f"mean program E2E {ratios['mean']:.2f}x (<= 0.75), long programs' P99 {ratios['long_p99']:.2f}x (<= 1.1), "
           f"prefix hit {tg['prefix_hit']:.2f} against {rr['prefix_hit']:.2f} (at least), lost {tg['lost']} (none): "
           + ("met" if all(ratios[k] <= TARGETS[k] for k in TARGETS) and tg["prefix_hit"] >= rr["prefix_hit"]
              and tg["lost"] == 0 else "NOT met")]
    sm = arms.get("smg cache_aware")
    if sm is not None:
        out.append(f"{label}: against smg cache_aware: short P99 {tg['short']['p99'] / sm['short']['p99']:.2f}x, "
                   f"mean {tg['all']['mean'] / sm['all']['mean']:.2f}x, long P99 {tg['long']['p99'] / sm['long']['p99']:.2f}x, "
                   f"prefix hit {tg['prefix_hit']:.2f} against {sm['prefix_hit']:.2f}")
    return out


async def main(args: argparse.Namespace) -> None:
    w = agent_workload(WORKLOAD)
    assert w is not None
    logs = RESULTS / "logs" / "agents"
    logs.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"machine": platform.platform(), "python": platform.python_version(), "args": vars(args),
                           "engine": ENGINE, "engines": ENGINES, "gateway": GATEWAY, "des": {}, "http": {}}
    kept = RESULTS / "agents.json"
    if (args.skip_des or args.skip_http) and kept.is_file():  # the part not run now: the last run's, with its args
        last = json.loads(kept.read_text())
        for part, skipped in (("des", args.skip_des), ("http", args.skip_http)):
            if skipped:
                out[part], out[f"{part}_args"] = last.get(part, {}), last.get(f"{part}_args", last.get("args"))
    for part, skipped in (("des", args.skip_des), ("http", args.skip_http)):
        if not skipped:
            out[f"{part}_args"] = vars(args)
    out["identity_us"] = identity_cost()
    if not args.skip_des:
        for name, params in des_arms().items():
            out["des"][name] = des_run(w, params, args.des_rate, args.des_programs, args.seed)
            print("des", name, json.dumps(out["des"][name]), flush=True)
    if not args.skip_http:
        chosen = args.http_arms.split(",")
        routers = http_routers()
        missing = [name for name in chosen if name not in routers]
        if missing:  # an arm left out would make the ratios against it silently absent
            raise SystemExit(f"no such HTTP arm here: {', '.join(missing)} (the smg arms need `make "
                             ".venv/.peers-installed`, SGLang's model gateway)")
        for name, router in routers.items():
            if name in chosen:
                out["http"][name] = await http_run(name, router, args, logs)
                print("http", name, json.dumps(out["http"][name]), flush=True)
        bench_compare("round-robin", "tailguard")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "agents.json").write_text(json.dumps(out, indent=2, default=str))
    md = ["# Agent programs on two engines with prefix caching", "",
          f"`.venv/bin/python benchmarks/agents.py` (arguments per part below; `--skip-des` or `--skip-http` keeps the "
          f"other part of the last run) on {platform.platform()}: `examples/agents.yaml`, {ENGINES} simulated engines ({ENGINE['preset']}, {SLOTS} "
          f"sequences, {ENGINE['kv_cache_tokens']:,} KV tokens, prefix caching); seconds are the engines' (simulated) "
          "seconds, the HTTP runs at real time.", ""]
    if out["des"]:
        a = out["des_args"]
        md += [f"## Discrete-event simulator ({a['des_programs']} programs at {a['des_rate']} a second, seed {a['seed']})",
               "", table(out["des"]), "", *verdicts(out["des"], "DES"), ""]
    if out["http"]:
        a = out["http_args"]
        md += [f"## HTTP ({a['http_programs']} programs at {a['http_rate']} a second, seed {a['seed']})", "",
               table(out["http"]), "", *verdicts(out["http"], "HTTP"), ""]
    md += ["Finding a call's program (`ProgramFinder.find`, once per request in the gateway's lifecycle), microseconds a "
           "call on this machine: " + ", ".join(f"{k} {v}" for k, v in out["identity_us"].items()) + ".", ""]
    (RESULTS / "agents.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--des-rate", type=float, default=4.0, help="programs per simulated second")
    p.add_argument("--des-programs", type=int, default=800)
    p.add_argument("--http-rate", type=float, default=4.0, help="programs per second (the simulators run at real time)")
    p.add_argument("--http-programs", type=int, default=800)
    p.add_argument("--http-arms", default="round-robin,tailguard,smg cache_aware",
                   help="comma-separated: round-robin, tailguard without programs, tailguard, smg cache_aware")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--skip-http", action="store_true")
    p.add_argument("--skip-des", action="store_true")
    asyncio.run(main(p.parse_args()))
