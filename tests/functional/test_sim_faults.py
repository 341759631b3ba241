"""`tailguard sim` as a fleet's hosts: real processes on 127.0.0.1 with a model of their own, a
slower engine, hung or failing on purpose, served to the openai package."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from tests.functional.sim_processes import sim_process

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


@contextlib.asynccontextmanager
async def sim(*flags: str) -> AsyncIterator[str]:
    """A simulator process with `flags` and no model of its own unless they name one."""
    async with sim_process(*flags, model=None) as p:
        yield p.url


def client(url: str, timeout: float = 10.0) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=timeout)


async def get(url: str, path: str, timeout: float = 5.0) -> tuple[int, str]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s, s.get(url + path) as r:
        return r.status, await r.text()


async def metric(url: str, name: str) -> float:
    _, text = await get(url, "/metrics")
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


async def test_a_named_model_is_listed_served_and_another_model_is_a_404() -> None:
    async with sim("--model-name", "llama-a") as url, client(url) as c:
        assert [m.id for m in (await c.models.list()).data] == ["llama-a"]
        r = await c.chat.completions.create(model="llama-a", messages=CHAT, max_tokens=2)
        assert r.model == "llama-a" and r.usage is not None and r.usage.completion_tokens == 2
        with pytest.raises(openai.NotFoundError) as e:
            await c.completions.create(model="qwen-b", prompt="hi", max_tokens=2)
        assert e.value.status_code == 404 and e.value.code == "model_not_found" and e.value.param == "model"
        assert "qwen-b" in e.value.message
        # the refusal left the engine untouched: it still serves
        assert (await c.completions.create(model="llama-a", prompt="hi", max_tokens=1)).usage is not None


async def test_without_a_model_name_any_model_is_served() -> None:
    async with sim() as url, client(url) as c:
        r = await c.chat.completions.create(model="whatever", messages=CHAT, max_tokens=1)
        assert r.model == "tailguard-sim"


async def test_a_slowdown_makes_every_step_that_many_times_longer() -> None:
    """The same request on a plain and a 5x slower simulator: each decode step (the inter-token
    latency its /metrics reports, in simulated seconds) takes 5 times as long."""
    async with sim() as fast, sim("--slowdown", "5") as slow:
        for url in (fast, slow):
            async with client(url) as c:
                await c.chat.completions.create(model="m", messages=CHAT, max_tokens=20)
        itl = [await metric(url, "vllm:inter_token_latency_seconds_sum") for url in (fast, slow)]
    assert itl[0] > 0 and itl[1] == pytest.approx(5 * itl[0], rel=1e-6)


async def test_a_hung_simulator_accepts_and_never_answers_anything() -> None:
    async with sim_process("--fault", "hang", model=None) as p:
        async with client(p.url, timeout=1.0) as c:
            with pytest.raises(openai.APITimeoutError):
                await c.chat.completions.create(model="m", messages=CHAT, max_tokens=1)
        with pytest.raises(asyncio.TimeoutError):
            await get(p.url, "/health", timeout=0.5)
        # a request still hanging when it is told to stop does not hold it up
        async with client(p.url, timeout=30.0) as c:
            pending = asyncio.create_task(c.chat.completions.create(model="m", messages=CHAT, max_tokens=1))
            await asyncio.sleep(0.2)
            p.proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(10):
                assert await p.proc.wait() == 0
                with contextlib.suppress(openai.APIError):
                    await pending


async def test_a_simulator_hung_on_completions_still_answers_its_health_and_models() -> None:
    async with sim("--fault", "hang-completions") as url:
        assert (await get(url, "/health"))[0] == 200
        assert (await get(url, "/v1/models"))[0] == 200
        async with client(url, timeout=1.0) as c:
            with pytest.raises(openai.APITimeoutError):
                await c.completions.create(model="m", prompt="hi", max_tokens=1)
        assert await metric(url, "vllm:prompt_tokens_total") == 0  # the engine never saw it


async def test_a_stalled_engine_keeps_its_streams_open_and_silent_while_its_health_answers() -> None:
    """From 10 simulated seconds (0.2 s wall) the engine stops: a long stream gets its first
    tokens, then nothing, its connection open; health still answers; a new request gets no token."""
    async with sim("--fault", "stall", "--fault-after-s", "10") as url, client(url, timeout=1.5) as c:
        stream = await c.chat.completions.create(model="m", messages=CHAT, max_tokens=5000, stream=True)
        got = 0
        with pytest.raises(openai.APITimeoutError):
            async for chunk in stream:
                got += bool(chunk.choices and chunk.choices[0].delta.content)
        assert 0 < got < 5000
        assert (await get(url, "/health"))[0] == 200
        with pytest.raises(openai.APITimeoutError):
            await c.completions.create(model="m", prompt="hi", max_tokens=1)


async def test_a_fault_can_start_mid_run() -> None:
    """Completions hang from 50 simulated seconds on (1 s wall): the first is answered, one sent
    later never is."""
    async with sim("--fault", "hang-completions", "--fault-after-s", "50") as url, client(url, timeout=1.0) as c:
        assert (await c.completions.create(model="m", prompt="hi", max_tokens=1)).usage is not None
        await asyncio.sleep(1.2)
        with pytest.raises(openai.APITimeoutError):
            await c.completions.create(model="m", prompt="hi", max_tokens=1)


async def test_an_error_rate_answers_that_share_of_completions_with_a_500() -> None:
    async with sim("--error-rate", "0.5") as half, sim("--error-rate", "1", "--fault-after-s", "100000") as later:
        async with client(half) as c:
            got: list[int] = []
            for _ in range(6):
                try:
                    await c.chat.completions.create(model="m", messages=CHAT, max_tokens=1)
                    got.append(200)
                except openai.InternalServerError as e:
                    assert e.status_code == 500 and isinstance(e.body, dict) and e.body.get("type") == "server_error"
                    got.append(500)
        assert got == [200, 500] * 3
        assert (await get(half, "/health"))[0] == 200  # only completions fail
        async with client(later) as c:  # its errors start long after this run
            assert (await c.completions.create(model="m", prompt="hi", max_tokens=1)).usage is not None


async def test_a_killed_simulator_cuts_its_stream_short_and_refuses_what_comes_next() -> None:
    async with sim_process(model=None) as p, client(p.url) as c:
        stream = await c.chat.completions.create(
            model="m", messages=CHAT, max_tokens=2000, stream=True)
        got = 0
        with pytest.raises(openai.APIError):
            async for chunk in stream:
                got += bool(chunk.choices and chunk.choices[0].delta.content)
                if got == 3:
                    p.kill()
        assert 3 <= got < 2000
        with pytest.raises(openai.APIConnectionError):
            await c.chat.completions.create(model="m", messages=CHAT, max_tokens=1)


async def test_bad_fault_values_exit_with_a_message() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard", "sim", "--fault", "explode",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert proc.returncode == 2 and b"unknown fault 'explode'" in err and b"hang-completions" in err
