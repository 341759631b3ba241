"""The quick form, as a new user runs it: `tailguard serve --backend URL --max-concurrency N` with no
`--backend-kind`, behind a burst of long batch jobs while chats keep arriving. Straight to the
engine against through the gateway, one after the other on a fresh engine each time.

Load: at t=0 a burst of `2 x slots` batch requests (`X-Tailguard-Class: batch`, long answers),
and from t=0 until the last batch job ends, chats (32 tokens) at a fixed rate, open loop (each
sent at its scheduled time, its latency measured from then). Every request streams; TTFT is to
the first content chunk. The gateway has to find out what it is talking to (`kind: auto`): on
the simulator and on llama-server it finds a kind that can continue a generation and suspends a
batch job for a waiting chat.

Targets (issue 8): chat P99 TTFT at least 10x lower than straight, batch makespan at most 1.3x,
and no request failed through the gateway that straight to the engine succeeded.

    .venv/bin/python benchmarks/quick_form.py [--engine sim|llamacpp] [--chat-rate 4]

Writes benchmarks/results/quick_form-<engine>.{json,md}. `--engine llamacpp` needs `make engines`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tailguard.cli.experiment import free_port, spawned, stop_process, wait_healthy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from open_loop import Result, send  # noqa: E402  beside this script
from seed_real import bench_gguf, manifest  # noqa: E402
from sim_des_speed import pct  # noqa: E402  one nearest-rank percentile for all

RESULTS = Path(__file__).resolve().parent / "results"
CHAT_TOKENS = 32


@dataclass
class Engine:
    """How to start one engine and what a long job is on it."""

    kind: str
    slots: int
    batch_tokens: int
    time_scale: float  # wall seconds per reported second (the simulator's clock); 1 for real engines


async def run_load(url: str, eng: Engine, chat_rate: float, limit_s: float) -> list[Result]:
    """The burst plus chats until every batch job has ended (or `limit_s`)."""
    out: list[Result] = []
    t0 = time.perf_counter() + 0.2
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=limit_s)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        # A fresh connection per request in every arm: llama-server closes a streamed response's
        # connection while advertising keep-alive, and this client must not trip over that either.
        batch = [asyncio.create_task(send(session, url, "batch", eng.batch_tokens, 0.0, t0, out, True))
                 for _ in range(2 * eng.slots)]
        chats: list[asyncio.Task[None]] = []
        i = 0
        while not all(t.done() for t in batch) and time.perf_counter() - t0 < limit_s:
            at = i / chat_rate
            chats.append(asyncio.create_task(send(session, url, "interactive", CHAT_TOKENS, at, t0, out, True)))
            i += 1
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        await asyncio.gather(*batch, *chats)
    return out


def summary(results: list[Result], scale: float) -> dict[str, Any]:
    chats = [r for r in results if r.cls == "interactive"]
    batch = [r for r in results if r.cls == "batch"]
    ttft = [r.ttft / scale for r in chats if r.ttft is not None and r.error is None]
    makespan = max((r.end for r in batch if r.end is not None), default=None)
    return {
        "chats": len(chats), "batch": len(batch),
        "failed": sum(1 for r in results if r.error is not None or r.end is None),
        "errors": sorted({r.error for r in results if r.error is not None})[:5],
        "chat_ttft_p50_s": pct(ttft, 0.50) if ttft else None,
        "chat_ttft_p99_s": pct(ttft, 0.99) if ttft else None,
        "batch_makespan_s": makespan / scale if makespan is not None else None,
        "batch_tokens": sum(r.tokens for r in batch),
    }


@contextlib.asynccontextmanager
async def engine_server(eng: Engine, logs: Path) -> AsyncIterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if eng.kind == "sim":
        args = ["sim", "--port", str(port), "--preset", "h100-llama8b", "--max-num-seqs", str(eng.slots),
                "--time-scale", str(eng.time_scale)]
        async with spawned(args, url + "/health", logs / "sim.log"):
            yield url
        return
    # The seed experiment's llama-server model (benchmarks/seed_real.py), with longer answers allowed.
    argv = [manifest()["llama_server"], "-m", bench_gguf(), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(eng.slots),
            "-c", str(eng.slots * 4096), "-t", "1", "--no-webui", "-a", "tiny", "-n", "4096"]
    with open(logs / "llama-server.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            await wait_healthy(url + "/health", proc, timeout_s=120)
            yield url
        finally:
            stop_process(proc)


async def main(args: argparse.Namespace) -> None:
    eng = (Engine("sim", 8, 2048, 0.25) if args.engine == "sim" else Engine("llamacpp", 4, 1024, 1.0))
    logs = RESULTS / "logs" / f"quick_form-{args.engine}"
    logs.mkdir(parents=True, exist_ok=True)
    runs: dict[str, Any] = {}
    for label in ("straight", "gateway"):
        async with engine_server(eng, logs) as engine_url:
            if label == "straight":
                res = await run_load(engine_url, eng, args.chat_rate, args.limit_s)
            else:
                port = free_port()
                gw = f"http://127.0.0.1:{port}"
                serve = ["serve", "--port", str(port), "--backend", engine_url, "--max-concurrency", str(eng.slots)]
                async with spawned(serve, gw + "/health", logs / "gateway.log"):
                    await asyncio.sleep(1.0)  # the kind probe runs in the background; give it its moment
                    async with aiohttp.ClientSession() as s, s.get(gw + "/health") as r:
                        runs["detected_kind"] = {n: b["kind"] for n, b in (await r.json())["backends"].items()}
                    res = await run_load(gw, eng, args.chat_rate, args.limit_s)
        runs[label] = summary(res, eng.time_scale)
        print(label, json.dumps(runs[label]), flush=True)
    write(args, eng, runs)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def write(args: argparse.Namespace, eng: Engine, runs: dict[str, Any]) -> None:
    s, g = runs["straight"], runs["gateway"]
    lower = _ratio(s["chat_ttft_p99_s"], g["chat_ttft_p99_s"])
    makespan = _ratio(g["batch_makespan_s"], s["batch_makespan_s"])
    verdict = {"chat_ttft_p99_lower_x": lower, "batch_makespan_x": makespan,
               "ttft_target_met": lower is not None and lower >= 10,
               "makespan_target_met": makespan is not None and makespan <= 1.3,
               "no_extra_failures": g["failed"] <= s["failed"]}
    doc = {"benchmark": "quick_form", "command": " ".join(["benchmarks/quick_form.py", *sys.argv[1:]]),
           "engine": eng.__dict__, "chat_rate_per_s": args.chat_rate, "runs": runs, "verdict": verdict,
           "python": platform.python_version()}
    (RESULTS / f"quick_form-{args.engine}.json").write_text(json.dumps(doc, indent=2) + "\n")
    unit = "simulated s" if eng.kind == "sim" else "s"
    lines = [f"# The quick form (no kind named) on {eng.kind}", "",
             f"`.venv/bin/python {doc['command']}`", "",
             f"Burst of {2 * eng.slots} batch jobs ({eng.batch_tokens} tokens) at t=0, chats ({CHAT_TOKENS} tokens) "
             f"at {args.chat_rate}/s until the last batch job ended; {eng.slots} slots; times in {unit}. "
             f"The gateway found kind `{', '.join(runs.get('detected_kind', {}).values())}`.", "",
             "| arm | chats | chat TTFT P50 | chat TTFT P99 | batch makespan | failed |", "|---|---:|---:|---:|---:|---:|"]
    for label in ("straight", "gateway"):
        r = runs[label]
        lines.append(f"| {label} | {r['chats']} | {_f(r['chat_ttft_p50_s'])} | {_f(r['chat_ttft_p99_s'])} | "
                     f"{_f(r['batch_makespan_s'])} | {r['failed']} |")
    lines += ["", f"Chat P99 TTFT {_f(lower, 1)}x lower (target >= 10x: {'met' if verdict['ttft_target_met'] else 'NOT met'}); "
              f"batch makespan {_f(makespan, 2)}x (target <= 1.3x: {'met' if verdict['makespan_target_met'] else 'NOT met'}); "
              f"failures straight {s['failed']}, gateway {g['failed']}.", ""]
    (RESULTS / f"quick_form-{args.engine}.md").write_text("\n".join(lines))
    print("\n".join(lines))


def _f(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("sim", "llamacpp"), default="sim")
    p.add_argument("--chat-rate", type=float, default=4.0, help="chats per wall second")
    p.add_argument("--limit-s", type=float, default=300.0, help="wall-clock bound of one arm")
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
