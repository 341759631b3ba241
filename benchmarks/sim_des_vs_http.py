"""Do the simulator's two drivers agree? One light workload through the HTTP server (a real
`tailguard sim` process at time scale 1, streamed over loopback) and through the discrete-event run,
compared request by request on TTFT and end-to-end latency.

The discrete-event run gets the HTTP run's actual send instants, so both see the same arrivals.
Client-side TTFT includes loopback HTTP and SSE parsing (a fraction of a millisecond) that the
discrete-event run does not model. Prints and writes benchmarks/results/sim_des_vs_http.{json,md}.

    .venv/bin/python benchmarks/sim_des_vs_http.py [--requests 40] [--rate 4] [--preset a100-llama8b]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

import aiohttp

from tailguard.clock import VirtualClock
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import run
from tailguard.sim.scenario import Arrival
from tailguard.sim.engine import Engine
from tailguard.wire.sse import SSEDecoder

from sim_des_speed import pct  # beside this script: one nearest-rank percentile for both

RESULTS = Path(__file__).resolve().parent / "results"


def workload(n: int, rate: float, seed: int) -> list[tuple[float, int, int]]:
    """(due offset s, prompt tokens, max_tokens): prompts of 256-2048 tokens, 16-64 tokens out."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append((t, rng.choice([256, 512, 1024, 2048]), rng.choice([16, 32, 64])))
    return out


async def one(session: aiohttp.ClientSession, url: str, t0: float, due: float, prompt: int, max_tokens: int,
              out: list[dict[str, float]]) -> None:
    await asyncio.sleep(max(0.0, t0 + due - time.perf_counter()))
    body = {"model": "tailguard-sim", "prompt": [7] * prompt, "max_tokens": max_tokens, "stream": True}
    sent = time.perf_counter() - t0
    first = None
    tokens = 0
    async with session.post(f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        dec = SSEDecoder()
        async for data in r.content.iter_any():
            now = time.perf_counter() - t0
            for ev in dec.feed(data):
                if ev.data != b"[DONE]" and b'"text":" tok"' in ev.data:
                    tokens += 1
                    if first is None:
                        first = now
    end = time.perf_counter() - t0
    assert first is not None and tokens == max_tokens, (tokens, max_tokens)
    out.append({"sent": sent, "ttft": first - sent, "e2e": end - sent, "prompt": prompt, "max_tokens": max_tokens})


async def http_run(preset: str, load: list[tuple[float, int, int]]) -> tuple[list[dict[str, float]], dict[str, float]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard", "sim", "--port", "0", "--preset", preset, "--time-scale", "1",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        m = re.search(r"listening on (http://[^ ]+)", line)
        assert m, line
        url = m.group(1)
        out: list[dict[str, float]] = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            t0 = time.perf_counter() + 0.2
            await asyncio.gather(*(one(session, url, t0, d, p, mt, out) for d, p, mt in load))
            async with session.get(f"{url}/metrics") as r:
                server = scrape_sums(await r.text())
        return sorted(out, key=lambda r: r["sent"]), server
    finally:
        proc.terminate()
        await proc.wait()


def scrape_sums(text: str) -> dict[str, float]:
    """`_sum` and `_count` of the simulator's own latency histograms (simulated seconds, no HTTP)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(vllm:\w+_seconds_(?:sum|count))\{[^}]*\} (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--preset", default="a100-llama8b")
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()

    load = workload(args.requests, args.rate, args.seed)
    http, server = asyncio.run(http_run(args.preset, load))
    base = http[0]["sent"]
    arrivals = [Arrival(f"r{i}", r["sent"] - base, int(r["prompt"]), int(r["max_tokens"])) for i, r in enumerate(http)]
    des = run(Engine(EngineConfig.from_preset(args.preset)), arrivals, VirtualClock())

    ttft_pairs = [(h["ttft"], d.ttft_s) for h, d in zip(http, des)]
    e2e_pairs = [(h["e2e"], d.e2e_s) for h, d in zip(http, des)]
    ttft_err = [abs(h - d) / d * 100 for h, d in ttft_pairs if d]
    e2e_err = [abs(h - d) / d * 100 for h, d in e2e_pairs if d]
    ttft_diff_ms = [(h - d) * 1000 for h, d in ttft_pairs if d is not None]

    def dist(values: list[float]) -> dict[str, float]:
        return {"p50": round(pct(values, 0.5), 4), "p90": round(pct(values, 0.9), 4), "p99": round(pct(values, 0.99), 4)}

    result = {
        "benchmark": "sim_des_vs_http",
        "preset": args.preset,
        "requests": args.requests,
        "arrival_rate_per_s": args.rate,
        "http_ttft_s": dist([h for h, _ in ttft_pairs]),
        "des_ttft_s": dist([d for _, d in ttft_pairs if d is not None]),
        "http_e2e_s": dist([h for h, _ in e2e_pairs]),
        "des_e2e_s": dist([d for _, d in e2e_pairs if d is not None]),
        "ttft_abs_diff_pct": {"mean": round(statistics.mean(ttft_err), 2), "median": round(statistics.median(ttft_err), 2),
                              "max": round(max(ttft_err), 2)},
        "ttft_http_minus_des_ms": {"mean": round(statistics.mean(ttft_diff_ms), 3),
                                   "median": round(statistics.median(ttft_diff_ms), 3)},
        "server_side_mean_ttft_s": round(server["vllm:time_to_first_token_seconds_sum"]
                                         / server["vllm:time_to_first_token_seconds_count"], 5),
        "des_mean_ttft_s": round(statistics.mean(d for _, d in ttft_pairs if d is not None), 5),
        "server_side_mean_e2e_s": round(server["vllm:e2e_request_latency_seconds_sum"]
                                        / server["vllm:e2e_request_latency_seconds_count"], 5),
        "des_mean_e2e_s": round(statistics.mean(d for _, d in e2e_pairs if d is not None), 5),
        "e2e_abs_diff_pct": {"mean": round(statistics.mean(e2e_err), 2), "median": round(statistics.median(e2e_err), 2),
                             "max": round(max(e2e_err), 2)},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sim_des_vs_http.json").write_text(json.dumps(result, indent=2) + "\n")
    r = result
    md = (
        "# Discrete-event run vs HTTP server on the same workload\n\n"
        f"`.venv/bin/python benchmarks/sim_des_vs_http.py --requests {args.requests} --rate {args.rate} "
        f"--preset {args.preset}`: Poisson arrivals, prompts of 256-2048 tokens, 16-64 tokens out, streamed "
        "over loopback from a `tailguard sim` process at time scale 1; the discrete-event run replays the same "
        "send instants.\n\n"
        "| | TTFT p50 | TTFT p90 | TTFT p99 | E2E p50 | E2E p90 | E2E p99 |\n|---|---:|---:|---:|---:|---:|---:|\n"
        f"| HTTP (client-side) | {r['http_ttft_s']['p50'] * 1000:.1f} ms | {r['http_ttft_s']['p90'] * 1000:.1f} ms | "
        f"{r['http_ttft_s']['p99'] * 1000:.1f} ms | {r['http_e2e_s']['p50']:.3f} s | {r['http_e2e_s']['p90']:.3f} s | "
        f"{r['http_e2e_s']['p99']:.3f} s |\n"
        f"| discrete-event | {r['des_ttft_s']['p50'] * 1000:.1f} ms | {r['des_ttft_s']['p90'] * 1000:.1f} ms | "
        f"{r['des_ttft_s']['p99'] * 1000:.1f} ms | {r['des_e2e_s']['p50']:.3f} s | {r['des_e2e_s']['p90']:.3f} s | "
        f"{r['des_e2e_s']['p99']:.3f} s |\n\n"
        f"Per request, TTFT differs by {r['ttft_abs_diff_pct']['median']}% (median; mean "
        f"{r['ttft_abs_diff_pct']['mean']}%, max {r['ttft_abs_diff_pct']['max']}%); HTTP is "
        f"{r['ttft_http_minus_des_ms']['median']} ms later at the median. End-to-end latency differs by "
        f"{r['e2e_abs_diff_pct']['median']}% (median; max {r['e2e_abs_diff_pct']['max']}%). The gap is the "
        "loopback HTTP path (client send to handler, token write to client read); the rare large per-request "
        "gap is a request that reached the server just after a step began, so it waited for the next step.\n\n"
        "Inside the server (its own `vllm:time_to_first_token_seconds` and `vllm:e2e_request_latency_seconds`, "
        "measured from the request reaching the engine, so without the HTTP path): mean TTFT "
        f"{r['server_side_mean_ttft_s'] * 1000:.2f} ms vs {r['des_mean_ttft_s'] * 1000:.2f} ms in the discrete-event "
        f"run; mean E2E {r['server_side_mean_e2e_s']:.4f} s vs {r['des_mean_e2e_s']:.4f} s.\n"
    )
    (RESULTS / "sim_des_vs_http.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
