"""The seed experiment on real engines: llama.cpp's llama-server and vLLM (CPU), straight and through
the gateway, side by side in one run.

For each engine the same closed-loop load (16 clients, mostly short chats of class `interactive`,
some long summaries of class `batch`) is sent twice per round: straight at the engine, then through
`tailguard serve` (own process) capping the engine at its own batch size (llama-server: 4 slots,
cap 4; vLLM: --max-num-seqs 8, cap 8). Rounds alternate the two arms so drift in the shared
machine's load hits both. Targets (issue 5): chat P99 TTFT at least 3x lower through the gateway,
total output tokens/s at least 90% of straight.

    make engines && .venv/bin/python benchmarks/seed_real.py [--engines llamacpp,vllm] [--requests 400]

Writes benchmarks/results/seed_real.json and benchmarks/results/seed_real.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tailguard.bench.load import BenchConfig, Timeouts

from tailguard.bench.run import run_bench
from tailguard.bench.stats import summarize
from tailguard.bench.workload import Workload
from tailguard.cli.experiment import free_port

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CACHE = Path(os.environ.get("TAILGUARD_CACHE", Path.home() / ".cache" / "tailguard"))
TAILGUARD = str(Path(sys.executable).with_name("tailguard"))


@dataclass(frozen=True)
class EngineSetup:
    kind: str
    slots: int  # the engine's batch size, and the gateway's cap
    summary_tokens: int
    requests: int  # measured requests per arm: enough chats for a P99 in a few minutes of this engine
    argv: list[str]
    env: dict[str, str]
    ready_s: float


def manifest() -> dict[str, str]:
    path = CACHE / "engines.json"
    if not path.exists():
        sys.exit(f"{path} missing: run `make engines` first")
    doc: dict[str, str] = json.loads(path.read_text())
    return doc


def bench_gguf() -> str:
    """A 256-wide, 4-layer model: a few thousand tokens/s on one core, so summaries hold a slot for
    about a second while the gateway relays few enough chunks to stay a small share of a core."""
    out = subprocess.run([sys.executable, str(ROOT / "engines" / "make_gguf.py"), "--n-embd", "256", "--n-layer", "4",
                          "--n-head", "4", "--n-ff", "704"], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def engine_setup(kind: str, port: int, m: dict[str, str]) -> EngineSetup:
    if kind == "llamacpp":
        # One thread: the machine has two cores, and the load generator (plus the gateway in the
        # gateway arm) needs the other. With two threads llama.cpp's workers spin against them.
        argv = [m["llama_server"], "-m", bench_gguf(), "--host", "127.0.0.1", "--port", str(port), "-np", "4",
                "-c", str(4 * 4096), "-t", "1", "--metrics", "--no-webui", "-a", "tiny", "-n", "2048"]
        return EngineSetup("llamacpp", 4, 1024, 600, argv, {}, 60)
    argv = [m["vllm_python"], "-m", "vllm.entrypoints.openai.api_server", "--model", m["hf_model"],
            "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "4096",
            "--max-num-seqs", "8", "--dtype", "float32", "--enforce-eager", "--scheduling-policy", "priority"]
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    return EngineSetup("vllm", 8, 1024, 250, argv, env, 360)


def workload(summary_tokens: int, kind: str) -> Workload:
    """The seed's mix (the built-in `seed-mixed`), with summaries sized to the engine's speed.

    Against llama-server the client asks for a fresh connection per request, in both arms:
    llama-server closes the connection after every streamed response while advertising keep-alive,
    and aiohttp (the load generator's client) would reuse it before seeing the close and fail."""
    extra = {"Connection": "close"} if kind == "llamacpp" else {}
    return Workload.model_validate({
        "name": "seed-real",
        "classes": [
            {"name": "chat", "weight": 0.92, "prompt_tokens": {"dist": "uniform", "low": 64, "high": 192},
             "max_tokens": 32, "headers": {"X-Tailguard-Class": "interactive", **extra}},
            {"name": "summary", "weight": 0.08, "prompt_tokens": {"dist": "uniform", "low": 128, "high": 384},
             "max_tokens": summary_tokens, "headers": {"X-Tailguard-Class": "batch", **extra}},
        ],
    })


class Proc:
    """A child process in its own session; `stop` ends the whole group (TERM, TERM, KILL)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.name = Path(argv[0]).name
        with open(log, "ab") as f:
            self.p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env={**os.environ, **env}, start_new_session=True)

    async def ready(self, url: str, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                if self.p.poll() is not None:
                    raise RuntimeError(f"{self.name} exited ({self.p.returncode}); see {self.log}")
                try:
                    async with s.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            return
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError(f"not ready after {limit_s} s; see {self.log}")

    def stop(self) -> None:
        for sig, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGTERM, 3.0), (signal.SIGKILL, 10.0)):
            if self.p.poll() is not None:
                return
            try:
                os.killpg(self.p.pid, sig)
                self.p.wait(wait_s)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                continue


async def one_arm(url: str, setup: EngineSetup, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One measured run; the summary gains `error_kinds`: failures counted by the client's error text."""
    config = BenchConfig(url=url, workload=workload(setup.summary_tokens, setup.kind), concurrency=args.clients,
                         requests=args.requests or setup.requests, warmup_requests=args.warmup, seed=seed, model="tiny",
                         timeouts=Timeouts(first_token_s=300, total_s=600))
    t0 = time.monotonic()
    result = await run_bench(config)
    summary = summarize(result.records, result.meta)
    summary["wall_s"] = time.monotonic() - t0
    kinds: dict[str, int] = {}
    for r in result.records:
        if not r.ok and not r.warmup:
            key = f"{r.status or r.error_kind}: {(r.error or '')[:80]}"
            kinds[key] = kinds.get(key, 0) + 1
    summary["error_kinds"] = kinds
    return summary


def _f(v: float | None, digits: int = 3) -> str:
    """A percentile is None when failures reach into it (failed requests stay in the tail)."""
    return "fail" if v is None else f"{v:.{digits}f}"


def arm_figures(s: dict[str, Any]) -> dict[str, Any]:
    chat, summ = s["classes"]["chat"], s["classes"]["summary"]
    return {
        "chat_ttft_p50_s": chat["ttft_s"]["p50"], "chat_ttft_p99_s": chat["ttft_s"]["p99"],
        "chat_e2e_p50_s": chat["e2e_s"]["p50"], "chat_e2e_p99_s": chat["e2e_s"]["p99"],
        "summary_e2e_p50_s": summ["e2e_s"]["p50"], "summary_e2e_p99_s": summ["e2e_s"]["p99"],
        "output_tokens_per_s": s["throughput"]["output_tokens_per_s"],
        "requests_per_s": s["throughput"]["requests_per_s"],
        "count": s["overall"]["count"], "ok": s["overall"]["ok"], "errors": s["overall"]["errors"],
        "chat_count": chat["count"], "summary_count": summ["count"],
        "valid": s["validity"]["valid"], "wall_s": s["wall_s"], "error_kinds": s["error_kinds"],
    }


async def run_engine(kind: str, args: argparse.Namespace, m: dict[str, str], logs: Path) -> dict[str, Any]:
    port = free_port()
    setup = engine_setup(kind, port, m)
    engine_url = f"http://127.0.0.1:{port}"
    gw_port = free_port()
    gw_url = f"http://127.0.0.1:{gw_port}"
    cfg_path = logs / f"gateway-{kind}.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "host": "127.0.0.1", "port": gw_port, "access_log": False,
        "health": {"timeout_s": 10.0},
        "backends": [{"name": kind, "url": engine_url, "kind": kind, "max_concurrency": setup.slots}],
    }))
    t0 = time.monotonic()
    engine = Proc(setup.argv, setup.env, logs / f"{kind}.log")
    gateway: Proc | None = None
    arms: dict[str, list[dict[str, Any]]] = {"straight": [], "gateway": []}
    try:
        await engine.ready(engine_url, setup.ready_s)
        start_s = time.monotonic() - t0
        gateway = Proc([TAILGUARD, "serve", "--config", str(cfg_path)], {}, logs / f"gateway-{kind}.log")
        await gateway.ready(gw_url, 30)
        print(f"{kind}: engine ready in {start_s:.1f} s", flush=True)
        for rnd in range(args.rounds):
            for arm, url in (("straight", engine_url), ("gateway", gw_url)):
                s = await one_arm(url, setup, args, seed=args.seed + rnd)
                fig = arm_figures(s)
                arms[arm].append(fig)
                print(f"{kind} round {rnd + 1} {arm:8s}: chat TTFT p50 {_f(fig['chat_ttft_p50_s'])} s "
                      f"p99 {_f(fig['chat_ttft_p99_s'])} s, {_f(fig['output_tokens_per_s'], 0)} tok/s, "
                      f"errors {fig['errors']} {fig['error_kinds']}, {fig['wall_s']:.0f} s", flush=True)
    finally:
        if gateway is not None:
            gateway.stop()
        engine.stop()
    return {"kind": kind, "slots": setup.slots, "engine_start_s": start_s, "summary_tokens": setup.summary_tokens,
            "requests": args.requests or setup.requests,
            "engine_argv": [Path(a).name if a.startswith("/") else a for a in setup.argv], "arms": arms,
            "verdict": verdict(arms)}


def verdict(arms: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per round and pooled: how much lower the chat P99 TTFT is, and the tokens/s kept."""
    rounds = []
    for st, gw in zip(arms["straight"], arms["gateway"]):
        s_p99, g_p99 = st["chat_ttft_p99_s"], gw["chat_ttft_p99_s"]
        rounds.append({
            # A failed P99 (None) through the gateway is no improvement; a failed straight one is unbounded.
            "ttft_p99_lower_by": 0.0 if g_p99 is None else (float("inf") if s_p99 is None else s_p99 / g_p99),
            "tokens_per_s_kept": gw["output_tokens_per_s"] / st["output_tokens_per_s"],
        })
    worst_ttft = min(r["ttft_p99_lower_by"] for r in rounds)
    worst_tps = min(r["tokens_per_s_kept"] for r in rounds)
    return {"rounds": rounds, "worst_ttft_p99_lower_by": worst_ttft, "worst_tokens_per_s_kept": worst_tps,
            "met": worst_ttft >= 3.0 and worst_tps >= 0.9}


def markdown(args: argparse.Namespace, results: list[dict[str, Any]], load: tuple[float, float]) -> str:
    lines = [
        "# The seed experiment on real engines",
        "",
        f"`.venv/bin/python benchmarks/seed_real.py --engines {args.engines} "
        + (f"--requests {args.requests} " if args.requests else "") + f"--rounds {args.rounds} --clients {args.clients}`",
        "",
        f"Closed loop, {args.clients} clients, the measured requests per arm given below (after {args.warmup} warm-up): "
        "92% chats (64-192 prompt tokens, 32 output tokens, class `interactive`), 8% summaries (128-384 prompt "
        "tokens, long outputs, class `batch`). Straight = the load generator talks to the engine; gateway = "
        "through `tailguard serve` (own process, default classes and ranked-SJF scheduler) capping the engine "
        "at its batch size. Models are tiny random-weight llamas made by `make engines` that never stop early, "
        "so every request is exactly as long as asked. Arms alternate within each round. "
        f"Machine: {os.cpu_count()} cores ({platform.machine()}), shared with other work (1-minute load "
        f"average {load[0]:.1f} at the start, {load[1]:.1f} at the end).",
        "",
    ]
    for r in results:
        lines += [
            f"## {r['kind']} ({r['slots']} slots, gateway cap {r['slots']}, summaries of {r['summary_tokens']} tokens, "
            f"{r['requests']} requests per arm; engine ready in {r['engine_start_s']:.1f} s)",
            "",
            "| round | arm | chat TTFT p50 s | chat TTFT p99 s | chat E2E p99 s | summary E2E p50 s | summary E2E p99 s "
            "| output tokens/s | requests/s | errors | valid |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for i, (st, gw) in enumerate(zip(r["arms"]["straight"], r["arms"]["gateway"])):
            for arm, f in (("straight", st), ("gateway", gw)):
                lines.append(
                    f"| {i + 1} | {arm} | {_f(f['chat_ttft_p50_s'])} | {_f(f['chat_ttft_p99_s'])} | "
                    f"{_f(f['chat_e2e_p99_s'])} | {_f(f['summary_e2e_p50_s'], 2)} | {_f(f['summary_e2e_p99_s'], 2)} | "
                    f"{_f(f['output_tokens_per_s'], 0)} | {_f(f['requests_per_s'], 2)} | {f['errors']} | "
                    f"{'yes' if f['valid'] else 'no'} |")
        failures: dict[str, int] = {}
        for a in ("straight", "gateway"):
            for f in r["arms"][a]:
                for k, n in f["error_kinds"].items():
                    failures[f"{a}: {k}"] = failures.get(f"{a}: {k}", 0) + n
        v = r["verdict"]
        per_round = ", ".join(f"{x['ttft_p99_lower_by']:.1f}x / {x['tokens_per_s_kept']:.1%}" for x in v["rounds"])
        lines += [
            "",
            f"Chat P99 TTFT lower through the gateway by / output tokens/s kept, per round: {per_round}. "
            f"Worst round: **{v['worst_ttft_p99_lower_by']:.1f}x** lower, **{v['worst_tokens_per_s_kept']:.1%}** of "
            f"straight tokens/s: targets (>= 3x, >= 90%) **{'met' if v['met'] else 'NOT met'}**.",
            "",
        ]
        if failures:
            lines += ["Failed requests (they stay in the tail: a P99 they reach reads `fail`): "
                      + "; ".join(f"{n} x `{k}`" for k, n in failures.items()), ""]
    lines += [
        "Why: straight, the engine's own queue is first come, first served, so a chat that arrives while "
        "summaries fill every slot waits for one to finish. Through the gateway the engine never holds more "
        "than its batch size, the chat waits in the gateway's queue instead, ahead of every queued summary, "
        "and when summaries hold every slot it suspends one (preemption) and continues it later from its text. "
        "Summary latency rises in this closed loop because faster chats send clients to their next summary "
        "sooner (see README). Timings on this shared 2-core machine vary by "
        "30-50% between runs; compare the arms of one round.",
        "",
    ]
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    m = manifest()
    load_start = os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory(prefix="seed_real-") as tmp:
        logs = Path(tmp)
        for kind in args.engines.split(","):
            results.append(await run_engine(kind, args, m, logs))
    load = (load_start, os.getloadavg()[0])
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {"args": vars(args), "machine": {"cpus": os.cpu_count(), "load_avg_1m": load}, "engines": results}
    (RESULTS / "seed_real.json").write_text(json.dumps(doc, indent=2) + "\n")
    (RESULTS / "seed_real.md").write_text(markdown(args, results, load))
    print(f"wrote {RESULTS / 'seed_real.md'} and seed_real.json")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="llamacpp,vllm")
    p.add_argument("--requests", type=int, help="measured requests per arm and round (default: 600 on "
                   "llama-server, 250 on vLLM)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
