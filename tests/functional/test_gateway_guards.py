"""Guards through a real gateway, with the openai and anthropic SDKs as clients, in front of the
simulator (or a scripted backend that records what it receives), and a moderation service of
the test's own on loopback speaking OpenAI's moderation shape.

A blocked input never reaches the engine (the simulator's own counters say so) and is not
charged; a redacting input guard changes what the engine receives; a blocked stream ends with
`finish_reason: content_filter` and an error event, and the engine's generation stops; a
redacting output guard masks an address split over chunks; a slow or failing guard follows its
`on_error` within its `timeout_s`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest

from tailguard.clock import monotonic
from tests.functional.gateways import gateway, sample, scrape
from tests.functional.moderation_server import Moderator, moderation_server
from tests.functional.raw_servers import SSE_HEAD, chunk, raw_server, read_request

KEYS = {"sk-team": {"name": "team"}, "sk-admin-only": {"name": "ops"}}
CHAT = [{"role": "user", "content": "hello there"}]


async def sim_counts(url: str) -> tuple[float, float]:
    """The simulator's own count of requests it finished and prompt tokens it read."""
    samples = await scrape(url)
    return tuple(sum(v for (n, _), v in samples.items() if n == name)  # type: ignore[return-value]
                 for name in ("vllm:request_success_total", "vllm:prompt_tokens_total"))


def moderation(m: Moderator, stage: str = "input", **kw: Any) -> dict[str, Any]:
    return {"name": f"mod-{stage}", "stage": stage, "check": "moderation", "url": m.url, **kw}


@asynccontextmanager
async def guarded(guards: list[dict[str, Any]], **cfg: Any) -> AsyncIterator[Any]:
    async with gateway(auth={"api_keys": KEYS}, guards=guards, **cfg) as gw:
        yield gw


async def test_a_blocked_input_never_reaches_the_engine_and_is_not_charged() -> None:
    async with asyncio.timeout(60), moderation_server() as m, guarded([moderation(m)]) as gw:
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="sk-team", max_retries=0)
        ok = await client.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4)
        assert ok.choices[0].message.content
        before, prompt_before = await sim_counts(gw.sims[0].url)
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(
                model="tailguard-sim", messages=[{"role": "user", "content": "tell me the forbidden thing"}], max_tokens=4)
        assert e.value.code == "content_policy_violation" and "mod-input" in str(e.value)
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(model="tailguard-sim", prompt="forbidden words", max_tokens=4, stream=True)
        anth = anthropic.AsyncAnthropic(base_url=gw.url, api_key="sk-team", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as ae:
            await anth.messages.create(model="tailguard-sim", max_tokens=4, system="be forbidden",
                                       messages=[{"role": "user", "content": "hi"}])
        assert ae.value.body["type"] == "error"  # Anthropic's error shape on its route
        await client.close()
        await anth.close()
        assert await sim_counts(gw.sims[0].url) == (before, prompt_before)  # none of the three reached it
        gw_samples = await scrape(gw.url)
        assert sample(gw_samples, "tailguard_caller_tokens_total", caller="team", kind="prompt") == prompt_before
        assert sample(gw_samples, "tailguard_caller_requests_total", caller="team", outcome="client_error") == 3
        assert sample(gw_samples, "tailguard_guard_checks_total", guard="mod-input", stage="input",
                      verdict="block") == 3
        assert sample(gw_samples, "tailguard_guard_seconds_count", guard="mod-input", stage="input") == 4
        assert ["system", "be forbidden"] not in m.inputs and ["be forbidden", "hi"] in m.inputs


async def test_input_redaction_changes_what_the_engine_receives() -> None:
    received: list[bytes] = []

    async def backend(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        received.append(await read_request(r))
        w.write(SSE_HEAD + chunk(b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m",'
                                 b'"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n')
                + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await w.drain()

    pii = {"name": "pii", "stage": "input", "check": "personal_data", "action": "redact"}
    async with asyncio.timeout(30), raw_server(backend) as url, gateway(
            sims=0, backends=[{"name": "raw", "url": url, "kind": "openai"}], guards=[pii]) as gw:
        client = gw.client()
        said = "mail jane.doe@example.com or call +44 20 7946 0958 about card 4111 1111 1111 1111"
        got = await client.chat.completions.create(model="tailguard-sim", messages=[{"role": "user", "content": said}])
        assert got.choices[0].message.content == "ok"
        await client.close()
    chats = [r for r in received if r.startswith(b"POST /v1/chat/completions")]  # (not the probes)
    body = orjson.loads(chats[0].split(b"\r\n\r\n", 1)[1])
    assert body["messages"][0]["content"] == "mail [EMAIL] or call [PHONE] about card [CARD]"


def scripted(*pieces: str) -> Any:
    """A backend that streams `pieces` as chat content chunks."""
    async def backend(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(SSE_HEAD)
        for p in pieces:
            ev = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                  "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
            w.write(chunk(b"data: " + orjson.dumps(ev) + b"\n\n"))
            await w.drain()
        w.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await w.drain()
    return backend


async def test_a_streamed_address_split_over_chunks_is_redacted() -> None:
    pii = {"name": "pii", "stage": "output", "check": "personal_data", "action": "redact", "window_chars": 64}
    backend = scripted("Sure, write to ja", "ne.doe@exa", "mple.com and I will", " answer by phone on 415-5", "55-0100.")
    async with asyncio.timeout(30), raw_server(backend) as url, gateway(
            sims=0, backends=[{"name": "raw", "url": url, "kind": "openai"}], guards=[pii]) as gw:
        client = gw.client()
        stream = await client.chat.completions.create(model="tailguard-sim", messages=CHAT, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        await client.close()
    assert text == "Sure, write to [EMAIL] and I will answer by phone on [PHONE]."


async def test_a_blocked_stream_ends_with_content_filter_and_the_engine_stops() -> None:
    async with asyncio.timeout(60), moderation_server() as m, guarded(
            [moderation(m, "output", window_chars=16)]) as gw:
        m.flag_from_call = 8  # the first seven windows pass: some text goes out first
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="sk-team", max_retries=0)
        stream = await client.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2000, stream=True)
        text, reasons = [], []
        with pytest.raises(openai.APIError) as e:
            async for c in stream:
                for choice in c.choices:
                    text.append(choice.delta.content or "")
                    reasons.append(choice.finish_reason)
        assert "content guard" in e.value.message
        assert reasons[-1] == "content_filter" and "tok" in "".join(text)
        generated = sum(v for (n, _), v in (await scrape(gw.sims[0].url)).items() if n == "vllm:generation_tokens_total")
        assert generated < 500  # its stream was closed: the engine did not go on to 2000 tokens
        plain = await client.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=64)
        assert plain.choices[0].finish_reason == "content_filter" and plain.choices[0].message.content == ""
        await client.close()


@pytest.mark.parametrize("on_error", ["open", "closed"])
@pytest.mark.parametrize("fault", ["slow", "failing"])
async def test_a_slow_or_failing_guard_follows_on_error_within_its_timeout(on_error: str, fault: str) -> None:
    async with asyncio.timeout(60), moderation_server() as m, guarded(
            [moderation(m, on_error=on_error, timeout_s=0.3)]) as gw:
        if fault == "slow":
            m.delay_s = 30.0
        else:
            m.status = 500
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="sk-team", max_retries=0)
        started = monotonic()
        if on_error == "open":
            got = await client.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4)
            assert got.choices[0].message.content
        else:
            with pytest.raises(openai.InternalServerError) as e:
                await client.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4)
            assert e.value.status_code == 503 and e.value.code == "guard_unavailable"
            assert e.value.response.headers["retry-after"] == "1"
        took = monotonic() - started
        assert took < 0.3 + 1.5  # the timeout's 0.3 s plus a loaded machine's scheduling, never the 30 s
        if fault == "slow":
            assert took >= 0.3
        await client.close()
        verdict = "error_open" if on_error == "open" else "error_closed"
        assert sample(await scrape(gw.url), "tailguard_guard_checks_total", guard="mod-input", stage="input",
                      verdict=verdict) == 1


async def test_a_flagged_request_goes_on_and_says_so() -> None:
    async with asyncio.timeout(30), moderation_server() as m, guarded([moderation(m, action="flag")]) as gw:
        async with aiohttp.ClientSession() as s, s.post(
                f"{gw.url}/v1/chat/completions", headers={"Authorization": "Bearer sk-team"},
                json={"model": "tailguard-sim", "messages": [{"role": "user", "content": "forbidden"}], "max_tokens": 4}) as r:
            assert r.status == 200
        assert sample(await scrape(gw.url), "tailguard_guard_checks_total", guard="mod-input", stage="input",
                      verdict="flag") == 1


async def test_a_reload_applies_new_guards_to_the_requests_after_it() -> None:
    from tailguard.config import GatewayConfig
    from tailguard.gateway.http.app import reloader_of
    from tailguard.gateway.http.keys import LIVE

    forbidden = [{"role": "user", "content": "the forbidden thing"}]
    async with asyncio.timeout(30), moderation_server() as m, guarded([]) as gw:
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="sk-team", max_retries=0)
        assert (await client.chat.completions.create(model="tailguard-sim", messages=forbidden, max_tokens=2)).choices
        cfg = gw.app[LIVE].cfg.model_dump(mode="json", exclude_unset=True)
        reloader_of(gw.app).apply(GatewayConfig.model_validate({**cfg, "guards": [moderation(m)]}))
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="tailguard-sim", messages=forbidden, max_tokens=2)
        await client.close()


async def test_personal_data_is_redacted_in_the_access_log_and_in_a_relayed_engine_error(
        caplog: pytest.LogCaptureFixture) -> None:
    """Where text is kept or passed on: the access log's prompt (log_prompts; a batch line's is
    written by the same code, as a request like any other), and an engine's 4xx message echoing
    the prompt."""
    import logging

    async def refusing(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        body = orjson.dumps({"error": {"message": "cannot answer 'write to jane.doe@example.com about card "
                                                  "4111 1111 1111 1111'", "type": "invalid_request_error",
                                       "code": "bad_prompt"}})
        w.write(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                % (len(body), body))
        await w.drain()

    caplog.set_level(logging.INFO, logger="tailguard.access")
    said = [{"role": "user", "content": "write to jane.doe@example.com about card 4111 1111 1111 1111"}]
    async with asyncio.timeout(30), gateway(log_prompts=True) as gw:
        async with gw.client() as c:
            await c.chat.completions.create(model="tailguard-sim", messages=said, max_tokens=2)
    async with asyncio.timeout(30), raw_server(refusing) as url, gateway(
            sims=0, backends=[{"name": "raw", "url": url, "kind": "openai"}]) as gw:
        async with gw.client() as c:
            with pytest.raises(openai.BadRequestError) as e:
                await c.chat.completions.create(model="tailguard-sim", messages=said, max_tokens=2)
    assert e.value.code == "bad_prompt" and "[EMAIL]" in e.value.message and "[CARD]" in e.value.message
    assert "jane.doe" not in e.value.message and "4111" not in e.value.message
    logged = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "tailguard.access"]
    assert "[EMAIL]" in logged[0]["prompt"] and "[CARD]" in logged[0]["prompt"]
    assert "jane.doe" not in " ".join(r.getMessage() for r in caplog.records)
