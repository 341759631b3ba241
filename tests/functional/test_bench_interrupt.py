"""`tailguard bench` stopped by a real SIGINT or SIGTERM: it stops sending, lets requests in flight
finish within the grace, writes a folder marked interrupted whose counts match what the simulator
received, and exits non-zero; a second signal ends it at once."""

from __future__ import annotations

import asyncio
import signal
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from tailguard.sim.cost import EngineConfig
from tailguard.sim.server import RunningSim, running_sim
from tests.cli import finish, start

LONG = "name: long\nclasses:\n  - {name: long, prompt_tokens: 50, max_tokens: 4000}\n"


async def scrape(sim: RunningSim) -> dict[str, float]:
    """The simulator's ended requests by finished_reason (length, stop, abort) and `running`."""
    async with aiohttp.ClientSession() as s, s.get(sim.url + "/metrics", timeout=aiohttp.ClientTimeout(5)) as r:
        text = await r.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if fam.name == "vllm:request_success" and sample.name.endswith("_total"):
                out[sample.labels["finished_reason"]] = sample.value
            elif fam.name == "vllm:num_requests_running":
                out["running"] = sample.value
    return out


def ended_total(counts: dict[str, float]) -> float:
    return counts["length"] + counts["stop"] + counts["abort"]


async def until(sim: RunningSim, done: Callable[[dict[str, float]], bool], limit_s: float = 20.0) -> dict[str, float]:
    """Poll the simulator's counters until `done` holds (aborts reach it just after a client closes)."""
    async with asyncio.timeout(limit_s):
        while not done(counts := await scrape(sim)):
            await asyncio.sleep(0.02)
    return counts


async def bench(sim: RunningSim, out: Path, scale: float, *args: str) -> asyncio.subprocess.Process:
    return await start("bench", "--url", sim.url, "--concurrency", "4", "--requests", "100000", "--out", str(out),
                       "--quiet", "--time-scale", str(scale), *args, columns=200)


def folder(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    summary = orjson.loads((out / "summary.json").read_bytes())
    records = [orjson.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert (out / "report.html").is_file()
    return summary, records


async def test_sigint_finishes_requests_in_flight_and_writes_an_interrupted_folder(tmp_path: Path) -> None:
    scale = 0.02
    async with running_sim(EngineConfig.from_preset("h100-llama8b"), time_scale=scale) as sim:
        proc = await bench(sim, tmp_path / "run", scale, "--workload", "chat-only")
        await until(sim, lambda c: ended_total(c) >= 20)
        proc.send_signal(signal.SIGINT)
        code, out = await finish(proc)
        summary, records = folder(tmp_path / "run")
        counts = await until(sim, lambda c: ended_total(c) >= len(records))
    assert code == 128 + signal.SIGINT, out
    assert "SIGINT: stopped sending" in out and "INTERRUPTED after" in out and f"wrote {tmp_path / 'run'}" in out
    info = summary["interrupted"]
    # 32-token chats end well within the 5 s grace: none was cut, and all the simulator finished were sent.
    assert info["cut"] == 0 and info["sent"] == info["done"] == len(records) >= 20
    assert summary["overall"]["count"] == summary["overall"]["ok"] == len(records)
    assert (counts["length"], counts["stop"], counts["abort"]) == (len(records), 0, 0)
    assert "INTERRUPTED after" in (tmp_path / "run" / "report.html").read_text()


@asynccontextmanager
async def long_answers(tmp_path: Path, grace_s: float) -> AsyncIterator[tuple[RunningSim, asyncio.subprocess.Process]]:
    """A bench of 4 clients on 4000-token answers, each about 5 wall seconds long (far longer than
    any grace here), yielded once all 4 run on the simulator; the bench never outlives the block."""
    scale = 0.2
    (tmp_path / "long.yaml").write_text(LONG)
    async with running_sim(EngineConfig.from_preset("h100-llama8b"), time_scale=scale) as sim:
        proc = await bench(sim, tmp_path / "run", scale, "--workload", str(tmp_path / "long.yaml"),
                           "--interrupt-grace", str(grace_s))
        try:
            await until(sim, lambda c: c["running"] == 4)
            yield sim, proc
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_sigterm_cuts_requests_still_running_after_the_grace(tmp_path: Path) -> None:
    async with long_answers(tmp_path, grace_s=0.2) as (sim, proc):
        proc.send_signal(signal.SIGTERM)
        code, out = await finish(proc)
        summary, records = folder(tmp_path / "run")
        counts = await until(sim, lambda c: ended_total(c) >= len(records))
    assert code == 128 + signal.SIGTERM, out
    info = summary["interrupted"]
    assert info["sent"] == len(records) == 4 and info["cut"] == 4 and info["done"] == 0
    assert all(r["error_kind"] == "interrupted" and r["chunk_at"] for r in records)
    assert summary["overall"]["count"] == 0  # cut by the bench: not the server's latency
    assert counts["abort"] == 4 and counts["length"] == 0  # the simulator saw each cut request leave


async def test_a_second_signal_ends_the_bench_at_once(tmp_path: Path) -> None:
    async with long_answers(tmp_path, grace_s=60) as (_, proc):
        proc.send_signal(signal.SIGINT)
        assert proc.stdout is not None
        async with asyncio.timeout(10):
            assert b"SIGINT: stopped sending" in await proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        code, _ = await finish(proc, limit_s=5.0)  # not the 60 s grace
    assert code == -signal.SIGINT and not (tmp_path / "run").exists()
