"""`classes[batch].start_interval_s` through the real gateway and simulator: the batch's lines
start one per interval however many slots are free (so their prefills do not land in one engine
step together), the class still fills every slot, chats are not paced, and the batch completes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tailguard.config.classes import default_classes
from tests.functional.batch_calls import MODEL, input_file, lines_of, submit, until_status
from tests.functional.gateways import engine, gateway, sample, scrape

INTERVAL_S = 0.1


async def test_lines_start_one_per_interval_yet_fill_every_slot(tmp_path: Path) -> None:
    paced = [c.model_dump() | ({"start_interval_s": INTERVAL_S} if c.name == "batch" else {}) for c in default_classes()]
    async with gateway(max_concurrency=16, engine_cfg=engine(max_num_seqs=16), scale=0.25, classes=paced,
                       batches={"dir": str(tmp_path), "poll_s": 0.1, "ahead": 2}) as gw, gw.client() as client:
        t0 = time.monotonic()  # before the first line can start: elapsed below is an upper bound
        # Lines of 1,000 tokens (about 1.6 s each at this scale): none ends while the slots fill.
        batch = await submit(client, input_file(40, max_tokens=1000))
        seen: list[tuple[float, float, float]] = []  # (elapsed at most, lines in flight, lines queued)
        async with asyncio.timeout(30):
            while not seen or seen[-1][1] < 16:
                m = await scrape(gw.url)
                seen.append((time.monotonic() - t0, sample(m, "tailguard_inflight", backend="sim0"),
                             sample(m, "tailguard_queue_length", **{"class": "batch"})))
                await asyncio.sleep(0.01)
        # Never more started than one per interval since the submission (load only delays starts)...
        assert all(n <= 1 + elapsed / INTERVAL_S for elapsed, n, _ in seen), seen
        # ... while lines waited with slots free: the pace held them, not the slots.
        assert any(n < 16 and q > 0 for _, n, q in seen), seen
        chat = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert chat.headers["X-Tailguard-Class"] == "interactive"
        assert float(chat.headers["X-Tailguard-Queue-Ms"]) < 500  # it preempted a line: no pace for chats
        async with asyncio.timeout(60):
            done = await until_status(client, batch.id, "completed", "failed")
        out = await lines_of(client, done.output_file_id)
        assert len(out) == 40 and all(o["response"]["status_code"] == 200 for o in out)
