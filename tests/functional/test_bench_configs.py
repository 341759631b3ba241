"""Bench records the gateway's config, and `bench compare` and `doctor --against` say which gateway
settings differed between two runs, warning when more than one did: real runs through real
gateways in front of the real simulator on loopback."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
import orjson

from tailguard.bench.load import BenchConfig

from tailguard.bench.run import run_bench
from tailguard.bench.report import compare_dirs, load_run, write_outputs
from tailguard.gateway.http.app import reloader_of
from tailguard.gateway.http.keys import LIVE
from tests.functional.gateways import engine, gateway

SCALE = 0.02
TAILGUARD = str(Path(sys.executable).with_name("tailguard"))


async def measured_run(url: str, out: Path) -> None:
    result = await run_bench(BenchConfig(url=url, workload="chat-only", concurrency=2, requests=8, seed=1,
                                         time_scale=SCALE))
    write_outputs(result, out, html=False)


async def test_runs_record_the_config_and_comparisons_name_what_changed(tmp_path: Path) -> None:
    """One gateway, reloaded live between three runs: (a) cap 4, (b) cap 6 and a smaller batch
    cap, (c) cap 6 alone."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    async with gateway(max_concurrency=4, engine_cfg=engine(), scale=SCALE) as gw, asyncio.timeout(90):
        app = gw.app
        reloader = reloader_of(app)
        base = app[LIVE].cfg
        wider = base.model_copy(update={"backends": [base.backends[0].model_copy(update={"max_concurrency": 6})]})
        batch = wider.classes[1].model_copy(update={"max_tokens_cap": 2048})
        hashes = []
        smaller_batch = wider.model_copy(update={"classes": [wider.classes[0], batch, *wider.classes[2:]]})
        for out, cfg in ((a, base), (b, smaller_batch), (c, wider)):
            reloader.apply(cfg)
            hashes.append(app[LIVE].hash)
            await measured_run(gw.url, out)
    ha, hb, hc = hashes
    assert len(set(hashes)) == 3

    records, meta = load_run(a)
    assert {r.config for r in records} == {ha}  # every request names the config that answered it
    assert meta["gateway_config"]["hash"] == ha
    assert meta["gateway_config"]["settings"]["backends"][0]["max_concurrency"] == 4
    assert orjson.loads((a / "summary.json").read_bytes())["run"]["gateway_config"] == ha

    one = compare_dirs(a, c)["config"]
    assert one == {"before": ha, "after": hc, "changes": ["backends[sim0].max_concurrency: 4 -> 6"], "warnings": []}
    two = compare_dirs(a, b)["config"]
    assert two["changes"] == ["backends[sim0].max_concurrency: 4 -> 6", "classes[batch].max_tokens_cap: 4096 -> 2048"]
    assert two["warnings"] == ["2 gateway settings differ between the runs: change one per run, or this comparison "
                               "cannot say which one made the difference"]
    page = (b / "compare.html").read_text()
    assert "classes[batch].max_tokens_cap: 4096 -&gt; 2048" in page and "2 gateway settings differ" in page

    proc = await asyncio.create_subprocess_exec(
        TAILGUARD, "doctor", str(b), "--against", str(a), "--json", stdout=asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):
        out, _ = await proc.communicate()
    assert proc.returncode == 0
    assert orjson.loads(out)["config"] == {**two, "before": ha, "after": hb}
