"""Where the gateway's own time per request goes, in numbers that repeat on a busy machine.

Counts the instructions `tailguard serve` executes (valgrind's callgrind: the same count for the
same code and inputs, whatever else the machine is doing) while it relays sequential streamed
chat answers from a `tailguard sim` on loopback, the same way `gateway_overhead.py` sends them.
Two runs of the gateway: answers of 1 token (the fixed cost of a request: accept, parse, classify,
admit, open upstream, first chunk, end, metrics, access log) and of 64 tokens (the difference,
over 63, is the cost of each further chunk; as the longer answers also take longer, the same
figures are given less what the gateway executes per second with no request, counted for
`--idle` seconds after each run). With `--top`, callgrind's inclusive counts of the
C functions that matter (the event loop, the HTTP parser, JSON, logging, the socket calls).

`--pyspy SECONDS` instead samples the gateway with py-spy under open-loop load at `--rate` and
prints which Python functions the time is spent in (inclusive and own share of samples).

    .venv/bin/python benchmarks/gateway_profile.py [--requests 200] [--top 25]   (writes results/gateway_profile.*)
    .venv/bin/python benchmarks/gateway_profile.py --pyspy 20 --rate 200
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tailguard.cli.experiment import free_port, wait_healthy
from tailguard.speedups import speedups

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = [{"role": "user", "content": "word " * 80}]  # about 104 prompt tokens, as gateway_overhead.py
WARMUP = 50


def body(tokens: int) -> bytes:
    return orjson.dumps({"model": "tailguard-sim", "messages": PROMPT, "max_tokens": tokens, "stream": True})


async def sequential(url: str, tokens: int, n: int) -> None:
    """`n` streamed requests one after another, each read to its end."""
    data = body(tokens)
    async with aiohttp.ClientSession() as s:
        for _ in range(n):
            async with s.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200, r.status
                async for _chunk in r.content.iter_any():
                    pass


async def open_loop(url: str, tokens: int, rate: float, seconds: float) -> int:
    """Poisson arrivals at `rate` for `seconds`; returns how many requests were sent."""
    rng = random.Random(1)
    data = body(tokens)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def one() -> None:
            async with s.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
                async for _chunk in r.content.iter_any():
                    pass

        tasks = []
        end = time.perf_counter() + seconds
        while (now := time.perf_counter()) < end:
            tasks.append(asyncio.create_task(one()))
            await asyncio.sleep(max(0.0, rng.expovariate(rate) - (time.perf_counter() - now)))
        await asyncio.gather(*tasks)
        return len(tasks)


class Stack:
    """A simulator and a gateway in front of it, the gateway optionally under valgrind, and
    with `gw_env` as its environment if given."""

    def __init__(self, tmp: Path, wrap: list[str], gw_env: dict[str, str] | None = None) -> None:
        self.sim_port, self.gw_port = free_port(), free_port()
        sim_url = f"http://127.0.0.1:{self.sim_port}"
        cfg = tmp / "tailguard.yaml"
        cfg.write_text(
            f"port: {self.gw_port}\naccess_log: true\nbackends:\n"
            f"  - {{name: sim, url: '{sim_url}', kind: sim, max_concurrency: 4096}}\n"
            "classes:\n  - {name: interactive, rank: 0, max_queue_len: 100000}\n  - {name: batch, rank: 1}\n")
        py = sys.executable
        self.log = open(tmp / "gateway.log", "wb")
        self.sim = subprocess.Popen([py, "-m", "tailguard", "sim", "--port", str(self.sim_port), "--max-num-seqs",
                                     "4096", "--time-scale", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.gw = subprocess.Popen([*wrap, py, "-m", "tailguard", "serve", "--config", str(cfg)],
                                   stdout=subprocess.DEVNULL, stderr=self.log, env=gw_env)
        self.url = f"http://127.0.0.1:{self.gw_port}/v1/chat/completions"

    async def ready(self) -> None:
        await wait_healthy(f"http://127.0.0.1:{self.sim_port}/health", self.sim)
        await wait_healthy(f"http://127.0.0.1:{self.gw_port}/health", self.gw, timeout_s=300.0)

    def stop(self) -> None:
        for p in (self.gw, self.sim):
            p.terminate()
        for p in (self.gw, self.sim):
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.log.close()


def _callgrind(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, stdout=subprocess.DEVNULL)


async def count(tmp: Path, tokens: int, n: int, idle_s: float) -> tuple[Path, float, float]:
    """The callgrind profile of `n` requests of `tokens` tokens (warm-up not counted), the
    seconds they took, and what the gateway executes per second with no request (its
    background: timers, pollers; 0.0 when `idle_s` is 0), counted for `idle_s` after them."""
    out = tmp / f"callgrind.{tokens}"
    stack = Stack(tmp, ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p"])
    try:
        await stack.ready()
        _callgrind(stack.gw.pid, "--instr=on")
        await sequential(stack.url, tokens, WARMUP)
        _callgrind(stack.gw.pid, "--dump=warm")  # a dump zeroes the counts: the next one holds the n alone
        start = time.perf_counter()
        await sequential(stack.url, tokens, n)
        took = time.perf_counter() - start
        _callgrind(stack.gw.pid, "--dump=measured")
        if idle_s:
            start = time.perf_counter()
            await asyncio.sleep(idle_s)
            idle_s = time.perf_counter() - start
            _callgrind(stack.gw.pid, "--dump=idle")
    finally:
        stack.stop()
    dumps = {}
    for path in tmp.glob(f"callgrind.{tokens}.*"):
        m = re.search(rb"^desc: Trigger: .*(measured|idle)", path.read_bytes(), re.M)
        if m:
            dumps[m.group(1).decode()] = path
    if "measured" not in dumps:
        raise RuntimeError(f"no measured dump in {tmp}")
    rate = _total(dumps["idle"]) / idle_s if idle_s else 0.0
    return dumps["measured"], took, rate


def _total(path: Path) -> int:
    m = re.search(r"^summary: (\d+)", path.read_text(errors="replace"), re.M)
    assert m is not None, path
    return int(m.group(1))


def _top(path: Path, k: int) -> str:
    res = subprocess.run(["callgrind_annotate", "--inclusive=yes", str(path)], capture_output=True, text=True)
    lines = [ln for ln in res.stdout.splitlines() if re.match(r"\s*[\d,]+ \(", ln)]
    return "\n".join(lines[:k])


async def pyspy(tmp: Path, seconds: float, rate: float, tokens: int) -> None:
    """Sample the gateway at 1 kHz under open-loop load; print each Python function's CPU time
    per request (inclusive and own): samples x 1 ms / requests."""
    stack = Stack(tmp, [])
    out = tmp / "pyspy.txt"
    try:
        await stack.ready()
        await open_loop(stack.url, tokens, rate, 2.0)
        spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "--format", "raw",
                                "--function", "-r", "1000", "-d", str(int(seconds)), "-o", str(out),
                                "--pid", str(stack.gw.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(1.0)  # py-spy attaches
        sent = await open_loop(stack.url, tokens, rate, seconds - 2.0)
        spy.wait(timeout=seconds + 60)
    finally:
        stack.stop()
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in out.read_text().splitlines():
        stack_s, _, n_s = line.rpartition(" ")
        n = int(n_s)
        frames = [re.sub(r" \((?:.*/)?([^/]+)\)", r" (\1)", f) for f in stack_s.split(";")]
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    us = 1e3 / sent  # one sample is 1 ms of the gateway's time, shared by `sent` requests
    print(f"py-spy at 1 kHz: {total} busy samples, {sent} requests of {tokens} tokens at {rate:.0f}/s; "
          f"{total * us:.0f} us of gateway time per request")
    print("inclusive, us per request:")
    for f, n in incl.most_common(60):
        print(f"  {n * us:7.1f}  {f}")
    print("own, us per request:")
    for f, n in own.most_common(30):
        print(f"  {n * us:7.1f}  {f}")


def _write(res: dict[str, Any]) -> None:
    """benchmarks/results/gateway_profile.{json,md}: the last run's counts."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    res["load_1m"] = round(os.getloadavg()[0], 2)
    res["relay_step"] = "C" if speedups is not None else "Python"  # the gateway inherits this environment
    (RESULTS / "gateway_profile.json").write_text(json.dumps(res, indent=2) + "\n")
    less = res.get("less_background")
    rows = [f"| as counted | {res['one_token']:,} | {res['full']:,} | {res['per_chunk']:,} |"]
    if isinstance(less, dict):
        rows.append(f"| less the background ({res['background_per_s']:,} instructions/s with no request) | "
                    f"{less['one_token']:,} | {less['full']:,} | {less['per_chunk']:,} |")
    (RESULTS / "gateway_profile.md").write_text(
        "# Instructions per request (callgrind)\n\n"
        f"`benchmarks/gateway_profile.py --requests {res['requests']}`, {res['requests']} sequential streamed "
        f"requests after {WARMUP} of warm-up; load average {res['load_1m']} at the end (the counts do not "
        f"depend on it); the relay's per-chunk step in {res['relay_step']} (`tailguard.speedups`).\n\n"
        f"| | 1-token answer | {res['tokens']}-token answer | each further chunk |\n|---|---:|---:|---:|\n"
        + "\n".join(rows) + "\n")


async def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--top", type=int, default=0, help="list the top C functions by inclusive count")
    p.add_argument("--pyspy", type=float, default=0.0, help="sample with py-spy for this many seconds instead")
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--keep", action="store_true", help="keep the profiles (the folder is printed)")
    p.add_argument("--idle", type=float, default=10.0,
                   help="seconds of no request counted after each run, for the background rate (0: not counted)")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tg-profile-"))
    if args.keep:
        print(f"profiles in {tmp}")
    try:
        if args.pyspy:
            await pyspy(tmp, args.pyspy, args.rate, args.tokens)
            return
        one, one_s, rate1 = await count(tmp, 1, args.requests, args.idle)
        full, full_s, rate2 = await count(tmp, args.tokens, args.requests, args.idle)
        n, k = args.requests, args.tokens - 1
        per_req, per_full = _total(one) / n, _total(full) / n
        res: dict[str, object] = {"requests": n, "tokens": args.tokens, "one_token": round(per_req),
                                  "full": round(per_full), "per_chunk": round((per_full - per_req) / k)}
        print(f"instructions per request, {n} sequential requests: 1-token answer {per_req:,.0f}; "
              f"{args.tokens}-token answer {per_full:,.0f}; each further chunk {res['per_chunk']:,}")
        if args.idle:
            # The longer answers take longer (the simulator paces its tokens): the background the
            # gateway runs meanwhile lands in "each further chunk" unless taken out.
            rate = (rate1 + rate2) / 2
            bg1, bg2 = rate * one_s / n, rate * full_s / n
            res["background_per_s"] = round(rate)
            res["less_background"] = {"one_token": round(per_req - bg1), "full": round(per_full - bg2),
                                      "per_chunk": round((per_full - bg2 - per_req + bg1) / k)}
            print(f"background with no request: {rate:,.0f} instructions/s; less it: 1-token answer "
                  f"{per_req - bg1:,.0f}; {args.tokens}-token answer {per_full - bg2:,.0f}; each further chunk "
                  f"{(per_full - bg2 - per_req + bg1) / k:,.0f}")
        _write(res)
        if args.top:
            print(f"\n1-token answers, inclusive:\n{_top(one, args.top)}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
