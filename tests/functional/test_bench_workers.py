"""`bench --workers 2` against a real simulator: one schedule (the same due times and requests as
one worker would send), split by index over two processes that start on one clock origin; the
records merged, and each worker's dispatch lag checked on its own."""

from __future__ import annotations

import asyncio

from tailguard.bench.load import BenchConfig

from tailguard.bench.run import run_bench
from tailguard.bench.stats import summarize
from tailguard.sim.server import running_sim
from tests.functional.gateways import engine

WORKLOAD = "seed-mixed"


async def test_two_workers_send_one_schedule_from_one_origin_and_merge() -> None:
    async with asyncio.timeout(60), running_sim(engine(max_num_seqs=64), time_scale=0.02) as sim:
        base = BenchConfig(url=sim.url, workload=WORKLOAD, rate=40.0, requests=40, seed=3, time_scale=1.0)
        spread = await run_bench(BenchConfig(**{**base.__dict__, "workers": 2}))
        alone = await run_bench(base)
    assert [r.index for r in spread.records] == list(range(40))
    assert all(r.ok for r in spread.records)
    # One schedule: the same classes, due times and sizes as the single-process run's.
    assert [(r.cls, r.scheduled_at, r.prompt_tokens, r.max_tokens) for r in spread.records] == \
        [(r.cls, r.scheduled_at, r.prompt_tokens, r.max_tokens) for r in alone.records]
    # One origin: each worker sent its requests near their due times on the shared clock, not offset
    # by when its process happened to start (a worker's median lag: one late wake-up of a loaded
    # machine moves a maximum, an offset origin moves every request).
    for w in (0, 1):
        lags = sorted(r.sent_at - r.scheduled_at for r in spread.records if r.index % 2 == w)
        assert lags[len(lags) // 2] < 0.5
    assert spread.meta["workers"] == 2 and [w["requests"] for w in spread.meta["per_worker"]] == [20, 20]
    v = summarize(spread.records, spread.meta)["validity"]
    assert [(w["worker"], w["count"]) for w in v["workers"]] == [(0, 20), (1, 20)]
    assert v["valid"] == all(w["valid"] for w in v["workers"]) and v["valid"] <= (v["dispatch_lag_p99_s"] <= 0.005)
