"""`tailguard sweep` end to end against the real simulator and a real gateway, both started as
processes per value (as a sweep against a real engine restarts the gateway), in under a minute."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import orjson

TAILGUARD = str(Path(sys.executable).with_name("tailguard"))


async def test_a_sweep_of_max_concurrency_over_http(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        TAILGUARD, "sweep", "--target", "sim", "--setting", "max_concurrency", "--values", "2,8",
        "--workload", "seed-mixed", "--concurrency", "8", "--requests", "24", "--time-scale", "0.05",
        "--min-repeats", "1", "--max-repeats", "1", "--slo", "chat:e2e_s=2.0", "--out", str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode()
    assert time.monotonic() - started < 60
    res = orjson.loads((tmp_path / "sweep.json").read_bytes())
    assert [p["value"] for p in res["points"]] == [2, 8]
    for p in res["points"]:
        assert p["runs"] == 1 and p["throughput_tokens_per_s"] > 0
        assert len(list(tmp_path.glob(f"max_concurrency={p['value']}/seed*/requests.jsonl"))) == p["runs"]
    # 8 slots serve more than 2 on this mix, and the page and the Pareto plot are written
    assert res["points"][1]["throughput_tokens_per_s"] > res["points"][0]["throughput_tokens_per_s"]
    assert (tmp_path / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    assert "Recommended" in (tmp_path / "sweep.html").read_text()
    assert b"recommended" in out
