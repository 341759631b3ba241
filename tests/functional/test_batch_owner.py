"""A batch's lines obey the rules of the key that made it, as that key's own requests do, on a
real gateway in front of a real simulator, driven by the unmodified openai SDK: its rate limits
count them and pace them (a line refused by them waits; it is not failed), its allowed models
and classes fail the lines that break them (in the error file, the rest run), and its
`batch_enqueued_tokens_limit` fails a batch that would hold more tokens than it allows, with the
tokens of a batch that ended given back. A key removed from the config fails what is left of its
batch."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from openai import AsyncOpenAI

from tailguard.batch.sqlite import SqliteJournal
from tests.functional.batch_calls import MODEL, input_file, lines_of, submit, until_status
from tests.functional.gateways import engine, gateway, sample, scrape

KEYS: dict[str, dict[str, Any]] = {
    "k": {"name": "alice"},
    "slow": {"name": "slow", "rpm_limit": 2},  # a request per 30 s once the two are used
    "paced": {"name": "paced", "rpm_limit": 120},  # two a second
    "tokens": {"name": "tokens", "tpm_limit": 3000},  # 50 tokens a second
    "narrow": {"name": "narrow", "allowed_models": ["other-model"]},
    "classy": {"name": "classy", "allowed_classes": ["interactive"]},
    # One request a minute keeps its second line waiting, so its batch stays in progress.
    "quota": {"name": "quota", "batch_enqueued_tokens_limit": 1000, "rpm_limit": 1},
    "gone": {"name": "gone"},  # removed from the config halfway through its batch
}


def owner_gateway(tmp_path: Path) -> Any:
    # One attempt per line: a refusal by the key's limits counted as an attempt would fail the line.
    batches = {"dir": str(tmp_path), "poll_s": 0.2, "line_attempts": 1}
    # `other-model`: a name the simulator serves too (an alias), which only the narrow key may use.
    return gateway(max_concurrency=16, engine_cfg=engine(max_num_seqs=16), auth={"api_keys": KEYS}, batches=batches,
                   aliases={"other-model": MODEL})


def client(url: str, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


async def ran(c: AsyncOpenAI, data: bytes) -> Any:
    batch = await submit(c, data)
    async with asyncio.timeout(60):
        return await until_status(c, batch.id, "completed", "failed", "expired")


async def chat(c: AsyncOpenAI, max_tokens: int = 8) -> Any:
    return await c.chat.completions.create(model=MODEL, max_tokens=max_tokens,
                                           messages=[{"role": "user", "content": "hi"}])


async def test_lines_count_against_their_keys_rate_limits_and_wait_for_them(tmp_path: Path) -> None:
    async with owner_gateway(tmp_path) as gw, client(gw.url, "slow") as slow, client(gw.url, "paced") as paced, \
            client(gw.url, "tokens") as tokens, client(gw.url, "k") as alice:
        done = await ran(slow, input_file(2))
        assert done.status == "completed" and done.request_counts.completed == 2, done
        with pytest.raises(openai.RateLimitError, match="requests per min"):
            await chat(slow)  # the batch used the key's two requests
        assert (await chat(alice)).choices  # another caller's are its own

        # A line of 2,000 tokens leaves ~1,000 of the key's 3,000 per minute: a direct request
        # reserving 2,500 must wait (50 tokens a second come back).
        done = await ran(tokens, input_file(1, max_tokens=2000))
        assert done.status == "completed", done
        with pytest.raises(openai.RateLimitError, match="tokens per min"):
            await chat(tokens, max_tokens=2500)

        # 125 lines at 120 a minute: the bucket's 120 go at once, the rest wait for it to refill
        # and run; none fails, though a line has only one attempt.
        done = await ran(paced, input_file(125))
        assert done.status == "completed", done
        assert done.request_counts.completed == 125 and done.request_counts.failed == 0
        metrics = await scrape(gw.url)
        assert sample(metrics, "tailguard_rejected_total", **{"class": "batch", "reason": "rate_limit_requests"}) >= 1


async def test_a_line_its_key_may_not_run_fails_alone_in_the_error_file(tmp_path: Path) -> None:
    lines = input_file(3).splitlines()
    other = orjson.loads(lines[1])
    other["body"]["model"] = "other-model"
    lines[1] = orjson.dumps(other)
    async with owner_gateway(tmp_path) as gw, client(gw.url, "narrow") as narrow, \
            client(gw.url, "classy") as classy:
        done = await ran(narrow, b"\n".join(lines) + b"\n")
        assert done.status == "completed" and done.request_counts.failed == 2, done
        errors = await lines_of(narrow, done.error_file_id)
        assert sorted(e["custom_id"] for e in errors) == ["line-00000", "line-00002"]
        assert {e["response"]["status_code"] for e in errors} == {403}
        assert {e["response"]["body"]["error"]["code"] for e in errors} == {"model_not_allowed"}
        # The other-model line passed the key's rule and reached the simulator (the alias's model).
        assert [o["custom_id"] for o in await lines_of(narrow, done.output_file_id)] == ["line-00001"]

        done = await ran(classy, input_file(2))  # batch lines run in class batch, which the key may not use
        assert done.status == "completed" and done.request_counts.failed == 2, done
        errors = await lines_of(classy, done.error_file_id)
        assert {e["response"]["body"]["error"]["code"] for e in errors} == {"class_not_allowed"}
        assert (await chat(classy)).choices  # the gateway goes on serving the key's own requests


async def test_enqueued_tokens_are_limited_per_key_and_given_back_when_a_batch_ends(tmp_path: Path) -> None:
    async with owner_gateway(tmp_path) as gw, client(gw.url, "quota") as quota:
        too_big = await ran(quota, input_file(4, max_tokens=300))  # ~4 x 310 tokens: over 1,000
        assert too_big.status == "failed" and too_big.errors is not None, too_big
        assert [e.code for e in too_big.errors.data] == ["token_limit_exceeded"]
        assert "Limit: 1,000 enqueued tokens" in (too_big.errors.data[0].message or "")

        long = await submit(quota, input_file(2, max_tokens=300))  # ~2 x 310: holds ~620 while it runs
        async with asyncio.timeout(30):
            await until_status(quota, long.id, "in_progress")
        second = await ran(quota, input_file(1, max_tokens=600))  # ~620 + ~610 > 1,000
        assert second.status == "failed" and second.errors is not None
        assert second.errors.data[0].code == "token_limit_exceeded"
        await quota.batches.cancel(long.id)
        async with asyncio.timeout(30):
            await until_status(quota, long.id, "cancelled")
        again = await submit(quota, input_file(1, max_tokens=600))  # the ended batch holds nothing
        async with asyncio.timeout(30):
            started = await until_status(quota, again.id, "in_progress", "failed")
        assert started.status == "in_progress", started
        await quota.batches.cancel(again.id)


async def test_a_batch_whose_key_was_removed_fails_its_remaining_lines(tmp_path: Path) -> None:
    async with owner_gateway(tmp_path) as gw, client(gw.url, "gone") as gone:
        batch = await submit(gone, input_file(2000))  # far more than run before the gateway stops
        async with asyncio.timeout(30):
            while (b := await gone.batches.retrieve(batch.id)).request_counts is None \
                    or b.request_counts.completed < 1:
                await asyncio.sleep(0.02)
    kept = {k: v for k, v in KEYS.items() if k != "gone"}
    async with gateway(max_concurrency=16, engine_cfg=engine(max_num_seqs=16), auth={"api_keys": kept},
                       batches={"dir": str(tmp_path), "poll_s": 0.2, "line_attempts": 1}):
        journal = SqliteJournal(tmp_path / "journal.sqlite3")
        await journal.open()
        try:
            async with asyncio.timeout(30):
                while (rec := await journal.get_batch(batch.id)) is None or rec.status != "completed":
                    await asyncio.sleep(0.05)
            failed = [orjson.loads(r) for ok, r in await journal.results(batch.id) if not ok]
        finally:
            await journal.close()
    assert rec.completed >= 1 and rec.failed >= 1 and rec.completed + rec.failed == 2000, rec
    assert {f["response"]["body"]["error"]["code"] for f in failed} == {"invalid_api_key"}
