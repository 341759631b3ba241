"""What the gateway itself costs: latency it adds per request, measured side by side against
going straight to the simulator, and the highest rate at which that added P99 stays within 10 ms.

Processes on loopback: a `tailguard sim` (time scale 1, H100 preset, batch large enough that it
never queues), a `tailguard serve` in front of it (`max_concurrency` large enough that the gateway
never holds a request back, access log on, written to a file), optionally nginx in front of the same
simulator as a reference proxy (`proxy_buffering off`, keep-alive upstream; used when `nginx` is on
PATH), and this load generator. Open-loop Poisson arrivals; requests rotate over the arms
(straight, gateway[, nginx]), so every arm sees the same engine at the same moment. Every request
streams a 64-token chat answer. TTFT is to the first content chunk, E2E to the end of the stream,
both from the instant the request was sent. "Added" is an arm's percentile minus the straight
arm's. Rates are totals over all arms; the gateway carries its share of them.

Also reported: the gateway's CPU time per request (from /proc), which bounds its own throughput
on one core independently of the load generator. A phase whose generator sent 1% of requests
more than 5 ms late ran on a saturated machine; it is run again, and the sweep stops there.

With `--baseline-rev REV`, the gateway as it was at git revision REV runs as one more arm, from
its own tree on the same venv: before and after side by side, on the same engine at the same moment.
With `--baseline-python PATH`, that arm runs on another interpreter (a venv with tailguard
installed), e.g. to compare Python versions; with both, REV on that interpreter. With `--record`,
the gateway arm records its front's events (`tailguard serve --record`) and the baseline does not:
`--record --baseline-python .venv/bin/python` is the recording's cost, on and off side by side.
`--telemetry` does the same for OpenTelemetry traces (the gateway arm exports them to a sink).

    .venv/bin/python benchmarks/gateway_overhead.py [--rate 30] [--seconds 30] [--sweep-seconds 10] [--no-nginx]
        [--baseline-rev REV] [--baseline-python PATH] [--record] [--telemetry]

Writes benchmarks/results/gateway_overhead.{json,md} (with a baseline arm:
gateway_overhead_vs_baseline.{json,md}, or gateway_overhead_vs_python.{json,md} for an interpreter;
`_record` added to the name with `--record`, `_telemetry` with `--telemetry`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from tailguard.cli.experiment import free_port, wait_healthy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from revisions import baseline_tree  # noqa: E402  beside this script

RESULTS = Path(__file__).resolve().parent / "results"
TOKENS = 64
PROMPT = [{"role": "user", "content": "word " * 80}]  # about 104 prompt tokens
LIMIT_MS = 10.0
MAX_LAG_MS = 5.0
ATTEMPTS = 3
CLK_TCK = os.sysconf("SC_CLK_TCK")

NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log {tmp}/nginx-access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    upstream sim {{ server 127.0.0.1:{sim_port}; keepalive 512; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


@dataclass(slots=True)
class Sample:
    arm: str
    lag_s: float  # send instant minus scheduled instant (the generator's own lateness)
    ttft_s: float
    e2e_s: float
    ok: bool


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """User and kernel CPU seconds of the processes, summed (utime, stime)."""
    user = kernel = 0
    for pid in pids:
        fields = _stat(pid)
        user, kernel = user + int(fields[11]), kernel + int(fields[12])
    return user / CLK_TCK, kernel / CLK_TCK


def with_children(pid: int) -> list[int]:
    """A process and its children (nginx's master and its worker)."""
    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int(_stat(int(d.name))[1]) == pid:
                    kids.append(int(d.name))
            except (OSError, ValueError, IndexError):
                continue
    return [pid, *kids]


async def one(session: aiohttp.ClientSession, url: str, arm: str, due: float, out: list[Sample]) -> None:
    delay = due - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    body = orjson.dumps({"model": "tailguard-sim", "messages": PROMPT, "max_tokens": TOKENS, "stream": True})
    sent = time.perf_counter()
    first = 0.0
    ok = False
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
            async for data in r.content.iter_any():
                if not first and b'"content":" tok' in data:
                    first = time.perf_counter()
            ok = r.status == 200 and first > 0
    except aiohttp.ClientError:
        ok = False
    end = time.perf_counter()
    out.append(Sample(arm, sent - due, (first or end) - sent, end - sent, ok))


async def phase(sessions: dict[str, aiohttp.ClientSession], urls: dict[str, str], rate: float, seconds: float,
                seed: int) -> list[Sample]:
    """Open-loop Poisson arrivals at `rate`, rotating over the arms; waits for every request."""
    rng = random.Random(seed)
    arms = list(urls)
    out: list[Sample] = []
    tasks = []
    t = time.perf_counter() + 0.05
    end = t + seconds
    i = 0
    while t < end:
        arm = arms[i % len(arms)]
        tasks.append(asyncio.create_task(one(sessions[arm], urls[arm], arm, t, out)))
        i += 1
        t += rng.expovariate(rate)
        # Create tasks a little ahead of time only, so thousands of sleepers do not pile up.
        ahead = t - time.perf_counter() - 0.5
        if ahead > 0:
            await asyncio.sleep(ahead)
    await asyncio.gather(*tasks)
    return out


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def summarize(samples: list[Sample], arms: list[str], rate: float, seconds: float) -> dict[str, Any]:
    res: dict[str, Any] = {"rate_per_s": rate, "seconds": seconds, "arms": {}}
    for arm in arms:
        ok = [s for s in samples if s.arm == arm and s.ok]
        n = sum(1 for s in samples if s.arm == arm)
        res["arms"][arm] = {
            "requests": n, "errors": n - len(ok),
            "ttft_ms": {"p50": pct([s.ttft_s for s in ok], 50) * 1e3, "p99": pct([s.ttft_s for s in ok], 99) * 1e3},
            "e2e_ms": {"p50": pct([s.e2e_s for s in ok], 50) * 1e3, "p99": pct([s.e2e_s for s in ok], 99) * 1e3},
        }
    s = res["arms"]["straight"]
    res["added_ms"] = {}
    for arm in arms[1:]:
        a = res["arms"][arm]
        res["added_ms"][arm] = {
            f"{m}_{q}": a[f"{m}_ms"][q] - s[f"{m}_ms"][q] for m in ("ttft", "e2e") for q in ("p50", "p99")
        }
    res["generator_lag_p99_ms"] = pct([x.lag_s for x in samples], 99) * 1e3
    res["valid"] = res["generator_lag_p99_ms"] <= MAX_LAG_MS
    return res


async def measured(sessions: dict[str, aiohttp.ClientSession], urls: dict[str, str], pids: dict[str, list[int]],
                   rate: float, seconds: float, seed: int) -> dict[str, Any]:
    """One phase, run again (up to ATTEMPTS times) while the generator could not keep its schedule.
    `pids`: the processes of each proxy arm, whose CPU time per request is reported."""
    res: dict[str, Any] = {}
    for attempt in range(1, ATTEMPTS + 1):
        before = {arm: cpu_seconds(p) for arm, p in pids.items()}
        res = summarize(await phase(sessions, urls, rate, seconds, seed=seed), list(urls), rate, seconds)
        res["cpu"] = {}
        for arm, p in pids.items():
            (u0, k0), (u1, k1) = before[arm], cpu_seconds(p)
            n = res["arms"][arm]["requests"] or float("nan")
            res["cpu"][arm] = {"ms_per_request": (u1 - u0 + k1 - k0) / n * 1e3, "user_ms_per_request":
                               (u1 - u0) / n * 1e3, "kernel_ms_per_request": (k1 - k0) / n * 1e3,
                               "share_of_a_core": (u1 - u0 + k1 - k0) / seconds}
        res["gateway_cpu_ms_per_request"] = res["cpu"]["gateway"]["ms_per_request"]
        res["gateway_cpu_share"] = res["cpu"]["gateway"]["share_of_a_core"]
        res["attempts"] = attempt
        if res["valid"]:
            break
        print(f"  (rate {rate:.0f}/s: generator lag p99 {res['generator_lag_p99_ms']:.1f} ms, running again)",
              flush=True)
    return res


def within_limit(res: dict[str, Any]) -> bool:
    a = res["added_ms"]["gateway"]
    return bool(a["ttft_p99"] <= LIMIT_MS and a["e2e_p99"] <= LIMIT_MS and res["arms"]["gateway"]["errors"] == 0)


# An OTLP/HTTP receiver that accepts every export and keeps nothing: what the traces cost the
# gateway, not what a collector does with them. Prints its port.
OTLP_SINK = """
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H); print(s.server_address[1], flush=True); s.serve_forever()
"""


async def run(args: argparse.Namespace, baseline_src: Path | None) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="tg-overhead-"))
    sim_port, gw_port, nginx_port = free_port(), free_port(), free_port()
    sim_url, gw_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{gw_port}"
    (tmp / "tailguard.yaml").write_text(
        f"port: {gw_port}\nbackends:\n  - {{name: sim, url: '{sim_url}', kind: sim, max_concurrency: 4096}}\n"
        "classes:\n  - {name: interactive, rank: 0, max_queue_len: 100000}\n  - {name: batch, rank: 1}\n"
    )
    nginx = shutil.which("nginx") if args.nginx else None
    py = sys.executable
    logs = [open(tmp / f"{n}.log", "wb") for n in ("sim", "gateway", "nginx", "baseline")]
    procs: list[subprocess.Popen[bytes]] = []
    sink = subprocess.Popen([py, "-c", OTLP_SINK], stdout=subprocess.PIPE, text=True) if args.telemetry else None
    procs.append(subprocess.Popen(
        [py, "-m", "tailguard", "sim", "--port", str(sim_port), "--preset", args.preset, "--max-num-seqs", "4096",
         "--time-scale", "1"], stdout=subprocess.DEVNULL, stderr=logs[0]))
    record = ["--record", str(tmp / "front.jsonl")] if args.record else []
    gw_env = dict(os.environ)
    if sink is not None:  # traces go to it through the standard variable (the baseline has none)
        assert sink.stdout is not None
        gw_env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"http://127.0.0.1:{int(sink.stdout.readline())}/v1/traces"
    gw = subprocess.Popen([py, "-m", "tailguard", "serve", "--config", str(tmp / "tailguard.yaml"), *record],
                          stdout=subprocess.DEVNULL, stderr=logs[1], env=gw_env)
    procs.append(gw)
    urls = {"straight": f"{sim_url}/v1/chat/completions", "gateway": f"{gw_url}/v1/chat/completions"}
    pids = {"gateway": [gw.pid]}
    if baseline_src is not None or args.baseline_python:
        # The same config on its own port, from the other revision's tree or interpreter.
        base_port = free_port()
        (tmp / "baseline.yaml").write_text((tmp / "tailguard.yaml").read_text().replace(f"port: {gw_port}",
                                                                                       f"port: {base_port}", 1))
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        if baseline_src is not None:
            env["PYTHONPATH"] = str(baseline_src)
        base = subprocess.Popen([args.baseline_python or py, "-m", "tailguard", "serve", "--config",
                                 str(tmp / "baseline.yaml")], stdout=subprocess.DEVNULL, stderr=logs[3], env=env)
        procs.append(base)
        urls["baseline"] = f"http://127.0.0.1:{base_port}/v1/chat/completions"
        pids["baseline"] = [base.pid]
    if nginx:
        (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, sim_port=sim_port, port=nginx_port))
        ngx = subprocess.Popen([nginx, "-c", str(tmp / "nginx.conf"), "-p", str(tmp)],
                               stdout=subprocess.DEVNULL, stderr=logs[2])
        procs.append(ngx)
        urls["nginx"] = f"http://127.0.0.1:{nginx_port}/v1/chat/completions"
    try:
        for url, proc in zip(urls.values(), procs):
            await wait_healthy(url.replace("/v1/chat/completions", "/health"), proc)
        if nginx:
            pids["nginx"] = with_children(ngx.pid)
        sessions = {arm: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0))
                    for arm in urls}
        try:
            await phase(sessions, urls, args.rate, 2.0, seed=1)  # warm-up: connections, caches
            moderate = await measured(sessions, urls, pids, args.rate, args.seconds, seed=2)
            print(_line(moderate), flush=True)
            sweep: list[dict[str, Any]] = []
            best: float | None = None
            stop_reason = "every rate was swept"
            for rate in args.sweep:
                res = await measured(sessions, urls, pids, rate, args.sweep_seconds, seed=int(rate))
                res["within_limit"] = within_limit(res)
                sweep.append(res)
                print(_line(res), flush=True)
                if not res["valid"]:
                    stop_reason = (f"at {rate:.0f}/s the load generator fell behind its schedule on every attempt "
                                   "(the machine's cores, not the gateway, were the limit)")
                    break
                if not res["within_limit"]:
                    stop_reason = f"at {rate:.0f}/s the gateway's added P99 passed {LIMIT_MS:.0f} ms"
                    break
                best = rate
        finally:
            for s in sessions.values():
                await s.close()
    finally:
        if sink is not None:
            sink.terminate()
            sink.wait()
            assert sink.stdout is not None
            sink.stdout.close()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
        recording = _recording_size(tmp / "front.jsonl") if args.record else None
        shutil.rmtree(tmp, ignore_errors=True)
    cpu = [1e3 / r["gateway_cpu_ms_per_request"] for r in [moderate, *sweep] if r["valid"]]
    return {
        "benchmark": "gateway_overhead",
        "setup": {
            "preset": args.preset, "time_scale": 1.0, "tokens_per_response": TOKENS, "prompt_tokens": 104,
            "arms": list(urls), "assignment": "rotating per request, one simulator", "arrivals": "open-loop Poisson",
            "gateway": "tailguard serve, ranked-sjf, max_concurrency 4096 (never binds), access log to a file"
                       + (", recording its front's events (--record)" if args.record else "")
                       + (", exporting OpenTelemetry traces to a sink on loopback (--telemetry)"
                          if args.telemetry else ""),
            "recording": recording,
            "nginx": "nginx 1 worker, proxy_buffering off, upstream keepalive, access log to a file" if nginx else None,
            "baseline": _baseline_text(args),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "processes": "simulator, proxies and load generator share the machine's cores",
            "load_average_1m": {"start": load_before, "end": os.getloadavg()[0]},
        },
        "moderate": moderate,
        "sweep": sweep,
        "limit_ms": LIMIT_MS,
        "max_rate_within_limit_per_s": best,
        "sweep_stopped": stop_reason,
        # Where the gateway alone would saturate one core: its CPU time per request, inverted.
        "cpu_bound_rate_per_core_per_s": min(cpu) if cpu else None,
    }


def _recording_size(path: Path) -> dict[str, int] | None:
    """Lines and bytes the gateway arm recorded (warm-up and sweep included), or None if absent."""
    if not path.exists():
        return None
    data = path.read_bytes()
    return {"lines": data.count(b"\n"), "bytes": len(data)}


def _baseline_text(args: argparse.Namespace) -> str | None:
    """What the baseline arm runs, for the report; None without one."""
    if not (args.baseline_rev or args.baseline_python):
        return None
    rev = f"git revision {args.baseline_rev}" if args.baseline_rev else "this tree"
    py = f" on {_python_version(args.baseline_python)}" if args.baseline_python else ""
    return f"the gateway at {rev}{py}, same config"


def _python_version(python: str) -> str:
    out = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                         capture_output=True, text=True, check=True)
    return f"Python {out.stdout.strip()}"


def _line(r: dict[str, Any]) -> str:
    parts = [f"rate {r['rate_per_s']:>6.1f}/s  straight ttft p50 {r['arms']['straight']['ttft_ms']['p50']:.2f} ms"]
    for arm, a in r["added_ms"].items():
        parts.append(f"{arm} added ttft {a['ttft_p50']:+.2f}/{a['ttft_p99']:+.2f} e2e {a['e2e_p50']:+.2f}/"
                     f"{a['e2e_p99']:+.2f} ms")
    parts.append("cpu " + ", ".join(f"{arm} {c['ms_per_request']:.3f}" for arm, c in r["cpu"].items())
                 + f" ms/req; lag p99 {r['generator_lag_p99_ms']:.1f} ms")
    return " | ".join(parts)


def _f(v: float) -> str:
    return f"{v:+.2f}"


def markdown(res: dict[str, Any]) -> str:
    m = res["moderate"]
    arms = res["setup"]["arms"]
    setup = res["setup"]
    lines = [
        "# Gateway overhead",
        "",
        f"Straight to the simulator vs through `tailguard serve`"
        f"{' (and vs nginx as a reference proxy)' if 'nginx' in arms else ''}, side by side (requests rotate "
        f"over the arms), streamed {TOKENS}-token chat answers, open-loop Poisson arrivals, {setup['preset']} at "
        f"time scale 1. Everything shares {setup['machine']['cpus']} CPU cores (1-minute load average "
        f"{setup['load_average_1m']['start']:.1f} at the start, {setup['load_average_1m']['end']:.1f} at the end; "
        "other work on the machine adds noise). Rates are totals over all arms."
        + (f" The `baseline` arm is {setup['baseline']}." if setup.get("baseline") else "")
        + (f" The `gateway` arm records its front's events (`--record`): {setup['recording']['lines']} lines, "
           f"{setup['recording']['bytes'] / 1e6:.1f} MB over the whole run." if setup.get("recording") else ""),
        "",
        f"## At a moderate rate ({m['rate_per_s']:.0f} requests/s, {m['seconds']:.0f} s, "
        + ", ".join(f"{m['arms'][a]['requests']} {a}" for a in arms) + ")",
        "",
        "| | " + " | ".join(arms) + " | " + " | ".join(f"{a} added" for a in arms[1:]) + " |",
        "|---" * (2 * len(arms)) + "|",  # label, one column per arm, one "added" per non-straight arm
    ]
    for metric, q, label in (("ttft", "p50", "TTFT P50"), ("ttft", "p99", "TTFT P99"),
                             ("e2e", "p50", "E2E P50"), ("e2e", "p99", "E2E P99")):
        vals = [f"{m['arms'][a][f'{metric}_ms'][q]:.2f}" for a in arms]
        added = [_f(m["added_ms"][a][f"{metric}_{q}"]) for a in arms[1:]]
        lines.append(f"| {label} (ms) | " + " | ".join(vals + added) + " |")
    lines += ["", f"CPU time per request ({TOKENS} chunks relayed each): "
              + "; ".join(f"{arm} {c['ms_per_request']:.3f} ms ({c['user_ms_per_request']:.3f} user + "
                          f"{c['kernel_ms_per_request']:.3f} kernel)" for arm, c in m["cpu"].items()) + "."]
    lines += [
        f"Generator lag P99 {m['generator_lag_p99_ms']:.1f} ms "
        f"({'valid' if m['valid'] else 'NOT valid: the machine was saturated'}).",
        "",
    ]
    if res["sweep"]:
        lines += [
            f"## Rate sweep ({res['sweep'][0]['seconds']:.0f} s per rate; stops at the first rate whose added P99 "
            f"passes {res['limit_ms']:.0f} ms or that the machine cannot drive)",
            "",
            "| rate (req/s, all arms) | gateway added TTFT P50 / P99 (ms) | gateway added E2E P50 / P99 (ms) | "
            + ("nginx added TTFT P50 / P99 (ms) | nginx added E2E P50 / P99 (ms) | " if "nginx" in arms else "")
            + "gateway CPU (ms/req, share of a core) | gateway errors | generator lag P99 (ms) | valid |",
            "|---" * (9 if "nginx" in arms else 7) + "|",
        ]
        for r in res["sweep"]:
            g = r["added_ms"]["gateway"]
            row = [f"{r['rate_per_s']:.0f}", f"{_f(g['ttft_p50'])} / {_f(g['ttft_p99'])}",
                   f"{_f(g['e2e_p50'])} / {_f(g['e2e_p99'])}"]
            if "nginx" in arms:
                n = r["added_ms"]["nginx"]
                row += [f"{_f(n['ttft_p50'])} / {_f(n['ttft_p99'])}", f"{_f(n['e2e_p50'])} / {_f(n['e2e_p99'])}"]
            row += [f"{r['gateway_cpu_ms_per_request']:.3f}, {r['gateway_cpu_share']:.0%}",
                    str(r["arms"]["gateway"]["errors"]), f"{r['generator_lag_p99_ms']:.1f}",
                    "yes" if r["valid"] else "no"]
            lines.append("| " + " | ".join(row) + " |")
    best = res["max_rate_within_limit_per_s"]
    share = 1.0 / len(arms)
    lines += [
        "",
        (f"Highest rate with the gateway's added P99 (TTFT and E2E) within {res['limit_ms']:.0f} ms: "
         f"**{best:.0f} requests/s** in total, {best * share:.0f}/s of them through the gateway."
         if best is not None else "No swept rate stayed within the limit."),
        f"The sweep stopped because {res['sweep_stopped']}.",
        "",
    ]
    if res["cpu_bound_rate_per_core_per_s"]:
        c = res["cpu_bound_rate_per_core_per_s"]
        lines += [f"The gateway's CPU time per request puts its own single-core ceiling at about **{c:.0f} "
                  f"requests/s** of {TOKENS}-token streams (about {c * TOKENS / 1000:.0f}k relayed chunks/s).", ""]
    lines += ["Percentile differences between arms are noisy at P99: a few hundred requests per arm put a "
              "millisecond or more of noise on them; a negative value means no measurable cost.", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rate", type=float, default=30.0, help="moderate rate, requests/s over all arms")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--sweep", type=float, nargs="*", default=[30, 75, 150, 225, 300, 450, 600, 900])
    p.add_argument("--sweep-seconds", type=float, default=10.0)
    p.add_argument("--preset", default="h100-llama8b")
    p.add_argument("--no-nginx", dest="nginx", action="store_false", help="skip the nginx reference arm")
    p.add_argument("--baseline-rev", help="also run the gateway at this git revision as an arm (before/after)")
    p.add_argument("--baseline-python", help="run the baseline arm on this interpreter (a venv's python)")
    p.add_argument("--telemetry", action="store_true",
                   help="the gateway arm exports OpenTelemetry traces (to a sink on loopback), the baseline arm "
                   "does not: with --baseline-python (this venv's python) the traces' cost side by side")
    p.add_argument("--record", action="store_true",
                   help="the gateway arm records its front's events (tailguard serve --record), the baseline arm "
                   "does not: with --baseline-python (this venv's python) the recording's cost side by side")
    args = p.parse_args()
    with contextlib.ExitStack() as stack:
        src = stack.enter_context(baseline_tree(args.baseline_rev)) if args.baseline_rev else None
        try:
            import uvloop
        except ImportError:  # pragma: no cover
            res = asyncio.run(run(args, src))
        else:
            res = uvloop.run(run(args, src))
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = ("gateway_overhead_vs_baseline" if args.baseline_rev else
            "gateway_overhead_vs_python" if args.baseline_python else "gateway_overhead")
    if args.record:
        stem += "_record"
    if args.telemetry:
        stem += "_telemetry"
    (RESULTS / f"{stem}.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / f"{stem}.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
