"""`tailguard bench --find-capacity` against the real simulator: a search of open-loop runs that
writes capacity.json and each step's folder, and `bench compare` of two such folders prints the
capacity ratio with its interval (issue 30)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tailguard.sim.cost import EngineConfig
from tailguard.sim.server import running_sim
from tests.cli import run

SCALE = 0.05  # 20x faster than real time


async def _search(url: str, out: Path, ttft_s: float) -> tuple[int, str]:
    return await run("bench", "--url", url, "--workload", "seed-mixed", "--rate", "40", "--duration", "1",
                     "--time-scale", str(SCALE), "--find-capacity", "chat",
                     "--capacity-slo", f"ttft_s={ttft_s}", "--capacity-precision", "1", "--max-dispatch-lag-ms",
                     "50", "--out", str(out), limit_s=50)


async def test_a_search_brackets_a_capacity_and_two_searches_compare(tmp_path: Path) -> None:
    engine = EngineConfig.from_preset("h100-llama8b", max_num_seqs=8)
    async with asyncio.timeout(110), running_sim(engine, time_scale=SCALE) as sim:
        code, out = await _search(sim.url, tmp_path / "tight", 0.1)
        code2, out2 = await _search(sim.url, tmp_path / "loose", 2.0)
    cap = json.loads((tmp_path / "tight" / "capacity.json").read_text())
    assert cap["class"] == "chat" and cap["slo"] == {"ttft_s": 0.1} and cap["share"] == 0.99
    steps = sorted((tmp_path / "tight" / "steps").iterdir())
    assert len(steps) == len(cap["steps"]) >= 2
    assert all((s / "requests.jsonl").is_file() for s in steps)
    lo, hi = cap["bracket"]
    assert cap["stopped"], cap
    if lo is not None:  # the run at the capacity found is the folder's own
        assert code == 0 and (tmp_path / "tight" / "summary.json").is_file()
        assert hi is None or lo < hi
    loose = json.loads((tmp_path / "loose" / "capacity.json").read_text())
    assert code2 == 0 and loose["capacity_per_s"] > 0
    if lo is not None:
        code3, out3 = await run("bench", "compare", str(tmp_path / "tight"), str(tmp_path / "loose"), limit_s=60)
        assert code3 == 0, out3
        assert "capacity at the SLO" in out3
        compared = json.loads((tmp_path / "loose" / "compare.json").read_text())
        assert compared["capacity"]["ratio"] == loose["capacity_per_s"] / lo
