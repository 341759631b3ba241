"""Batch jobs against chat latency and engine throughput (issue 20): one simulator behind one
gateway (`tailguard serve --config`, SQLite journal), three measurements.

a. Interference: interactive chats arriving open loop (Poisson, `tailguard bench --workload
   chat-only`) alone, then the same chats while a 10,000-line batch runs. Target: chat TTFT P99
   with the batch within 1.1x of alone.
b. Throughput: a batch alone against `tailguard bench` straight to the engine with the same
   requests (closed loop, as many clients as the engine's sequences). Target: the batch gets at
   least 80% of the engine's output tokens per second.
c. Resume: the gateway killed (SIGKILL) mid-batch and started again: seconds from the new
   process's start to its first line recorded done.

    .venv/bin/python benchmarks/batch_capacity.py [--lines 10000] [--chat-rate 4] [--seconds 20]

Writes benchmarks/results/batch_capacity.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml
from openai import AsyncOpenAI

from tailguard.cli.experiment import free_port, spawned, stop_process

RESULTS = Path(__file__).resolve().parent / "results"
TIME_SCALE = 0.25
SEQS = 16
MAX_TOKENS = 64
PROMPT = "Summarise the following record in one line. " + "lorem ipsum dolor sit amet " * 16  # ~128 tokens


def lines(n: int) -> bytes:
    return b"".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "tailguard-sim", "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": f"{i} {PROMPT}"}]}}).encode() + b"\n" for i in range(n))


async def submit(c: AsyncOpenAI, n: int) -> str:
    f = await c.files.create(file=("in.jsonl", io.BytesIO(lines(n))), purpose="batch")
    b = await c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    return b.id


async def counts(c: AsyncOpenAI, batch_id: str) -> tuple[str, int]:
    b = await c.batches.retrieve(batch_id)
    return b.status, b.request_counts.completed if b.request_counts else 0


def bench(url: str, out: Path, *args: str) -> dict[str, Any]:
    subprocess.run([sys.executable, "-m", "tailguard", "bench", "--url", url, "--out", str(out), "--api-key", "k",
                    "--time-scale", "1", *args], check=True, stdout=subprocess.DEVNULL)
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


@contextlib.asynccontextmanager
async def stack(tmp: Path) -> AsyncIterator[tuple[str, str, Path]]:
    sim_port, gw_port = free_port(), free_port()
    sim = f"http://127.0.0.1:{sim_port}"
    cfg = {"port": gw_port, "access_log": False, "auth": {"api_keys": {"k": {}}},
           "backends": [{"name": "sim", "url": sim, "kind": "sim", "max_concurrency": SEQS}],
           "batches": {"dir": str(tmp / "batches"), "poll_s": 0.5}}
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "tailguard.yaml"
    path.write_text(yaml.safe_dump(cfg))
    async with spawned(["sim", "--port", str(sim_port), "--time-scale", str(TIME_SCALE), "--max-num-seqs", str(SEQS),
                        "--model-name", "tailguard-sim"], f"{sim}/health", tmp / "sim.log"):
        yield sim, f"http://127.0.0.1:{gw_port}", path


async def interference(tmp: Path, n: int, rate: float, seconds: float) -> dict[str, Any]:
    async with stack(tmp) as (_, gw, cfg):
        async with spawned(["serve", "--config", str(cfg)], f"{gw}/health", tmp / "gw.log"):
            args = ("--workload", "chat-only", "--rate", str(rate), "--duration", str(seconds), "--warmup", "2s")
            alone = bench(gw, tmp / "alone", *args)
            async with AsyncOpenAI(base_url=f"{gw}/v1", api_key="k") as c:
                batch_id = await submit(c, n)
                while (await counts(c, batch_id))[1] < 50:  # the batch fills the engine first
                    await asyncio.sleep(0.5)
                with_batch = await asyncio.to_thread(bench, gw, tmp / "with", *args)
                status, done = await counts(c, batch_id)
                if status != "completed":
                    await c.batches.cancel(batch_id)
    p99 = (alone["overall"]["ttft_s"]["p99"], with_batch["overall"]["ttft_s"]["p99"])
    return {"lines": n, "chat_rate_per_s": rate, "seconds": seconds, "chat_ttft_p99_alone_s": p99[0],
            "chat_ttft_p99_with_batch_s": p99[1], "ratio": p99[1] / p99[0],
            "chats": [alone["overall"]["count"], with_batch["overall"]["count"]],
            "chat_errors": [alone["overall"]["errors"], with_batch["overall"]["errors"]],
            "batch_lines_done_meanwhile": done, "batch_status_then": status}


async def throughput(tmp: Path, n: int) -> dict[str, Any]:
    async with stack(tmp) as (sim, gw, cfg):
        workload = tmp / "same.yaml"
        workload.write_text(yaml.safe_dump({"name": "same", "classes": [{"name": "line", "weight": 1.0, "prompt_tokens":
                                            136, "max_tokens": MAX_TOKENS}]}))
        straight = bench(sim, tmp / "straight", "--workload", str(workload), "--concurrency", str(SEQS),
                         "--requests", str(n), "--model", "tailguard-sim")
        async with spawned(["serve", "--config", str(cfg)], f"{gw}/health", tmp / "gw.log"), \
                AsyncOpenAI(base_url=f"{gw}/v1", api_key="k") as c:
            t0 = time.perf_counter()
            batch_id = await submit(c, n)
            while (await counts(c, batch_id))[0] != "completed":
                await asyncio.sleep(0.2)
            wall = time.perf_counter() - t0
            b = await c.batches.retrieve(batch_id)
            assert b.output_file_id
            out = [json.loads(x) for x in (await c.files.content(b.output_file_id)).content.splitlines()]
    tokens = sum(o["response"]["body"]["usage"]["completion_tokens"] for o in out)
    prompt = sum(o["response"]["body"]["usage"]["prompt_tokens"] for o in out) / len(out)
    engine = straight["throughput"]["output_tokens_per_s"]
    return {"lines": n, "batch_output_tokens_per_s": tokens / wall, "engine_output_tokens_per_s": engine,
            "ratio": tokens / wall / engine, "batch_wall_s": wall, "batch_prompt_tokens_mean": prompt}


async def resume(tmp: Path, n: int) -> dict[str, Any]:
    async with stack(tmp) as (_, gw, cfg):
        log = open(tmp / "gw-killed.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "tailguard", "serve", "--config", str(cfg)], stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            async with AsyncOpenAI(base_url=f"{gw}/v1", api_key="k", max_retries=10) as c:
                batch_id = await submit(c, n)
                while (await counts(c, batch_id))[1] < n // 2:
                    await asyncio.sleep(0.2)
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                started = time.perf_counter()
                async with spawned(["serve", "--config", str(cfg)], f"{gw}/health", tmp / "gw2.log"):
                    listening = time.perf_counter()
                    _, before = await counts(c, batch_id)
                    while (got := await counts(c, batch_id))[1] <= before:
                        await asyncio.sleep(0.02)
                    first = time.perf_counter()
                    while (got := await counts(c, batch_id))[0] != "completed":
                        await asyncio.sleep(0.2)
        finally:
            stop_process(proc)
            log.close()
    return {"lines": n, "start_to_listening_s": listening - started, "start_to_first_line_done_s": first - started,
            "completed_after_restart": got[0] == "completed"}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=10_000)
    ap.add_argument("--throughput-lines", type=int, default=1_500)
    ap.add_argument("--chat-rate", type=float, default=4.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        res: dict[str, Any] = {"a_interference": await interference(tmp / "a", a.lines, a.chat_rate, a.seconds),
               "b_throughput": await throughput(tmp / "b", a.throughput_lines),
               "c_resume": await resume(tmp / "c", 2000)}
    res["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(), "load_1m": os.getloadavg()[0]}
    res["command"] = "python benchmarks/batch_capacity.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "batch_capacity.json").write_text(json.dumps(res, indent=2) + "\n")
    i, t, r = res["a_interference"], res["b_throughput"], res["c_resume"]
    md = f"""# Batch jobs: chat latency, throughput, resume

`{res['command']}` (simulator h100-llama8b, {SEQS} sequences, time scale {TIME_SCALE}; one gateway, SQLite journal;
load average {res['machine']['load_1m']:.1f} on {res['machine']['cpus']} CPUs when it ended)

| measure | result | target |
|---|---|---|
| chat TTFT P99 alone / with a {i['lines']:,}-line batch | {i['chat_ttft_p99_alone_s'] * 1000:.0f} ms / {i['chat_ttft_p99_with_batch_s'] * 1000:.0f} ms (**{i['ratio']:.2f}x**; {i['batch_lines_done_meanwhile']:,} lines done meanwhile) | within 1.1x |
| batch output tokens/s vs `tailguard bench` straight to the engine | {t['batch_output_tokens_per_s']:.0f} vs {t['engine_output_tokens_per_s']:.0f} (**{t['ratio']:.0%}**) | at least 80% |
| resume after SIGKILL: new process start to first line done | **{r['start_to_first_line_done_s']:.2f} s** (listening after {r['start_to_listening_s']:.2f} s) | |
"""
    (RESULTS / "batch_capacity.md").write_text(md)
    print(md)


if __name__ == "__main__":
    asyncio.run(main())
