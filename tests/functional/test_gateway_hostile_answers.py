"""A backend whose answer is not what was asked, through a real gateway, with the SDKs clients use
(openai for chat, completions and the Responses API, anthropic for Messages): content past the
request's `max_tokens` (a stream that never ends, events of half a MiB, a usage count that lies)
and a 200 of another kind (gzip'd JSON to a stream request, an SSE stream to a non-stream one).

Each is ended at its bound with the route's own error (a stream: the event that says it ended at
its length, then an error event; a non-stream answer: a 502 `protocol` naming the backend), the
gateway's memory stays within a budget, and the caller is metered and charged at most what it
asked (`/admin/usage`, its `tpm_limit`, the access log), the rest counted as the backend's fault
(`tailguard_upstream_overrun_tokens_total`)."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest

from tailguard.config import BackendConfig
from tailguard.gateway.ops.access import ACCESS_LOGGER
from tests.functional.gateways import Stack, gateway, sample, scrape
from tests.functional.hostile_backend import hostile, rss

MiB = 1024 * 1024
BUDGET = 64 * MiB  # what one attack may add to the gateway's RSS (the gateway runs in this process)
APP, ADMIN = "sk-app-0123456789", "sk-admin-0123456789"
# A caller whose tokens per minute would be spent for a while by one request charged past its
# max_tokens (the endless stream used to be metered a million tokens for `max_tokens: 5`).
AUTH = {"api_keys": {APP: {"name": "app", "tpm_limit": 300}}, "admin_keys": [ADMIN]}
MSGS: Any = [{"role": "user", "content": "hi"}]
ROUTES = ("chat", "completions", "responses", "messages")


@pytest.fixture
def access(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    return caplog


def _access(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [orjson.loads(r.getMessage()) for r in caplog.records if r.name == ACCESS_LOGGER]


@asynccontextmanager
async def _evil(case: str, models: tuple[str, ...] = ("evil",), **cfg: Any) -> AsyncIterator[Stack]:
    """A gateway in front of the hostile backend `case` (serving `models`) and a simulator, with a
    metered, token-limited client key and an admin key; retries off unless `cfg` says."""
    async with hostile(case) as url:
        evil = BackendConfig(name="evil", url=url, kind="openai", max_concurrency=4, models=list(models))
        cfg.setdefault("retries", {"max_attempts": 1})
        async with gateway(extra_backends=[evil], auth=AUTH, **cfg) as gw:
            yield gw


async def _usage(gw: Stack) -> dict[str, Any]:
    """The caller's row of `/admin/usage` (model `evil`)."""
    async with aiohttp.ClientSession() as s, \
            s.get(f"{gw.url}/admin/usage", headers={"Authorization": f"Bearer {ADMIN}"}) as r:
        rows = (await r.json())["data"]
    [row] = [r for r in rows if r["caller"] == "app" and r["model"] == "evil"]
    return row


async def _stream(gw: Stack, route: str) -> tuple[list[Any], BaseException | None]:
    """A streamed request of `max_tokens: 5` to model `evil` by the route's SDK: what it yielded,
    and what it raised at the end (None: nothing)."""
    got: list[Any] = []
    try:
        if route == "messages":
            async with anthropic.AsyncAnthropic(base_url=gw.url, api_key=APP, max_retries=0) as a:
                async for ev in await a.messages.create(model="evil", max_tokens=5, messages=MSGS, stream=True):
                    got.append(ev)
            return got, None
        async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=APP, max_retries=0) as c:
            if route == "chat":
                stream: Any = await c.chat.completions.create(model="evil", messages=MSGS, max_tokens=5, stream=True)
            elif route == "completions":
                stream = await c.completions.create(model="evil", prompt="hi", max_tokens=5, stream=True)
            else:
                stream = await c.responses.create(model="evil", input="hi", max_output_tokens=5, stream=True)
            async for ev in stream:
                got.append(ev)
        return got, None
    except (openai.APIError, anthropic.APIError) as e:
        return got, e


async def _whole(gw: Stack, route: str) -> tuple[int, dict[str, Any]]:
    """A non-stream request of `max_tokens: 5` to model `evil`, its status and JSON body."""
    path, body = {
        "chat": ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 5}),
        "completions": ("/v1/completions", {"prompt": "hi", "max_tokens": 5}),
        "responses": ("/v1/responses", {"input": "hi", "max_output_tokens": 5}),
        "messages": ("/v1/messages", {"messages": MSGS, "max_tokens": 5}),
    }[route]
    async with aiohttp.ClientSession() as s, s.post(f"{gw.url}{path}", json={"model": "evil", **body},
                                                    headers={"Authorization": f"Bearer {APP}"}) as r:
        return r.status, await r.json()


def _message(body: dict[str, Any]) -> str:
    """An error body's message, OpenAI's shape or Anthropic's."""
    return str(body["error"]["message"])


def _content_events(route: str, got: list[Any]) -> int:
    if route == "chat":
        return sum(1 for c in got if c.choices and c.choices[0].delta.content)
    if route == "completions":
        return sum(1 for c in got if c.choices and c.choices[0].text)
    if route == "responses":
        return sum(1 for e in got if e.type == "response.output_text.delta")
    return sum(1 for e in got if e.type == "content_block_delta")


def _ended_at_length(route: str, got: list[Any], err: BaseException | None) -> str:
    """The event that says the answer ended at its length, and the error that followed: the error's text."""
    if route in ("chat", "completions"):
        assert got[-1].choices[0].finish_reason == "length" and isinstance(err, openai.APIError)
        return str(err.message)
    if route == "responses":
        assert err is None and got[-2].type == "response.incomplete" and got[-1].type == "error"
        assert got[-2].response.incomplete_details.reason == "max_output_tokens"
        assert got[-1].code == "protocol"
        return str(got[-1].message)
    assert got[-1].type == "message_delta" and got[-1].delta.stop_reason == "max_tokens"
    assert isinstance(err, anthropic.APIError)
    return str(err.message)


async def _after(gw: Stack) -> None:
    """The caller is not in debt: a normal chat of its key gets in (its `tpm_limit` would refuse it
    had it been charged past its max_tokens)."""
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=APP, max_retries=0) as c:
        done = await c.chat.completions.create(model="tailguard-sim", messages=MSGS, max_tokens=2)
    assert done.choices[0].message.content


@pytest.mark.parametrize("route", ROUTES)
async def test_a_flood_past_max_tokens_before_the_stream_began_is_a_502(route: str,
                                                                       access: pytest.LogCaptureFixture) -> None:
    """Hundreds of content events in the first read: past the bound before anything reached the
    client, so the client gets a 502 (another backend would be tried) and its caller pays nothing."""
    async with asyncio.timeout(60), _evil("post-content") as gw:
        gc.collect()
        base = rss()
        got, err = await _stream(gw, route)
        assert rss() - base < BUDGET
        assert got == [] and err is not None and getattr(err, "status_code", None) == 502
        assert "content events, past max_tokens 5" in str(err.message), err
        assert (await _usage(gw))["output_tokens"] == 0
        await _after(gw)
    [line] = [a for a in _access(access) if a["model"] == "evil"]
    assert (line["status"], line["outcome"], line["reason"]) == (502, "upstream_error", "protocol")


@pytest.mark.parametrize("route", ROUTES)
async def test_a_stream_that_never_ends_is_cut_at_its_max_tokens(route: str, access: pytest.LogCaptureFixture) -> None:
    """One content event a millisecond, for ever: the client gets its max_tokens and the margin,
    then the event that says the answer ended at its length and an error event; its caller pays 5."""
    async with asyncio.timeout(60), _evil("post-trickle") as gw:
        gc.collect()
        base = rss()
        got, err = await _stream(gw, route)
        grown = rss() - base
        said = _ended_at_length(route, got, err)
        assert "Backend 'evil' sent 22 content events, past max_tokens 5" in said, said
        assert 5 <= _content_events(route, got) <= 21  # the margin (16) passed, never the 22nd
        assert grown < BUDGET
        assert (await _usage(gw))["output_tokens"] == 5
        m = await scrape(gw.url)
        await _after(gw)
    assert sample(m, "tailguard_upstream_errors_total", backend="evil", kind="protocol") == 1
    assert sample(m, "tailguard_upstream_overrun_tokens_total", backend="evil") >= 17
    [line] = [a for a in _access(access) if a["model"] == "evil"]
    assert (line["status"], line["outcome"], line["reason"], line["output_tokens"]) == (200, "upstream_error",
                                                                                        "protocol", 5)
    assert line["overrun_tokens"] >= 17


@pytest.mark.parametrize("route", ["chat", "completions"])
async def test_a_non_stream_answer_past_its_max_tokens_is_a_502(route: str) -> None:
    """Assembled from a stream that never ends: cut at the bound, the caller charged 5."""
    async with asyncio.timeout(60), _evil("post-content") as gw:
        status, body = await _whole(gw, route)
        assert status == 502 and body["error"]["code"] == "protocol"
        assert "Backend 'evil' sent 22 content events, past max_tokens 5" in _message(body)
        assert (await _usage(gw))["output_tokens"] == 5
        await _after(gw)


@pytest.mark.parametrize("route", ["chat", "responses", "messages"])
async def test_events_of_half_a_mib_are_cut_at_the_bytes_max_tokens_allows(route: str) -> None:
    """Three events carry more than 5 tokens' bytes may (1 MiB and 4 KiB a token): the bytes
    bound ends the stream where the token count would not yet."""
    async with asyncio.timeout(60), _evil("post-big-events") as gw:
        gc.collect()
        base = rss()
        got, err = await _stream(gw, route)
        grown = rss() - base
        said = str(got[-1].message) if route == "responses" else str(getattr(err, "message", err))
        assert "Backend 'evil' sent over" in said and "answer_bytes_per_token" in said, said
        assert _content_events(route, got) <= 3
        assert grown < BUDGET
        await _after(gw)


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("route", ["chat", "responses", "messages"])
async def test_a_usage_that_lies_is_charged_at_most_max_tokens(route: str, stream: bool,
                                                               access: pytest.LogCaptureFixture) -> None:
    """Three tokens and a usage of a million (the non-stream routes' answer is an SSE stream, not
    their JSON: a 502; chat's is assembled): the answer stands where it can, the caller pays 5."""
    async with asyncio.timeout(60), _evil("post-lying-usage") as gw:
        if stream:
            got, err = await _stream(gw, route)
            assert err is None and _content_events(route, got) == 3
        else:
            status, body = await _whole(gw, route)
            assert status == (200 if route == "chat" else 502), body
        assert (await _usage(gw))["output_tokens"] == (5 if stream or route == "chat" else 0)
        m = await scrape(gw.url)
        await _after(gw)
    if stream or route == "chat":
        assert sample(m, "tailguard_upstream_overrun_tokens_total", backend="evil") == 999_995
        [line] = [a for a in _access(access) if a["model"] == "evil"]
        assert (line["outcome"], line["output_tokens"], line["overrun_tokens"]) == ("success", 5, 999_995)


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("route", ["chat", "responses", "messages"])
async def test_a_200_that_is_not_what_was_asked_is_a_502_naming_the_backend(
        route: str, stream: bool, access: pytest.LogCaptureFixture) -> None:
    """gzip'd JSON whatever was asked (a stream or not): never relayed, never a success."""
    async with asyncio.timeout(60), _evil("post-gzip-json") as gw:
        if stream:
            got, err = await _stream(gw, route)
            assert got == [] and err is not None and getattr(err, "status_code", None) == 502
            said = str(err.message)
        else:
            status, body = await _whole(gw, route)
            assert status == 502
            said = _message(body)
        assert "Backend 'evil' answered a" in said and "Content-Encoding 'gzip'" in said, said
        m = await scrape(gw.url)
    assert sample(m, "tailguard_upstream_errors_total", backend="evil", kind="protocol") == 1
    [line] = [a for a in _access(access) if a["model"] == "evil"]
    assert (line["status"], line["outcome"], line["reason"]) == (502, "upstream_error", "protocol")


@pytest.mark.parametrize("route", ["responses", "messages"])
async def test_a_non_stream_call_answered_with_a_stream_is_a_502(route: str) -> None:
    async with asyncio.timeout(60), _evil("post-content") as gw:
        status, body = await _whole(gw, route)
        assert status == 502
        assert "answered a non-stream request with Content-Type 'text/event-stream'" in _message(body)


async def test_a_whole_answer_that_never_ends_is_cut_at_the_bytes_max_tokens_allows() -> None:
    async with asyncio.timeout(60), _evil("post-endless-json") as gw:
        gc.collect()
        base = rss()
        status, body = await _whole(gw, "responses")
        assert status == 502 and "answer_bytes_per_token" in _message(body)
        assert rss() - base < BUDGET


async def test_a_stream_answered_with_gzip_json_goes_to_another_backend() -> None:
    """The hostile backend serves the simulator's model too: a request it takes fails there
    before anything reached the client, and is answered by the simulator."""
    async with asyncio.timeout(60), _evil("post-gzip-json", models=("tailguard-sim",),
                                          retries={"max_attempts": 2}, routing={"policy": "round-robin"}) as gw, \
            openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=APP, max_retries=0) as c:
        for i in range(4):
            raw = await c.chat.completions.with_raw_response.create(
                model="tailguard-sim", messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=2, stream=True)
            assert raw.headers["x-tailguard-backend"] == "sim0"
            assert [ch async for ch in raw.parse()]
        m = await scrape(gw.url)
    assert sample(m, "tailguard_upstream_errors_total", backend="evil", kind="protocol") >= 1
    assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "success"}) >= 4
