"""A batch survives SIGKILL of its gateway: after a restart it completes, every custom_id is in
exactly one of the output and error files, no line the journal had recorded done reaches the
simulator again, and a line that was running reaches it at most once more (counted at the
simulator, by the custom_id in each arriving prompt)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from openai import AsyncOpenAI

from tests.functional.batch_calls import (
    counting_sim, gateway_config, gateway_process, input_file, lines_of, submit, until_completed, until_status,
)

N = 1000


def client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=2)


def journal_states(path: Path) -> dict[str, str]:
    with sqlite3.connect(path) as db:
        return dict(db.execute("SELECT custom_id, state FROM lines").fetchall())


async def test_sigkill_halfway_then_restart_completes_without_replaying_done_lines(tmp_path: Path) -> None:
    async with counting_sim() as sim:
        config = gateway_config(tmp_path / "tailguard.yaml", sim.url, {"dir": str(tmp_path / "batches")})
        journal = tmp_path / "batches" / "journal.sqlite3"
        async with gateway_process(config) as gw, client(gw.url) as c:
            batch = await submit(c, input_file(N))
            async with asyncio.timeout(60):
                await until_completed(c, batch.id, N // 2)
                while "running" not in journal_states(journal).values():  # kill it with lines on the engine
                    await asyncio.sleep(0.005)
            gw.kill()
            await gw.proc.wait()
        await asyncio.sleep(0.3)  # what the dead gateway had sent has arrived
        before = dict(sim.arrived)
        states = journal_states(journal)
        done = {cid for cid, s in states.items() if s in ("done", "failed")}
        running = {cid for cid, s in states.items() if s == "running"}
        assert N // 2 <= len(done) < N and running, (len(done), len(running))

        async with gateway_process(config) as gw, client(gw.url) as c:
            async with asyncio.timeout(90):
                final = await until_status(c, batch.id, "completed", "failed", "expired", step_s=0.2)
            assert final.status == "completed" and final.request_counts is not None
            assert final.request_counts.completed == N
            out = await lines_of(c, final.output_file_id) + await lines_of(c, final.error_file_id)
        ids = sorted(o["custom_id"] for o in out)
        assert ids == [f"line-{i:05d}" for i in range(N)]  # every custom_id exactly once
        after = sim.arrived
        assert all(after[cid] == before.get(cid, 0) for cid in done)  # no done line sent again
        assert all(after[cid] - before.get(cid, 0) <= 1 for cid in running)  # a running one once more at most
        assert all(after[cid] >= 1 for cid in ids)
