"""Bad input gets a clear OpenAI-style 4xx and the gateway keeps serving; upstream failures are
retried on another backend when nothing reached the client; deadlines answer 504 or end the
stream with an error event, and the engine's request is aborted."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from tailguard.config import BackendConfig
from tests.functional.gateways import dead_url, engine, gateway, health, sample, scrape, sim_running, until
from tests.functional.raw_servers import DONE_END, SSE_HEAD, TOK_EVENT, chunk, raw_server, read_request

CHAT = [{"role": "user", "content": "hello"}]


async def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/chat/completions", data=body,
                          headers={"Content-Type": "application/json", **(headers or {})}) as r:
            return r.status, orjson.loads(await r.read())


@pytest.mark.parametrize("body,headers,status,code,param", [
    (b"{not json", None, 400, "invalid_json", None),
    (b"[1, 2]", None, 400, "invalid_json", None),
    (orjson.dumps({"model": "tailguard-sim"}), None, 400, "missing_required_parameter", "messages"),
    (orjson.dumps({"model": "tailguard-sim", "messages": "hi"}), None, 400, "invalid_type", "messages"),
    (orjson.dumps({"model": "tailguard-sim", "messages": CHAT, "max_tokens": "10"}), None, 400, "invalid_type", "max_tokens"),
    (orjson.dumps({"model": "tailguard-sim", "messages": CHAT, "stream": "yes"}), None, 400, "invalid_type", "stream"),
    (orjson.dumps({"model": "tailguard-sim", "messages": CHAT}), {"X-Tailguard-Class": "vip"}, 400, "unknown_class",
     "X-Tailguard-Class"),
    (orjson.dumps({"model": "tailguard-sim", "messages": CHAT, "service_tier": "gold"}), None, 400, "invalid_value",
     "service_tier"),
    (orjson.dumps({"model": "tailguard-sim", "messages": [{"role": "user", "content": "x" * 5000}]}), None, 413,
     "body_too_large", None),
])
async def test_bad_input_is_an_openai_4xx_and_the_gateway_keeps_serving(
    body: bytes, headers: dict[str, str] | None, status: int, code: str, param: str | None,
) -> None:
    async with asyncio.timeout(20), gateway(max_body_bytes=4096) as gw:
        got, err = await _post(gw.url, body, headers)
        assert got == status
        assert set(err["error"]) == {"message", "type", "param", "code"}
        assert err["error"]["code"] == code and err["error"]["param"] == param
        assert err["error"]["message"]
        async with gw.client() as c:
            ok = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2)
        assert ok.choices[0].message.content == " tok tok"
        m = await scrape(gw.url)
    assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "success"}) == 1
    # Refused before it had a class: counted once, by status, with no placeholder class.
    assert sample(m, "tailguard_unclassified_requests_total", status=str(status)) == 1
    assert sum(v for (name, labels), v in m.items()
               if name == "tailguard_requests_total" and ("outcome", "client_error") in labels) == 0


async def test_unknown_route_and_method_are_openai_errors() -> None:
    async with asyncio.timeout(20), gateway() as gw, aiohttp.ClientSession() as s:
        async with s.get(f"{gw.url}/v1/nothing") as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
        async with s.get(f"{gw.url}/v1/chat/completions") as r:
            assert r.status == 405 and (await r.json())["error"]["code"] == "method_not_allowed"


async def test_upstream_4xx_is_passed_back_with_its_body() -> None:
    async with asyncio.timeout(20), gateway(engine_cfg=engine(max_model_len=1024, kv_cache_tokens=4096)) as gw, \
            gw.client() as c:
        with pytest.raises(openai.BadRequestError) as info:
            await c.chat.completions.create(model="tailguard-sim", messages=[{"role": "user", "content": "z" * 8000}],
                                            max_tokens=10)
        assert info.value.code == "context_length_exceeded"
        assert info.value.response.headers["x-tailguard-backend"] == "sim0"
        ok = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=1)
        assert ok.choices[0].message.content == " tok"


async def test_dead_backend_is_retried_on_the_other_one() -> None:
    # Said to serve the model: one whose models are not known yet is tried only after those known to
    # serve it (the simulator, once its /v1/models is read), and the race with that read decided the test.
    dead = BackendConfig(name="dead", url=dead_url(), kind="sim", models=["tailguard-sim"])
    async with asyncio.timeout(20), gateway(extra_backends=[dead]) as gw, gw.client() as c:
        raw = await c.chat.completions.with_raw_response.create(model="tailguard-sim", messages=CHAT, max_tokens=3)
        s = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3, stream=True)
        text = "".join([ch.choices[0].delta.content or "" async for ch in s if ch.choices])
        m = await scrape(gw.url)
    assert raw.headers["x-tailguard-backend"] == "sim0"
    assert raw.parse().choices[0].message.content == " tok" * 3
    assert text == " tok" * 3
    assert sample(m, "tailguard_upstream_errors_total", backend="dead", kind="connect") >= 1
    assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "success"}) == 2


async def test_without_retry_a_dead_backend_is_a_502() -> None:
    dead = BackendConfig(name="dead", url=dead_url(), kind="sim")
    async with asyncio.timeout(20), gateway(sims=0, extra_backends=[dead], retries={"max_attempts": 1}) as gw, \
            gw.client() as c:
        with pytest.raises(openai.APIStatusError) as info:
            await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3)
        m = await scrape(gw.url)
    assert info.value.status_code == 502
    assert info.value.response.json()["error"]["code"] == "connect"
    assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "upstream_error"}) == 1


async def test_no_healthy_backend_is_a_503_with_retry_after() -> None:
    dead = BackendConfig(name="dead", url=dead_url(), kind="sim")
    hc = {"unhealthy_after": 1, "interval_s": 0.05, "timeout_s": 0.5}
    async with asyncio.timeout(20), gateway(sims=0, extra_backends=[dead], health=hc) as gw, gw.client() as c:
        async def down() -> bool:
            return bool((await health(gw.url))["status"] == "unavailable")
        await until(down)
        with pytest.raises(openai.InternalServerError) as info:
            await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3)
        probe_error = (await health(gw.url))["backends"]["dead"]["probe_error"]
    assert probe_error.startswith("ClientConnectorError")  # /health says why the backend is out
    resp = info.value.response
    assert resp.status_code == 503
    assert resp.headers["x-tailguard-reject-reason"] == "no_healthy_backend"
    assert int(resp.headers["retry-after"]) >= 1


async def _streams_but_never_answers_probes(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    """An engine too loaded to answer its health page: every GET hangs, a POST streams 40
    content chunks 30 ms apart."""
    if not (await read_request(r)).startswith(b"POST"):
        await asyncio.sleep(3600)
    w.write(SSE_HEAD)
    for _ in range(40):
        w.write(chunk(TOK_EVENT))
        await w.drain()
        await asyncio.sleep(0.03)
    w.write(DONE_END)
    await w.drain()


async def test_probes_that_time_out_while_the_backend_streams_do_not_take_it_out() -> None:
    """Every probe times out, but while the backend streams to a request in flight it stays in;
    once it has nothing in flight, the same silence takes it out, and /health says why."""
    hc = {"unhealthy_after": 2, "interval_s": 0.05, "timeout_s": 0.3}
    async with asyncio.timeout(30), raw_server(_streams_but_never_answers_probes) as url, \
            gateway(sims=0, extra_backends=[BackendConfig(name="busy", url=url, kind="openai")], health=hc) as gw, \
            gw.client() as c:
        statuses: list[str] = []

        async def watch() -> None:
            while True:
                statuses.append((await health(gw.url))["status"])
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        stream = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=40, stream=True)
        texts = [ch.choices[0].delta.content async for ch in stream]
        watcher.cancel()

        async def down() -> bool:
            return bool((await health(gw.url))["status"] == "unavailable")
        await until(down)
        probe_error = (await health(gw.url))["backends"]["busy"]["probe_error"]
    assert texts == [" tok"] * 40
    # About 1.2 s of streaming, polled: its probes fail, so the gateway says it is degraded, but the
    # backend is never taken out while it streams.
    assert len(statuses) >= 10 and set(statuses) == {"degraded"}
    assert probe_error == "no answer within 0.3 s"


async def test_first_token_deadline_is_a_504_and_aborts_the_engine_request() -> None:
    # Real time: a 6,000-token prompt takes the engine about 100 ms of prefill, far past 20 ms.
    timeouts = {"first_token_s": 0.02}
    async with asyncio.timeout(20), gateway(scale=1.0, timeouts=timeouts) as gw, gw.client() as c:
        with pytest.raises(openai.APIStatusError) as info:
            await c.chat.completions.create(model="tailguard-sim", messages=[{"role": "user", "content": "p" * 24000}],
                                            max_tokens=5000)

        async def idle() -> bool:
            return await sim_running(gw.sims[0]) == 0
        await until(idle)
        m = await scrape(gw.url)
    assert info.value.status_code == 504
    assert info.value.response.json()["error"]["code"] == "timeout_first_token"
    assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "timeout"}) == 1
    assert sample(m, "tailguard_upstream_errors_total", backend="sim0", kind="timeout_first_token") == 1


async def test_idle_deadline_mid_stream_ends_it_with_an_error_event() -> None:
    # At time_scale 5 a decode step takes about 30 ms of wall time: longer than the 10 ms idle bound.
    timeouts = {"idle_s": 0.01, "first_token_s": 10.0}
    async with asyncio.timeout(20), gateway(scale=5.0, timeouts=timeouts) as gw, gw.client() as c:
        s = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=50, stream=True)
        got = 0
        with pytest.raises(openai.APIError) as info:
            async for ch in s:
                got += 1
        m = await scrape(gw.url)
    assert got >= 1  # the first token arrived before the stall
    assert "idle" in info.value.message
    assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "timeout"}) == 1


async def test_an_error_inside_the_gateway_mid_stream_ends_it_with_the_routes_error_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault in the gateway's own code after the first bytes went out (here: its relay failing
    as the stream ends) reaches the client as the route's error event, in OpenAI's and Anthropic's
    shape, not as a stream that ends cleanly but short; the gateway answers the next request."""
    import anthropic

    from tailguard.gateway.upstream.stream import StreamRelay

    async def broken_end(self: StreamRelay, data: bytes) -> None:
        raise RuntimeError("a fault in the relay")

    monkeypatch.setattr(StreamRelay, "_end", broken_end)
    async with asyncio.timeout(20), gateway() as gw, gw.client() as c, \
            anthropic.AsyncAnthropic(base_url=gw.url, api_key="k", max_retries=0) as a:
        s = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=8, stream=True)
        got = []
        with pytest.raises(openai.APIError) as info:
            async for ch in s:
                got.append(ch)
        assert got and "Internal gateway error" in info.value.message
        with pytest.raises(anthropic.APIStatusError) as ant:
            async with a.messages.stream(model="tailguard-sim", max_tokens=8, messages=CHAT) as ms:
                async for _ in ms:
                    pass
        assert "Internal gateway error" in str(ant.value)
        monkeypatch.undo()
        r = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4)
        m = await scrape(gw.url)
    assert r.choices[0].message.content
    assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "upstream_error"}) == 2
