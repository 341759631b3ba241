"""The real engines on their own, through the `openai` package: the behaviour the gateway must relay.

These pin down what tailguard's relay and metering depend on, per engine: exact lengths from the
never-ending tiny models, where usage arrives in a stream, the role-only first chunk, the context
error, and the load signals (`/metrics`, `/slots`).
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from tailguard.wire.sse import SSEDecoder
from tests.real.processes import EngineProcess, http_text

pytestmark = pytest.mark.real

STEP_S = 60.0  # bound on every await against an engine


def client(proc: EngineProcess) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=proc.base_url + "/v1", api_key="unused", max_retries=0, timeout=STEP_S)


def assert_chunking(engine: EngineProcess, content_chunks: int, tokens: int) -> None:
    """llama.cpp sends one chunk per token (the models emit only whole ASCII pieces); vLLM coalesces
    several tokens into one chunk when its output loop runs behind, so only `usage` counts tokens there."""
    if engine.kind == "llamacpp":
        assert content_chunks == tokens
    else:
        assert 1 <= content_chunks <= tokens


async def chat_stream(proc: EngineProcess, max_tokens: int, **extra: object) -> list[dict[str, object]]:
    async with client(proc) as c, asyncio.timeout(STEP_S):
        stream = await c.chat.completions.create(  # type: ignore[call-overload]
            model=proc.model, messages=[{"role": "user", "content": "tell me about the queue"}],
            max_tokens=max_tokens, stream=True, stream_options={"include_usage": True}, **extra,
        )
        return [chunk.model_dump() async for chunk in stream]


@pytest.mark.parametrize("max_tokens", [1, 37])
async def test_chat_stream_is_exactly_max_tokens_with_usage_last(engine: EngineProcess, max_tokens: int) -> None:
    chunks = await chat_stream(engine, max_tokens)
    first = chunks[0]["choices"][0]  # type: ignore[index]
    assert first["delta"]["role"] == "assistant" and not first["delta"]["content"]
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"]["content"]]  # type: ignore[index]
    assert_chunking(engine, len(content), max_tokens)
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]  # type: ignore[index]
    assert finish[-1] == "length" and set(finish[:-1]) == {None}
    usage_chunks = [c for c in chunks if c["usage"]]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and chunks[-1]["choices"] == []
    assert usage_chunks[0]["usage"]["completion_tokens"] == max_tokens  # type: ignore[index]


async def raw_chat_events(proc: EngineProcess, max_tokens: int) -> list[bytes]:
    """The stream's `data:` payloads byte for byte (the openai package hides null versus absent)."""
    body = {"model": proc.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    decoder = SSEDecoder()
    events: list[bytes] = []
    async with aiohttp.ClientSession() as s, asyncio.timeout(STEP_S):
        async with s.post(proc.base_url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            async for data in r.content.iter_any():
                events += [e.data for e in decoder.feed(data)]
    return events + [e.data for e in decoder.flush()]


async def test_llamacpp_stream_quirks(llama_server: EngineProcess) -> None:
    events = await raw_chat_events(llama_server, 3)
    assert events[-1] == b"[DONE]"
    first, *middle, usage = [json.loads(e) for e in events[:-1]]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}  # role-only, content null
    assert [m["choices"][0]["finish_reason"] for m in middle] == [None, None, None, "length"]
    assert middle[-1]["choices"][0]["delta"] == {}  # the finish chunk carries no content
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3  # usage: its own last chunk
    assert "timings" in usage  # llama.cpp's own prompt/decode timings ride along


@pytest.mark.parametrize("max_tokens", [5, 64])
async def test_chat_non_stream_sampled_is_exact(engine: EngineProcess, max_tokens: int) -> None:
    async with client(engine) as c, asyncio.timeout(STEP_S):
        r = await c.chat.completions.create(
            model=engine.model, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens, temperature=1.0,
        )
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == max_tokens
    assert r.choices[0].message.content


async def test_completions_stream_usage(engine: EngineProcess) -> None:
    async with client(engine) as c, asyncio.timeout(STEP_S):
        stream = await c.completions.create(
            model=engine.model, prompt="the batch slot", max_tokens=9, stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    usage = [ch.usage for ch in chunks if ch.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 9
    texts = [ch.choices[0].text for ch in chunks if ch.choices and ch.choices[0].text]
    assert_chunking(engine, len(texts), 9)
    if engine.kind == "llamacpp":
        assert chunks[-1].choices and chunks[-1].choices[0].finish_reason == "length"  # usage rides on it
    else:
        assert chunks[-1].choices == []  # vLLM: a usage-only chunk of its own


async def test_greedy_is_deterministic(engine: EngineProcess) -> None:
    async with client(engine) as c, asyncio.timeout(STEP_S):
        a, b = [
            await c.completions.create(model=engine.model, prompt="slow queue", max_tokens=16, temperature=0.0)
            for _ in range(2)
        ]
    assert a.choices[0].text == b.choices[0].text


async def test_context_too_long_is_a_400_with_the_engines_body(engine: EngineProcess) -> None:
    prompt = "the " * 20000  # over the 2048-token context of a llama slot and the 16384 of vLLM's max-model-len
    async with client(engine) as c, asyncio.timeout(STEP_S):
        with pytest.raises(openai.BadRequestError) as e:
            await c.completions.create(model=engine.model, prompt=prompt, max_tokens=4)
    assert e.value.status_code == 400
    body = e.value.body
    assert isinstance(body, dict) and "context" in str(body.get("message", "")).lower()
    if engine.kind == "llamacpp":
        assert body["type"] == "exceed_context_size_error"


async def test_llamacpp_load_signals(llama_server: EngineProcess) -> None:
    metrics = await asyncio.to_thread(http_text, llama_server.base_url + "/metrics")
    for name in ("llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:n_busy_slots_per_decode"):
        assert f"\n{name} " in metrics
    slots = await asyncio.to_thread(http_text, llama_server.base_url + "/slots")
    assert slots.count('"is_processing"') == 4


async def test_vllm_load_signals_and_priority_field(vllm_server: EngineProcess) -> None:
    async with client(vllm_server) as c, asyncio.timeout(STEP_S):
        r = await c.completions.create(model=vllm_server.model, prompt="x", max_tokens=2,
                                       extra_body={"priority": 3})
    assert r.usage is not None and r.usage.completion_tokens == 2
    metrics = await asyncio.to_thread(http_text, vllm_server.base_url + "/metrics")
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert f"\n{name}{{" in metrics
