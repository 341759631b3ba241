"""Preemption end to end: a running batch request is suspended for a chat that finds no free
slot (its upstream closed, so the simulator aborts it), then resumed where it stopped; the client
of the batch request sees one ordinary response with every token it asked for."""

from __future__ import annotations

import asyncio
from typing import Any


from tests.functional.gateways import Stack, classes, gateway, health, sample, scrape, sim_running, until

CHAT = [{"role": "user", "content": "y" * 40}]
BATCH = {"X-Tailguard-Class": "batch"}
PREEMPTIBLE = classes(batch={"preemptible": True, "max_share": 1.0})
# One slot, so any chat has to take the batch request's; no minimum run time, so the test need not wait.
CFG: dict[str, Any] = {"classes": PREEMPTIBLE, "scheduler": {"min_run_s": 0.0}}
SCALE = 0.05  # the batch request below runs for about 1 s of wall time


async def _sim_counter(gw: Stack, name: str) -> float:
    """A simulator counter summed over its label sets (it is labelled by model name)."""
    return sum(v for (n, _), v in (await scrape(gw.sims[0].url)).items() if n == name)


async def _finished(gw: Stack, reason: str) -> float:
    m = await scrape(gw.sims[0].url)
    return sum(v for (name, labels), v in m.items()
               if name == "vllm:request_success_total" and ("finished_reason", reason) in labels)


async def test_stream_preempted_by_a_chat_resumes_with_every_token_and_true_usage() -> None:
    max_tokens = 3000
    async with asyncio.timeout(30), gateway(max_concurrency=1, scale=SCALE, **CFG) as gw, gw.client() as c:
        stream = await c.chat.completions.create(
            model="tailguard-sim", messages=CHAT, max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_headers=BATCH)
        text: list[str] = []
        roles = 0
        usage = None
        chat_done_at_tokens: int | None = None
        chat_task: asyncio.Task[Any] | None = None
        ids: set[str] = set()
        async for ch in stream:
            ids.add(ch.id)
            if ch.usage is not None:
                usage = ch.usage
            for choice in ch.choices:
                if choice.delta.role is not None:
                    roles += 1
                if choice.delta.content:
                    text.append(choice.delta.content)
            if len(text) == 100 and chat_task is None:
                chat_task = asyncio.create_task(c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=16))
            if chat_task is not None and chat_task.done() and chat_done_at_tokens is None:
                chat_done_at_tokens = len(text)
        assert chat_task is not None
        chat = await chat_task
        assert chat.usage is not None and chat.usage.completion_tokens == 16
        # The chat did not wait for the batch request: it ended while the batch stream had far to go.
        assert chat_done_at_tokens is not None and chat_done_at_tokens < max_tokens // 2
        assert "".join(text) == " tok" * max_tokens
        assert roles == 1
        assert len(ids) == 1  # one response id, though two engine requests made it
        assert usage is not None and usage.completion_tokens == max_tokens
        assert usage.prompt_tokens == 4 + 10  # one message of 40 bytes, as the simulator counts it
        m = await scrape(gw.url)
        assert sample(m, "tailguard_preemptions_total", **{"class": "batch"}) == 1
        # Metered as the client was told: every token of both runs, its own prompt only.
        assert sample(m, "tailguard_output_tokens_total", **{"class": "batch"}) == max_tokens
        assert sample(m, "tailguard_prompt_tokens_total", **{"class": "batch"}) == 4 + 10
        assert sample(m, "tailguard_requests_total", **{"class": "batch", "outcome": "success"}) == 1
        # Metered as the client was told, not as the continuation's usage counted it (its text as prompt).
        assert sample(m, "tailguard_output_tokens_total", **{"class": "batch"}) == max_tokens
        assert sample(m, "tailguard_prompt_tokens_total", **{"class": "batch"}) == 4 + 10
        # The simulator aborted the batch request's first run when the gateway closed it.
        assert await _finished(gw, "abort") == 1
        assert await _finished(gw, "length") == 2


async def test_non_stream_preempted_returns_the_full_text() -> None:
    max_tokens = 3000
    async with asyncio.timeout(30), gateway(max_concurrency=1, scale=SCALE, **CFG) as gw, gw.client() as c:
        batch = asyncio.create_task(c.completions.create(
            model="tailguard-sim", prompt="x" * 400, max_tokens=max_tokens, extra_headers=BATCH))

        async def generating() -> bool:
            return await _sim_counter(gw, "vllm:generation_tokens_total") >= 100
        await until(generating)
        chat = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=8)
        assert not batch.done()
        assert chat.choices[0].message.content == " tok" * 8
        out = await batch
        assert out.choices[0].text == " tok" * max_tokens
        assert out.usage is not None
        assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (100, max_tokens)
        m = await scrape(gw.url)
        assert sample(m, "tailguard_preemptions_total", **{"class": "batch"}) == 1


async def test_a_client_that_leaves_while_suspended_is_removed_and_counted_once() -> None:
    async with asyncio.timeout(30), gateway(max_concurrency=1, scale=SCALE, **CFG) as gw, gw.client() as c:
        stream = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=5000, stream=True,
                                                 extra_headers=BATCH)
        async for ch in stream:
            if ch.choices and ch.choices[0].delta.content:
                break
        # A long chat takes the only slot; the batch request is suspended behind it.
        chat = asyncio.create_task(c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3000))

        async def suspended() -> bool:
            return bool((await health(gw.url))["queued"] == 1)
        await until(suspended)
        await stream.close()

        async def gone() -> bool:
            m = await scrape(gw.url)
            return sample(m, "tailguard_requests_total", **{"class": "batch", "outcome": "client_gone"}) == 1
        await until(gone)
        assert (await health(gw.url))["queued"] == 0
        await chat
        m = await scrape(gw.url)
        assert sample(m, "tailguard_requests_total", **{"class": "batch", "outcome": "client_gone"}) == 1
        assert sample(m, "tailguard_requests_total", **{"class": "batch", "outcome": "success"}) == 0
        assert sample(m, "tailguard_queue_length", **{"class": "batch"}) == 0
        assert await sim_running(gw.sims[0]) == 0
        # The gateway keeps serving, and its one slot is free again.
        again = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4, extra_headers=BATCH)
        assert again.choices[0].message.content == " tok" * 4


async def test_interactive_requests_are_never_suspended() -> None:
    async with asyncio.timeout(30), gateway(max_concurrency=1, scale=SCALE, **CFG) as gw, gw.client() as c:
        first = asyncio.create_task(c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2000))

        async def running() -> bool:
            return await sim_running(gw.sims[0]) == 1
        await until(running)
        second = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4)
        assert first.done()  # the second chat waited for the first instead of suspending it
        assert (await first).usage.completion_tokens == 2000  # type: ignore[union-attr]
        assert second.usage is not None and second.usage.completion_tokens == 4
        assert sample(await scrape(gw.url), "tailguard_preemptions_total", **{"class": "interactive"}) == 0
