"""Streams that survive their backend: real `tailguard sim` processes behind the gateway in the
quick form (`--backend URL` repeated, no kind named), one killed with SIGKILL or stopped with
SIGSTOP while streams run on it. Each of its streams goes on on another simulator from the text
the client already has: full output, no repeats, one response id, exact usage; a request that
cannot be continued from its text ends with one error event that says why."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from tailguard.config import GatewayConfig
from tailguard.gateway.http.app import create_app
from tailguard.sim.answer import TOKEN_TEXT
from tests.functional.gateways import health, sample, scrape, until
from tests.functional.sim_processes import SimProcess, sim_process
from tests.servers import running

TOKENS = 400  # at time scale 1, about 3 s of decoding: long enough to break in the middle
CHAT = [{"role": "user", "content": "tell me a long story"}]
TOOLS = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object", "properties": {}}}}]


def name(sim: SimProcess) -> str:
    """The name the quick form gives its backend (host:port)."""
    return sim.url.removeprefix("http://")


@asynccontextmanager
async def fleet(n: int, max_concurrency: int = 8, extra: list[dict[str, Any]] | None = None,
                **cfg: Any) -> AsyncIterator[tuple[str, list[SimProcess]]]:
    """`n` simulator processes behind one in-process gateway in the quick form (and `extra`
    backends), once every backend's kind is known (a migration needs a backend that can continue
    a generation)."""
    async with AsyncExitStack() as stack:
        # (a stopped one is killed all the same: SIGKILL needs no SIGCONT)
        sims = [await stack.enter_async_context(sim_process(time_scale=1.0)) for _ in range(n)]
        quick = GatewayConfig.quick([s.url for s in sims], max_concurrency).model_dump()
        quick["backends"] += extra or []
        gw = GatewayConfig.model_validate({**quick, **cfg})
        url = await stack.enter_async_context(running(create_app(gw), handler_cancellation=True))

        async def known() -> bool:
            return {b["kind"] for b in (await health(url))["backends"].values()} == {"sim"}

        await until(known, 0.05)
        yield url, sims


@dataclass
class Seen:
    """What one client saw of its stream."""

    backend: str = ""
    ids: set[str] = field(default_factory=set)
    text: str = ""
    usage: Any = None
    times: list[float] = field(default_factory=list)
    error: openai.APIError | None = None
    going: asyncio.Event = field(default_factory=asyncio.Event)  # set once 20 tokens arrived
    extra: set[str] = field(default_factory=set)  # fields beyond OpenAI's its chunks carried

    @property
    def pause_s(self) -> float:
        """The longest gap between two content chunks."""
        return max(b - a for a, b in zip(self.times, self.times[1:]))

    def gap_at(self, at: float) -> float:
        """The gap between the content chunks either side of `at` (a kill)."""
        after = next(i for i, t in enumerate(self.times) if t > at)
        return self.times[after] - self.times[after - 1]


async def consume(c: AsyncOpenAI, seen: Seen, stop_after: int | None = None, **kw: Any) -> Seen:
    raw = await c.chat.completions.with_raw_response.create(
        model="tailguard-sim", messages=CHAT, max_tokens=TOKENS, stream=True, stream_options={"include_usage": True}, **kw)
    seen.backend = raw.headers["x-tailguard-backend"]
    stream = raw.parse()
    try:
        async for chunk in stream:
            seen.ids.add(chunk.id)
            seen.extra.update(chunk.model_extra or {})
            for choice in chunk.choices:
                seen.extra.update(choice.model_extra or {})
            if chunk.usage is not None:
                seen.usage = chunk.usage
            if chunk.choices and chunk.choices[0].delta.content:
                seen.text += chunk.choices[0].delta.content
                seen.times.append(time.monotonic())
                if len(seen.times) == 20:
                    seen.going.set()
                if stop_after is not None and len(seen.times) >= stop_after:
                    break  # the client's own cancel
    except openai.APIError as e:
        seen.error = e
    finally:
        seen.going.set()  # (also when it failed early: the test goes on and finds out)
        await stream.close()
    return seen


async def test_streams_of_a_killed_backend_go_on_elsewhere_and_tools_end_with_one_error() -> None:
    async with asyncio.timeout(90), fleet(3) as (url, sims):
        async with AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as c:
            plain = [Seen() for _ in range(6)]
            tools = [Seen() for _ in range(3)]
            left = Seen()
            jobs = [Seen() for _ in range(3)]  # preemptible: their text is parsed as it goes
            runs = [asyncio.create_task(consume(c, s)) for s in plain]
            runs += [asyncio.create_task(consume(c, s, extra_headers={"X-Tailguard-Class": "batch"})) for s in jobs]
            runs += [asyncio.create_task(consume(c, s, tools=TOOLS)) for s in tools]
            runs.append(asyncio.create_task(consume(c, left, stop_after=30)))
            whole = [asyncio.create_task(c.chat.completions.with_raw_response.create(
                model="tailguard-sim", messages=CHAT, max_tokens=TOKENS)) for _ in range(3)]  # assembled at the gateway
            await tools[0].going.wait()  # (all started together: the others are as far, or nearly)
            victim = next(s for s in sims if name(s) == tools[0].backend)
            victim.proc.kill()  # SIGKILL: no goodbye, mid-stream
            killed_at = time.monotonic()
            await asyncio.gather(*runs)
            answers = await asyncio.gather(*whole)
            prompt_tokens = {s.usage.prompt_tokens for s in [*plain, *jobs]}
            metrics = await scrape(url)
            by_ids = 0.0
            for sim in sims:
                if sim is not victim:
                    by_ids += sample(await scrape(sim.url), "tailguard_sim_token_id_prompts_total",
                                     model_name="tailguard-sim")
    moved = [s for s in [*plain, *jobs] if s.backend == name(victim)]
    assert any(s in moved for s in plain), "a chat stream ran on the killed backend"
    for s in [*plain, *jobs]:  # every stream whole: nothing lost, nothing repeated, one id, usage exact
        assert s.error is None and s.text == TOKEN_TEXT * TOKENS and len(s.ids) == 1
        assert s.usage.completion_tokens == TOKENS
    assert len(prompt_tokens) == 1  # the prompt counted once: a continued one as the others
    for raw in answers:  # a non-stream answer is continued just the same, before it is sent
        r = raw.parse()
        assert r.choices[0].message.content == TOKEN_TEXT * TOKENS and r.usage is not None
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (*prompt_tokens, TOKENS)
    for s in tools:
        if s.backend == name(victim):
            assert s.error is not None and "cannot be continued" in s.error.message
            assert 20 <= len(s.text) // len(TOKEN_TEXT) < TOKENS
        else:
            assert s.error is None and s.text == TOKEN_TEXT * TOKENS
    migrated = sum(sample(metrics, "tailguard_migrations_total", reason=r, **{"class": c})
                   for r in ("disconnect", "reset") for c in ("interactive", "batch"))
    # Each stream that ran there, and any non-stream answer that did (its header names where it
    # ended); the client that left (`left`) is no migration.
    assert len(moved) <= migrated <= len(moved) + len(answers)
    # The simulator returns token ids as vLLM does: each continuation went on from the ids the
    # killed engine produced (its prompt: token ids), and no client saw the ids the gateway asked for.
    # (A continuation of the client that left may be counted and then not sent: it left first.)
    assert len(moved) <= by_ids <= migrated
    assert all(not s.extra & {"token_ids", "prompt_token_ids"} for s in [*plain, *jobs, *tools, left])
    others = [s for s in [*plain, *jobs] if s not in moved]
    print(f"migrated: {len(moved)} streams ({sum(s in jobs for s in moved)} batch), {migrated - len(moved)} "
          f"non-stream answers; their gap at the kill: up to {max(s.gap_at(killed_at) for s in moved) * 1000:.0f} ms "
          f"(the other streams': up to {max(s.gap_at(killed_at) for s in others) * 1000:.0f} ms)")


async def test_a_stalled_backend_is_left_at_the_idle_deadline() -> None:
    idle_s = 1.0
    async with asyncio.timeout(90), fleet(2, timeouts={"idle_s": idle_s}) as (url, sims):
        async with AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as c:
            plain = [Seen() for _ in range(4)]
            runs = [asyncio.create_task(consume(c, s)) for s in plain]
            await asyncio.gather(*(s.going.wait() for s in plain))
            stalled = next(s for s in sims if name(s) == plain[0].backend)
            os.kill(stalled.proc.pid, signal.SIGSTOP)  # accepts nothing, sends nothing, closes nothing
            await asyncio.gather(*runs)
            metrics = await scrape(url)
    moved = [s for s in plain if s.backend == name(stalled)]
    for s in plain:
        assert s.error is None and s.text == TOKEN_TEXT * TOKENS and len(s.ids) == 1
        assert s.usage.completion_tokens == TOKENS
    idle = sample(metrics, "tailguard_migrations_total", reason="timeout_idle", **{"class": "interactive"})
    assert idle == len(moved)
    pause = max(s.pause_s for s in moved)
    assert idle_s <= pause < idle_s + 2.0  # the stall found at the idle deadline, then little more
    print(f"stalled streams' longest pause: {pause * 1000:.0f} ms (idle deadline {idle_s * 1000:.0f} ms)")


async def _refuses(request: web.Request) -> web.Response:
    """A backend that takes every request and refuses it, as an engine refuses a prompt past its
    context: what a continuation can meet."""
    return web.json_response({"error": {"message": "maximum context length is 100 tokens", "type": "BadRequestError",
                                        "param": None, "code": 400}}, status=400)


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def test_a_continuation_the_next_backend_refuses_ends_the_stream_with_that_error_event() -> None:
    refusing = web.Application()
    refusing.router.add_post("/v1/chat/completions", _refuses)
    refusing.router.add_post("/v1/completions", _refuses)  # (a `sim` kind is continued by token ids there)
    refusing.router.add_get("/health", _ok)
    async with asyncio.timeout(60), running(refusing) as refuser, fleet(
            1, max_concurrency=1, extra=[{"name": "refuser", "url": refuser, "kind": "sim", "max_concurrency": 1}],
    ) as (url, [sim]):
        async with AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as c:
            for _ in range(2):  # the first may go to the refuser (a 400 before any byte): then the sim's turn
                seen = Seen()
                run = asyncio.create_task(consume(c, seen))
                going = asyncio.create_task(seen.going.wait())
                await asyncio.wait([run, going], return_when=asyncio.FIRST_COMPLETED)
                going.cancel()
                if not run.done():
                    break
                with pytest.raises(openai.BadRequestError):
                    await run
            assert seen.backend == name(sim)
            sim.proc.kill()
            await run
    assert seen.error is not None and len(seen.ids) == 1
    assert "refused to continue the answer (400): maximum context length" in seen.error.message
    assert 20 <= len(seen.text) // len(TOKEN_TEXT) < TOKENS
