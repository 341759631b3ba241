"""The gateway in front of real engines: what users will meet first.

The gateway runs in-process on 127.0.0.1; llama-server and vLLM run as real child processes. Each
test states a behaviour that the simulator alone could not prove: the engines' own chunk shapes
relayed faithfully, usage metered, a departed client's request aborted inside the engine, a dead
engine routed around, a class mapped to vLLM's own priority, the engine's 4xx passed back intact.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from openai import APIStatusError, AsyncOpenAI

from tailguard.config import GatewayConfig
from tailguard.gateway.http.app import create_app, gateway_runner
from tailguard.wire.sse import SSEDecoder
from tests.real.processes import EngineProcess, http_text

pytestmark = pytest.mark.real

STEP_S = 60.0
EXPLAIN_S = 20.0


def config(*backends: tuple[EngineProcess, int], **extra: Any) -> GatewayConfig:
    doc: dict[str, Any] = {
        "port": 0, "access_log": False,
        # Generous probe timeout: a busy vLLM on two shared cores can take seconds to answer /health.
        "health": {"interval_s": 0.5, "timeout_s": 10.0},
        # A loopback connect takes microseconds, but the gateway shares the test's event loop, and
        # on a starved CI machine that loop woke too late for the default 5 s (a 504 in CI). The same
        # holds for the response head: a 9 s late wake-up failed a queued vLLM stream under the
        # default `header_s` of 5 s (these tests are about the engines, not about hung hosts).
        "timeouts": {"connect_s": STEP_S, "header_s": STEP_S},
        "backends": [{"name": f"{p.name}-{p.port}", "url": p.base_url, "kind": p.kind, "max_concurrency": n}
                     for p, n in backends],
    }
    doc.update(extra)
    return GatewayConfig.model_validate(doc)


@asynccontextmanager
async def gateway(cfg: GatewayConfig) -> AsyncIterator[str]:
    """The real gateway on an ephemeral port, served as `tailguard serve` serves it: the lean
    server for the hot routes, aiohttp's for the rest, the client-side limits, and a client that
    leaves cancelling its handler and the upstream request."""
    app = create_app(cfg)
    runner = gateway_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def client(base_url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=STEP_S)


def metric(text: str, name: str) -> float:
    """Sum of every sample of `name` (any labels) in a Prometheus text page."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M):
        total += float(m.group(1))
    return total


async def engine_metric(proc: EngineProcess, name: str) -> float:
    return metric(await asyncio.to_thread(http_text, proc.base_url + "/metrics"), name)


async def gateway_health(url: str) -> dict[str, Any]:
    """The gateway's `/health` body, whatever its status (503 when no backend is healthy)."""
    async with aiohttp.ClientSession() as s, asyncio.timeout(STEP_S):
        async with s.get(url + "/health") as r:
            body: dict[str, Any] = await r.json()
            return body


async def wait_for(check: Callable[[], Any], what: str, timeout_s: float = 15.0,
                   senders: Sequence[asyncio.Task[Any]] = (),
                   explain: Callable[[], Awaitable[str]] | None = None) -> None:
    """Poll an async condition until true; fail with `what` when the bound passes. A condition that
    waits on requests in flight names their tasks as `senders`: when one of them fails, its error
    is raised at once, instead of the condition timing out without saying why. `explain` adds
    what the parts involved say about themselves to a timeout (a CI log is all there is). A check
    that outlasts the bound (a busy engine's page) counts as not yet, so the bound holds. How long
    each wait took is printed, for the report of a test that fails later."""
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        for task in senders:
            if task.done() and not task.cancelled() and task.exception() is not None:
                error = task.exception()
                raise AssertionError(f"a request failed while waiting for {what}: {described(error)}") from error
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                if await check():
                    print(f"waited {time.monotonic() - started:.1f} s for {what}")  # shown if the test fails
                    return
        except (TimeoutError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{await explained(explain)}")
        await asyncio.sleep(0.05)


def described(error: BaseException | None) -> str:
    """A request's failure in one line: a CI log cuts the chained traceback before the status and
    body an `APIStatusError` carries."""
    if isinstance(error, APIStatusError):
        return f"{type(error).__name__} {error.status_code}: {error.message}"
    return repr(error)


async def explained(explain: Callable[[], Awaitable[str]] | None) -> str:
    """`explain`'s text on a line of its own, bounded: an engine too busy to answer must not turn
    a failure that says why into a test timeout that does not."""
    if explain is None:
        return ""
    try:
        async with asyncio.timeout(EXPLAIN_S):
            return f"\n{await explain()}"
    except (TimeoutError, OSError) as e:
        return f"\n(no explanation within {EXPLAIN_S:g} s: {e!r})"


# --- relaying each engine's own stream ----------------------------------------------------------

async def test_chat_stream_through_gateway(engine: EngineProcess) -> None:
    async with gateway(config((engine, 4))) as url, client(url) as c, asyncio.timeout(STEP_S):
        stream = await c.chat.completions.create(
            model=engine.model, messages=[{"role": "user", "content": "hello"}], max_tokens=21, stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [ch async for ch in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 21
    assert sum(1 for ch in chunks if ch.usage is not None) == 1


async def raw_stream(url: str, body: dict[str, Any]) -> tuple[dict[str, str], list[bytes]]:
    """Response headers and every SSE `data:` payload as bytes (the openai package hides null vs absent)."""
    decoder = SSEDecoder()
    events: list[bytes] = []
    async with aiohttp.ClientSession() as s, asyncio.timeout(STEP_S):
        async with s.post(url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            async for data in r.content.iter_any():
                events += [e.data for e in decoder.feed(data)]
            return dict(r.headers), events + [e.data for e in decoder.flush()]


async def test_llamacpp_role_and_usage_chunks_are_relayed_as_sent(llama_server: EngineProcess) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    _, direct = await raw_stream(llama_server.base_url, body)
    async with gateway(config((llama_server, 4))) as url:
        headers, relayed = await raw_stream(url, body)
    assert headers["X-Tailguard-Backend"] == f"llama-{llama_server.port}"
    assert headers["X-Tailguard-Class"] == "interactive"
    assert len(relayed) == len(direct) == 8  # role, 4 tokens, finish, usage, [DONE]
    first = json.loads(relayed[0])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}  # not rewritten to ""
    usage = json.loads(relayed[-2])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4 and "timings" in usage
    # Greedy decoding: the same tokens whichever way the request went.
    contents = [[json.loads(e)["choices"][0]["delta"].get("content") for e in ev[1:5]] for ev in (direct, relayed)]
    assert contents[0] == contents[1]


async def test_stream_without_include_usage_gets_no_usage_chunk(engine: EngineProcess) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True}
    async with gateway(config((engine, 4))) as url:
        _, events = await raw_stream(url, body)
    assert events[-1] == b"[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert all(p.get("usage") is None for p in parsed)  # the gateway asked upstream for usage; the client did not
    assert all(p["choices"] for p in parsed)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_non_stream_through_gateway_is_assembled_with_usage(engine: EngineProcess, endpoint: str) -> None:
    async with gateway(config((engine, 4))) as url, client(url) as c, asyncio.timeout(STEP_S):
        if endpoint == "chat":
            r = await c.chat.completions.create(
                model=engine.model, messages=[{"role": "user", "content": "hi"}], max_tokens=33)
            text = r.choices[0].message.content
        else:
            rc = await c.completions.create(model=engine.model, prompt="the queue", max_tokens=33)
            r, text = rc, rc.choices[0].text  # type: ignore[assignment]
    assert text and r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 33 and r.usage.prompt_tokens > 0


def same_logprobs(a: Any, b: Any) -> bool:
    """Equal logprob records: same tokens, log-probabilities within float noise."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-3 * max(1.0, abs(a))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_logprobs(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_logprobs(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_non_stream_logprobs_are_assembled_as_the_engine_answers_them(engine: EngineProcess, endpoint: str) -> None:
    # The gateway asks upstream for a stream and joins the chunks' logprobs back into one record.
    async def ask(c: AsyncOpenAI) -> tuple[str | None, Any]:
        if endpoint == "chat":
            r = await c.chat.completions.create(model=engine.model, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=8, temperature=0.0, logprobs=True, top_logprobs=2)
            lp = r.choices[0].logprobs
            return r.choices[0].message.content, lp.model_dump(exclude_none=True) if lp else None
        rc = await c.completions.create(model=engine.model, prompt="the queue", max_tokens=8, temperature=0.0,
                                        logprobs=2)
        lpc = rc.choices[0].logprobs
        return rc.choices[0].text, lpc.model_dump(exclude_none=True) if lpc else None

    async with client(engine.base_url) as c, asyncio.timeout(STEP_S):
        direct_text, direct = await ask(c)
    async with gateway(config((engine, 4))) as url, client(url) as c, asyncio.timeout(STEP_S):
        text, relayed = await ask(c)
    assert direct and relayed is not None
    assert text == direct_text
    if endpoint == "completions" and engine.kind == "llamacpp":
        relayed.pop("text_offset", None)  # llama-server's streamed offsets count from each chunk
        direct.pop("text_offset", None)
    assert same_logprobs(relayed, direct)


async def test_non_stream_tool_call_is_assembled(vllm_server: EngineProcess) -> None:
    # A named tool choice makes vLLM call the tool whatever the (random) model says; the gateway
    # asks upstream for a stream and must join the tool call's deltas back into one message.
    tools: Any = [{"type": "function", "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                       "required": ["city"]}}}]
    body: Any = {"model": vllm_server.model, "messages": [{"role": "user", "content": "weather?"}], "tools": tools,
                 "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 300,
                 "temperature": 0.0}
    async with client(vllm_server.base_url) as c, asyncio.timeout(STEP_S):
        direct = (await c.chat.completions.create(**body)).choices[0].message
    async with gateway(config((vllm_server, 4))) as url, client(url) as c, asyncio.timeout(STEP_S):
        relayed = (await c.chat.completions.create(**body)).choices[0].message
    assert direct.tool_calls and relayed.tool_calls
    assert [(t.type, t.function.name, t.function.arguments) for t in relayed.tool_calls] == \
        [(t.type, t.function.name, t.function.arguments) for t in direct.tool_calls]
    assert relayed.tool_calls[0].function.name == "get_weather" and relayed.tool_calls[0].id


async def test_completions_stream_through_gateway(engine: EngineProcess) -> None:
    async with gateway(config((engine, 4))) as url, client(url) as c, asyncio.timeout(STEP_S):
        stream = await c.completions.create(model=engine.model, prompt="slot", max_tokens=12, stream=True,
                                            stream_options={"include_usage": True})
        chunks = [ch async for ch in stream]
    assert [u.completion_tokens for u in (ch.usage for ch in chunks) if u is not None] == [12]
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices)


async def test_context_too_long_passes_the_engines_own_400(engine: EngineProcess) -> None:
    prompt = "the " * 20000  # over every engine's context
    async with client(engine.base_url) as c, asyncio.timeout(STEP_S):
        with pytest.raises(openai.BadRequestError) as direct:
            await c.completions.create(model=engine.model, prompt=prompt, max_tokens=4)
    async with gateway(config((engine, 4))) as url, client(url) as c, asyncio.timeout(STEP_S):
        with pytest.raises(openai.BadRequestError) as relayed:
            await c.completions.create(model=engine.model, prompt=prompt, max_tokens=4)
        # The gateway and the engine keep serving after the refusal.
        ok = await c.completions.create(model=engine.model, prompt="x", max_tokens=2)
    assert relayed.value.status_code == 400
    # The engine's own error in OpenAI's shape (its type, code and message, the message cut to 200
    # characters: a backend's body is never relayed whole, docs/security.md), not a gateway rewrite.
    engine_said, relayed_said = direct.value.body, relayed.value.body
    assert isinstance(engine_said, dict) and isinstance(relayed_said, dict)
    assert relayed_said["message"][:150] == engine_said["message"][:150]
    assert relayed_said["type"] == engine_said["type"]
    assert relayed_said.get("code") == (None if engine_said.get("code") is None else str(engine_said["code"]))
    assert ok.usage is not None and ok.usage.completion_tokens == 2


# --- a client that leaves frees the engine's slot ------------------------------------------------

async def stream_then_leave(url: str, body: dict[str, Any], content_chunks: int) -> None:
    """Read a few content chunks of a long stream, then drop the connection."""
    seen = 0
    decoder = SSEDecoder()
    async with aiohttp.ClientSession() as s, asyncio.timeout(STEP_S):
        async with s.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            async for data in r.content.iter_any():
                seen += sum(1 for e in decoder.feed(data) if e.data != b"[DONE]")
                if seen >= content_chunks:
                    r.close()  # the client leaves mid-stream
                    return
    raise AssertionError("the stream ended before the client left")


async def test_disconnect_frees_the_llamacpp_slot(start_llama: Callable[..., EngineProcess]) -> None:
    engine = start_llama("llama-slow", slow=True)
    max_tokens = 1900  # tens of seconds for the slow model: only an abort stops it short of that (checked below)
    before = await engine_metric(engine, "llamacpp:tokens_predicted_total")
    async with gateway(config((engine, 4))) as url:
        await stream_then_leave(url, {"model": "tiny", "prompt": "hello", "max_tokens": max_tokens,
                                      "stream": True}, content_chunks=3)

        async def slots_idle() -> bool:
            slots = json.loads(await asyncio.to_thread(http_text, engine.base_url + "/slots"))
            return not any(s["is_processing"] for s in slots)

        async def gateway_idle() -> bool:
            h = await gateway_health(url)
            return all(b["in_flight"] == 0 for b in h["backends"].values())

        # Bounds, not expectations (an abort takes milliseconds): a stalled CI machine gets its time.
        await wait_for(slots_idle, "llama-server to free the slot after the client left", timeout_s=STEP_S / 2)
        await wait_for(gateway_idle, "the gateway to release its slot", timeout_s=STEP_S / 2)
    decoded = await engine_metric(engine, "llamacpp:tokens_predicted_total") - before
    assert 3 <= decoded < max_tokens  # stopped early, by the abort


async def test_disconnect_frees_the_vllm_request(vllm_server: EngineProcess) -> None:
    # The client leaves once vLLM is generating, whether or not a chunk has reached it yet: on a
    # busy CPU vLLM's API server can hold the first chunks back for seconds, and its /metrics showed
    # the first tokens only after 35 s, when 3,686 had been made. So the request asks for nearly the
    # whole context (the interactive class has no cap): about two minutes of decoding on this CPU.
    max_tokens = 16000
    before = await engine_metric(vllm_server, "vllm:generation_tokens_total")
    body = {"model": "tiny", "prompt": "hello", "max_tokens": max_tokens, "stream": True}

    async def idle() -> bool:
        return await engine_metric(vllm_server, "vllm:num_requests_running") == 0

    async def generating() -> bool:
        return await engine_metric(vllm_server, "vllm:generation_tokens_total") - before >= 3

    async with gateway(config((vllm_server, 8))) as url, aiohttp.ClientSession() as s:
        async def read_all() -> None:
            async with s.post(url + "/v1/completions", json=body) as r:
                async for _ in r.content.iter_any():
                    pass

        reader = asyncio.create_task(read_all())
        try:
            await wait_for(generating, "vLLM to generate", timeout_s=STEP_S, senders=[reader])
        finally:
            reader.cancel()  # the client leaves: its connection to the gateway closes
            await asyncio.gather(reader, return_exceptions=True)
        await wait_for(idle, "vLLM to stop running the abandoned request", timeout_s=STEP_S)
    decoded = await engine_metric(vllm_server, "vllm:generation_tokens_total") - before
    assert 3 <= decoded < max_tokens


# --- one of two engines dies mid-run --------------------------------------------------------------

async def test_killed_llamacpp_is_routed_around(start_llama: Callable[..., EngineProcess]) -> None:
    a = start_llama("llama-a")
    b = start_llama("llama-b")
    name_a, name_b = f"llama-a-{a.port}", f"llama-b-{b.port}"
    workers = 6
    outcomes: list[tuple[float, str | None]] = []  # (started_at, serving backend, or None on failure)
    killed_at: list[float] = []
    marked_down_at: list[float] = []

    async def worker(c: AsyncOpenAI, todo: list[int]) -> None:
        while todo:
            todo.pop()
            started = time.monotonic()
            try:
                raw = await c.chat.completions.with_raw_response.create(
                    model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=48)
                r = raw.parse()
                assert r.usage is not None and r.usage.completion_tokens == 48
                outcomes.append((started, raw.headers["X-Tailguard-Backend"]))
            except openai.APIError:
                outcomes.append((started, None))
            # Killed mid-run once both have answered: on a starved CI machine the first answer of
            # one engine can come after twenty of the other's.
            if len(outcomes) >= 20 and not killed_at and name_a in {be for _, be in outcomes}:
                a.kill()  # SIGKILL mid-run: open connections drop, the port refuses
                killed_at.append(time.monotonic())

    async def watch(url: str) -> None:
        # Taken out either way: by its failed probe, or first by its failed requests (ejection).
        while not marked_down_at:
            state = (await gateway_health(url))["backends"][name_a]
            if not state["healthy"] or state["ejected"]:
                marked_down_at.append(time.monotonic())
            await asyncio.sleep(0.01)

    # A killed engine refuses connections, so its probe fails at once; the generous timeout only
    # keeps a stalled CI machine from taking the survivor out with a late answer.
    fast_probes = {"interval_s": 0.2, "timeout_s": 10.0, "unhealthy_after": 1}
    async with gateway(config((a, 4), (b, 4), health=fast_probes)) as url, client(url) as c, \
            asyncio.timeout(STEP_S * 2):
        watcher = asyncio.create_task(watch(url))
        todo = list(range(200))  # 20 or more before the kill, and enough after it however late it is noticed
        await asyncio.gather(*(worker(c, todo) for _ in range(workers)))
        await asyncio.wait_for(watcher, STEP_S)
        health = await gateway_health(url)
    assert killed_at and not a.alive() and b.alive()
    assert {name_a, name_b} <= {be for at, be in outcomes if at < killed_at[0]}  # both served before
    # Requests that were already bound to the dead engine may fail; once the gateway has marked it
    # down, every request succeeds, all of them on the survivor.
    after = [be for at, be in outcomes if at >= marked_down_at[0]]
    assert len(after) >= 50 and set(after) == {name_b}
    assert sum(1 for _, be in outcomes if be is None) <= workers
    assert health["backends"][name_a]["healthy"] is False and health["backends"][name_b]["healthy"] is True


# --- the class becomes vLLM's own priority ------------------------------------------------------

async def hold_stream(c: AsyncOpenAI, cls: str, max_tokens: int, started: asyncio.Event) -> None:
    """Read a completion stream until it ends or is cancelled; `started` is set at its first text.
    Only the bytes up to that are parsed: a dozen held streams parsed chunk by chunk by the openai
    package take CPU that the gateway, on this same loop, needs on a starved CI machine."""
    decoder = SSEDecoder()
    async with c.completions.with_streaming_response.create(
            model="tiny", prompt="queue", max_tokens=max_tokens, stream=True,
            extra_headers={"X-Tailguard-Class": cls}) as resp:
        chunks = resp.iter_bytes()
        async for data in chunks:
            if any(carries_text(e.data) for e in decoder.feed(data)):
                started.set()
                break
        async for _ in chunks:
            pass


def carries_text(data: bytes) -> bool:
    """Whether a completion stream's event holds generated text."""
    if data == b"[DONE]":
        return False
    choices: list[dict[str, Any]] = json.loads(data).get("choices") or []
    return bool(choices and choices[0].get("text"))


@pytest.mark.timeout(STEP_S * 8 + EXPLAIN_S * 2)
async def test_class_maps_to_vllm_priority(vllm_server: EngineProcess) -> None:
    # The gateway may keep 16 in flight, vLLM runs 8 (--max-num-seqs): the other 8 wait in vLLM's
    # own queue, which `--scheduling-policy priority` orders by the `priority` the gateway set.
    # Every request is long enough to hold its seat until cancelled, so which requests run is read
    # from the engine's state and from which streams ever start, never from when chunks arrive (vLLM's
    # API server on a busy CPU delivers in bursts that can reorder first chunks across requests).
    # What is tested is vLLM's queue order, not health: a probe that a starved CI machine answers
    # late must not take the only backend out (and leave the requests in the gateway's queue).
    cfg = config((vllm_server, 16), health={"interval_s": 0.5, "timeout_s": 10.0, "unhealthy_after": 1000})
    long = vllm_server.long_request_tokens
    async with gateway(cfg) as url, asyncio.timeout(STEP_S * 7 + EXPLAIN_S * 2), \
            AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=STEP_S * 4) as c:
        # (a queued stream sees no byte until it runs: its read timeout covers the whole set-up)
        async def engine_is(running: int, waiting: int) -> Callable[[], Any]:
            async def check() -> bool:
                return (await engine_metric(vllm_server, "vllm:num_requests_running") == running
                        and await engine_metric(vllm_server, "vllm:num_requests_waiting") == waiting)
            return check

        async def explain() -> str:
            running = await engine_metric(vllm_server, "vllm:num_requests_running")
            waiting = await engine_metric(vllm_server, "vllm:num_requests_waiting")
            return f"vLLM running {running:g}, waiting {waiting:g}; gateway /health: {await gateway_health(url)}"

        held: list[asyncio.Task[None]] = []

        def send(cls: str, n: int) -> tuple[list[asyncio.Task[None]], list[asyncio.Event]]:
            events = [asyncio.Event() for _ in range(n)]
            tasks = [asyncio.create_task(hold_stream(c, cls, long, e)) for e in events]
            held.extend(tasks)
            return tasks, events

        try:
            # vLLM may still be ending requests that earlier tests abandoned.
            await wait_for(await engine_is(0, 0), "vLLM to be idle", timeout_s=STEP_S, explain=explain)
            fill, _ = send("batch", 8)  # take every seat
            await wait_for(await engine_is(8, 0), "vLLM to run 8 batch requests", timeout_s=STEP_S * 2,
                           senders=fill, explain=explain)
            queued_batch, batch_started = send("batch", 4)
            await wait_for(await engine_is(8, 4), "4 batch requests to wait inside vLLM", timeout_s=STEP_S,
                           senders=held, explain=explain)
            queued_interactive, interactive_started = send("interactive", 4)
            await wait_for(await engine_is(8, 8), "4 interactive requests to wait inside vLLM", timeout_s=STEP_S,
                           senders=held, explain=explain)
            # Four seats free: vLLM fills them from its queue, and they stay taken.
            for f in fill[:4]:
                f.cancel()
            await wait_for(await engine_is(8, 4), "vLLM to take 4 queued requests", timeout_s=STEP_S,
                           senders=held, explain=explain)

            async def interactive_running() -> bool:
                return all(e.is_set() for e in interactive_started)

            await wait_for(interactive_running, "the 4 interactive requests to start", timeout_s=STEP_S,
                           senders=held, explain=explain)
            batch_ran = sum(e.is_set() for e in batch_started)
        finally:
            for t in held:
                t.cancel()
            await asyncio.gather(*held, return_exceptions=True)
    # Sent last, served first: vLLM saw priority 0 for interactive and 1 for batch.
    assert batch_ran == 0


async def test_kind_auto_finds_the_real_engine_and_treats_it_so(engine: EngineProcess) -> None:
    """No kind named: the gateway asks the server, and then translates and protects as for that
    kind (vLLM gets the class as `priority`; both can have a batch request suspended)."""
    cfg = config((engine, 4))
    cfg = cfg.model_copy(update={"backends": [b.model_copy(update={"kind": "auto"}) for b in cfg.backends]})
    async with gateway(cfg) as url, client(url) as c, asyncio.timeout(STEP_S * 2):
        name = cfg.backends[0].name

        async def detected() -> bool:
            return bool((await gateway_health(url))["backends"][name]["kind"] == engine.kind)
        await wait_for(detected, f"the gateway to detect {engine.kind}", timeout_s=STEP_S)
        h = (await gateway_health(url))["backends"][name]
        assert h["reserved_slots"] == 0  # a kind that can continue a generation needs no reservation
        out = await c.chat.completions.create(model=engine.model, messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=4, extra_headers={"X-Tailguard-Class": "batch"})
        assert out.choices[0].message.content is not None
        async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
            page = await r.text()
    assert f'tailguard_backend_kind{{backend="{name}",kind="{engine.kind}"}} 1.0' in page
