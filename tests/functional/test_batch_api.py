"""OpenAI's Files and Batches API on a real gateway in front of a real simulator, driven by the
unmodified openai SDK: a batch runs to `completed` with one output line per custom_id, a bad
line fails the batch naming it, cancel and expiry keep what finished, retry runs exactly the
failed lines, and another key sees nothing."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from openai import AsyncOpenAI

from tailguard.config import GatewayConfig
from tailguard.gateway.http.app import create_app, gateway_runner
from tailguard.sim.fault import Faults
from tests.functional.batch_calls import MODEL, counting_sim, input_file, lines_of, submit, until_status
from tests.functional.gateways import engine, gateway, sample, scrape
from tests.servers import running

KEYS = {"k": {"name": "alice"}, "other": {"name": "bob"}}


def batch_gateway(tmp_path: Path, **kw: Any) -> Any:
    batches = {"dir": str(tmp_path), "poll_s": 0.2, **kw.pop("batches", {})}
    return gateway(max_concurrency=kw.pop("max_concurrency", 32), engine_cfg=engine(max_num_seqs=64),
                   auth={"api_keys": KEYS}, batches=batches, **kw)


async def test_a_large_batch_completes_with_one_output_line_per_custom_id(tmp_path: Path) -> None:
    async with batch_gateway(tmp_path) as gw, gw.client() as client:
        batch = await submit(client, input_file(2000))
        assert batch.status == "validating" and batch.request_counts is not None
        async with asyncio.timeout(90):
            done = await until_status(client, batch.id, "completed", "failed", step_s=0.25)
        assert done.status == "completed", done
        assert done.request_counts is not None and done.request_counts.total == 2000
        assert done.request_counts.completed == 2000 and done.request_counts.failed == 0
        assert done.in_progress_at and done.finalizing_at and done.completed_at and done.error_file_id is None
        out = await lines_of(client, done.output_file_id)
        assert sorted(o["custom_id"] for o in out) == [f"line-{i:05d}" for i in range(2000)]
        first = out[0]
        assert first["response"]["status_code"] == 200 and first["error"] is None
        assert first["response"]["body"]["object"] == "chat.completion"
        assert first["response"]["body"]["model"] == MODEL
        metrics = await scrape(gw.url)
        assert sample(metrics, "tailguard_batch_tokens_total", kind="completion") == sum(
            o["response"]["body"]["usage"]["completion_tokens"] for o in out)
        assert sample(metrics, "tailguard_batch_line_attempts_total") >= 2000
        async with asyncio.timeout(5):  # the gauges are as of the runner's last poll
            while sample(await scrape(gw.url), "tailguard_batches", status="completed") != 1:
                await asyncio.sleep(0.05)
        listed = await client.batches.list(limit=1)
        assert [b.id for b in listed.data] == [batch.id]


async def test_files_api_upload_get_list_content_delete(tmp_path: Path) -> None:
    async with batch_gateway(tmp_path) as gw, gw.client() as client:
        data = input_file(3)
        f = await client.files.create(file=("mine.jsonl", io.BytesIO(data)), purpose="batch")
        assert f.bytes == len(data) and f.filename == "mine.jsonl" and f.purpose == "batch"
        assert (await client.files.retrieve(f.id)).id == f.id
        assert (await client.files.content(f.id)).content == data
        assert [x.id for x in (await client.files.list()).data] == [f.id]
        with pytest.raises(openai.BadRequestError, match="purpose"):
            await client.files.create(file=("x.jsonl", io.BytesIO(data)), purpose="fine-tune")
        assert (await client.files.delete(f.id)).deleted
        with pytest.raises(openai.NotFoundError):
            await client.files.retrieve(f.id)


async def test_upload_limits_are_refused(tmp_path: Path) -> None:
    async with batch_gateway(tmp_path, batches={"max_file_bytes": 4096, "max_lines": 5}) as gw, \
            gw.client() as client:
        with pytest.raises(openai.APIStatusError) as big:
            await client.files.create(file=("big.jsonl", io.BytesIO(b"x" * 5000)), purpose="batch")
        assert big.value.status_code == 413
        with pytest.raises(openai.BadRequestError, match="more than 5 lines"):
            await client.files.create(file=("long.jsonl", io.BytesIO(b"{}\n" * 6)), purpose="batch")
        assert (await client.files.list()).data == []
        assert not [p for p in (tmp_path / "files").iterdir()]


async def test_a_bad_line_fails_the_batch_naming_it(tmp_path: Path) -> None:
    lines = input_file(4).splitlines()
    lines[1] = lines[0]  # a duplicate custom_id on line 2
    lines[2] = lines[2].replace(b"/v1/chat/completions", b"/v1/completions")  # the wrong endpoint on line 3
    lines[3] = b"{not json"
    async with batch_gateway(tmp_path) as gw, gw.client() as client:
        batch = await submit(client, b"\n".join(lines))
        async with asyncio.timeout(20):
            failed = await until_status(client, batch.id, "failed", "completed")
        assert failed.status == "failed" and failed.failed_at
        assert failed.errors is not None and failed.errors.data is not None
        found = [(e.line, e.code) for e in failed.errors.data]
        assert found == [(2, "duplicate_custom_id"), (3, "mismatched_endpoint"), (4, "invalid_json")]
        assert failed.output_file_id is None


async def test_cancel_passes_through_cancelling_and_keeps_partial_output(tmp_path: Path) -> None:
    # Slow lines (many tokens, few slots): some finish, most are still to run when the cancel comes.
    async with batch_gateway(tmp_path, max_concurrency=4) as gw, gw.client() as client:
        batch = await submit(client, input_file(200, max_tokens=400))

        async def some_done() -> None:
            while True:
                b = await client.batches.retrieve(batch.id)
                if b.request_counts is not None and b.request_counts.completed >= 4:
                    return
                await asyncio.sleep(0.05)

        async with asyncio.timeout(30):
            await some_done()
            cancelling = await client.batches.cancel(batch.id)
            assert cancelling.status in ("cancelling", "cancelled")
            done = await until_status(client, batch.id, "cancelled")
        assert done.cancelling_at and done.cancelled_at
        out, err = await lines_of(client, done.output_file_id), await lines_of(client, done.error_file_id)
        assert len(out) >= 4 and len(out) + len(err) == 200
        assert {o["custom_id"] for o in out}.isdisjoint(e["custom_id"] for e in err)
        assert {e["error"]["code"] for e in err} == {"batch_cancelled"}


async def test_an_expired_window_keeps_finished_lines_and_retry_runs_exactly_the_rest(tmp_path: Path) -> None:
    async with batch_gateway(tmp_path, max_concurrency=4) as gw, gw.client() as client:
        batch = await submit(client, input_file(200, max_tokens=400), window="2s")
        async with asyncio.timeout(30):
            expired = await until_status(client, batch.id, "expired", "completed")
        assert expired.status == "expired" and expired.expired_at
        out, err = await lines_of(client, expired.output_file_id), await lines_of(client, expired.error_file_id)
        assert out and err and len(out) + len(err) == 200
        assert {e["error"]["code"] for e in err} == {"batch_expired"}
        again = await client.post(f"/batches/{batch.id}/retry", body={"completion_window": "1h"},
                                  cast_to=openai.types.Batch)
        assert again.metadata == {"retry_of": batch.id}
        assert (await client.batches.retrieve(batch.id)).metadata == {"retried_as": again.id}
        retried_input = (await client.files.content(again.input_file_id)).content.splitlines()
        assert sorted(orjson.loads(ln)["custom_id"] for ln in retried_input) == sorted(e["custom_id"] for e in err)
        async with asyncio.timeout(60):
            done = await until_status(client, again.id, "completed", "failed", "expired")
        assert done.status == "completed" and done.request_counts is not None
        assert done.request_counts.completed == len(err)


async def test_another_key_sees_nothing(tmp_path: Path) -> None:
    async with batch_gateway(tmp_path) as gw, gw.client() as client, \
            AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="other", max_retries=0) as stranger:
        batch = await submit(client, input_file(2))
        with pytest.raises(openai.NotFoundError):
            await stranger.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            await stranger.batches.cancel(batch.id)
        with pytest.raises(openai.NotFoundError):
            await stranger.files.content(batch.input_file_id)
        assert (await stranger.batches.list()).data == []
        with pytest.raises(openai.BadRequestError):  # its file is not the stranger's to run
            await stranger.batches.create(input_file_id=batch.input_file_id, endpoint="/v1/chat/completions",
                                          completion_window="24h")
        async with AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="nobody", max_retries=0) as nobody:
            with pytest.raises(openai.AuthenticationError):
                await nobody.batches.list()


async def test_transient_failures_are_retried_inside_the_batch_and_retry_takes_only_the_failed(tmp_path: Path) -> None:
    # Every other completion is a 500 and the gateway itself does not retry: the batch does, per line.
    async with counting_sim(faults=Faults(error_rate=0.5)) as sim:
        cfg = GatewayConfig.model_validate({
            "backends": [{"name": "sim", "url": sim.url, "kind": "sim", "max_concurrency": 16}],
            "retries": {"max_attempts": 1}, "ejection": {"enabled": False}, "auth": {"api_keys": KEYS},
            "batches": {"dir": str(tmp_path), "poll_s": 0.2, "line_attempts": 3, "retry_base_s": 0.05}})
        app = create_app(cfg)
        async with running(app, runner=gateway_runner(app)) as url, \
                AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client:
            batch = await submit(client, input_file(200))
            async with asyncio.timeout(60):
                done = await until_status(client, batch.id, "completed", "failed")
            assert done.status == "completed" and done.request_counts is not None
            out, err = await lines_of(client, done.output_file_id), await lines_of(client, done.error_file_id)
            assert len(out) + len(err) == 200 and len(out) >= 150  # one try each would leave about 100
            assert sum(sim.arrived.values()) > 200 and max(sim.arrived.values()) <= 3
            assert all(sim.arrived[e["custom_id"]] == 3 and e["response"]["status_code"] == 502 for e in err), \
                [(sim.arrived[e["custom_id"]], e["response"]) for e in err]
            if err:
                again = await client.post(f"/batches/{batch.id}/retry", cast_to=openai.types.Batch)
                retried = (await client.files.content(again.input_file_id)).content.splitlines()
                assert sorted(orjson.loads(ln)["custom_id"] for ln in retried) == sorted(e["custom_id"] for e in err)


async def test_lists_page_as_openai_does(tmp_path: Path) -> None:
    async with batch_gateway(tmp_path) as gw, gw.client() as client:
        made = [(await submit(client, input_file(1))).id for _ in range(3)]
        first = await client.batches.list(limit=2)
        assert len(first.data) == 2 and first.has_more
        rest = await client.batches.list(limit=2, after=first.data[-1].id)
        assert len(rest.data) == 1 and not rest.has_more
        assert sorted(b.id for b in [*first.data, *rest.data]) == sorted(made)
        assert sorted([b.id async for b in client.batches.list(limit=1)]) == sorted(made)  # the SDK's own paging
        files = await client.files.list(limit=2)
        assert len(files.data) == 2 and files.has_more
