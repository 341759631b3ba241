"""What an input guard and the audit trail add to a request: TTFT and E2E P50/P99 and the
gateway's CPU time per request, side by side with them off, in one run.

Processes on loopback, as benchmarks/gateway_overhead.py runs them: a `tailguard sim` (time scale
1, H100 preset, a batch that never queues), one `tailguard serve` per arm in front of it (access
log on, to a file), a moderation service in OpenAI's shape (an aiohttp process answering every
text `flagged: false`), and this load generator. Open-loop Poisson arrivals at `--rate` in all,
rotating over the arms, so every arm meets the same engine at the same moment; every request
streams a 16-token chat answer (short, so that 200 requests/s fit a shared 2-core machine: what a
guard or the trail costs is per request, not per token) to a prompt of about 100 tokens holding an
e-mail address, an order number and a date. The arms:

    off          no guard, no audit trail
    pii          an input guard: the built-in personal data, `action: redact` (the address is found and
                 redacted, so the body is re-encoded)
    moderation   an input guard on the moderation service (one HTTP round trip on loopback per request)
    audit        the audit trail, in SQLite (WAL), one entry per request
    pii+audit    both (with `--arms off,pii,moderation,audit,pii+audit`)

"Added" is an arm's percentile minus the `off` arm's, per round; the report gives each round and
the median over `--rounds`. Also: the guards' own check time from each gateway's
`tailguard_guard_seconds` (mean), the trail's entries and how long `tailguard audit verify` takes
to check them, and the moderation service's own CPU per request.

    .venv/bin/python benchmarks/guard_audit_cost.py [--rate 200] [--seconds 20] [--rounds 3] [--arms off,pii,...]

Writes benchmarks/results/guard_audit_cost.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tailguard.cli.experiment import free_port, wait_healthy

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gateway_overhead as go  # noqa: E402  beside this script: its sender, phases and CPU reading

RESULTS = Path(__file__).resolve().parent / "results"
TOKENS = 16  # short answers: 200 requests/s must fit a shared 2-core machine; what a guard or the trail
# costs is per request, not per token
PROMPT_TEXT = ("Hi, this is Jane Doe (jane.doe@example.com). Order 4471-2290 placed on 2024-03-05 arrived "
               "damaged; the box was crushed and two of the three items are broken. " + "word " * 60)
ARMS = ("off", "pii", "moderation", "audit")  # (`--arms` may add "pii+audit")

WHAT = {"off": "no guard, no audit trail", "pii": "an input guard: the built-in personal data, `action: redact`",
        "moderation": "an input guard calling a moderation service in OpenAI's shape on loopback",
        "audit": "the audit trail in SQLite", "pii+audit": "both"}

MODERATOR = """
import sys
from aiohttp import web
async def moderate(request):
    body = await request.json()
    n = len(body["input"]) if isinstance(body["input"], list) else 1
    return web.json_response({"id": "modr", "model": "bench", "results": [{"flagged": False, "categories": {}}] * n})
app = web.Application()
app.router.add_post("/v1/moderations", moderate)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def arm_config(arm: str, port: int, sim_url: str, moderation_url: str, tmp: Path) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "port": port,
        "backends": [{"name": "sim", "url": sim_url, "kind": "sim", "max_concurrency": 4096}],
        "classes": [{"name": "interactive", "rank": 0, "max_queue_len": 100000}, {"name": "batch", "rank": 1}],
    }
    guards: list[dict[str, Any]] = []
    if "pii" in arm:
        guards.append({"name": "pii", "stage": "input", "check": "personal_data", "action": "redact"})
    if arm == "moderation":
        guards.append({"name": "moderation", "stage": "input", "check": "moderation", "url": moderation_url,
                       "on_error": "open", "timeout_s": 1.0})
    if guards:
        cfg["guards"] = guards
    if "audit" in arm:
        cfg["audit"] = {"enabled": True, "path": str(tmp / f"audit-{arm}.sqlite3")}
    return cfg


def summarize(samples: list[go.Sample], arms: list[str], seconds: float, rate: float) -> dict[str, Any]:
    out: dict[str, Any] = {"rate_per_s": rate, "seconds": seconds, "arms": {}}
    for arm in arms:
        ok = [s for s in samples if s.arm == arm and s.ok]
        n = sum(1 for s in samples if s.arm == arm)
        out["arms"][arm] = {"requests": n, "errors": n - len(ok),
                            "ttft_ms": {q: go.pct([s.ttft_s for s in ok], p) * 1e3 for q, p in (("p50", 50), ("p99", 99))},
                            "e2e_ms": {q: go.pct([s.e2e_s for s in ok], p) * 1e3 for q, p in (("p50", 50), ("p99", 99))}}
    off = out["arms"]["off"]
    out["added_ms"] = {arm: {f"{m}_{q}": out["arms"][arm][f"{m}_ms"][q] - off[f"{m}_ms"][q]
                             for m in ("ttft", "e2e") for q in ("p50", "p99")} for arm in arms[1:]}
    out["generator_lag_p99_ms"] = go.pct([s.lag_s for s in samples], 99) * 1e3
    out["valid"] = out["generator_lag_p99_ms"] <= go.MAX_LAG_MS
    return out


async def one_round(sessions: dict[str, aiohttp.ClientSession], urls: dict[str, str], pids: dict[str, list[int]],
                    rate: float, seconds: float, seed: int) -> dict[str, Any]:
    before = {arm: go.cpu_seconds(p) for arm, p in pids.items()}
    res = summarize(await go.phase(sessions, urls, rate, seconds, seed=seed), list(urls), seconds, rate)
    res["cpu_ms_per_request"] = {}
    for arm, p in pids.items():
        (u0, k0), (u1, k1) = before[arm], go.cpu_seconds(p)
        n = res["arms"][arm]["requests"] if arm in res["arms"] else res["arms"]["moderation"]["requests"]
        res["cpu_ms_per_request"][arm] = (u1 - u0 + k1 - k0) / max(n, 1) * 1e3
    return res


async def guard_seconds(url: str) -> dict[str, float]:
    """Each guard's mean check time in microseconds, from the gateway's own histogram."""
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == "tailguard_guard_seconds_sum":
                sums[smp.labels["guard"]] = smp.value
            elif smp.name == "tailguard_guard_seconds_count":
                counts[smp.labels["guard"]] = smp.value
    return {g: sums[g] / counts[g] * 1e6 for g in sums if counts.get(g)}


def verify_trail(path: Path) -> dict[str, Any]:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "tailguard", "audit", "verify", "--store", str(path)],
                         capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - started
    line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr
    found = re.search(r": (\d+) entries", line)
    entries = int(found.group(1)) if found else 0
    return {"ok": out.returncode == 0, "entries": entries, "verify_s": took, "said": line,
            "bytes": sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))}


async def on_the_loop(n: int = 2000) -> dict[str, float]:
    """What each feature costs the event loop per request, in this process, one call at a time
    (microseconds, the median of 5 batches): the `pii` guard's screening of the benchmark's body
    (find, redact, the body copied), the personal data search alone on the prompt's text (what
    `redaction:` costs wherever text is kept), and the audit trail's part of a request's end (an
    entry built and queued; its hashing and writing are the trail's thread's)."""
    from tailguard.audit.trail import Trail
    from tailguard.audit.store import SqliteStore
    from tailguard.config import GatewayConfig
    from tailguard.gateway.ops.audit import AuditLog
    from tailguard.gateway.ops.live import Live
    from tailguard.gateway.ops.metrics import GatewayMetrics
    from tailguard.gateway.request import Ended, Request
    from tailguard.guards.guard import GuardSet
    from tailguard.guards.moderation import Moderation

    cfg = GatewayConfig.model_validate({"backends": [{"name": "sim", "url": "http://127.0.0.1:1"}], "guards": [
        {"name": "pii", "stage": "input", "check": "personal_data", "action": "redact"}]})
    guards = GuardSet.of(cfg, Moderation(), GatewayMetrics())
    assert guards is not None
    finder = cfg.redaction.finder()
    body = {"model": "m", "messages": [{"role": "user", "content": PROMPT_TEXT}], "max_tokens": TOKENS, "stream": True}
    tmp = Path(tempfile.mkdtemp(prefix="tg-loop-"))
    store = SqliteStore(tmp / "a.sqlite3")
    store.open()
    log = AuditLog(Trail(store, "bench", queue_entries=n * 10), Live.of(cfg), retain_text=False, refuse=False)
    t = Request("tg-1", 0.0, "chat", request_id="req-1", client="127.0.0.1", user_agent="bench", cls="interactive",
                caller="team", key="key:0123456789abcdef", model="m", prompt_tokens=104, output_tokens=16)
    ended = Ended(t, "POST", "/v1/chat/completions")

    async def screened() -> None:
        for _ in range(n):
            await guards.screen(body, "chat", "interactive", "m", True, [])

    def found() -> None:
        for _ in range(n):
            finder.find(PROMPT_TEXT)

    def audited() -> None:
        for _ in range(n):
            log.ended(ended)

    out: dict[str, list[float]] = {"pii_screen_us": [], "pii_find_us": [], "audit_request_us": []}
    for _ in range(5):
        started = time.perf_counter()
        await screened()
        out["pii_screen_us"].append((time.perf_counter() - started) / n * 1e6)
        started = time.perf_counter()
        found()
        out["pii_find_us"].append((time.perf_counter() - started) / n * 1e6)
        started = time.perf_counter()
        audited()
        out["audit_request_us"].append((time.perf_counter() - started) / n * 1e6)
    log.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return {k: statistics.median(v) for k, v in out.items()}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    loop_costs = await on_the_loop()
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="tg-guard-audit-"))
    py = sys.executable
    sim_port, mod_port = free_port(), free_port()
    sim_url, mod_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{mod_port}/v1/moderations"
    logs = []
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = open(tmp / f"{name}.log", "wb")
        logs.append(log)
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        return procs[name]

    start("sim", [py, "-m", "tailguard", "sim", "--port", str(sim_port), "--preset", "h100-llama8b",
                  "--max-num-seqs", "4096", "--time-scale", "1"])
    start("moderator", [py, "-c", MODERATOR, str(mod_port)])
    arms: list[str] = args.arms.split(",")
    urls = {}
    for arm in arms:
        port = free_port()
        path = tmp / f"{arm}.yaml"
        path.write_text(yaml.safe_dump(arm_config(arm, port, sim_url, mod_url, tmp)))
        start(arm, [py, "-m", "tailguard", "serve", "--config", str(path)])
        urls[arm] = f"http://127.0.0.1:{port}/v1/chat/completions"
    go.PROMPT = [{"role": "user", "content": PROMPT_TEXT}]  # the sender's prompt: one with personal data
    go.TOKENS = TOKENS
    rounds: list[dict[str, Any]] = []
    try:
        await wait_healthy(f"{sim_url}/health", procs["sim"])
        for arm in arms:
            await wait_healthy(urls[arm].replace("/v1/chat/completions", "/health"), procs[arm])
        await _wait_moderator(mod_url, procs["moderator"])
        pids = {arm: [procs[arm].pid] for arm in arms} | {"moderator": [procs["moderator"].pid]}
        sessions = {arm: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0))
                    for arm in arms}
        try:
            await go.phase(sessions, urls, args.rate, 2.0, seed=1)  # warm-up: connections, caches
            for k in range(args.rounds):
                for attempt in range(go.ATTEMPTS):
                    res = await one_round(sessions, urls, pids, args.rate, args.seconds, seed=10 + k)
                    if res["valid"]:
                        break
                    print(f"  (round {k + 1}: generator lag p99 {res['generator_lag_p99_ms']:.1f} ms, again)", flush=True)
                res["attempts"] = attempt + 1
                rounds.append(res)
                print(_line(k + 1, res), flush=True)
            checks = {arm: await guard_seconds(urls[arm].replace("/v1/chat/completions", "")) for arm in arms
                      if arm in ("pii", "moderation", "pii+audit")}
        finally:
            for s in sessions.values():
                await s.close()
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=30)  # the gateways write their trails' last entries as they stop
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
    trails = {arm: verify_trail(tmp / f"audit-{arm}.sqlite3") for arm in arms if "audit" in arm}
    shutil.rmtree(tmp, ignore_errors=True)
    return {
        "benchmark": "guard_audit_cost",
        "setup": {
            "preset": "h100-llama8b", "time_scale": 1.0, "tokens_per_response": TOKENS, "prompt": PROMPT_TEXT,
            "arms": arms, "assignment": "rotating per request, one simulator", "arrivals": "open-loop Poisson",
            "rate_per_s_all_arms": args.rate, "seconds_per_round": args.seconds, "rounds": args.rounds,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "load_average_1m": {"start": load_before, "end": os.getloadavg()[0]},
        },
        "rounds": rounds,
        "median_added_ms": {arm: {key: statistics.median(r["added_ms"][arm][key] for r in rounds)
                                  for key in rounds[0]["added_ms"][arm]} for arm in arms[1:]},
        "median_cpu_ms_per_request": {arm: statistics.median(r["cpu_ms_per_request"][arm] for r in rounds)
                                      for arm in rounds[0]["cpu_ms_per_request"]},
        "guard_check_mean_us": checks,
        "on_the_loop_us": loop_costs,
        "trails": trails,
    }


async def _wait_moderator(url: str, proc: subprocess.Popen[bytes]) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(200):
            if proc.poll() is not None:
                raise RuntimeError("the moderation service exited")
            try:
                async with s.post(url, json={"input": ["x"]}) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError("the moderation service did not answer")


def _line(k: int, r: dict[str, Any]) -> str:
    parts = [f"round {k}: off ttft p50 {r['arms']['off']['ttft_ms']['p50']:.2f} ms"]
    for arm, a in r["added_ms"].items():
        parts.append(f"{arm} {a['ttft_p50']:+.2f}/{a['ttft_p99']:+.2f}")
    cpu = r["cpu_ms_per_request"]
    parts.append("cpu " + ", ".join(f"{arm} {cpu[arm]:.3f}" for arm in cpu) + f" ms/req; lag p99 "
                 f"{r['generator_lag_p99_ms']:.1f} ms")
    return " | ".join(parts)


def markdown(res: dict[str, Any]) -> str:
    s = res["setup"]
    med, cpu = res["median_added_ms"], res["median_cpu_ms_per_request"]
    lines = [
        "# What an input guard and the audit trail cost",
        "",
        f"`tailguard serve` with each feature off and on, side by side: requests rotate over {len(s['arms'])} "
        f"gateways in front of one simulator ({s['preset']}, time scale 1), open-loop Poisson arrivals at "
        f"{s['rate_per_s_all_arms']:.0f} requests/s in all ({s['rate_per_s_all_arms'] / len(s['arms']):.0f}/s per "
        f"arm), {s['rounds']} rounds of {s['seconds_per_round']:.0f} s, streamed {s['tokens_per_response']}-token "
        "chat answers to a prompt of about 100 tokens holding an e-mail address, an order number and a date. "
        f"Everything shares {s['machine']['cpus']} CPU cores (1-minute load average "
        f"{s['load_average_1m']['start']:.1f} at the start, {s['load_average_1m']['end']:.1f} at the end; other "
        "work on the machine adds noise). Command: `.venv/bin/python benchmarks/guard_audit_cost.py`.",
        "",
        "Arms: " + "; ".join(f"`{a}` ({WHAT[a]})" for a in s["arms"]) + ".",
        "",
        "## Added to the `off` arm (median of the rounds)",
        "",
        "| arm | TTFT P50 (ms) | TTFT P99 (ms) | E2E P50 (ms) | E2E P99 (ms) | gateway CPU (ms/request) | vs off |",
        "|---|---|---|---|---|---|---|",
        f"| off | | | | | {cpu['off']:.3f} | |",
    ]
    for arm in s["arms"][1:]:
        a = med[arm]
        lines.append(f"| {arm} | {a['ttft_p50']:+.2f} | {a['ttft_p99']:+.2f} | {a['e2e_p50']:+.2f} | "
                     f"{a['e2e_p99']:+.2f} | {cpu[arm]:.3f} | {cpu[arm] - cpu['off']:+.3f} |")
    lp = res["on_the_loop_us"]
    lines += ["", f"The moderation service's own CPU per request it checked: {cpu['moderator']:.3f} ms (not the "
              "gateway's).", "",
              f"On the event loop, one call at a time in this process: the `pii` guard screens the benchmark's body "
              f"(finds the address, redacts it, copies the body) in {lp['pii_screen_us']:.0f} us, of which the search of "
              f"the {len(PROMPT_TEXT)}-character prompt is {lp['pii_find_us']:.0f} us; the audit trail's "
              f"part of a request (its entry built and queued) is {lp['audit_request_us']:.1f} us, the rest (hashing, "
              "writing) on the trail's own thread.", "", "## Each round", "",
              "| round | off TTFT P50 / P99 (ms) | " + " | ".join(f"{a} added TTFT P50 / P99" for a in s["arms"][1:])
              + " | generator lag P99 (ms) | valid |", "|---" * (len(s["arms"]) + 3) + "|"]
    for k, r in enumerate(res["rounds"], 1):
        off = r["arms"]["off"]["ttft_ms"]
        lines.append(f"| {k} | {off['p50']:.2f} / {off['p99']:.2f} | " + " | ".join(
            f"{r['added_ms'][a]['ttft_p50']:+.2f} / {r['added_ms'][a]['ttft_p99']:+.2f}" for a in s["arms"][1:])
            + f" | {r['generator_lag_p99_ms']:.1f} | {'yes' if r['valid'] else 'no'} |")
    lines += ["", "## The checks and the trails", ""]
    for arm, checks in res["guard_check_mean_us"].items():
        for guard, us in checks.items():
            lines.append(f"- `{arm}`: guard `{guard}` took {us:.0f} us a check on average "
                         "(`tailguard_guard_seconds`, the whole check: the moderation one its round trip).")
    for arm, t in res["trails"].items():
        lines.append(f"- `{arm}`: {t['entries']} entries, {t['bytes'] / 1e6:.1f} MB of SQLite; `tailguard audit "
                     f"verify` checked them in {t['verify_s']:.2f} s ({'ok' if t['ok'] else t['said']}).")
    lines += ["", "Percentile differences between arms are noisy at P99 (a few hundred requests per arm and round); "
              "a negative value means no measurable cost.", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=200.0, help="requests per second, all arms together")
    p.add_argument("--seconds", type=float, default=20.0, help="length of each round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--arms", default=",".join(ARMS), help="the arms, `off` first (off, pii, moderation, audit, "
                   "pii+audit)")
    args = p.parse_args()
    res = asyncio.run(run(args))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "guard_audit_cost.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / "guard_audit_cost.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
