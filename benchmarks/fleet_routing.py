"""Routing over a fleet with prefix caches (issue 16, benchmark a): four simulated instances with
prefix caching, each with room for about four 3,000-token prefixes, behind one gateway; the
same open-loop load through each routing policy, side by side in one run, and through SGLang's
model gateway (`smg launch`, its default `cache_aware` policy) when it is installed
(`pip install smg`).

Two workloads, each on fresh engines (their caches empty):
- `shared`: eight groups of chats, each group behind one system prompt of about 3,000 tokens,
  with a short user message of its own: the case prefix affinity is for.
- `unique`: every chat a prompt of its own of the same size: nothing to share, where affinity
  must do no worse than `least-tokens`.

Per arm: TTFT (from each request's scheduled instant to its first content chunk) mean, P50 and
P99 in the simulator's seconds, failures, and the engines' own prefix-cache hit rate (the sum over
the four of `vllm:prefix_cache_hits` over `vllm:prefix_cache_queries`, read from their `/metrics`
before and after).

Targets: on `shared`, prefix-affinity at least 1.5x better mean TTFT than round-robin, and at least
as good as smg's cache_aware (mean TTFT and hit rate); on `unique`, no worse than least-tokens.

    .venv/bin/python benchmarks/fleet_routing.py [--rate 16] [--seconds 20] [--arms ...]

Writes benchmarks/results/fleet_routing.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import random
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tailguard.cli.experiment import free_port, spawned, stop_process, wait_healthy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from open_loop import first_token  # noqa: E402  beside this script
from sim_des_speed import pct  # noqa: E402  one nearest-rank percentile for all

RESULTS = Path(__file__).resolve().parent / "results"
INSTANCES = 4
GROUPS = 8
PREFIX_CHARS = 12_000  # about 3,000 tokens as the simulator counts them (4 bytes a token)
KV_TOKENS = 16_000  # about four such prefixes, with room for the running sequences
SLOTS = 4
TIME_SCALE = 1.0  # real time: the gateways' own milliseconds count as they would in front of an engine
MAX_TOKENS = 16
MODEL = "fleet-model"
POLICIES = ("round-robin", "least-tokens", "prefix-affinity")


@dataclass
class Sent:
    scheduled: float
    ttft: float | None = None
    error: str | None = None


@dataclass
class Arm:
    name: str
    results: list[Sent] = field(default_factory=list)
    hits: float = 0.0
    queries: float = 0.0


def prompts(workload: str, n: int, seed: int) -> list[str]:
    """`n` prompts: a group's system prompt and a short question of its own (`shared`), or each
    one of its own (`unique`)."""
    rng = random.Random(seed)

    def text(chars: int) -> str:
        words = []
        size = 0
        while size < chars:
            w = f"w{rng.randrange(1 << 30):x}"
            words.append(w)
            size += len(w) + 1
        return " ".join(words)

    systems = [text(PREFIX_CHARS) for _ in range(GROUPS)]
    out = []
    for i in range(n):
        system = systems[rng.randrange(GROUPS)] if workload == "shared" else text(PREFIX_CHARS)
        out.append(system + "\n\nQuestion " + text(200))
    return out


async def one(session: aiohttp.ClientSession, url: str, prompt: str, at: float, t0: float, out: Sent) -> None:
    system, question = prompt.split("\n\nQuestion ")
    body = {"model": MODEL, "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": MAX_TOKENS, "stream": True}
    out.ttft, out.error = await first_token(session, url, body, at, t0)


async def load(url: str, texts: list[str], rate: float, seed: int) -> list[Sent]:
    rng = random.Random(seed)
    at, schedule = 0.0, []
    for _ in texts:
        at += rng.expovariate(rate)
        schedule.append(at)
    out = [Sent(a) for a in schedule]
    t0 = time.perf_counter() + 0.3
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(one(session, url, p, a, t0, s) for p, a, s in zip(texts, schedule, out)))
    return out


async def cache_counters(urls: list[str]) -> tuple[float, float]:
    """Prefix-cache hits and queries (tokens), summed over the engines."""
    hits = queries = 0.0
    async with aiohttp.ClientSession() as s:
        for u in urls:
            async with s.get(u + "/metrics") as r:
                text = await r.text()
            for fam in text_string_to_metric_families(text):
                for sample in fam.samples:
                    if sample.name == "vllm:prefix_cache_hits_total":
                        hits += sample.value
                    elif sample.name == "vllm:prefix_cache_queries_total":
                        queries += sample.value
    return hits, queries


def engines(logs: Path) -> contextlib.AbstractAsyncContextManager[list[str]]:
    return simulators(logs, INSTANCES, ["--preset", "h100-llama8b", "--max-num-seqs", str(SLOTS),
                                        "--time-scale", str(TIME_SCALE), "--enable-prefix-caching",
                                        "--kv-cache-tokens", str(KV_TOKENS), "--model-name", MODEL])


@contextlib.asynccontextmanager
async def simulators(logs: Path, n: int, args: list[str]) -> AsyncIterator[list[str]]:
    """`n` fresh `tailguard sim` processes (their caches empty) started with `args`: their URLs."""
    async with contextlib.AsyncExitStack() as stack:
        urls = []
        for i in range(n):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            await stack.enter_async_context(spawned(["sim", "--port", str(port), *args], url + "/health",
                                                    logs / f"sim{i}.log"))
            urls.append(url)
        yield urls


@contextlib.asynccontextmanager
async def tailguard(policy: str, urls: list[str], logs: Path) -> AsyncIterator[str]:
    port = free_port()
    cfg = {"port": port, "access_log": False, "routing": {"policy": policy},
           "backends": [{"name": f"sim{i}", "url": u, "max_concurrency": SLOTS} for i, u in enumerate(urls)]}
    path = logs / f"tailguard-{policy}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    async with spawned(["serve", "--config", str(path)], f"http://127.0.0.1:{port}/health", logs / f"{policy}.log"):
        await asyncio.sleep(1.0)  # the first probes: kinds and models known
        yield f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def smg(urls: list[str], logs: Path, policy: str = "cache_aware") -> AsyncIterator[str]:
    """SGLang's model gateway in front of `urls`, routing by `policy` (benchmarks/agents.py runs two)."""
    port = free_port()
    exe = Path(sys.executable).with_name("smg")
    argv = [str(exe), "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
            "--worker-urls", *urls]
    with open(logs / f"smg-{policy}.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            await wait_healthy(f"http://127.0.0.1:{port}/health", proc, timeout_s=60)
            await asyncio.sleep(1.0)
            yield f"http://127.0.0.1:{port}"
        finally:
            stop_process(proc)


async def run_arm(name: str, workload: str, args: argparse.Namespace, logs: Path) -> Arm:
    texts = prompts(workload, int(args.rate * args.seconds), args.seed)
    arm = Arm(name)
    async with engines(logs) as urls:
        router = smg(urls, logs) if name == "smg-cache_aware" else tailguard(name, urls, logs)
        async with router as url:
            h0, q0 = await cache_counters(urls)
            arm.results = await load(url, texts, args.rate, args.seed)
            h1, q1 = await cache_counters(urls)
    arm.hits, arm.queries = h1 - h0, q1 - q0
    return arm


def summary(arm: Arm) -> dict[str, Any]:
    ttft = [s.ttft / TIME_SCALE for s in arm.results if s.ttft is not None and s.error is None]
    return {
        "requests": len(arm.results), "failed": sum(1 for s in arm.results if s.error is not None or s.ttft is None),
        "errors": sorted({s.error for s in arm.results if s.error})[:3],
        "ttft_mean_s": sum(ttft) / len(ttft) if ttft else None,
        "ttft_p50_s": pct(ttft, 0.5) if ttft else None, "ttft_p99_s": pct(ttft, 0.99) if ttft else None,
        "prefix_hit_rate": arm.hits / arm.queries if arm.queries else None,
    }


def table(runs: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = []
    for workload, arms in runs.items():
        lines += [f"### `{workload}`", "", "| arm | TTFT mean | P50 | P99 | prefix-cache hit rate | failed |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name, s in arms.items():
            def f(v: float | None) -> str:
                return "-" if v is None else f"{v * 1000:.0f} ms"
            hit = "-" if s["prefix_hit_rate"] is None else f"{s['prefix_hit_rate']:.2f}"
            lines.append(f"| {name} | {f(s['ttft_mean_s'])} | {f(s['ttft_p50_s'])} | {f(s['ttft_p99_s'])} | {hit} "
                         f"| {s['failed']} of {s['requests']} |")
        lines.append("")
    return "\n".join(lines)


def verdicts(runs: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    out = []
    shared, unique = runs.get("shared", {}), runs.get("unique", {})
    pa = shared.get("prefix-affinity")
    if pa and shared.get("round-robin"):
        r = shared["round-robin"]["ttft_mean_s"] / pa["ttft_mean_s"]
        out.append(f"shared: prefix-affinity mean TTFT {r:.2f}x better than round-robin (target >= 1.5x): "
                   f"{'met' if r >= 1.5 else 'NOT met'}")
    if pa and shared.get("smg-cache_aware"):
        s = shared["smg-cache_aware"]
        r = s["ttft_mean_s"] / pa["ttft_mean_s"]
        out.append(f"shared: against smg cache_aware, mean TTFT {r:.2f}x (>= 1 is as good or better), hit rate "
                   f"{pa['prefix_hit_rate']:.2f} vs {s['prefix_hit_rate']:.2f}")
    if unique.get("prefix-affinity") and unique.get("least-tokens"):
        r = unique["prefix-affinity"]["ttft_mean_s"] / unique["least-tokens"]["ttft_mean_s"]
        out.append(f"unique: prefix-affinity mean TTFT {r:.2f}x least-tokens' (target <= 1, within noise)")
    return out


async def main(args: argparse.Namespace) -> None:
    logs = RESULTS / "logs" / "fleet_routing"
    logs.mkdir(parents=True, exist_ok=True)
    arms = list(args.arms.split(",")) if args.arms else list(POLICIES)
    if not args.arms and shutil.which("smg", path=str(Path(sys.executable).parent)):
        arms.append("smg-cache_aware")
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    for workload in args.workloads.split(","):
        runs[workload] = {}
        for name in arms:
            if workload == "unique" and name not in ("least-tokens", "prefix-affinity"):
                continue
            runs[workload][name] = summary(await run_arm(name, workload, args, logs))
            print(workload, name, json.dumps(runs[workload][name]), flush=True)
    out = {"machine": platform.platform(), "python": platform.python_version(), "args": vars(args),
           "setup": {"instances": INSTANCES, "groups": GROUPS, "prefix_chars": PREFIX_CHARS, "kv_tokens": KV_TOKENS,
                     "slots": SLOTS, "time_scale": TIME_SCALE, "max_tokens": MAX_TOKENS},
           "runs": runs, "verdicts": verdicts(runs)}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fleet_routing.json").write_text(json.dumps(out, indent=2))
    md = ["# Routing over a fleet with prefix caches", "",
          f"`.venv/bin/python benchmarks/fleet_routing.py --rate {args.rate} --seconds {args.seconds}` on "
          f"{platform.platform()}: {INSTANCES} simulators (h100-llama8b, {SLOTS} slots, {KV_TOKENS} KV tokens, "
          f"prefix caching), {GROUPS} groups of chats each behind a ~3,000-token system prompt (`shared`) or "
          f"every prompt its own (`unique`); TTFT in the simulator's seconds.", "", table(runs), *verdicts(runs), ""]
    (RESULTS / "fleet_routing.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=16.0, help="requests per wall second, Poisson")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--arms", default="", help="comma-separated: " + ", ".join(POLICIES) + ", smg-cache_aware")
    p.add_argument("--workloads", default="shared,unique")
    asyncio.run(main(p.parse_args()))
