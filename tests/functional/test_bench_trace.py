"""`bench --trace` against real servers: the first half of a 500-request excerpt of each format
(tests/data) replayed through a gateway to two simulators, every request arriving when the trace
says, as long as the trace says, in the class the trace's rules give; the whole excerpt on the DES
with `sweep --trace`;
and the peer tools' flags (`--input-tokens`, `--output-tokens`) read back exactly from the
simulator."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tailguard.bench.load import BenchConfig
from tailguard.bench.run import run_bench
from tailguard.bench.stats import summarize
from tailguard.bench.trace.blocks import block_reuse
from tailguard.bench.trace.plan import TraceSpec, load_replay
from tailguard.sim.server import running_sim
from tests.cli import run
from tests.functional.gateway_processes import gateway_process
from tests.functional.gateways import classes, engine
from tests.functional.sim_processes import sim_process

DATA = Path(__file__).resolve().parents[1] / "data"
SCALE = 0.02
RULES = {"azure_conv_500.csv": "azure_rules.yaml", "azure_code_500.csv": "azure_rules.yaml"}


async def prefix_tokens(url: str) -> tuple[float, float]:
    """(hit, queried) prompt tokens of a simulator's prefix cache, from its vLLM counters."""
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    got = {smp.name: smp.value for fam in text_string_to_metric_families(text) for smp in fam.samples}
    return got["vllm:prefix_cache_hits_total"], got["vllm:prefix_cache_queries_total"]


FORMATS = ("azure_conv_500.csv", "mooncake_500.jsonl", "burstgpt_500.csv", "tailguard_access_500.jsonl")
# Of each excerpt, what goes through the gateway: its first half still holds each format's classes
# and its rows clamped to the simulator's minimum sizes (and Mooncake's shared blocks), and the
# replay is CPU-bound on two cores (every token streamed through three processes), not clock-bound.
REPLAYED = 250


async def test_each_format_replays_through_the_gateway_as_the_trace_says(tmp_path: Path) -> None:
    """Each simulator and the gateway in a process of its own, as deployed (the trace's load is
    what they serve, not what one event loop shared by all could keep up with); the four
    excerpts one after another through the same stack."""
    async with AsyncExitStack() as stack, asyncio.timeout(240):
        sims = [await stack.enter_async_context(sim_process(
            "--max-num-seqs", "32", "--enable-prefix-caching", time_scale=SCALE)) for _ in range(2)]
        # No class bound that sheds: on a loaded 2-core machine a stall of the simulators' scaled clock
        # (100 ms wall is 2 s simulated) would otherwise turn into refusals this test is not about.
        patient = {"max_queue_wait_s": 600.0}
        gw = await stack.enter_async_context(gateway_process(tmp_path, {
            "classes": classes(interactive=patient, batch=patient), "backends": [
                {"name": f"sim{i}", "url": s.url, "kind": "sim", "max_concurrency": 32} for i, s in enumerate(sims)]}))
        for name in FORMATS:
            before = [await prefix_tokens(s.url) for s in sims]
            await replays_as_the_trace_says(name, gw.url)
            after = [await prefix_tokens(s.url) for s in sims]
            hits = sum(a[0] - b[0] for a, b in zip(after, before))
            queried = sum(a[1] - b[1] for a, b in zip(after, before))
            replay = load_replay(TraceSpec(str(DATA / name), limit=REPLAYED))
            reuse = block_reuse(replay.requests, replay.trace.block_tokens)
            if reuse is not None:  # Mooncake: its shared blocks hit in the engines' caches (each engine its own)
                assert hits / queried > 0.5 * reuse, (name, hits / queried, reuse)
            else:  # nothing shared: not within the trace, not with the trace replayed before it
                assert hits < 0.01 * queried, (name, hits, queried)


async def replays_as_the_trace_says(name: str, url: str) -> None:
    rules = RULES.get(name)
    spec = TraceSpec(str(DATA / name), rules=None if rules is None else str(DATA / rules), limit=REPLAYED)
    replay = load_replay(spec)
    result = await run_bench(BenchConfig(url=url, trace=spec, time_scale=SCALE, requests=None))
    records = sorted(result.records, key=lambda r: r.index)
    assert len(records) == REPLAYED and all(r.ok for r in records), (name, [r.error for r in records if not r.ok][:3])
    for r, t, c in zip(records, replay.requests, replay.classes):
        # sizes exact as the simulator counted them; the class the trace's rules (or its log) gave
        assert r.usage_prompt_tokens == r.prompt_tokens == max(t.input_tokens, 5), name
        assert r.output_tokens == max(1, t.output_tokens), name
        assert r.scheduled_at == pytest.approx(t.at, abs=1e-5) and r.cls == c.name, name
        assert r.server_class == (c.headers.get("X-Tailguard-Class") or "interactive"), name
    s = summarize(result.records, result.meta)
    assert s["trace"]["requests"] == REPLAYED and s["trace"]["format"] == replay.trace.format
    assert s["run"]["mode"] == "open" and s["overall"]["count"] == REPLAYED
    assert s["trace"]["classes"] == {n: g["count"] for n, g in s["classes"].items()}
    assert s["validity"]["bursts"]["most_due_in_window"] >= 1


async def test_the_cli_replays_part_of_a_trace_faster(tmp_path: Path) -> None:
    async with running_sim(engine(max_num_seqs=32), time_scale=SCALE) as sim, asyncio.timeout(120):
        code, out = await run("bench", "--url", sim.url, "--trace", str(DATA / "burstgpt_500.csv"), "--window", "20:60",
                              "--speed", "2", "--limit", "120", "--out", str(tmp_path / "b"), "--quiet")
        assert code == 0, out
        assert "trace" in out and "burstgpt" in out and "first 120" in out and "at 2x its rate" in out
        code, out = await run("bench", "--url", sim.url, "--trace", str(DATA / "burstgpt_500.csv"), "--rate", "5")
        assert code == 1 and "a trace sets its own arrivals and length: --rate" in out
        code, out = await run("bench", "--url", sim.url, "--limit", "5", "--concurrency", "1")
        assert code == 1 and "go with --trace FILE" in out
    summary = orjson.loads((tmp_path / "b" / "summary.json").read_bytes())
    assert summary["overall"]["count"] == 120 and summary["trace"]["window"] == "20:60"
    records = [orjson.loads(line) for line in (tmp_path / "b" / "requests.jsonl").read_bytes().splitlines()]
    replay = load_replay(TraceSpec(str(DATA / "burstgpt_500.csv"), window="20:60", speed=2.0, limit=120))
    assert [r["scheduled_at"] for r in records] == pytest.approx([t.at for t in replay.requests], abs=1e-5)
    assert records[-1]["scheduled_at"] <= 30.0  # 60 s of the trace at twice its rate
    html = (tmp_path / "b" / "report.html").read_text()
    assert "arrival rate and TTFT over time" in html and "Lengths" in html


async def test_sweep_replays_each_excerpt_on_the_des(tmp_path: Path) -> None:
    values = {"mooncake_500.jsonl": "4,16"}  # one sweep of two values; the others one value each, to stay quick
    sweeps = await asyncio.gather(*(run(
        "sweep", "--trace", str(DATA / name), "--setting", "max_concurrency", "--values", values.get(name, "16"),
        "--max-num-seqs", "16", "--min-repeats", "1", "--max-repeats", "1", "--out", str(tmp_path / name),
        limit_s=120) for name in FORMATS))
    for name, (code, out) in zip(FORMATS, sweeps):
        assert code == 0, out
        sweep = orjson.loads((tmp_path / name / "sweep.json").read_bytes())
        assert f"Trace {DATA / name}" in sweep["how"] and len(sweep["points"]) == len(values.get(name, "16").split(","))
        summary = orjson.loads(next((tmp_path / name).glob("max_concurrency=16/seed*/summary.json")).read_bytes())
        assert summary["overall"]["count"] == 500 and summary["trace"]["requests"] == 500
    low, high = orjson.loads((tmp_path / "mooncake_500.jsonl" / "sweep.json").read_bytes())["points"]
    assert low["throughput_tokens_per_s"] <= high["throughput_tokens_per_s"]


async def test_input_and_output_tokens_without_a_workload_file(tmp_path: Path) -> None:
    """vllm bench's --random-input-len, AIPerf's --isl/--osl: the lengths asked are the lengths the
    simulator counts, and the summary's length statistics say so exactly."""
    async with running_sim(engine(max_num_seqs=8), time_scale=SCALE) as sim, asyncio.timeout(60):
        code, out = await run("bench", "--url", sim.url, "--input-tokens", "300:40", "--output-tokens", "20..40",
                              "--concurrency", "4", "--requests", "40", "--out", str(tmp_path / "l"), "--quiet",
                              columns=100)
    assert code == 0, out
    assert "Lengths in tokens" in out and "ITL/chunk" in out and "P25" in out
    s = orjson.loads((tmp_path / "l" / "summary.json").read_bytes())
    records = [orjson.loads(line) for line in (tmp_path / "l" / "requests.jsonl").read_bytes().splitlines()]
    assert s["run"]["workload"] == "fixed-lengths" and all(r["ok"] for r in records)
    assert all(r["usage_prompt_tokens"] == r["prompt_tokens"] and r["output_tokens"] == r["max_tokens"]
               for r in records)
    lengths = s["overall"]["lengths"]
    assert lengths["input_tokens"]["min"] == min(r["prompt_tokens"] for r in records)
    assert lengths["input_tokens"]["max"] == max(r["prompt_tokens"] for r in records)
    assert lengths["output_tokens"]["mean"] == pytest.approx(sum(r["max_tokens"] for r in records) / 40, abs=0.01)
    assert 20 <= lengths["output_tokens"]["min"] and lengths["output_tokens"]["max"] <= 40
    assert 250 < lengths["input_tokens"]["mean"] < 350 and lengths["input_tokens"]["std"] > 10
