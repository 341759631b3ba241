"""Batch jobs against chat latency and engine throughput (issue 20): one simulator behind one
gateway (`tailguard serve --config`, SQLite journal), three measurements.

a. Interference: interactive chats arriving open loop (Poisson; `chat-only`'s sizes: 64-192
   prompt tokens, max_tokens 32, streamed by the openai SDK) alone, then the same chats while a
   10,000-line batch runs; several hundred chats each, so the P99 is not one chat. Target: chat
   TTFT P99 with the batch within 1.1x of alone. Each chat's time is split with the gateway's
   access line (joined by X-Request-Id): arrival to a slot (`queue_ms`: reading, admitting and
   any wait for a slot), slot to first token (upstream connect, the engine's queue and prefill:
   `ttft_ms - queue_ms`) and first token at the gateway to first token at the client (the
   gateway's write and the client's read). Meanwhile: the CPU the gateway and the simulator used
   (/proc), the lines the front suspended for chats and the engine's mean queue time (/metrics).
   Runs of the batch with the default settings and with a setting of the batch class:
   `classes[batch].max_share` (`--batch-share`) or `classes[batch].start_interval_s`
   (`--batch-pace`, wall seconds), alternated for `--rounds`.
b. Throughput: a batch alone against `tailguard bench` straight to the engine with the same
   requests (closed loop, as many clients as the engine's sequences). Target: the batch gets at
   least 80% of the engine's output tokens per second. With `--batch-pace`, the batch runs paced.
c. Resume: the gateway killed (SIGKILL) mid-batch and started again: seconds from the new
   process's start to its first line recorded done.

    .venv/bin/python benchmarks/batch_capacity.py [--lines 10000] [--chat-rate 8] [--chats 480] \
        [--batch-share 0.75 | --batch-pace 0.0016] [--rounds 2]

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
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from tailguard.cli.experiment import free_port, spawned, stop_process
from tailguard.config.classes import default_classes

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
async def stack(tmp: Path, batch: dict[str, Any] | None = None,
                access_log: bool = False) -> AsyncIterator[tuple[str, str, Path, int]]:
    """A simulator and a gateway config; `batch`: settings of the batch class over its defaults."""
    sim_port, gw_port = free_port(), free_port()
    sim = f"http://127.0.0.1:{sim_port}"
    cfg: dict[str, Any] = {"port": gw_port, "access_log": access_log, "auth": {"api_keys": {"k": {}}},
                           "backends": [{"name": "sim", "url": sim, "kind": "sim", "max_concurrency": SEQS}],
                           "batches": {"dir": str(tmp / "batches"), "poll_s": 0.5}}
    if batch:
        cfg["classes"] = [c.model_dump(exclude_defaults=True) | (batch if c.name == "batch" else {})
                          for c in default_classes()]
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "tailguard.yaml"
    path.write_text(yaml.safe_dump(cfg))
    async with spawned(["sim", "--port", str(sim_port), "--time-scale", str(TIME_SCALE), "--max-num-seqs", str(SEQS),
                        "--model-name", "tailguard-sim"], f"{sim}/health", tmp / "sim.log") as sim_proc:
        yield sim, f"http://127.0.0.1:{gw_port}", path, sim_proc.pid


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def chats(c: AsyncOpenAI, n: int, rate: float, tag: str, seed: int = 1) -> dict[str, float]:
    """`n` streamed chats arriving Poisson at `rate` per wall second: each one's client TTFT, by request id."""
    rng = random.Random(seed)
    ttft: dict[str, float] = {}

    async def one(rid: str, words: int) -> None:
        t0 = time.perf_counter()
        stream = await c.chat.completions.create(
            model="tailguard-sim", max_tokens=32, stream=True, messages=[{"role": "user", "content": "hi " * words}],
            extra_headers={"X-Tailguard-Class": "interactive", "X-Request-Id": rid})
        async for chunk in stream:
            if rid not in ttft and chunk.choices and chunk.choices[0].delta.content:
                ttft[rid] = time.perf_counter() - t0
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(one(f"{tag}-{i}", rng.randint(64, 192))))
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)
    return ttft


def access_lines(log: Path, tag: str) -> dict[str, dict[str, Any]]:
    out = {}
    for line in log.read_text(errors="replace").splitlines():
        if '"event":"access"' in line and f'"request_id":"{tag}-' in line:
            rec = json.loads(line[line.index("{"):])
            out[rec["request_id"]] = rec
    return out


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of a /metrics sample's values over the series matching `labels`."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def counters(gw: str, sim: str) -> tuple[float, float, float]:
    """Lines suspended so far; the engine's summed and counted queue time (every request's)."""
    return (metric(gw, "tailguard_preemptions_total", **{"class": "batch"}),
            metric(sim, "vllm:request_queue_time_seconds_sum"), metric(sim, "vllm:request_queue_time_seconds_count"))


def pcts(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    return {"p50": v[len(v) // 2], "p90": v[int(0.9 * (len(v) - 1))], "p99": v[int(0.99 * (len(v) - 1))], "max": v[-1]}


async def measured(c: AsyncOpenAI, tag: str, n: int, rate: float, pids: tuple[int, int], log: Path,
                   urls: tuple[str, str]) -> dict[str, Any]:
    """One phase of chats, with each chat's time split by the gateway's access line, and what the
    gateway and the engine did meanwhile: CPU, lines suspended for chats, the engine's queue."""
    cpu0, t0, n0 = [cpu_s(p) for p in pids], time.perf_counter(), counters(*urls)
    ttft = await chats(c, n, rate, tag)
    wall = time.perf_counter() - t0
    cpu = [(cpu_s(p) - c0) / wall for p, c0 in zip(pids, cpu0)]
    suspended, queued_s, queued_n = (b - a for a, b in zip(n0, counters(*urls)))
    await asyncio.sleep(0.5)  # the access log is flushed in batches
    acc = access_lines(log, tag)
    ms = {rid: v * 1000 for rid, v in ttft.items()}
    queue = [acc[r]["queue_ms"] for r in ms if r in acc]
    engine = [acc[r]["ttft_ms"] - acc[r]["queue_ms"] for r in ms if r in acc]
    delivery = [ms[r] - acc[r]["ttft_ms"] for r in ms if r in acc]
    return {"chats": n, "answered": len(ms), "ttft_ms": pcts(list(ms.values())), "queue_ms": pcts(queue),
            "slot_to_first_token_ms": pcts(engine), "gateway_to_client_ms": pcts(delivery),
            "lines_suspended": suspended, "engine_queue_mean_ms": 1000 * queued_s / queued_n if queued_n else 0.0,
            "gateway_cpu_cores": cpu[0], "sim_cpu_cores": cpu[1], "load_1m": os.getloadavg()[0]}


def label(batch: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in batch.items()) or "defaults"


async def interference(tmp: Path, n: int, chats_n: int, rate: float, batch: dict[str, Any]) -> dict[str, Any]:
    async with stack(tmp, batch, access_log=True) as (sim, gw, cfg, sim_pid):
        async with spawned(["serve", "--config", str(cfg)], f"{gw}/health", tmp / "gw.log") as gw_proc:
            pids = (gw_proc.pid, sim_pid)
            async with AsyncOpenAI(base_url=f"{gw}/v1", api_key="k", max_retries=0) as c:
                alone = await measured(c, "alone", chats_n, rate, pids, tmp / "gw.log", (gw, sim))
                batch_id = await submit(c, n)
                while (await counts(c, batch_id))[1] < 50:  # the batch fills the engine first
                    await asyncio.sleep(0.5)
                _, before = await counts(c, batch_id)
                t0 = time.perf_counter()
                with_batch = await measured(c, "with", chats_n, rate, pids, tmp / "gw.log", (gw, sim))
                status, done = await counts(c, batch_id)
                lines_per_s = (done - before) / (time.perf_counter() - t0)
                if status != "completed":
                    await c.batches.cancel(batch_id)
    p99 = (alone["ttft_ms"]["p99"], with_batch["ttft_ms"]["p99"])
    return {"lines": n, "batch_setting": label(batch), "chat_rate_per_s": rate, "alone": alone, "with_batch": with_batch,
            "ratio_p99": p99[1] / p99[0], "ratio_p50": with_batch["ttft_ms"]["p50"] / alone["ttft_ms"]["p50"],
            "batch_lines_per_s_meanwhile": lines_per_s, "batch_status_then": status}


async def throughput(tmp: Path, n: int, batch: dict[str, Any]) -> dict[str, Any]:
    async with stack(tmp, batch) as (sim, gw, cfg, _):
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
    return {"lines": n, "batch_setting": label(batch), "batch_output_tokens_per_s": tokens / wall, "engine_output_tokens_per_s": engine,
            "ratio": tokens / wall / engine, "batch_wall_s": wall, "batch_prompt_tokens_mean": prompt}


async def resume(tmp: Path, n: int) -> dict[str, Any]:
    async with stack(tmp) as (_, gw, cfg, _):
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


def interference_rows(runs: list[dict[str, Any]]) -> str:
    rows = []
    for i in runs:
        for phase in ("alone", "with_batch"):
            m = i[phase]
            what = "chats alone" if phase == "alone" else f"with the batch ({i['batch_lines_per_s_meanwhile']:.0f} lines/s)"
            rows.append(f"| {i['batch_setting']} | {what} | {m['answered']} | {m['ttft_ms']['p50']:.0f} / "
                        f"{m['ttft_ms']['p99']:.0f} | {m['queue_ms']['p50']:.1f} / {m['queue_ms']['p99']:.1f} | "
                        f"{m['slot_to_first_token_ms']['p50']:.1f} / {m['slot_to_first_token_ms']['p99']:.1f} | "
                        f"{m['gateway_to_client_ms']['p50']:.1f} / {m['gateway_to_client_ms']['p99']:.1f} | "
                        f"{m['lines_suspended']:.0f} | {m['engine_queue_mean_ms']:.2f} | "
                        f"{m['gateway_cpu_cores']:.2f} / {m['sim_cpu_cores']:.2f} | "
                        f"{m['load_1m']:.1f} |")
        rows.append(f"| {i['batch_setting']} | **P99 with / alone: {i['ratio_p99']:.2f}x** (P50 {i['ratio_p50']:.2f}x) "
                    "| | | | | | | | | |")
    return "\n".join(rows)


def ratio_lines(runs: list[dict[str, Any]]) -> str:
    """Per setting, the median over its rounds of each round's ratio (its own alone against its own with)."""
    out = []
    for setting in dict.fromkeys(i["batch_setting"] for i in runs):
        mine = [i for i in runs if i["batch_setting"] == setting]
        p99, p50 = (statistics.median(i[k] for i in mine) for k in ("ratio_p99", "ratio_p50"))
        out.append(f"- batch {setting}: P99 with / alone **{p99:.2f}x**, P50 {p50:.2f}x (median of "
                   f"{len(mine)} rounds; batch {statistics.median(i['batch_lines_per_s_meanwhile'] for i in mine):.0f} "
                   "lines/s meanwhile)")
    return "\n".join(out)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=10_000)
    ap.add_argument("--throughput-lines", type=int, default=1_500)
    ap.add_argument("--chat-rate", type=float, default=8.0, help="chats per wall second (x4 simulated seconds)")
    ap.add_argument("--chats", type=int, default=480, help="chats per phase")
    ap.add_argument("--batch-share", type=float, default=0.75, help="the second run's classes[batch].max_share")
    ap.add_argument("--batch-pace", type=float, help="instead: the second run's classes[batch].start_interval_s")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each setting, alternated (the machine's load drifts)")
    a = ap.parse_args()
    second = {"start_interval_s": a.batch_pace} if a.batch_pace else {"max_share": a.batch_share}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        res: dict[str, Any] = {"a_interference": [
            await interference(tmp / f"a{n}-{k}", a.lines, a.chats, a.chat_rate, batch)
            for n in range(a.rounds) for k, batch in enumerate(({}, second))],
            "b_throughput": await throughput(tmp / "b", a.throughput_lines, second if a.batch_pace else {}),
            "c_resume": await resume(tmp / "c", 2000)}
    res["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(), "load_1m": os.getloadavg()[0]}
    res["command"] = "python benchmarks/batch_capacity.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "batch_capacity.json").write_text(json.dumps(res, indent=2) + "\n")
    t, r = res["b_throughput"], res["c_resume"]
    md = f"""# Batch jobs: chat latency, throughput, resume

`{res['command']}` (simulator h100-llama8b, {SEQS} sequences, time scale {TIME_SCALE}, so a wall ms is 4 simulated
ms; one gateway, SQLite journal; load average {res['machine']['load_1m']:.1f} on {res['machine']['cpus']} CPUs when it
ended). Times in wall ms, each cell P50 / P99 over the phase's chats.

a. Chats (Poisson, {a.chat_rate}/s) alone, then while a {a.lines:,}-line batch runs. Target: P99 with the batch within
1.1x of alone.

| batch class | phase | chats | client TTFT | gateway: arrival to slot | slot to first token (gateway) | gateway to client | lines suspended | engine queue mean, simulated ms (all requests) | CPU cores gateway / sim | load 1m |
|---|---|---|---|---|---|---|---|---|---|---|
{interference_rows(res["a_interference"])}

{ratio_lines(res["a_interference"])}

| measure | result | target |
|---|---|---|
| batch ({t['batch_setting']}) output tokens/s vs `tailguard bench` straight to the engine | {t['batch_output_tokens_per_s']:.0f} vs {t['engine_output_tokens_per_s']:.0f} (**{t['ratio']:.0%}**) | at least 80% |
| resume after SIGKILL: new process start to first line done | **{r['start_to_first_line_done_s']:.2f} s** (listening after {r['start_to_listening_s']:.2f} s) | |
"""
    (RESULTS / "batch_capacity.md").write_text(md)
    print(md)


if __name__ == "__main__":
    asyncio.run(main())
