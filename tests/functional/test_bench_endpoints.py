"""`tailguard bench --endpoint`: each route driven against the simulator, straight and through
the gateway, with TTFT and ITL read from that route's own events and usage from its own fields."""

from __future__ import annotations

import asyncio

import pytest

from tailguard.bench.load import BenchConfig

from tailguard.bench.run import run_bench
from tailguard.bench.workload import parse_workload
from tests.functional.gateways import SCALE, gateway

WORKLOAD = parse_workload({"name": "one", "classes": [
    {"name": "w", "prompt_tokens": 60, "max_tokens": 8, "system_prompt": {"tokens": 16}},
    {"name": "whole", "weight": 0.5, "prompt_tokens": 30, "max_tokens": 4, "stream": False},
]})


@pytest.mark.parametrize("endpoint", ["chat", "completions", "responses", "messages", "embeddings"])
async def test_each_route_is_measured_from_its_own_events(endpoint: str) -> None:
    async with asyncio.timeout(60), gateway() as gw:
        for url in (gw.sims[0].url, gw.url):
            result = await run_bench(BenchConfig(url=url, workload=WORKLOAD, concurrency=3, requests=9, seed=1,
                                                 time_scale=SCALE, endpoint=endpoint))  # type: ignore[arg-type]
            assert len(result.records) == 9 and all(r.ok for r in result.records), [r.error for r in result.records]
            for r in result.records:
                assert r.ttft_s is not None and 0 < r.ttft_s <= r.e2e_s
                assert r.usage_prompt_tokens == r.prompt_tokens  # the workload's estimate is the server's count
                if endpoint == "embeddings":
                    assert not r.stream and r.output_tokens == 0
                    continue
                assert r.output_tokens == r.max_tokens
                if r.stream:  # one content event per token: TTFT at the first, ITL between them
                    assert len(r.chunk_at) == r.max_tokens and r.chunk_at == sorted(r.chunk_at)
