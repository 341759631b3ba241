"""What callers' limits and leases cost per request end to end over HTTP, in memory mode and in
Redis mode (issue 17; target: at most one pipelined Redis round trip on admission and one at the
end, and under 0.2 ms of gateway CPU in memory mode).

Three `tailguard serve` processes side by side in front of one fast `tailguard sim` (time scale
0.01): `none` (a key without limits), `memory` (a key with `rpm_limit`, `tpm_limit` and
`max_parallel_requests`, all far above the load, kept by the gateway alone) and `redis` (the same
key, `state.url` set: the limits and the key's places in a real `redis-server`, the backend's
slots leased there). A closed loop of `--concurrency` clients (one phase each) sends short non-streaming chats,
each client taking the arms in turn, so every arm sees the same machine at the same moment.
Reported per arm: the latency (median, P99) and what it adds over `none`, the gateway process's
CPU per request (from /proc) and what it adds over `none`, and for `redis` the commands
redis-server itself counted (`INFO commandstats`, before and after) per request: the scripts run
per request, and the rest (heartbeats, slot renewals, usage writes, place renewals: per replica
and per second, not per request). Writes benchmarks/results/lease_cost_http.{json,md}.

    .venv/bin/python benchmarks/lease_cost_http.py [--requests 3000] [--concurrency 1,6]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from redis import asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import cpu_seconds  # noqa: E402  beside this script
from sim_des_speed import pct  # noqa: E402  one nearest-rank percentile for all
from tests.functional.gateway_processes import gateway_process  # noqa: E402
from tests.functional.redis_server import redis_server  # noqa: E402
from tests.functional.sim_processes import sim_process  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ARMS = ("none", "memory", "redis")
LIMITED = {"name": "app", "rpm_limit": 10**8, "tpm_limit": 10**11, "max_parallel_requests": 10**5}
BODY = orjson.dumps({"model": "tailguard-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})


def config(sim_url: str, arm: str, redis_url: str) -> dict[str, Any]:
    key = {"name": "free"} if arm == "none" else LIMITED
    cfg: dict[str, Any] = {"backends": [{"name": "sim", "url": sim_url, "max_concurrency": 256}],
                           "auth": {"api_keys": {"sk-bench": key}}, "access_log": False}
    if arm == "redis":
        cfg["state"] = {"url": redis_url}
    return cfg


async def redis_counts(url: str) -> dict[str, int]:
    async with aioredis.Redis.from_url(url) as r:
        stats = await r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


async def redis_cpu(url: str) -> float:
    async with aioredis.Redis.from_url(url) as r:
        info = await r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def load(urls: dict[str, str], n: int, concurrency: int) -> dict[str, list[float]]:
    """`n` requests per arm from `concurrency` clients in a closed loop, the arms taken in turn;
    the latencies in ms per arm."""
    out: dict[str, list[float]] = {a: [] for a in urls}
    headers = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}
    turns = iter([ARMS[i % len(ARMS)] for i in range(n * len(ARMS))])  # shared: each client takes the next
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def client() -> None:
            for arm in turns:
                t0 = time.perf_counter()
                async with s.post(urls[arm], data=BODY, headers=headers) as r:
                    await r.read()
                    assert r.status == 200, (arm, r.status)
                out[arm].append((time.perf_counter() - t0) * 1e3)
        await asyncio.gather(*(client() for _ in range(concurrency)))
    return out


async def run(n: int, concurrencies: list[int]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        async with AsyncExitStack() as stack:
            redis = await stack.enter_async_context(redis_server(root))
            sim = await stack.enter_async_context(sim_process("--max-num-seqs", "1024", time_scale=0.01))
            gws = {}
            for arm in ARMS:
                (root / arm).mkdir()
                gws[arm] = await stack.enter_async_context(gateway_process(root / arm, config(sim.url, arm, redis.url)))
            urls = {a: f"{g.url}/v1/chat/completions" for a, g in gws.items()}
            await load(urls, 200, max(concurrencies))  # warm: connections open, scripts loaded
            pids = {a: g.proc.pid for a, g in gws.items()}
            return {str(c): await phase(urls, pids, redis.url, n, c) for c in concurrencies}


async def phase(urls: dict[str, str], pids: dict[str, int], redis_url: str, n: int, concurrency: int) -> dict[str, Any]:
    """One measured run of `n` requests per arm at `concurrency`."""
    load_before = os.getloadavg()[0]
    cpu0 = {a: sum(cpu_seconds([pid])) for a, pid in pids.items()}
    cmd0, rcpu0 = await redis_counts(redis_url), await redis_cpu(redis_url)
    started = time.perf_counter()
    lat = await load(urls, n, concurrency)
    seconds = time.perf_counter() - started
    cpu = {a: (sum(cpu_seconds([pid])) - cpu0[a]) / n * 1e3 for a, pid in pids.items()}
    cmd1, rcpu1 = await redis_counts(redis_url), await redis_cpu(redis_url)
    calls = {k: v - cmd0.get(k, 0) for k, v in cmd1.items() if v - cmd0.get(k, 0)}
    scripts = calls.get("evalsha", 0) + calls.get("eval", 0)
    p50 = {a: statistics.median(v) for a, v in lat.items()}
    p99 = {a: pct(v, 0.99) for a, v in lat.items()}
    arms = {a: {"latency p50 (ms)": p50[a], "latency p99 (ms)": p99[a], "added p50 over none (ms)": p50[a] - p50["none"],
                "gateway CPU (ms/request)": cpu[a], "added CPU over none (ms/request)": cpu[a] - cpu["none"]}
            for a in ARMS}
    return {"arms": arms, "seconds": seconds, "load_before": load_before, "load_after": os.getloadavg()[0],
            "redis": {"commands during the run (those inside scripts included)": calls,
                      "script calls per request": scripts / n,
                      "script calls beyond two per request, per second": (scripts - 2 * n) / seconds,
                      "usage writes (HINCRBY, HINCRBYFLOAT)": calls.get("hincrby", 0) + calls.get("hincrbyfloat", 0),
                      "redis-server CPU (ms/request)": (rcpu1 - rcpu0) / n * 1e3}}


def markdown(doc: dict[str, Any]) -> str:
    lines = [f"# lease_cost_http\n\n`{doc['command']}` ({doc['machine']}): {doc['args']['requests']} requests per "
             "arm and phase, the clients in a closed loop taking the arms in turn\n"]
    for c, res in doc["result"].items():
        lines += [f"## {c} client(s) at once: {res['seconds']:.1f} s, load average {res['load_before']:.2f} before, "
                  f"{res['load_after']:.2f} after\n",
                  "| arm | latency P50 (ms) | P99 (ms) | added P50 over none (ms) | gateway CPU (ms/request) | "
                  "added CPU over none (ms/request) |", "|---|---|---|---|---|---|"]
        for arm, r in res["arms"].items():
            lines.append(f"| {arm} | {r['latency p50 (ms)']:.2f} | {r['latency p99 (ms)']:.2f} | "
                         f"{r['added p50 over none (ms)']:.2f} | {r['gateway CPU (ms/request)']:.3f} | "
                         f"{r['added CPU over none (ms/request)']:.3f} |")
        rd = res["redis"]
        lines += ["", f"redis-server counted {rd['script calls per request']:.3f} script calls (`EVALSHA`, each its "
                  "own round trip) per request of the redis arm: two per request (admission, end) and "
                  f"{rd['script calls beyond two per request, per second']:.1f} a second besides (the heartbeat, "
                  "the places' renewal, and the slot allotment's renewals: up to 20 a second while the replica "
                  "holds slots it is not using; per second, not per request). The meter's usage writes (one "
                  f"pipeline every 5 s) sent {rd['usage writes (HINCRBY, HINCRBYFLOAT)']} increments; the other "
                  "commands in the JSON file's counts are those the scripts ran. redis-server's own CPU: "
                  f"{rd['redis-server CPU (ms/request)']:.3f} ms per request.\n"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000, help="requests per arm")
    ap.add_argument("--concurrency", type=lambda v: [int(c) for c in v.split(",")], default=[1, 6],
                    help="clients at once, one phase each (comma-separated)")
    args = ap.parse_args()
    result = asyncio.run(run(args.requests, args.concurrency))
    doc = {"benchmark": "lease_cost_http", "command": " ".join(["benchmarks/lease_cost_http.py", *sys.argv[1:]]),
           "machine": platform.platform(), "args": vars(args), "result": result}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "lease_cost_http.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    text = markdown(doc)
    (RESULTS / "lease_cost_http.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
