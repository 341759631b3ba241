"""What a backend that never stops answering costs the gateway, per route, before and after a change:
bytes relayed to the client, the gateway's RSS growth, how the request ended and what its caller
was metered (the access log's `output_tokens`), for a request that asked for `max_tokens: 5`.

Processes on loopback: the hostile backend of the functional tests
(`tests/functional/hostile_backend.py`: `post-content`, content events in the route's shape, 400
to a write, for ever; `post-trickle`, one a millisecond, for ever; `post-endless-json`, a JSON
answer that never ends), a `tailguard serve` in front of it (one per case, so each RSS is its
own; retries off, access log to a file) and this client, which reads each answer for at most
`--cap` seconds. With `--baseline-src DIR`, every case runs a second time on the gateway whose
`tailguard` package is in DIR (a checkout of an earlier revision, its extension built in place),
so before and after come from one run on the same machine.

    .venv/bin/python benchmarks/endless_backend.py [--cap 10] [--baseline-src /tmp/base/src]

Writes benchmarks/results/endless_backend.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from tailguard.cli.experiment import free_port, stop_process, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MiB = 1024 * 1024
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses",
         "messages": "/v1/messages"}
CASES = [("chat", True, "post-content"), ("chat", True, "post-trickle"), ("chat", False, "post-content"),
         ("completions", True, "post-content"), ("responses", True, "post-content"),
         ("responses", True, "post-trickle"), ("responses", False, "post-endless-json"),
         ("messages", True, "post-content"), ("messages", True, "post-trickle"), ("messages", False, "post-content")]
CONFIG = """\
port: {port}
access_log: true
backends:
  - {{name: evil, url: '{url}', kind: openai, max_concurrency: 4, models: [evil]}}
retries: {{max_attempts: 1}}
"""


def body(route: str, stream: bool) -> dict[str, Any]:
    chat = [{"role": "user", "content": "hi"}]
    out: dict[str, Any] = {"model": "evil", "stream": stream}
    if route == "responses":
        return {**out, "input": "hi", "max_output_tokens": 5}
    if route == "completions":
        return {**out, "prompt": "hi", "max_tokens": 5}
    return {**out, "messages": chat, "max_tokens": 5}


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def one_case(route: str, stream: bool, case: str, cap_s: float, src: str | None, tmp: Path) -> dict[str, Any]:
    """One request against a fresh gateway in front of a fresh hostile backend."""
    hostile = subprocess.Popen([sys.executable, "-m", "tests.functional.hostile_backend", case],
                               stdout=subprocess.PIPE, cwd=ROOT)
    assert hostile.stdout is not None
    url = f"http://127.0.0.1:{int(hostile.stdout.readline())}"
    port = free_port()
    cfg = tmp / "gw.yaml"
    cfg.write_text(CONFIG.format(port=port, url=url))
    log = tmp / f"{route}-{stream}-{src is not None}.log"
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    with open(log, "wb") as err:
        gw = subprocess.Popen([sys.executable, "-m", "tailguard", "serve", "--config", str(cfg)],
                              stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=tmp)
    base_url = f"http://127.0.0.1:{port}"
    try:
        await wait_healthy(f"{base_url}/health", gw)
        base = peak = rss(gw.pid)
        got, status, last = 0, 0, b""
        started = time.perf_counter()
        async with aiohttp.ClientSession() as s:
            try:
                async with asyncio.timeout(cap_s):
                    async with s.post(base_url + PATHS[route], json=body(route, stream)) as r:
                        status = r.status
                        async for piece in r.content.iter_any():
                            got += len(piece)
                            last = (last + piece)[-600:]
                            peak = max(peak, rss(gw.pid))
            except TimeoutError:
                pass
        seconds = time.perf_counter() - started
        peak = max(peak, rss(gw.pid))
    finally:
        stop_process(gw)
        hostile.kill()
        hostile.wait()
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith('{"ts"') and '"access"' in x]
    access: dict[str, Any] = next((x for x in lines if x.get("path") == PATHS[route]), {})
    return {"route": route, "stream": stream, "case": case, "gateway": "before" if src is not None else "after", "status": status,
            "relayed_bytes": got, "seconds": round(seconds, 2), "ended": seconds < cap_s - 0.05,
            "rss_growth_mib": round((peak - base) / MiB, 1), "output_tokens": access.get("output_tokens"),
            "outcome": access.get("outcome"), "reason": access.get("reason"),
            "last_bytes": last.decode("utf-8", "replace")[-300:]}


def size(n: int) -> str:
    return f"{n / MiB:,.1f} MiB" if n >= MiB else f"{n / 1024:,.1f} KiB" if n >= 1024 else f"{n} B"


def table(rows: list[dict[str, Any]], cap_s: float) -> str:
    out = ["| route | stream | backend | gateway | status | relayed | ended after | RSS growth | metered output tokens | outcome |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        ended = f"{r['seconds']:.2f} s" if r["ended"] else f"not in {cap_s:g} s"
        out.append(f"| {r['route']} | {'yes' if r['stream'] else 'no'} | {r['case']} | {r['gateway']} | {r['status']} | "
                   f"{size(r['relayed_bytes'])} | {ended} | {r['rss_growth_mib']:+.1f} MiB | "
                   f"{r['output_tokens'] if r['output_tokens'] is not None else '-'} | "
                   f"{r['outcome'] or '-'} {r['reason'] or ''} |")
    return "\n".join(out)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap", type=float, default=10.0, help="seconds an answer is read at most")
    ap.add_argument("--baseline-src", help="a `src` directory holding the earlier tailguard package")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for route, stream, case in CASES:
            for src in ([args.baseline_src] if args.baseline_src else []) + [None]:
                row = await one_case(route, stream, case, args.cap, src, Path(d))
                print(json.dumps(row), flush=True)
                rows.append(row)
    load = os.getloadavg()[0]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "endless_backend.json").write_text(json.dumps({"cap_s": args.cap, "load": load, "rows": rows}, indent=1))
    (RESULTS / "endless_backend.md").write_text(
        "# A backend that never stops, per route\n\n"
        f"`benchmarks/endless_backend.py --cap {args.cap:g}`: one request of `max_tokens: 5` per case against a "
        "hostile backend that never ends (`tests/functional/hostile_backend.py`, the case named), read for at most "
        f"{args.cap:g} s; a fresh gateway process per case (RSS growth is its own, peak less its idle RSS); the "
        f"metered tokens are its access log's. Load average {load:.1f} at the end.\n\n" + table(rows, args.cap) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
