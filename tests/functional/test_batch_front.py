"""Batch lines go through the gateway's own front as the batch class: how many run follows the
free slots (the class's queue is kept at `ahead` lines, every slot fills), and a chat that
arrives while the batch fills every slot preempts a line instead of waiting; the preempted line
resumes and the batch still completes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.functional.batch_calls import MODEL, input_file, lines_of, submit, until_status
from tests.functional.gateways import engine, gateway, sample, scrape


async def test_lines_fill_free_slots_keep_the_queue_short_and_yield_to_a_chat(tmp_path: Path) -> None:
    # Short lines on a slower clock: many end between two looks at the front, which is where a runner
    # adding a fixed number of lines per look falls behind the free slots.
    async with gateway(max_concurrency=16, engine_cfg=engine(max_num_seqs=16), scale=0.25,
                       batches={"dir": str(tmp_path), "poll_s": 0.2, "ahead": 2}) as gw, gw.client() as client:
        batch = await submit(client, input_file(400, max_tokens=64))
        queued: list[float] = []
        in_flight: list[float] = []
        async with asyncio.timeout(30):
            while not in_flight or in_flight[-1] < 16:  # the batch has filled the engine once
                in_flight.append(sample(await scrape(gw.url), "tailguard_inflight", backend="sim0"))
            in_flight.clear()
            while len(in_flight) < 30:
                m = await scrape(gw.url)
                queued.append(sample(m, "tailguard_queue_length", **{"class": "batch"}))
                in_flight.append(sample(m, "tailguard_inflight", backend="sim0"))
                await asyncio.sleep(0.02)
        assert max(queued) <= 2, queued  # never more than `ahead` lines wait in the front
        assert sum(in_flight) / len(in_flight) >= 13, in_flight  # and the free slots stay taken
        # Eight chats at once: a slot a line just left may take one or two of them (13 of 16 are taken on
        # average, asserted above), never all (a lone chat found a free slot on CI and preempted nothing).
        # Each preempts a line rather than wait for one.
        raws = await asyncio.gather(*(client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4) for _ in range(8)))
        assert max(float(r.headers["X-Tailguard-Queue-Ms"]) for r in raws) < 500, [r.headers for r in raws]
        assert {r.headers["X-Tailguard-Class"] for r in raws} == {"interactive"}
        async with asyncio.timeout(60):
            done = await until_status(client, batch.id, "completed", "failed")
        out = await lines_of(client, done.output_file_id)
        assert len(out) == 400 and all(o["response"]["status_code"] == 200 for o in out)
        preempted = sum(v for (name, _), v in (await scrape(gw.url)).items() if name == "tailguard_preemptions_total")
        assert preempted >= 1  # the gateway suspended lines for the chats
