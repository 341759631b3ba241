"""The batch journal in a real PostgreSQL server shared by two gateway replicas: both run the
batch's lines; one is killed (SIGKILL) halfway; the other takes its lines once their leases end
and completes the batch, every custom_id exactly once, no line recorded done sent again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
from openai import AsyncOpenAI

from tests.functional.batch_calls import (
    counting_sim, gateway_config, gateway_process, input_file, lines_of, submit, until_completed, until_status,
)
from tests.functional.postgres_server import postgres_server

N = 1000


def running_holders(url: str) -> set[str]:
    with psycopg.connect(url) as db:
        return {r[0] for r in db.execute("SELECT DISTINCT holder FROM lines WHERE state = 'running'")}


def client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=2)


async def test_two_replicas_share_a_batch_and_the_survivor_takes_the_dead_ones_lines(tmp_path: Path) -> None:
    with postgres_server() as url:
        async with counting_sim() as sim:
            # A lease a starved CI machine cannot outlast between two renewals (every third of it), so a
            # line is taken from the dead replica only, never from a live one that renewed late.
            batches = {"dir": str(tmp_path / "batches"), "store": url, "lease_s": 3.0}
            a_cfg = gateway_config(tmp_path / "a.yaml", sim.url, batches, max_concurrency=16)
            b_cfg = gateway_config(tmp_path / "b.yaml", sim.url, batches, max_concurrency=16)
            async with gateway_process(a_cfg) as a, client(a.url) as ca:
                async with gateway_process(b_cfg) as b:
                    batch = await submit(ca, input_file(N))
                    async with asyncio.timeout(60):
                        await until_completed(ca, batch.id, N // 2)
                        while len(running_holders(url)) < 2:  # kill it with lines on the engine from both
                            await asyncio.sleep(0.005)
                    b.kill()
                    await b.proc.wait()
                with psycopg.connect(url) as db:
                    done = {r[0] for r in db.execute("SELECT custom_id FROM lines WHERE state IN ('done', 'failed')")}
                    b_running = {r[0] for r in db.execute(
                        "SELECT custom_id FROM lines WHERE state = 'running' AND holder LIKE %s",
                        (f"%-{b.proc.pid}-%",))}
                before = dict(sim.arrived)
                assert b_running  # the dead replica's lines wait for their leases to end
                async with asyncio.timeout(90):
                    final = await until_status(ca, batch.id, "completed", "failed", "expired", step_s=0.2)
                assert final.status == "completed" and final.request_counts is not None
                assert final.request_counts.completed == N
                out = await lines_of(ca, final.output_file_id) + await lines_of(ca, final.error_file_id)
        assert sorted(o["custom_id"] for o in out) == [f"line-{i:05d}" for i in range(N)]
        after = sim.arrived
        assert all(after[cid] == before.get(cid, 0) for cid in done)
        assert all(after[cid] - before.get(cid, 0) <= 1 for cid in b_running)
