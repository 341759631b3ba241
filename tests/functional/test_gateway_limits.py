"""Callers' limits through the real gateway and the real `openai` client: a key over its
requests per minute gets OpenAI's own 429 (type `requests`, code `rate_limit_exceeded`) with the
wait in `retry-after-ms`, which the SDK's retry reads; another key is not held up; every request
is metered by caller. The limits are slow next to the requests, so no machine is too slow for them."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from tests.functional.gateways import gateway, sample, scrape, until

CHAT = [{"role": "user", "content": "hi"}]
RPM = 4  # a burst of 4, then one every 15 s: far slower than any machine sends the burst


async def metered(url: str, caller: str, kind: str = "output") -> float:
    """A caller's metered tokens. A request is metered (and charged) as its handler ends, a moment
    after its client has read the last byte: tests wait for it rather than race it."""
    return sample(await scrape(url), "tailguard_caller_tokens_total", caller=caller, kind=kind)


async def test_a_caller_over_its_rpm_gets_openais_429_with_the_wait_to_the_millisecond() -> None:
    keys = {"sk-app": {"name": "app", "rpm_limit": RPM}, "sk-web": {"name": "web"}}
    async with asyncio.timeout(30), gateway(auth={"api_keys": keys}) as gw, \
            AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="sk-app", max_retries=0) as app, \
            AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="sk-web", max_retries=0) as web:
        left = []
        for _ in range(RPM):
            raw = await app.chat.completions.with_raw_response.create(model="tailguard-sim", messages=CHAT, max_tokens=1)
            assert raw.headers["x-ratelimit-limit-requests"] == str(RPM)
            left.append(int(raw.headers["x-ratelimit-remaining-requests"]))
        assert left == [3, 2, 1, 0]  # OpenAI's x-ratelimit-* headers, as a client's own throttle reads them

        with pytest.raises(openai.RateLimitError) as over:
            await app.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=1)
        err = over.value
        assert err.status_code == 429 and err.code == "rate_limit_exceeded" and err.type == "requests"
        # OpenAI's words: which limit, its use, and when to try again.
        assert err.body["message"].startswith(  # type: ignore[index]
            "Rate limit reached for caller 'app' on requests per min (RPM): Limit 4, Used 4. Please try again in 1")
        headers = err.response.headers
        assert headers["x-tailguard-reject-reason"] == "rate_limit_requests"
        wait_ms = int(headers["retry-after-ms"])  # what the openai SDK's own retry waits
        assert 10_000 < wait_ms <= 15_000 and int(headers["retry-after"]) == -(-wait_ms // 1000)
        assert headers["x-ratelimit-remaining-requests"] == "0" and headers["x-ratelimit-reset-requests"].endswith("s")

        assert (await web.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=1)).choices  # not held up

        async def web_metered() -> bool:
            return await metered(gw.url, "web") == 1
        await until(web_metered, step_s=0.01)
        metrics = await scrape(gw.url)
    assert sample(metrics, "tailguard_caller_requests_total", caller="app", outcome="success") == RPM
    assert sample(metrics, "tailguard_caller_requests_total", caller="app", outcome="rejected") == 1
    assert sample(metrics, "tailguard_caller_requests_total", caller="web", outcome="success") == 1
    assert sample(metrics, "tailguard_caller_tokens_total", caller="web", kind="output") == 1
    # Each request that ran costs its prompt; the refused one cost nothing.
    prompt = sample(metrics, "tailguard_caller_tokens_total", caller="web", kind="prompt")
    assert prompt > 0 and sample(metrics, "tailguard_caller_tokens_total", caller="app", kind="prompt") == prompt * RPM
    assert sample(metrics, "tailguard_prompt_tokens_total", **{"class": "interactive"}) == prompt * (RPM + 1)
    assert sample(metrics, "tailguard_rejected_total", **{"class": "interactive", "reason": "rate_limit_requests"}) == 1


async def test_a_caller_in_token_debt_waits_for_a_full_bucket() -> None:
    keys = {"sk-reports": {"name": "reports", "tpm_limit": 600}}  # 10 tokens a second
    async with asyncio.timeout(30), gateway(auth={"api_keys": keys}) as gw, aiohttp.ClientSession() as s:
        body = {"model": "tailguard-sim", "messages": CHAT, "max_tokens": 700}  # more than the minute's worth
        head = {"Authorization": "Bearer sk-reports"}
        async with s.post(f"{gw.url}/v1/chat/completions", json=body, headers=head) as r:
            assert r.status == 200  # a full bucket: it may start, taking it all and the rest as debt
            usage = (await r.json())["usage"]

        async def charged() -> bool:
            return await metered(gw.url, "reports") > 0
        await until(charged, step_s=0.01)
        async with s.post(f"{gw.url}/v1/chat/completions", json=body, headers=head) as r:
            answer = await r.json()
            assert r.status == 429 and answer["error"]["type"] == "tokens", answer
            # It needs the whole bucket again: what was used, at 10 a second.
            used = usage["prompt_tokens"] + usage["completion_tokens"]
            assert float(r.headers["retry-after-ms"]) == pytest.approx(used / 10 * 1000, rel=0.1)
