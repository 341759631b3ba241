"""The bench against the real simulator over loopback: the openai-compatible stream is read the
way the `openai` package reads it, and the CLI writes and compares real output folders."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
from openai import AsyncOpenAI

from tailguard.bench.load import BenchConfig

from tailguard.bench.run import run_bench
from tailguard.bench.stats import summarize
from tailguard.bench.stream import RequestFactory
from tailguard.bench.workload import load_workload, parse_workload
from tailguard.sim.cost import EngineConfig
from tailguard.sim.server import running_sim
from tests.cli import run

SCALE = 0.02  # 50x faster than real time


def engine(**kw: Any) -> EngineConfig:
    return EngineConfig.from_preset("h100-llama8b", **{"max_num_seqs": 4, "max_model_len": 4096,
                                                       "kv_cache_tokens": 65536, **kw})


async def test_bench_reads_the_simulator_stream_exactly() -> None:
    w = parse_workload({"name": "mix", "classes": [
        {"name": "chat", "weight": 3, "prompt_tokens": {"dist": "uniform", "low": 40, "high": 200}, "max_tokens": 16,
         "system_prompt": {"tokens": 64, "shared": True}},
        {"name": "plain", "weight": 1, "prompt_tokens": 50, "max_tokens": 5, "stream": False},
    ]})
    async with running_sim(engine(), time_scale=SCALE) as sim, asyncio.timeout(60):
        result = await run_bench(BenchConfig(url=sim.url, workload=w, concurrency=4, requests=24, seed=3,
                                             time_scale=SCALE))
    assert result.meta["model"] == "tailguard-sim"
    assert len(result.records) == 24 and all(r.ok and r.status == 200 for r in result.records)
    for r in result.records:
        assert r.usage_prompt_tokens == r.prompt_tokens  # the workload's estimate is the server's count
        assert r.output_tokens == r.usage_output_tokens == r.max_tokens
        ttft = r.ttft_s
        assert ttft is not None and 0 < ttft <= r.e2e_s
        if r.stream:
            assert len(r.chunk_at) == r.max_tokens and r.chunk_at == sorted(r.chunk_at)
        else:
            assert not r.chunk_at
    s = summarize(result.records, result.meta)
    assert s["classes"]["chat"]["count"] + s["classes"]["plain"]["count"] == 24
    # at 50x speed several tokens can arrive in one read (a 0 gap), but never all of them
    assert s["classes"]["chat"]["itl_s"]["max"] > 0 and s["classes"]["plain"]["itl_s"]["p50"] is None
    assert s["overall"]["throughput"]["output_tokens_per_s"] > 0


async def test_bench_counts_what_the_openai_package_sees() -> None:
    w, _ = load_workload("seed-mixed")
    factory = RequestFactory(w, seed=9, model="tailguard-sim")
    req = factory.next("chat")
    body = orjson.loads(req.body)
    async with running_sim(engine(), time_scale=SCALE) as sim, asyncio.timeout(60):
        async with AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0) as client:
            stream = await client.chat.completions.create(**body, extra_headers=dict(req.headers))
            content_chunks, usage = 0, None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    content_chunks += 1
                if chunk.usage is not None:
                    usage = chunk.usage
        one = parse_workload({"name": "one", "classes": [w.classes[0].model_dump()]})
        result = await run_bench(BenchConfig(url=sim.url, workload=one, concurrency=1, requests=1, seed=9,
                                             time_scale=SCALE))
    rec = result.records[0]
    assert usage is not None
    assert len(rec.chunk_at) == content_chunks == 32
    assert rec.usage_output_tokens == usage.completion_tokens == 32
    assert rec.prompt_tokens == usage.prompt_tokens == req.prompt_tokens


async def test_cli_runs_compares_and_rerenders(tmp_path: Path) -> None:
    async with running_sim(engine(), time_scale=SCALE) as sim:
        code, out = await run("bench", "--url", sim.url, "--workload", "chat-only", "--concurrency", "2",
                                  "--requests", "8", "--warmup", "2", "--out", str(tmp_path / "a"), "--quiet")
        # The simulator lists its time scale: without --time-scale the run takes it, and says so.
        assert code == 0 and f"announced time scale {SCALE:g}" in out, out
        assert orjson.loads((tmp_path / "a" / "run.json").read_bytes())["time_scale"] == SCALE
        assert "E2E" in out and "chat" in out and "run" in out
        code, out = await run("bench", "--url", sim.url, "--workload", "chat-only", "--rate", "40",
                                  "--arrival", "gamma", "--burstiness", "0.5", "--duration", "0.5",
                                  "--out", str(tmp_path / "b"), "--quiet", "--seed", "4", "--time-scale", str(SCALE))
        assert code == 0, out
    for d in ("a", "b"):
        assert {p.name for p in (tmp_path / d).iterdir()} == {"summary.json", "requests.jsonl", "run.json", "report.html"}
    a = orjson.loads((tmp_path / "a" / "summary.json").read_bytes())
    assert a["overall"]["count"] == 8 and a["run"]["warmup_requests_excluded"] == 2 and a["run"]["mode"] == "closed"
    b = orjson.loads((tmp_path / "b" / "run.json").read_bytes())
    assert b["mode"] == "open" and b["arrival"] == "gamma" and b["burstiness"] == 0.5
    code, out = await run("bench", "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c"))
    assert code == 0, out
    assert "Verdict" in out and (tmp_path / "c" / "compare.html").is_file()
    assert "Throughput, after / before" in out and "requests/s" in out and "output tok/s" in out
    assert orjson.loads((tmp_path / "c" / "compare.json").read_bytes())["overall"]["throughput"]["requests_per_s"]["ci95"]
    (tmp_path / "a" / "report.html").unlink()
    code, out = await run("bench", "report", str(tmp_path / "a"))
    assert code == 0 and (tmp_path / "a" / "report.html").is_file()
    code, out = await run("bench", "--url", "http://127.0.0.1:9", "--concurrency", "1", "--rate", "3")
    assert code == 1 and "not both" in out
    code, out = await run("bench", "--url", "http://127.0.0.1:9", "--workload", "nope", "--concurrency", "1")
    assert code == 1 and "built-ins are" in out
