"""`tailguard bench` with an agent workload, through a real gateway in front of a real simulator:
each call is the conversation so far (the server's own answers sent back, so the engine's prefix
cache finds every earlier turn), the gateway knows each program by its header, and the run's
folder and `bench compare` report program E2E per program class beside the calls'."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import orjson
import pytest
import yaml

from tailguard.bench.load import BenchConfig
from tailguard.bench.report import write_outputs
from tailguard.bench.run import run_bench
from tailguard.gateway.ops.access import ACCESS_LOGGER
from tests.cli import run
from tests.functional.gateways import SCALE, engine, gateway, sample, scrape

WORKLOAD = {"name": "tiny-agents", "programs": [
    {"name": "short", "weight": 2, "steps": {"dist": "uniform", "low": 1, "high": 2}, "system_prompt": {"tokens": 200},
     "task_tokens": 40, "tool_tokens": 60, "max_tokens": 8, "tool_gap_s": 0.5},
    {"name": "long", "weight": 1, "steps": 4, "parallel": {"dist": "uniform", "low": 1, "high": 2},
     "system_prompt": {"tokens": 200}, "task_tokens": 40, "tool_tokens": 60, "max_tokens": 8, "tool_gap_s": 0.5}]}


async def test_an_agent_workload_runs_as_programs_and_is_reported_per_program(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(yaml.safe_dump(WORKLOAD))
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with asyncio.timeout(90), gateway(engine_cfg=engine(enable_prefix_caching=True)) as gw:
        result = await run_bench(BenchConfig(url=gw.url, workload=path, rate=40.0, requests=12, seed=5,
                                             time_scale=SCALE))
        m = await scrape(gw.url)
    calls = result.records
    assert all(r.ok for r in calls) and len({r.program for r in calls}) == 12
    assert result.meta["mode"] == "programs" and result.meta["agents"]["name"] == "tiny-agents"
    for program in {r.program for r in calls}:
        mine = sorted((r for r in calls if r.program == program), key=lambda r: r.program_call or 0)
        assert [r.program_call for r in mine] == list(range(1, len(mine) + 1)) and mine[-1].program_last
        assert all(a.prompt_tokens < b.prompt_tokens or a.scheduled_at == b.scheduled_at  # siblings share one
                   for a, b in zip(mine, mine[1:]))
        assert all(r.usage_prompt_tokens == r.prompt_tokens for r in mine)  # the conversation as the server counts it
    # The gateway knew each program by its header, and counted its calls as one program's.
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == ACCESS_LOGGER]
    assert {ln["program_source"] for ln in lines} == {"x-tailguard-program"}
    assert len({ln["program"] for ln in lines}) == 12
    assert sample(m, "tailguard_programs_total", **{"class": "interactive", "source": "x-tailguard-program"}) == 12
    summary = write_outputs(result, tmp_path / "a")
    assert "<h2>Programs</h2>" in (tmp_path / "a" / "report.html").read_text()
    progs = summary["programs"]
    assert progs["overall"]["count"] == 12 and progs["overall"]["failed"] == 0
    assert set(progs["classes"]) == {"short", "long"} and progs["classes"]["long"]["calls_mean"] >= 4
    assert progs["classes"]["long"]["e2e_s"]["p50"] > progs["classes"]["short"]["e2e_s"]["p50"]
    write_outputs(result, tmp_path / "b", html=False)  # compare reads the records, not the page
    code, out = await run("bench", "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c"))
    assert code == 0 and "Program E2E" in out, out
    assert orjson.loads((tmp_path / "c" / "compare.json").read_bytes())["programs"]["long"]["ratio"]["p50"] == 1.0
