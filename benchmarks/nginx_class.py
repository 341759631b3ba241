"""nginx's class on CPU (issue 23), in one run on one machine:

1. tailguard against nginx side by side, in front of the same `tailguard sim` (time scale 1, H100
   preset), streamed 64-chunk chat answers, open-loop Poisson arrivals rotating over the arms
   (straight, gateway, nginx) at each of `--rates` (totals over the three arms): added TTFT P50/P99
   (arm minus straight) and CPU per request of the gateway's process and of nginx's (master and
   worker), from /proc. The setup and the measuring code are `gateway_overhead.py`'s.
2. tailguard's sustained ceiling with `tailguard serve --workers 1` and `--workers 2`: the highest
   rate of the gateway arm (arms straight and gateway, alternating) at which its added TTFT P99
   stays under 5 ms with no error and a punctual generator.
3. The load generator's ceiling (`tailguard bench --workers 1` and `2`): the highest rate at which
   its dispatch-lag P99 stays under 5 ms (and every worker's), against nginx answering the same
   64-chunk stream from memory (the cheapest target there is, so the generator is what is measured).

The machine's cores are shared by every process here (simulator, proxies, generator): a ceiling
reads "at least this, on this machine", and `load_average_1m` says how busy the machine was.

    .venv/bin/python benchmarks/nginx_class.py [--rates 200 1000] [--seconds 10]
        [--sweep 100 200 300 400 600 800 1000] [--sweep-seconds 6] [--bench-sweep 100 200 300 400 600 800]

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
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tailguard.bench.load import BenchConfig, run_bench
from tailguard.bench.validity import validity
from tailguard.bench.workload import parse_workload
from tailguard.cli.experiment import free_port, wait_healthy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import NGINX_CONF, RESULTS, TOKENS, measured, with_children  # noqa: E402  beside this script

CEILING_MS = 5.0
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
    arms = " ".join(f"{arm} +{v['ttft_p50']:.2f}/+{v['ttft_p99']:.2f} ms" for arm, v in a.items())
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
            r = await measured(sessions, urls, pids, rate, args.seconds, seed=int(rate))
            r["cpu_ratio_gateway_to_nginx"] = r["cpu"]["gateway"]["ms_per_request"] / r["cpu"]["nginx"]["ms_per_request"]
            out.append(r)
            print(_line("side by side", r), flush=True)
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


async def ceiling(sim_url: str, gw_url: str, gw: subprocess.Popen[bytes], args: argparse.Namespace,
                  label: str) -> dict[str, Any]:
    """The highest gateway-arm rate with added TTFT P99 under 5 ms (rates: totals over 2 arms)."""
    urls = {"straight": f"{sim_url}/v1/chat/completions", "gateway": f"{gw_url}/v1/chat/completions"}
    pids = {"gateway": with_children(gw.pid)}
    best, steps, why = None, [], "every rate was swept"
    async with _sessions(urls) as sessions:
        await measured(sessions, urls, pids, 100.0, 2.0, seed=1)
        for rate in args.sweep:
            r = await measured(sessions, urls, pids, rate * 2, args.sweep_seconds, seed=int(rate))
            steps.append(r)
            print(_line(label, r), flush=True)
            if not r["valid"]:
                why = f"at {rate:.0f}/s the generator fell behind its schedule (the machine's cores were the limit)"
                break
            if r["added_ms"]["gateway"]["ttft_p99"] >= CEILING_MS or r["arms"]["gateway"]["errors"]:
                why = f"at {rate:.0f}/s the added TTFT P99 reached {CEILING_MS:g} ms (or requests failed)"
                break
            best = rate
    return {"ceiling_per_s": best, "stopped": why, "steps": steps}


async def generator_ceiling(url: str, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    workload = parse_workload({"name": "ceiling", "classes": [
        {"name": "chat", "prompt_tokens": 104, "max_tokens": TOKENS, "stream": True}]})
    best, steps, why = None, [], "every rate was swept"
    for rate in args.bench_sweep:
        res = await run_bench(BenchConfig(url=url, workload=workload, rate=rate, duration_s=args.sweep_seconds,
                                          warmup_s=1.0, seed=int(rate), time_scale=1.0, workers=workers))
        measured_recs = [r for r in res.records if not r.warmup]
        v = validity(measured_recs, res.meta)
        errors = sum(1 for r in measured_recs if not r.ok)
        steps.append({"rate_per_s": rate, "requests": len(measured_recs), "errors": errors,
                      "dispatch_lag_p99_ms": v["dispatch_lag_p99_s"] * 1e3, "valid": v["valid"],
                      "workers": v.get("workers")})
        print(f"bench --workers {workers} {rate:.0f}/s: dispatch lag p99 {v['dispatch_lag_p99_s'] * 1e3:.2f} ms, "
              f"{errors} errors, valid {v['valid']}", flush=True)
        if not v["valid"] or errors:
            why = f"at {rate:.0f}/s the dispatch lag P99 passed {CEILING_MS:g} ms (or requests failed)"
            break
        best = rate
    return {"ceiling_per_s": best, "stopped": why, "steps": steps}


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


def markdown(res: dict[str, Any]) -> str:
    la = res["setup"]["load_average_1m"]
    lines = ["# nginx's class on CPU", "",
             f"`benchmarks/nginx_class.py`, one run; load average {la['start']:.1f} at the start, {la['end']:.1f} at "
             "the end (2 cores shared by every process of the run).", "",
             "| total rate | arm | added TTFT P50 | added TTFT P99 | CPU ms/request | errors | generator valid |",
             "|---:|---|---:|---:|---:|---:|---|"]
    for r in res["side_by_side"]:
        for arm in ("gateway", "nginx"):
            a, c = r["added_ms"][arm], r["cpu"][arm]
            lines.append(f"| {r['rate_per_s']:.0f}/s | {arm} | +{a['ttft_p50']:.2f} ms | +{a['ttft_p99']:.2f} ms | "
                         f"{c['ms_per_request']:.3f} | {r['arms'][arm]['errors']} | {r['valid']} |")
        lines.append(f"| | ratio gateway/nginx CPU | | | {r['cpu_ratio_gateway_to_nginx']:.2f}x | | |")
    lines += ["", "| what | 1 worker | 2 workers |", "|---|---:|---:|"]
    g, b = res["gateway_ceiling"], res["generator_ceiling"]
    lines.append(f"| tailguard ceiling (added TTFT P99 < 5 ms) | {g['1']['ceiling_per_s']} /s | "
                 f"{g['2']['ceiling_per_s']} /s |")
    lines.append(f"| load generator ceiling (dispatch lag P99 < 5 ms) | {b['1']['ceiling_per_s']} /s | "
                 f"{b['2']['ceiling_per_s']} /s |")
    lines += ["", "Why each sweep stopped: " + "; ".join(
        f"tailguard {w}: {g[w]['stopped']}" for w in g) + "; " + "; ".join(
        f"generator {w}: {b[w]['stopped']}" for w in b) + ".", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rates", type=float, nargs="*", default=[200, 1000])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--sweep", type=float, nargs="*", default=[100, 200, 300, 400, 600, 800, 1000])
    p.add_argument("--sweep-seconds", type=float, default=6.0)
    p.add_argument("--bench-sweep", type=float, nargs="*", default=[100, 200, 300, 400, 600, 800])
    args = p.parse_args()
    import uvloop

    res = uvloop.run(run(args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "nginx_class.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / "nginx_class.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
