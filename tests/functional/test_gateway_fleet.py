"""A fleet behind one gateway in the quick form (`--backend URL` repeated, no kind named): real
simulators as processes, one of them slower, one killed with SIGKILL mid-stream, and a host that
accepts connections and never answers; then two models behind one gateway, with an alias and a
model nobody serves."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from tailguard.config import GatewayConfig
from tailguard.gateway.http.app import create_app
from tests.functional.raw_servers import raw_server, read_request
from tests.functional.sim_processes import sim_process
from tests.servers import running

MAX_TOKENS = 24
LONG = 400  # long enough that the slow simulator's engine time decides its speed, and streams are mid-way at the kill


class _Hung:
    """A wedged engine: it accepts every connection, answers its health and model pages (so its
    probes find it well), and never answers a request for a completion; it counts those (POSTs)."""

    MODELS = b'{"object":"list","data":[{"id":"tailguard-sim","object":"model"}]}'

    def __init__(self) -> None:
        self.posts = 0

    async def __call__(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            head = await read_request(r)
            if head.startswith(b"POST"):
                self.posts += 1
                await asyncio.sleep(3600)
            body = self.MODELS if b" /v1/models " in head.split(b"\r\n", 1)[0] else b"{}"
            w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                    % (len(body), body))
            await w.drain()


class _EjectionWatch(logging.Handler):
    """Notes how many requests the hung host had been sent at the instant it was ejected: the
    gateway logs the ejection in the same loop step as it decides it."""

    def __init__(self, hung: _Hung, name: str) -> None:
        super().__init__()
        self.hung, self.name, self.posts_then = hung, name, -1

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if self.posts_then < 0 and msg.startswith(f"backend {self.name} ejected"):
            self.posts_then = self.hung.posts


async def _chat(client: AsyncOpenAI, model: str = "tailguard-sim", max_tokens: int = MAX_TOKENS,
                ) -> tuple[str, int, str, float]:
    """One streamed chat: the backend that served it, its output tokens, its text, its E2E."""
    t0 = time.perf_counter()
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hello fleet"}], max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True})
    text, tokens = [], 0
    async for chunk in raw.parse():
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return raw.headers["x-tailguard-backend"], tokens, "".join(text), time.perf_counter() - t0


async def test_streams_outlive_a_killed_backend_a_hung_host_is_ejected_and_a_slower_one_gets_less_work() -> None:
    hung = _Hung()
    async with AsyncExitStack() as stack:
        fast_a = await stack.enter_async_context(sim_process(time_scale=0.1))
        fast_b = await stack.enter_async_context(sim_process(time_scale=0.1))
        slow = await stack.enter_async_context(sim_process(time_scale=0.5))  # 5x slower in wall time
        hung_url = await stack.enter_async_context(raw_server(hung))
        cfg = GatewayConfig.quick([fast_a.url, fast_b.url, slow.url, hung_url], max_concurrency=4)
        names = {b.url: b.name for b in cfg.backends}
        watch = _EjectionWatch(hung, names[hung_url])
        logging.getLogger("tailguard.gateway").addHandler(watch)
        stack.callback(logging.getLogger("tailguard.gateway").removeHandler, watch)
        url = await stack.enter_async_context(running(create_app(cfg), handler_cancellation=True))
        client = await stack.enter_async_context(AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0))

        async with asyncio.timeout(40):
            # A burst (spread over the four, the hung one's share stuck), then chats arriving two
            # at a time, 8 a second, for 8 s.
            sent = [asyncio.create_task(_chat(client, max_tokens=LONG)) for _ in range(16)]
            for i in range(32):
                await asyncio.sleep(0.25)
                sent += [asyncio.create_task(_chat(client, max_tokens=LONG)) for _ in range(2)]
                if i == 12:  # about 3 s in, streams running on it: the engine dies
                    fast_b.kill()
            results = await asyncio.gather(*sent)
            async with aiohttp.ClientSession() as s, s.get(f"{url}/health") as resp:
                health = await resp.json()

    served = Counter(b for b, *_ in results)
    # Every one whole, those the killed engine was serving continued elsewhere: the full length of
    # text (nothing repeated, nothing lost) and the exact count of tokens.
    assert all(tokens == LONG and len(text) == len(" tok") * LONG for _, tokens, text, _ in results)
    # At worst: the hung host's head deadline (5 s), then the whole stream elsewhere (about 0.5 s
    # on a fast engine, 2.5 s on the slow one, on a loaded machine).
    assert max(e2e for *_, e2e in results) < 9.0, "a request waited on the hung host past its head deadline"
    assert served[names[hung_url]] == 0
    assert watch.posts_then > 0 and hung.posts == watch.posts_then, "sent to the hung host after its ejection"
    assert health["backends"][names[hung_url]]["state"] in ("ejected", "unhealthy")
    assert served[names[slow.url]] < 0.5 * served[names[fast_a.url]], served


async def _wait_models(url: str, wanted: set[str]) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        while True:
            async with s.get(f"{url}/v1/models") as resp:
                data = (await resp.json())["data"]
            if wanted <= {m["id"] for m in data}:
                return data
            await asyncio.sleep(0.05)


async def test_each_request_reaches_a_backend_serving_its_model_an_alias_works_and_an_unknown_model_is_404() -> None:
    async with AsyncExitStack() as stack:
        llama = await stack.enter_async_context(sim_process(model="llama-a"))
        qwen = await stack.enter_async_context(sim_process(model="qwen-b"))
        quick = GatewayConfig.quick([llama.url, qwen.url], max_concurrency=4)
        cfg = GatewayConfig.model_validate({**quick.model_dump(), "aliases": {"chat": "llama-a"}})
        names = {b.url: b.name for b in cfg.backends}
        url = await stack.enter_async_context(running(create_app(cfg), handler_cancellation=True))
        client = await stack.enter_async_context(AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0))
        async with asyncio.timeout(30):
            listed = await _wait_models(url, {"llama-a", "qwen-b"})
            asked = ["llama-a", "qwen-b", "chat"] * 8
            done = await asyncio.gather(*(_chat(client, m) for m in asked))
            alias = await client.models.retrieve("chat")
            with pytest.raises(openai.NotFoundError) as nobody:
                await client.chat.completions.create(model="mistral-c", messages=[{"role": "user", "content": "x"}])
            with pytest.raises(openai.NotFoundError):
                await client.models.retrieve("mistral-c")

    assert sorted(m["id"] for m in listed) == ["chat", "llama-a", "qwen-b"]  # each once, and the alias
    expected = {"llama-a": names[llama.url], "qwen-b": names[qwen.url], "chat": names[llama.url]}
    assert [backend for backend, *_ in done] == [expected[m] for m in asked]
    assert all(tokens == MAX_TOKENS for _, tokens, *_ in done)
    assert alias.id == "chat"
    assert nobody.value.code == "model_not_found" and "llama-a, qwen-b" in nobody.value.message
