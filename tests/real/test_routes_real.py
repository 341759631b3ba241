"""The Responses and Messages APIs through the gateway to the real engines, with the clients people
use: the openai SDK's `responses.create` and the anthropic SDK's `messages.create` and
`messages.stream`, streamed and not, each checked for its text, its usage, the class the gateway
gave it and what the gateway metered. Both engines serve both routes (vLLM 0.32 and llama-server
11434 register `/v1/responses` and `/v1/messages`; found by asking each, docs/routes.md); a route an
engine does not serve with the model it runs (rerank, on a generation model) gets that engine's
own refusal relayed. And vLLM started without priority scheduling (its default, FCFS) serves the
batch class, whose `priority` the gateway adds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import anthropic
import pytest
from openai import AsyncOpenAI

from tests.real.conftest import Engines, vllm_process
from tests.real.processes import EngineProcess
from tests.real.test_gateway_real import STEP_S, config, gateway, gateway_health, metric, wait_for

pytestmark = pytest.mark.real

BATCH = {"X-Tailguard-Class": "batch"}


def openai_client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=STEP_S)


def anthropic_client(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="unused", max_retries=0, timeout=STEP_S)


async def gateway_metrics(url: str, done: dict[str, int]) -> str:
    """The gateway's metrics page once it has metered `done` (class -> requests finished): a
    client may read a stream's last event before the gateway's handler has finished and counted it."""
    page = ""

    async def metered() -> bool:
        nonlocal page
        async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
            page = await r.text()
        ok = "\n".join(line for line in page.splitlines() if 'outcome="success"' in line)
        return all(sample(ok, "tailguard_requests_total", c) == n for c, n in done.items())

    await wait_for(metered, f"the gateway to meter {done}", timeout_s=STEP_S)
    return page


def sample(text: str, name: str, cls: str) -> float:
    return metric("\n".join(line for line in text.splitlines() if f'class="{cls}"' in line), name)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_responses_through_the_gateway(engine: EngineProcess, stream: bool) -> None:
    raw: Any
    final: Any = None
    async with gateway(config((engine, 4))) as url, openai_client(url) as c, asyncio.timeout(STEP_S * 2):
        if stream:
            raw = await c.responses.with_raw_response.create(model=engine.model, input="hello there",
                                                             max_output_tokens=9, stream=True)
            types, text = [], ""
            async for ev in raw.parse():
                types.append(ev.type)
                if ev.type == "response.output_text.delta":
                    text += ev.delta
                if ev.type in ("response.completed", "response.incomplete"):
                    final = ev.response
            assert types[0] == "response.created" and types[-1] in ("response.completed", "response.incomplete")
            assert types.count("response.output_text.delta") >= 1
        else:
            raw = await c.responses.with_raw_response.create(model=engine.model, input="hello there",
                                                             max_output_tokens=9)
            final = raw.parse()
            text = final.output_text
        page = await gateway_metrics(url, {"interactive": 1})
    assert raw.headers["x-tailguard-class"] == "interactive"
    assert raw.headers["x-tailguard-backend"] == f"{engine.name}-{engine.port}"
    assert text and final is not None and final.usage is not None
    assert final.usage.output_tokens == 9 and final.usage.input_tokens > 0
    assert final.output_text == text
    # Metered from the engine's own usage; TTFT read from its own events.
    assert sample(page, "tailguard_output_tokens_total", "interactive") == 9
    assert sample(page, "tailguard_prompt_tokens_total", "interactive") == final.usage.input_tokens
    assert sample(page, "tailguard_ttft_seconds_count", "interactive") == 1


async def test_messages_through_the_gateway(engine: EngineProcess) -> None:
    msgs: Any = [{"role": "user", "content": "hello there"}]
    async with gateway(config((engine, 4))) as url, anthropic_client(url) as a, asyncio.timeout(STEP_S * 3):
        raw = await a.messages.with_raw_response.create(model=engine.model, max_tokens=7, messages=msgs)
        whole = await raw.parse()
        async with a.messages.stream(model=engine.model, max_tokens=5, messages=msgs,
                                     extra_headers=BATCH) as stream:
            pieces = [t async for t in stream.text_stream]
            final = await stream.get_final_message()
            streamed_class = stream.response.headers["x-tailguard-class"]
        # A refusal on this route reaches the SDK in Anthropic's shape.
        with pytest.raises(anthropic.BadRequestError) as bad:
            await a.messages.create(model=engine.model, max_tokens=0, messages=msgs)
        page = await gateway_metrics(url, {"interactive": 1})
    assert raw.headers["x-tailguard-class"] == "interactive" and streamed_class == "batch"
    texts = [b.text for b in whole.content if b.type == "text"]
    assert texts and texts[0] and whole.stop_reason == "max_tokens"
    assert (whole.usage.output_tokens, final.usage.output_tokens) == (7, 5)
    assert whole.usage.input_tokens > 0 and final.usage.input_tokens > 0
    assert pieces and "".join(pieces) == "".join(b.text for b in final.content if b.type == "text")
    assert bad.value.body["type"] == "error"  # type: ignore[index]
    assert sample(page, "tailguard_output_tokens_total", "interactive") == 7
    # The whole prompt, cached part included (llama-server reports most of a repeated one as cache reads).
    u = whole.usage
    assert sample(page, "tailguard_prompt_tokens_total", "interactive") == (
        u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0))
    assert sample(page, "tailguard_output_tokens_total", "batch") == 5
    assert sample(page, "tailguard_ttft_seconds_count", "batch") == 1


async def test_a_route_the_engine_does_not_serve_gets_its_own_answer(engine: EngineProcess) -> None:
    """Rerank needs a cross-encoder: neither engine serves it with a generation model (vLLM: 404;
    llama-server: 501, "Start it with `--reranking`"). The gateway relays the engine's status and
    its message, in OpenAI's error shape, instead of inventing an answer or calling it a failure."""
    body = {"model": engine.model, "query": "cat", "documents": ["a cat", "a dog"]}
    async with aiohttp.ClientSession() as s, asyncio.timeout(STEP_S * 2):
        async with s.post(engine.base_url + "/v1/rerank", json=body) as r:
            status, said = r.status, await r.json()
        async with gateway(config((engine, 4))) as url:
            async with s.post(url + "/v1/rerank", json=body) as r:
                relayed, answer, cls = r.status, await r.json(), r.headers.get("X-Tailguard-Class")
    assert status == {"vllm": 404, "llamacpp": 501}[engine.kind]
    message = said["detail"] if "detail" in said else said["error"]["message"]  # FastAPI's or llama-server's
    assert (relayed, answer["error"]["message"], cls) == (status, message, "embeddings")


@pytest.fixture(scope="module")
def vllm_fcfs(engines: Engines, engine_logs: Any) -> Iterator[EngineProcess]:
    """A second vLLM, started as a new user would: its default scheduling, first come first served."""
    proc = vllm_process(engines, engine_logs)
    proc.name = "vllm-fcfs"
    i = proc.argv.index("--scheduling-policy")
    del proc.argv[i:i + 2]
    try:
        proc.start(ready_timeout_s=360)
        yield proc
    finally:
        proc.stop()


@pytest.mark.timeout(STEP_S * 10)
async def test_vllm_without_priority_scheduling_serves_batch(vllm_fcfs: EngineProcess) -> None:
    """The gateway gives the batch class vLLM's `priority` 1. vLLM 0.32 under its default FCFS
    policy accepts the field and ignores it, so nothing is dropped and batch is served; an engine
    that refuses it (older vLLM, the simulator) gets it dropped once (tests/functional)."""
    async with gateway(config((vllm_fcfs, 4))) as url, openai_client(url) as c, asyncio.timeout(STEP_S * 3):
        answers = await asyncio.gather(*(
            c.chat.completions.with_raw_response.create(model=vllm_fcfs.model, max_tokens=4,
                                                        messages=[{"role": "user", "content": "hi"}],
                                                        extra_headers=BATCH) for _ in range(3)))
        later = await c.responses.create(model=vllm_fcfs.model, input="hi", max_output_tokens=3, extra_headers=BATCH)
        health = await gateway_health(url)
    assert [a.headers["x-tailguard-class"] for a in answers] == ["batch"] * 3
    assert all(a.parse().usage.completion_tokens == 4 for a in answers)  # type: ignore[union-attr]
    assert later.usage is not None and later.usage.output_tokens == 3
    # Accepted, so never dropped: the fallback is for engines that refuse it.
    assert health["backends"][f"vllm-fcfs-{vllm_fcfs.port}"]["dropped_fields"] == []
