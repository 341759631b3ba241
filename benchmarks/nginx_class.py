"""nginx's class on CPU (issue 23), in one run on one machine:

1. tailguard against nginx side by side, in front of the same `tailguard sim` (time scale 1, H100
   preset), streamed 64-chunk chat answers, open-loop Poisson arrivals rotating over the arms
   (straight, gateway, nginx) at each of `--rates` (totals over the three arms), `--rounds` times
   back to back: added TTFT P50/P99 (arm minus straight) and CPU per request of the gateway's
   process and of nginx's (master and worker), from /proc; the median ratio over the rounds. The
   setup and the measuring code are `gateway_overhead.py`'s.
2. tailguard's sustained ceiling with `tailguard serve --workers 1` and `--workers 2`: the highest
   rate at which its added TTFT P99 stays under 5 ms. At each rate of `--sweep` the same schedule
   of `tailguard bench --workers` (`--bench-workers` processes) goes straight to the simulator,
   then through the gateway; the sweep ends where the gateway falls behind, or where the
   simulator's modelled engine queues or the generator falls behind, which then says the machine,
   not the gateway, is the limit.
3. The load generator's ceiling (`tailguard bench --workers 1` and `2`): the highest rate at which
   its dispatch-lag P99 stays under 5 ms (and every worker's), against nginx answering the same
   64-chunk stream from memory (the cheapest target there is, so the generator is what is measured).

The machine's cores are shared by every process here (simulator, proxies, generator): each sweep
step says how many were busy (/proc/stat), so a ceiling reads "at least this, on this machine".

    .venv/bin/python benchmarks/nginx_class.py [--rates 200 1000] [--seconds 10] [--rounds 3]
        [--sweep 100 200 300 400 600 800 1000] [--sweep-seconds 6] [--bench-workers 2]
        [--bench-sweep 1000 2000 2600 3000 ... 7000]

Needs nginx on PATH (`make nginx`). Writes benchmarks/results/nginx_class.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from tailguard.bench.load import BenchConfig

from tailguard.bench.run import run_bench
from tailguard.bench.validity import validity
from tailguard.bench.workload import parse_workload
from tailguard.cli.experiment import free_port, wait_healthy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import NGINX_CONF, RESULTS, TOKENS, cpu_seconds, measured, pct, with_children  # noqa: E402  beside this script

CEILING_MS = 5.0
# A straight TTFT P99 past this: the modelled engine itself queues (its step grows with its batch),
# so what a proxy adds is lost in the engine's own queue.
SATURATED_MS = 50.0
STATIC_CONF = """\
worker_processes 1;
daemon off;
pid {tmp}/static.pid;
error_log {tmp}/static-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/sbody;
    server {{
        listen 127.0.0.1:{port};
        root {tmp}/static;
        location = /v1/models {{ default_type application/json; }}
        # A POST to a file is a 405 in nginx; turned into the file itself (a GET, internally).
        location = /v1/chat/completions {{ default_type text/event-stream; error_page 405 =200 $uri; }}
    }}
}}
"""


def _stream() -> str:
    chunk = ('data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
             '"delta":{"content":" tok"},"finish_reason":null}]}\n\n')
    return chunk * TOKENS + "data: [DONE]\n\n"


class Procs:
    """The processes of a run, stopped together."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.procs, self.log = tmp, list[subprocess.Popen[bytes]](), open(tmp / "servers.log", "wb")

    def start(self, *argv: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=self.log)
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.log.close()


def _gateway(procs: Procs, sim_port: int, workers: int) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    cfg = procs.tmp / f"gw{workers}.yaml"
    cfg.write_text(f"port: {port}\nbackends:\n  - {{name: sim, url: 'http://127.0.0.1:{sim_port}', kind: sim, "
                   "max_concurrency: 8192}\nclasses:\n  - {name: interactive, rank: 0, max_queue_len: 100000}\n"
                   "  - {name: batch, rank: 1}\n")
    p = procs.start(sys.executable, "-m", "tailguard", "serve", "--config", str(cfg), "--workers", str(workers))
    return f"http://127.0.0.1:{port}", p


def _line(label: str, r: dict[str, Any]) -> str:
    a = r["added_ms"]
    arms = " ".join(f"{arm} {v['ttft_p50']:+.2f}/{v['ttft_p99']:+.2f} ms" for arm, v in a.items())
    cpu = " ".join(f"{arm} {c['ms_per_request']:.3f} ms" for arm, c in r["cpu"].items())
    return f"{label} {r['rate_per_s']:.0f}/s: added TTFT p50/p99 {arms}; CPU/request {cpu}; valid {r['valid']}"


async def side_by_side(procs: Procs, sim_url: str, gw_url: str, gw: subprocess.Popen[bytes], nginx: str,
                       args: argparse.Namespace) -> list[dict[str, Any]]:
    port = free_port()
    sim_port = sim_url.rsplit(":", 1)[1]
    (procs.tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=procs.tmp, sim_port=sim_port, port=port))
    ngx = procs.start(nginx, "-c", str(procs.tmp / "nginx.conf"), "-p", str(procs.tmp))
    ngx_url = f"http://127.0.0.1:{port}"
    await wait_healthy(f"{ngx_url}/health", ngx)
    urls = {"straight": sim_url, "gateway": gw_url, "nginx": ngx_url}
    urls = {k: f"{v}/v1/chat/completions" for k, v in urls.items()}
    pids = {"gateway": with_children(gw.pid), "nginx": with_children(ngx.pid)}
    out = []
    async with _sessions(urls) as sessions:
        await measured(sessions, urls, pids, 100.0, 2.0, seed=1)  # warm-up: connections, caches
        for rate in args.rates:
            for i in range(args.rounds):  # rounds back to back: a shared machine moves between them
                r = await measured(sessions, urls, pids, rate, args.seconds, seed=int(rate) + i)
                r["round"] = i + 1
                r["cpu_ratio_gateway_to_nginx"] = (r["cpu"]["gateway"]["ms_per_request"]
                                                   / r["cpu"]["nginx"]["ms_per_request"])
                out.append(r)
                print(_line(f"side by side, round {i + 1},", r), flush=True)
    return out


class _sessions:
    def __init__(self, urls: dict[str, str]) -> None:
        self.s = {arm: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0))
                  for arm in urls}

    async def __aenter__(self) -> dict[str, aiohttp.ClientSession]:
        return self.s

    async def __aexit__(self, *exc: object) -> None:
        for s in self.s.values():
            await s.close()


def _machine_busy() -> tuple[float, float]:
    """The machine's busy and total CPU ticks so far (/proc/stat; iowait counts as idle)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return total - fields[3] - fields[4], total


def _cores_busy(before: tuple[float, float], after: tuple[float, float]) -> float:
    """How many of the machine's cores were busy between two `_machine_busy` readings."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total * (os.cpu_count() or 1) if total else 0.0


def _chat_workload() -> Any:
    return parse_workload({"name": "ceiling", "classes": [
        {"name": "chat", "prompt_tokens": 104, "max_tokens": TOKENS, "stream": True}]})


async def bench_step(url: str, rate: float, workers: int, seconds: float, seed: int) -> dict[str, Any]:
    """One open-loop step of `tailguard bench --workers N` at `rate` against `url`: its TTFT
    (send to first content), errors, the generator's own validity, and how busy the machine was."""
    machine = _machine_busy()
    res = await run_bench(BenchConfig(url=url, workload=_chat_workload(), rate=rate, duration_s=seconds,
                                      warmup_s=1.0, seed=seed, time_scale=1.0, workers=workers))
    cores = _cores_busy(machine, _machine_busy())
    recs = [r for r in res.records if not r.warmup]
    v = validity(recs, res.meta)
    ttft = [(r.first_token_at - r.sent_at) * 1e3 for r in recs if r.ok and r.first_token_at is not None]
    return {"rate_per_s": rate, "workers": workers, "requests": len(recs), "errors": sum(1 for r in recs if not r.ok),
            "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
            "dispatch_lag_p99_ms": v["dispatch_lag_p99_s"] * 1e3, "valid": v["valid"], "cores_busy": cores}


def _stops(step: dict[str, Any]) -> list[str]:
    """Why a step of tailguard's ceiling ends the sweep, every reason that holds (none: the
    gateway kept up)."""
    straight, gateway, added_ms = step["straight"], step["gateway"], step["added_ttft_p99_ms"]
    out = []
    if straight["errors"] or straight["ttft_p99_ms"] >= SATURATED_MS:
        out.append(f"the simulator's engine model queued (TTFT P99 {straight['ttft_p99_ms']:.0f} ms straight, "
                   f"{straight['errors']} errors)")
    if not (straight["valid"] and gateway["valid"]):
        out.append(f"the generator fell behind its schedule ({gateway['cores_busy']:.2f} of {os.cpu_count()} "
                   "cores busy)")
    if added_ms >= CEILING_MS or gateway["errors"]:
        out.append(f"the added TTFT P99 reached {CEILING_MS:g} ms ({added_ms:.1f} ms, {gateway['errors']} errors)")
    return out


async def _sweep(rates: list[float], step_at: Callable[[float], Awaitable[dict[str, Any]]],
                 stops_of: Callable[[dict[str, Any]], list[str]]) -> dict[str, Any]:
    """The highest of `rates` (in order) before the first whose step (`step_at`) gives a reason
    to stop (`stops_of`: every reason that holds, none to go on); every step, and why it ended."""
    best, steps, why = None, [], "every rate was swept"
    for rate in rates:
        step = await step_at(rate)
        steps.append(step)
        stops = stops_of(step)
        if stops:
            why = f"at {rate:.0f}/s " + " and ".join(stops)
            break
        best = rate
    return {"ceiling_per_s": best, "stopped": why, "steps": steps}


async def ceiling(sim_url: str, gw_url: str, gw: subprocess.Popen[bytes], args: argparse.Namespace,
                  label: str) -> dict[str, Any]:
    """The highest rate with the gateway's added TTFT P99 under 5 ms: at each rate the same
    schedule (`bench --workers`, `--bench-workers` processes) goes straight to the simulator,
    then through the gateway, whose CPU per request is taken from /proc."""
    pids = with_children(gw.pid)  # `serve --workers N`: the parent and its N workers

    async def step_at(rate: float) -> dict[str, Any]:
        seed = int(rate)
        straight = await bench_step(sim_url, rate, args.bench_workers, args.sweep_seconds, seed)
        cpu = cpu_seconds(pids)
        gateway = await bench_step(gw_url, rate, args.bench_workers, args.sweep_seconds, seed)
        user, kernel = (a - b for a, b in zip(cpu_seconds(pids), cpu))
        step = {"rate_per_s": rate, "straight": straight, "gateway": gateway,
                "added_ttft_p99_ms": gateway["ttft_p99_ms"] - straight["ttft_p99_ms"],
                "added_ttft_p50_ms": gateway["ttft_p50_ms"] - straight["ttft_p50_ms"],
                "gateway_cpu_ms_per_request": (user + kernel) / max(1, gateway["requests"]) * 1e3}
        print(f"{label} {rate:.0f}/s: added TTFT p50/p99 {step['added_ttft_p50_ms']:+.2f}/"
              f"{step['added_ttft_p99_ms']:+.2f} ms, gateway CPU {step['gateway_cpu_ms_per_request']:.3f} ms/request, "
              f"errors {straight['errors']}+{gateway['errors']}, cores busy {straight['cores_busy']:.2f}/"
              f"{gateway['cores_busy']:.2f}, generator valid {straight['valid'] and gateway['valid']}", flush=True)
        return step

    return await _sweep(args.sweep, step_at, _stops)


async def generator_ceiling(url: str, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    async def step_at(rate: float) -> dict[str, Any]:
        step = await bench_step(url, rate, workers, args.sweep_seconds, int(rate))
        print(f"bench --workers {workers} {rate:.0f}/s: dispatch lag p99 {step['dispatch_lag_p99_ms']:.2f} ms, "
              f"{step['errors']} errors, valid {step['valid']}, cores busy {step['cores_busy']:.2f}", flush=True)
        return step

    def stops_of(step: dict[str, Any]) -> list[str]:
        bad = not step["valid"] or step["errors"]
        return [f"the dispatch lag P99 passed {CEILING_MS:g} ms (or requests failed)"] if bad else []

    return await _sweep(args.bench_sweep, step_at, stops_of)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None:
        raise SystemExit("nginx is not installed: `make nginx`")
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="tg-nginx-class-"))
    tmp.chmod(0o755)  # nginx's workers (not root) read the static answer from here
    procs = Procs(tmp)
    try:
        sim_port = free_port()
        sim_url = f"http://127.0.0.1:{sim_port}"
        sim = procs.start(sys.executable, "-m", "tailguard", "sim", "--port", str(sim_port), "--preset",
                          "h100-llama8b", "--max-num-seqs", "8192", "--time-scale", "1")
        await wait_healthy(f"{sim_url}/health", sim)
        gw1_url, gw1 = _gateway(procs, sim_port, 1)
        gw2_url, gw2 = _gateway(procs, sim_port, 2)
        await wait_healthy(f"{gw1_url}/health", gw1)
        await wait_healthy(f"{gw2_url}/health", gw2)
        side = await side_by_side(procs, sim_url, gw1_url, gw1, nginx, args)
        ceilings = {"1": await ceiling(sim_url, gw1_url, gw1, args, "ceiling, 1 worker"),
                    "2": await ceiling(sim_url, gw2_url, gw2, args, "ceiling, 2 workers")}
        static_port = free_port()
        (tmp / "static" / "v1" / "chat").mkdir(parents=True)
        (tmp / "static" / "v1" / "chat" / "completions").write_text(_stream())
        (tmp / "static" / "v1" / "models").write_bytes(
            orjson.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}))
        (tmp / "static.conf").write_text(STATIC_CONF.format(tmp=tmp, port=static_port))
        static = procs.start(nginx, "-c", str(tmp / "static.conf"), "-p", str(tmp))
        static_url = f"http://127.0.0.1:{static_port}"
        await wait_healthy(f"{static_url}/v1/models", static)
        generator = {str(w): await generator_ceiling(static_url, w, args) for w in (1, 2)}
    finally:
        procs.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "benchmark": "nginx_class",
        "setup": {"tokens_per_response": TOKENS, "prompt_tokens": 104, "ceiling_ms": CEILING_MS,
                  "rates_are": "totals over the arms (side by side: straight, gateway, nginx)",
                  "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                  "load_average_1m": {"start": load_before, "end": os.getloadavg()[0]}},
        "side_by_side": side, "gateway_ceiling": ceilings, "generator_ceiling": generator,
    }


def _side_lines(res: dict[str, Any]) -> list[str]:
    lines = ["| total rate | round | arm | added TTFT P50 | added TTFT P99 | CPU ms/request | errors | generator valid |",
             "|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in res["side_by_side"]:
        for arm in ("gateway", "nginx"):
            a, c = r["added_ms"][arm], r["cpu"][arm]
            lines.append(f"| {r['rate_per_s']:.0f}/s | {r['round']} | {arm} | {a['ttft_p50']:+.2f} ms | "
                         f"{a['ttft_p99']:+.2f} ms | {c['ms_per_request']:.3f} | {r['arms'][arm]['errors']} | "
                         f"{r['valid']} |")
        lines.append(f"| | | ratio gateway/nginx CPU | | | {r['cpu_ratio_gateway_to_nginx']:.2f}x | | |")
    for rate in sorted({r["rate_per_s"] for r in res["side_by_side"]}):
        ok = [r for r in res["side_by_side"] if r["rate_per_s"] == rate and r["valid"]]
        if ok:
            ratio = float(np.median([r["cpu_ratio_gateway_to_nginx"] for r in ok]))
            gap = float(np.median([r["added_ms"]["gateway"]["ttft_p50"] - r["added_ms"]["nginx"]["ttft_p50"]
                                   for r in ok]))
            lines.append(f"\nAt {rate:.0f}/s, over its {len(ok)} valid rounds: CPU ratio median {ratio:.2f}x; "
                         f"added TTFT P50 behind nginx's by {gap:+.2f} ms (median).")
    return lines


def _ceiling_lines(res: dict[str, Any]) -> list[str]:
    g, b = res["gateway_ceiling"], res["generator_ceiling"]
    lines = ["| what | 1 worker | 2 workers |", "|---|---:|---:|",
             f"| tailguard ceiling (added TTFT P99 < 5 ms) | {g['1']['ceiling_per_s']} /s | "
             f"{g['2']['ceiling_per_s']} /s |",
             f"| load generator ceiling (dispatch lag P99 < 5 ms) | {b['1']['ceiling_per_s']} /s | "
             f"{b['2']['ceiling_per_s']} /s |", "",
             "Why each sweep stopped: " + "; ".join(f"tailguard {w}: {g[w]['stopped']}" for w in g) + "; "
             + "; ".join(f"generator {w}: {b[w]['stopped']}" for w in b) + ".", "",
             "| sweep | rate | added TTFT P50 / P99 | gateway CPU ms/request | cores busy (straight / gateway) |",
             "|---|---:|---:|---:|---:|"]
    for w, c in g.items():
        for st in c["steps"]:
            lines.append(f"| tailguard {w} | {st['rate_per_s']:.0f}/s | {st['added_ttft_p50_ms']:+.2f} / "
                         f"{st['added_ttft_p99_ms']:+.2f} ms | {st['gateway_cpu_ms_per_request']:.3f} | "
                         f"{st['straight']['cores_busy']:.2f} / {st['gateway']['cores_busy']:.2f} |")
    lines += ["", "| generator | rate | dispatch lag P99 | valid | cores busy |", "|---|---:|---:|---|---:|"]
    for w, c in b.items():
        for st in c["steps"]:
            lines.append(f"| {w} | {st['rate_per_s']:.0f}/s | {st['dispatch_lag_p99_ms']:.2f} ms | {st['valid']} | "
                         f"{st['cores_busy']:.2f} |")
    return lines


def markdown(res: dict[str, Any]) -> str:
    la = res["setup"]["load_average_1m"]
    lines = ["# nginx's class on CPU", "",
             f"`benchmarks/nginx_class.py`, one run; load average {la['start']:.1f} at the start, {la['end']:.1f} at "
             "the end (2 cores shared by every process of the run).", ""]
    return "\n".join(lines + _side_lines(res) + [""] + _ceiling_lines(res) + [""])


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rates", type=float, nargs="*", default=[200, 1000])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3, help="side-by-side rounds at each rate")
    p.add_argument("--sweep", type=float, nargs="*", default=[100, 200, 300, 400, 600, 800, 1000])
    p.add_argument("--sweep-seconds", type=float, default=6.0)
    p.add_argument("--bench-workers", type=int, default=2, help="load generator processes of the gateway's sweep")
    p.add_argument("--bench-sweep", type=float, nargs="*",
                   default=[1000, 2000, 2600, 3000, 3200, 3400, 3600, 4000, 4500, 5000, 5400, 5800, 6000, 6400, 7000])
    args = p.parse_args()
    import uvloop

    res = uvloop.run(run(args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "nginx_class.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / "nginx_class.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
