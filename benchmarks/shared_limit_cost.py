"""What shared limits cost per request in Redis mode (`state: {url: ...}`, `gateway.shared`): one
caller with `rpm_limit` and `tpm_limit` reserved and settled in a real `redis-server` on loopback,
one request after another: the wall time of a reservation and of a settlement (each one Lua
script, one round trip), the gateway process's CPU per request, and the round trips Redis itself
counted (`INFO commandstats`). Target (issue 17): at most one round trip on admission and one at
the end. Prints and writes benchmarks/results/shared_limit_cost.{json,md}.

    .venv/bin/python benchmarks/shared_limit_cost.py [--requests 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson
from redis import asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tailguard.front.params import CallerSpec  # noqa: E402
from tailguard.config import StateConfig  # noqa: E402
from tailguard.gateway.shared.limits import SharedLimits  # noqa: E402
from tailguard.gateway.shared.link import Link  # noqa: E402
from tests.functional.redis_server import redis_server  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SPEC = CallerSpec("app", requests_per_minute=10**9, tokens_per_minute=10**12)


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


async def commands(url: str) -> int:
    """Script calls Redis has run (EVALSHA and EVAL), from its own statistics."""
    async with aioredis.Redis.from_url(url) as r:
        stats = await r.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


async def run(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        async with redis_server(Path(folder)) as server:
            link = Link(StateConfig(url=server.url), lambda up: None)
            shared = SharedLimits(link, [SPEC], time.perf_counter)
            try:
                await shared.reserve("app", 600)  # warm: the scripts loaded, a connection open
                before = await commands(server.url)
                reserve, settle = [], []
                cpu0 = time.process_time()
                for _ in range(n):
                    t0 = time.perf_counter()
                    _, held = await shared.reserve("app", 600)
                    t1 = time.perf_counter()
                    assert held is not None
                    shared.settle(held, 540, admitted=True)
                    await shared.close()  # the settlement sent (in the gateway it runs in the background)
                    t2 = time.perf_counter()
                    reserve.append((t1 - t0) * 1e3)
                    settle.append((t2 - t1) * 1e3)
                cpu = (time.process_time() - cpu0) / n * 1e3
                calls = await commands(server.url) - before
            finally:
                await link.close()
    return {"reserve p50 (ms)": statistics.median(reserve), "reserve p99 (ms)": pct(reserve, 0.99),
            "settle p50 (ms)": statistics.median(settle), "settle p99 (ms)": pct(settle, 0.99),
            "gateway CPU, reserve + settle (ms/request)": cpu,
            "Redis script calls per request": calls / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    args = ap.parse_args()
    runs = asyncio.run(run(args.requests))
    for k, v in runs.items():
        print(f"{k}: {v:.3f}")
    doc = {"benchmark": "shared_limit_cost", "command": " ".join(["benchmarks/shared_limit_cost.py", *sys.argv[1:]]),
           "machine": platform.platform(), "args": vars(args), "runs": runs}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "shared_limit_cost.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    lines = [f"# shared_limit_cost\n\n`{doc['command']}` ({doc['machine']}), one request after another, "
             "a real redis-server on loopback\n", "| what | value |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in runs.items()]
    (RESULTS / "shared_limit_cost.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
