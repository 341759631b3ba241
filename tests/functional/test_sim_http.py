"""The simulator over real HTTP on 127.0.0.1, driven by the real `openai` package."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import aiohttp
import openai
import orjson
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from tailguard.sim.cost import EngineConfig
from tailguard.sim.server import RunningSim, running_sim, start_sim
from tailguard.wire.sse import SSEDecoder

SCALE = 0.02  # 50x faster than real time


def cfg(**kw: Any) -> EngineConfig:
    return EngineConfig.from_preset("h100-llama8b", **kw)


@pytest.fixture
async def sim() -> AsyncIterator[RunningSim]:
    async with running_sim(cfg(max_num_seqs=4, max_model_len=4096, kv_cache_tokens=65536), time_scale=SCALE) as s:
        yield s


def client(sim: RunningSim, **kw: Any) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0, **kw)


async def scrape(sim: RunningSim) -> dict[str, float]:
    """Samples by name (labels dropped; the simulator has one model)."""
    async with aiohttp.ClientSession() as s, s.get(f"{sim.url}/metrics") as r:
        assert r.status == 200
        text = await r.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name.endswith("_bucket"):
                continue
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


async def wait_metric(sim: RunningSim, name: str, value: float) -> None:
    while (await scrape(sim))[name] != value:
        await asyncio.sleep(0.01)


async def test_chat_non_stream_has_exact_tokens_and_usage(sim: RunningSim) -> None:
    async with asyncio.timeout(10), client(sim) as c:
        r = await c.chat.completions.create(
            model="anything", messages=[{"role": "user", "content": "x" * 400}], max_tokens=7)
    assert r.object == "chat.completion" and r.model == "tailguard-sim"
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == " tok" * 7
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (104, 7, 111)


async def test_chat_stream_role_first_one_token_per_chunk_then_usage(sim: RunningSim) -> None:
    async with asyncio.timeout(10), client(sim) as c:
        stream = await c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=5, stream=True,
            stream_options={"include_usage": True})
        chunks = [ch async for ch in stream]
    assert chunks[0].choices[0].delta.role == "assistant" and not chunks[0].choices[0].delta.content
    content = chunks[1:-1]
    assert [ch.choices[0].delta.content for ch in content] == [" tok"] * 5
    assert [ch.choices[0].finish_reason for ch in content] == [None] * 4 + ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].usage.prompt_tokens == 6
    assert all(ch.usage is None for ch in chunks[:-1])


async def test_raw_stream_ends_with_done_and_has_no_usage_unless_asked(sim: RunningSim) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    async with asyncio.timeout(10), aiohttp.ClientSession() as s:
        async with s.post(f"{sim.url}/v1/chat/completions", json=body) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            dec = SSEDecoder()
            events = []
            async for data in r.content.iter_any():
                events += dec.feed(data)
            events += dec.flush()
    assert events[-1].data == b"[DONE]"
    payloads = [orjson.loads(e.data) for e in events[:-1]]
    assert len(payloads) == 4  # role + 3 tokens
    assert all("usage" not in p for p in payloads)


async def test_completions_stream_and_non_stream(sim: RunningSim) -> None:
    async with asyncio.timeout(10), client(sim) as c:
        r = await c.completions.create(model="m", prompt="abcdefgh", max_tokens=4)
        assert r.choices[0].text == " tok" * 4 and r.choices[0].finish_reason == "length"
        assert r.usage is not None and r.usage.prompt_tokens == 2 and r.usage.completion_tokens == 4
        stream = await c.completions.create(model="m", prompt=[1, 2, 3, 4, 5], max_tokens=3, stream=True,
                                            stream_options={"include_usage": True})
        chunks = [ch async for ch in stream]
    assert [ch.choices[0].text for ch in chunks[:-1]] == [" tok"] * 3
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 5


async def test_missing_max_tokens_runs_to_max_model_len() -> None:
    async with running_sim(cfg(max_model_len=64, kv_cache_tokens=1024), time_scale=SCALE) as s:
        async with asyncio.timeout(10), client(s) as c:
            r = await c.completions.create(model="m", prompt="a" * 40)
    assert r.usage is not None and r.usage.completion_tokens == 64 - 10


async def test_models_and_health(sim: RunningSim) -> None:
    async with asyncio.timeout(10):
        async with client(sim) as c:
            models = await c.models.list()
        async with aiohttp.ClientSession() as s, s.get(f"{sim.url}/health") as r:
            assert r.status == 200
    assert [m.id for m in models.data] == ["tailguard-sim"]


async def test_metrics_are_present_and_move(sim: RunningSim) -> None:
    async with asyncio.timeout(10):
        before = await scrape(sim)
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                     "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                     "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                     "vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds_count"):
            assert name in before, name
        async with client(sim) as c:
            await asyncio.gather(*(c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "y" * 80}], max_tokens=10) for _ in range(6)))
        after = await scrape(sim)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 60
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 6 * 24
    assert after["vllm:time_to_first_token_seconds_count"] - before["vllm:time_to_first_token_seconds_count"] == 6
    assert after["vllm:e2e_request_latency_seconds_count"] - before["vllm:e2e_request_latency_seconds_count"] == 6
    assert after["vllm:inter_token_latency_seconds_count"] - before["vllm:inter_token_latency_seconds_count"] == 54
    assert after["vllm:request_queue_time_seconds_count"] == 6
    assert after["vllm:request_queue_time_seconds_sum"] > 0  # 6 requests, 4 slots: two waited
    assert after["vllm:request_success_total"] == 6
    assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0


async def test_gauges_show_running_and_waiting_requests(sim: RunningSim) -> None:
    async with asyncio.timeout(10), client(sim) as c:
        tasks = [asyncio.ensure_future(c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "z"}], max_tokens=3000)) for _ in range(6)]
        while (m := await scrape(sim))["vllm:num_requests_waiting"] != 2:
            await asyncio.sleep(0.01)
        assert m["vllm:num_requests_running"] == 4 and m["vllm:kv_cache_usage_perc"] > 0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await wait_metric(sim, "vllm:num_requests_running", 0)
        await wait_metric(sim, "vllm:num_requests_waiting", 0)
    assert (await scrape(sim))["vllm:kv_cache_usage_perc"] == 0


async def test_stream_disconnect_frees_the_slot_at_once() -> None:
    async with running_sim(cfg(max_num_seqs=1), time_scale=SCALE) as s:
        async with asyncio.timeout(10), client(s) as c:
            stream = await c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "long"}], max_tokens=8000, stream=True)
            seen = 0
            async for _ in stream:
                seen += 1
                if seen == 3:
                    break
            assert (await scrape(s))["vllm:num_requests_running"] == 1
            await stream.close()
            await wait_metric(s, "vllm:num_requests_running", 0)
            # The freed slot serves the next request straight away.
            r = await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            assert r.usage is not None and r.usage.completion_tokens == 2
        m = await scrape(s)
    assert m["vllm:kv_cache_usage_perc"] == 0


async def test_queued_client_that_gives_up_leaves_the_queue() -> None:
    async with running_sim(cfg(max_num_seqs=1), time_scale=SCALE) as s:
        async with asyncio.timeout(10), client(s) as c:
            busy = asyncio.ensure_future(c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "busy"}], max_tokens=8000))
            await wait_metric(s, "vllm:num_requests_running", 1)
            with pytest.raises(openai.APITimeoutError):
                await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}],
                                                max_tokens=5, timeout=0.3)
            await wait_metric(s, "vllm:num_requests_waiting", 0)
            busy.cancel()
            await asyncio.gather(busy, return_exceptions=True)
            await wait_metric(s, "vllm:num_requests_running", 0)


async def test_priority_policy_serves_lower_priority_value_first() -> None:
    async with running_sim(cfg(max_num_seqs=1, scheduling_policy="priority"), time_scale=SCALE) as s:
        async with asyncio.timeout(10), client(s) as c:
            first = asyncio.ensure_future(c.completions.create(model="m", prompt="x", max_tokens=8000))
            await wait_metric(s, "vllm:num_requests_running", 1)
            done: list[str] = []

            async def one(name: str, prio: int) -> None:
                await c.completions.create(model="m", prompt="x", max_tokens=2, extra_body={"priority": prio})
                done.append(name)

            low = asyncio.ensure_future(one("low", 10))
            await wait_metric(s, "vllm:num_requests_waiting", 1)
            high = asyncio.ensure_future(one("high", -5))
            await wait_metric(s, "vllm:num_requests_waiting", 2)
            first.cancel()  # its slot frees: the waiting requests go by priority, not arrival
            await asyncio.gather(first, return_exceptions=True)
            await asyncio.gather(low, high)
    assert done == ["high", "low"]


async def test_prefix_caching_hits_over_http() -> None:
    async with running_sim(cfg(enable_prefix_caching=True), time_scale=SCALE) as s:
        system = "You are a careful assistant. " * 40
        async with asyncio.timeout(10), client(s) as c:
            for q in ("first question", "second question"):
                await c.chat.completions.create(
                    model="m", max_tokens=2,
                    messages=[{"role": "system", "content": system}, {"role": "user", "content": q}])
        m = await scrape(s)
    assert m["vllm:prefix_cache_hits_total"] >= 256
    assert m["vllm:prefix_cache_queries_total"] > m["vllm:prefix_cache_hits_total"]


async def _abort_after(c: AsyncOpenAI, tokens: int, **request: Any) -> str:
    """Stream a request, leave after `tokens` chunks of text (the engine aborts it); its text."""
    stream: Any = await (c.chat.completions if "messages" in request else c.completions).create(
        model="m", stream=True, **request)
    parts: list[str] = []
    async for ch in stream:
        piece = (ch.choices[0].delta.content if "messages" in request else ch.choices[0].text) if ch.choices else None
        if piece:
            parts.append(piece)
        if len(parts) == tokens:
            break
    await stream.close()
    return "".join(parts)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_a_continuation_finds_what_its_aborted_original_left_cached(endpoint: str) -> None:
    # What the gateway does to a suspended request: the engine aborts it, then gets the prompt
    # plus the text so far. With prefix caching, the blocks of prompt + output are found again.
    async with running_sim(cfg(enable_prefix_caching=True), time_scale=SCALE) as s:
        async with asyncio.timeout(10), client(s) as c:
            if endpoint == "completions":
                prompt = "x" * 400  # 100 tokens
                text = await _abort_after(c, 100, prompt=prompt, max_tokens=300)
                await wait_metric(s, "vllm:num_requests_running", 0)
                before = (await scrape(s))["vllm:prefix_cache_hits_total"]
                await c.completions.create(model="m", prompt=prompt + text, max_tokens=200)
                expected = (100 + 100 - 1) // 16 * 16  # all full blocks but the one with the last token
            else:
                messages: list[Any] = [{"role": "user", "content": "y" * 40}]
                text = await _abort_after(c, 100, messages=messages, max_tokens=300)
                await wait_metric(s, "vllm:num_requests_running", 0)
                before = (await scrape(s))["vllm:prefix_cache_hits_total"]
                await c.chat.completions.create(
                    model="m", max_tokens=200, messages=[*messages, {"role": "assistant", "content": text}],
                    extra_body={"continue_final_message": True, "add_generation_prompt": False})
                expected = 7 * 16  # the continuation's text holds 7 full blocks of 64 bytes
            hits = (await scrape(s))["vllm:prefix_cache_hits_total"] - before
    assert text == " tok" * 100
    assert hits == expected


BAD_BODIES: list[tuple[str, bytes, str | None]] = [
    ("chat", b"{not json", "invalid_json"),
    ("chat", b"[1, 2]", "invalid_json"),
    ("chat", b'{"model": "m"}', "missing_required_parameter"),
    ("chat", b'{"messages": "hello"}', "invalid_type"),
    ("chat", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', "invalid_value"),
    ("chat", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "invalid_value"),
    ("chat", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 99999999999}', "invalid_value"),
    ("chat", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}', "invalid_type"),
    ("chat", b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "invalid_type"),
    ("chat", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000}', "context_length_exceeded"),
    ("chat", b'{"messages": [{"role": "user", "content": "x"}], "priority": 3}', "invalid_value"),
    ("chat", b'{"messages": [{"role": "user", "content": "x"}], "n": 2}', "invalid_value"),
    ("chat", b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', "invalid_type"),
    ("chat", b'{"messages": [{"role": "user", "content": "x"}], "priority": "high"}', "invalid_type"),
    ("completions", b'{"model": "m"}', "missing_required_parameter"),
    ("completions", b'{"prompt": {"a": 1}}', "invalid_type"),
]


async def test_bad_requests_get_openai_style_400s_and_the_server_keeps_serving(sim: RunningSim) -> None:
    async with asyncio.timeout(10), aiohttp.ClientSession() as s:
        for endpoint, body, code in BAD_BODIES:
            path = "chat/completions" if endpoint == "chat" else "completions"
            async with s.post(f"{sim.url}/v1/{path}", data=body,
                              headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400, body
                err = (await r.json())["error"]
                assert set(err) == {"message", "type", "param", "code"}
                assert err["type"] == "invalid_request_error" and err["code"] == code, (body, err)
                assert err["message"]
        async with s.post(f"{sim.url}/v1/chat/completions",
                          json={"messages": [{"role": "user", "content": "still here?"}], "max_tokens": 2}) as r:
            assert r.status == 200
            assert (await r.json())["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("headers,code", [
    ({"Content-Type": "text/plain"}, "invalid_type"),
    ({"Content-Type": "application/json", "Content-Encoding": "gzip"}, "invalid_body"),
])
async def test_a_body_not_declared_or_not_decodable_as_json_is_a_400(
    sim: RunningSim, headers: dict[str, str], code: str,
) -> None:
    body = b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}'
    async with asyncio.timeout(10), aiohttp.ClientSession() as s:
        async with s.post(f"{sim.url}/v1/chat/completions", data=body, headers=headers) as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] == code
        async with s.post(f"{sim.url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200


async def test_context_length_over_http_through_openai(sim: RunningSim) -> None:
    async with asyncio.timeout(10), client(sim) as c:
        with pytest.raises(openai.BadRequestError) as e:
            await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 20_000}])
    assert "maximum context length is 4096" in str(e.value)


async def test_oversized_body_is_a_413_with_an_openai_body() -> None:
    async with running_sim(cfg(), time_scale=SCALE, max_body_bytes=10_000) as s:
        async with asyncio.timeout(10), aiohttp.ClientSession() as session:
            big = {"messages": [{"role": "user", "content": "x" * 20_000}], "max_tokens": 1}
            async with session.post(f"{s.url}/v1/chat/completions", json=big) as r:
                assert r.status == 413
                err = (await r.json())["error"]
                assert err["code"] == "payload_too_large" and "10000" in err["message"]
            async with session.post(f"{s.url}/v1/chat/completions",
                                    json={"messages": [{"role": "user", "content": "ok"}], "max_tokens": 1}) as r:
                assert r.status == 200


async def test_closing_the_server_ends_open_streams_promptly() -> None:
    s = await start_sim(cfg(max_num_seqs=2), time_scale=1.0)
    async with asyncio.timeout(10):
        async with aiohttp.ClientSession() as session:
            body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 8000, "stream": True}
            resp = await session.post(f"{s.url}/v1/chat/completions", json=body)
            await resp.content.readany()
            await s.close()
            rest = await resp.content.read()
            assert b"[DONE]" not in rest
            resp.release()


async def test_without_handler_cancellation_a_stream_is_aborted_at_its_next_write() -> None:
    from tailguard.sim.server import create_app
    from tests.servers import running

    app = create_app(cfg(max_num_seqs=1), time_scale=SCALE)
    async with running(app) as url, asyncio.timeout(10):
        sim = RunningSim(url, app, None)  # type: ignore[arg-type]
        async with AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
            stream = await c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], max_tokens=8000, stream=True)
            async for _ in stream:
                break
            await stream.close()
            await wait_metric(sim, "vllm:num_requests_running", 0)
