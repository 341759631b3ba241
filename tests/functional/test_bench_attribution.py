"""Attribution of a real run through the real gateway in front of the real simulator: every
request's parts add up to its E2E, and the gateway's queue is where its Server-Timing says."""

from __future__ import annotations

import asyncio

import pytest

from tailguard.bench.attribution import PARTS, attribute_all
from tailguard.bench.load import BenchConfig
from tailguard.bench.run import run_bench
from tailguard.bench.workload import load_workload
from tests.functional.gateways import SCALE, engine, gateway


async def test_parts_add_up_to_e2e_through_the_gateway() -> None:
    w, _ = load_workload("seed-mixed")
    async with gateway(max_concurrency=2, engine_cfg=engine(max_num_seqs=2)) as gw, asyncio.timeout(60):
        result = await run_bench(BenchConfig(url=gw.url, workload=w, concurrency=6, requests=40, seed=4,
                                             time_scale=SCALE))
    records = result.records
    attribute_all(records)
    assert all(r.ok for r in records)
    assert sum(1 for r in records if r.server_timing_s and r.server_timing_s["queue"] > 0) >= 10
    for r in records:
        parts = r.attribution
        assert parts is not None and set(parts) == set(PARTS) and min(parts.values()) >= 0
        assert sum(parts.values()) == pytest.approx(r.e2e_s, rel=0.01, abs=1e-5)
        assert r.server_timing_s is not None
        assert parts["gateway_queue_s"] == pytest.approx(r.server_timing_s["queue"], abs=1e-5)
