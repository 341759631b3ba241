"""The gateway's preemption (suspend a running batch request for an interactive one, then continue
it from its text) against real engines: the engine must really continue, and the client must get
exactly what it asked for in total."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from tests.real.processes import EngineProcess
from tests.real.test_gateway_real import STEP_S, config, engine_metric, gateway, metric

pytestmark = pytest.mark.real

BATCH_TOKENS = 1500  # long enough that the chat always arrives while it runs, on a fast or a slow machine
CHAT_TOKENS = 10
# The chat is sent once the batch client holds this many pieces of text. A continuation that asked the
# engine for all BATCH_TOKENS again (instead of only the missing ones) would make the engine generate
# at least this many tokens more than both requests asked for; an engine that only finishes a few
# tokens after the abort (llama-server: up to 17 seen on a quiet machine, 64 on a loaded CI machine)
# stays well below it.
SENT_BEFORE_CHAT = 300
GENERATED = {"llamacpp": "llamacpp:tokens_predicted_total", "vllm": "vllm:generation_tokens_total"}


async def preempted_run(engine: EngineProcess, endpoint: str) -> tuple[int, str, float, float]:
    """A batch stream on a gateway with one slot, and a chat sent once it is under way. Returns the
    batch client's usage.completion_tokens, its text, the gateway's preemption count and the tokens
    the engine generated in all."""
    before = await engine_metric(engine, GENERATED[engine.kind])
    async with gateway(config((engine, 1))) as url, \
            AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=STEP_S) as c, \
            asyncio.timeout(STEP_S * 2):
        batch_headers = {"X-Tailguard-Class": "batch"}
        common: dict[str, Any] = {"model": engine.model, "max_tokens": BATCH_TOKENS, "stream": True,
                                  "stream_options": {"include_usage": True}, "extra_headers": batch_headers}
        if endpoint == "chat":
            stream: Any = await c.chat.completions.create(messages=[{"role": "user", "content": "write"}], **common)
        else:
            stream = await c.completions.create(prompt="write about the queue", **common)
        parts: list[str] = []
        usage = None
        chat: asyncio.Task[Any] | None = None
        async for ch in stream:
            if ch.choices:
                piece = ch.choices[0].delta.content if endpoint == "chat" else ch.choices[0].text
                if piece:
                    parts.append(piece)
            if ch.usage is not None:
                usage = ch.usage
            if chat is None and len(parts) >= SENT_BEFORE_CHAT:
                chat = asyncio.create_task(c.chat.completions.create(
                    model=engine.model, messages=[{"role": "user", "content": "hi"}], max_tokens=CHAT_TOKENS,
                    extra_headers={"X-Tailguard-Class": "interactive"}))
        assert chat is not None
        answer = await chat
        async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
            preemptions = metric(await r.text(), "tailguard_preemptions_total")
    assert answer.usage is not None and answer.usage.completion_tokens == CHAT_TOKENS
    assert usage is not None
    generated = await engine_metric(engine, GENERATED[engine.kind]) - before
    return usage.completion_tokens, "".join(parts), preemptions, generated


@pytest.fixture(params=["llamacpp", "vllm"])
def one_slot_engine(request: pytest.FixtureRequest) -> EngineProcess:
    """llama-server with one slot of the slow model, or the session's vLLM (the gateway caps it at 1)."""
    if request.param == "vllm":
        proc: EngineProcess = request.getfixturevalue("vllm_server")
        return proc
    start: Callable[..., EngineProcess] = request.getfixturevalue("start_llama")
    return start("llama-preempt", slots=1, slow=True)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_preempted_request_continues_to_exactly_max_tokens(one_slot_engine: EngineProcess, endpoint: str) -> None:
    if one_slot_engine.kind == "vllm":
        # Not reliably observable here: on a busy CPU vLLM's API server delivers a stream in bursts
        # (measured with two CPU hogs: first chunk after 2-15 s, then up to 2,800 one-token chunks at
        # once after a 15 s gap), so the batch stream is often over by the time the chat is sent and
        # there is nothing left to suspend: the gateway rightly preempts nothing.
        pytest.skip("preemption against vLLM CPU is not yet reliably observed by this test")
    completion_tokens, text, preemptions, generated = await preempted_run(one_slot_engine, endpoint)
    assert preemptions == 1  # the chat found the only slot taken and suspended the batch request
    assert text
    assert completion_tokens == BATCH_TOKENS  # what the batch client asked for, in total
    # The engine made every token both clients got, and less than a continuation asking for all of
    # BATCH_TOKENS again would have made: it continued with exactly the tokens still missing.
    wasted = generated - (BATCH_TOKENS + CHAT_TOKENS)
    assert 0 <= wasted < SENT_BEFORE_CHAT
