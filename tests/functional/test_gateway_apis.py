"""Every API a client sends, with the clients people use: the openai SDK's Responses API
(streamed and not), embeddings and `models.retrieve`, and the anthropic SDK's Messages API
(`messages.create`, `messages.stream`), each through a real gateway in front of the simulator:
content, usage, class, metering and the access log; and what an unknown route is told."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest
from aiohttp import web

from tailguard.config import BackendConfig
from tailguard.gateway.ops.access import ACCESS_LOGGER
from tests.functional.gateways import classes, gateway, sample, scrape
from tests.servers import running

MODEL = "tailguard-sim"
BATCH = {"X-Tailguard-Class": "batch"}


def _access(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [orjson.loads(r.getMessage()) for r in caplog.records if r.name == ACCESS_LOGGER]


@pytest.fixture
def access(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    return caplog


async def test_the_responses_api_streamed_and_not(access: pytest.LogCaptureFixture) -> None:
    async with asyncio.timeout(30), gateway(classes=classes(batch={"max_tokens_cap": 6})) as gw, \
            gw.client() as c:
        raw = await c.responses.with_raw_response.create(model=MODEL, input="hello there", max_output_tokens=5)
        whole = raw.parse()
        assert raw.headers["x-tailguard-class"] == "interactive"
        assert whole.output_text == " tok" * 5 and whole.usage is not None
        assert (whole.usage.input_tokens, whole.usage.output_tokens) == (7, 5)
        # max_output_tokens is capped per class as max_tokens is: batch's cap of 6 clamps 50.
        stream = await c.responses.create(model=MODEL, input=[{"role": "user", "content": "hello there"}],
                                          max_output_tokens=50, stream=True, extra_headers=BATCH)
        types, text, final = [], "", None
        async for ev in stream:
            types.append(ev.type)
            if ev.type == "response.output_text.delta":
                text += ev.delta
            if ev.type in ("response.completed", "response.incomplete"):
                final = ev.response
        assert types[0] == "response.created" and types[-1] == "response.incomplete"
        assert text == " tok" * 6 and final is not None and final.usage is not None
        assert final.usage.output_tokens == 6
        m = await scrape(gw.url)
    assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "success"}) == 1
    assert sample(m, "tailguard_requests_total", **{"class": "batch", "outcome": "success"}) == 1
    assert sample(m, "tailguard_output_tokens_total", **{"class": "interactive"}) == 5
    assert sample(m, "tailguard_output_tokens_total", **{"class": "batch"}) == 6
    assert sample(m, "tailguard_ttft_seconds_count", **{"class": "batch"}) == 1
    assert sample(m, "tailguard_itl_seconds_count", **{"class": "batch"}) == 5  # gaps between its 6 deltas
    lines = [(a["path"], a["class"], a["status"], a["output_tokens"]) for a in _access(access)]
    assert lines == [("/v1/responses", "interactive", 200, 5), ("/v1/responses", "batch", 200, 6)]


async def test_the_messages_api_with_the_anthropic_sdk(access: pytest.LogCaptureFixture) -> None:
    keys = {"auth": {"api_keys": {"sk-app": {"name": "app"}}}}
    async with asyncio.timeout(30), gateway(**keys) as gw, \
            anthropic.AsyncAnthropic(base_url=gw.url, api_key="sk-app", max_retries=0) as a:
        msgs: Any = [{"role": "user", "content": "hi"}]
        whole = await a.messages.create(model=MODEL, max_tokens=4, messages=msgs, system="be brief")
        assert [b.text for b in whole.content if b.type == "text"] == [" tok" * 4]
        assert (whole.usage.input_tokens, whole.usage.output_tokens, whole.stop_reason) == (7, 4, "max_tokens")  # "be brief" (2) + "hi" (1) + 4 per message
        async with a.messages.stream(model=MODEL, max_tokens=3, messages=msgs) as stream:
            pieces = [t async for t in stream.text_stream]
            final = await stream.get_final_message()
        assert pieces == [" tok"] * 3 and final.usage.output_tokens == 3
        # Errors on this route are Anthropic's shape, which the SDK turns into its own exceptions.
        with pytest.raises(anthropic.BadRequestError) as bad:
            await a.messages.create(model=MODEL, max_tokens=0, messages=msgs)
        assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        async with anthropic.AsyncAnthropic(base_url=gw.url, api_key="sk-nobody", max_retries=0) as stranger:
            with pytest.raises(anthropic.AuthenticationError):
                await stranger.messages.create(model=MODEL, max_tokens=2, messages=msgs)
        m = await scrape(gw.url)
    assert sample(m, "tailguard_caller_requests_total", caller="app", outcome="success") == 2
    assert sample(m, "tailguard_output_tokens_total", **{"class": "interactive"}) == 7
    ok = [a for a in _access(access) if a["status"] == 200]
    assert [(a["path"], a["caller"], a["output_tokens"]) for a in ok] == [("/v1/messages", "app", 4),
                                                                          ("/v1/messages", "app", 3)]


async def test_a_model_the_only_backend_does_not_list_is_a_404_on_every_route() -> None:
    """A fleet of one model: a name it does not list gets OpenAI's 404 `model_not_found` on chat
    (with the names served), Anthropic's 404 on /v1/messages, and /v1/models/{id} agrees, as in a
    fleet of several models; the name it lists is served."""
    import openai

    async with asyncio.timeout(30), gateway() as gw, gw.client() as c, \
            anthropic.AsyncAnthropic(base_url=gw.url, api_key="k", max_retries=0) as a:
        assert [m.id for m in (await c.models.list()).data] == [MODEL]  # its models are known from here on
        with pytest.raises(openai.NotFoundError) as chat:
            await c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert chat.value.code == "model_not_found" and f"Served here: {MODEL}." in chat.value.message
        with pytest.raises(anthropic.NotFoundError):
            await a.messages.create(model="nope", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.NotFoundError):
            await c.models.retrieve("nope")
        ok = await c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert ok.usage is not None and ok.usage.completion_tokens == 2


async def test_embeddings_are_one_job_in_their_own_class(access: pytest.LogCaptureFixture) -> None:
    async with asyncio.timeout(30), gateway() as gw, gw.client() as c:
        raw = await c.embeddings.with_raw_response.create(model=MODEL, input=["alpha", "beta gamma", "alpha"])
        e = raw.parse()
        assert raw.headers["x-tailguard-class"] == "embeddings"
        assert [d.index for d in e.data] == [0, 1, 2] and len(e.data[0].embedding) == 32
        assert e.data[0].embedding == e.data[2].embedding != e.data[1].embedding  # deterministic per input
        floats = await c.embeddings.create(model=MODEL, input="alpha", encoding_format="float")
        assert floats.data[0].embedding == pytest.approx(e.data[0].embedding, rel=1e-6)
        assert e.usage.prompt_tokens == 2 + 3 + 2  # each input by the bytes/4 estimate
        assert (await c.models.retrieve(MODEL)).id == MODEL
        m = await scrape(gw.url)
    assert sample(m, "tailguard_requests_total", **{"class": "embeddings", "outcome": "success"}) == 2
    assert sample(m, "tailguard_prompt_tokens_total", **{"class": "embeddings"}) == 9
    assert sample(m, "tailguard_output_tokens_total", **{"class": "embeddings"}) == 0
    assert [(a["path"], a["class"]) for a in _access(access)] == [("/v1/embeddings", "embeddings")] * 2


async def test_an_unknown_route_is_told_what_is_served() -> None:
    async with asyncio.timeout(30), gateway() as gw, aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}/v1/audio/speech", json={}) as r:
            err = (await r.json())["error"]
        assert r.status == 404 and err["code"] == "not_found"
        for route in ("POST /v1/responses", "POST /v1/messages", "POST /v1/embeddings", "GET /v1/models/{model}"):
            assert route in err["message"]
        async with s.get(f"{gw.url}/v1/messages/batches") as r:
            body = await r.json()
        assert r.status == 404 and body["type"] == "error" and body["error"]["type"] == "not_found_error"
        async with s.post(f"{gw.url}/pooling", json={"model": MODEL, "input": "hi"}) as r:
            assert r.status == 404  # a route the gateway does not serve, though vLLM does


async def test_rerank_score_and_the_tokenizer_routes_in_vllm_shapes(access: pytest.LogCaptureFixture) -> None:
    """Each pooling and tokenizer route through the gateway to the simulator, with a real HTTP
    client: vLLM's answer shapes, the `embeddings` class, prompt tokens metered from the answer's
    usage (rerank: the query once per document, as the engine scores each pair), nothing generated."""
    docs = ["a cat purrs", "dogs bark loudly", "cats"]
    calls: list[tuple[str, dict[str, Any]]] = [
        ("/v1/rerank", {"model": MODEL, "query": "cat", "documents": docs, "top_n": 2}),
        ("/rerank", {"model": MODEL, "query": "cat", "documents": docs}),
        ("/score", {"model": MODEL, "text_1": "cat", "text_2": docs}),
        ("/tokenize", {"model": MODEL, "prompt": "hello world"}),
        ("/detokenize", {"model": MODEL, "tokens": [1, 2, 3]}),
    ]
    answers = {}
    async with asyncio.timeout(30), gateway() as gw, aiohttp.ClientSession() as s:
        for path, body in calls:
            async with s.post(gw.url + path, json=body) as r:
                assert (r.status, r.headers["X-Tailguard-Class"]) == (200, "embeddings"), await r.text()
                answers[path] = await r.json()
        async with s.post(gw.url + "/score", json={"model": MODEL, "text_1": ["a", "b"], "text_2": docs}) as r:
            refused = (r.status, (await r.json())["error"]["param"])
        m = await scrape(gw.url)
    top, every = answers["/v1/rerank"], answers["/rerank"]
    assert len(top["results"]) == 2 and top["results"] == every["results"][:2]
    assert sorted(x["index"] for x in every["results"]) == [0, 1, 2]
    scores = [x["relevance_score"] for x in every["results"]]
    assert scores == sorted(scores, reverse=True) and all(0 <= x <= 1 for x in scores)
    pair_tokens = (1 + 3) + (1 + 4) + (1 + 1)  # "cat" with each document, by the bytes/4 estimate
    assert every["usage"] == {"prompt_tokens": pair_tokens, "total_tokens": pair_tokens}
    score = answers["/score"]
    assert score["object"] == "list" and [d["index"] for d in score["data"]] == [0, 1, 2]
    # The same pair scores the same on both routes (a cross-encoder's rerank is its score, sorted).
    assert sorted(d["score"] for d in score["data"]) == sorted(scores)
    assert answers["/tokenize"]["count"] == len(answers["/tokenize"]["tokens"]) == 3
    assert answers["/detokenize"] == {"prompt": " tok tok tok"}
    assert refused == (400, "text_1")  # the engine's own 400, relayed
    assert sample(m, "tailguard_requests_total", **{"class": "embeddings", "outcome": "success"}) == 5
    assert sample(m, "tailguard_output_tokens_total", **{"class": "embeddings"}) == 0
    assert [(a["path"], a["class"]) for a in _access(access)][:5] == [(p, "embeddings") for p, _ in calls]


async def test_a_backend_that_does_not_serve_a_route_is_relayed_not_failed() -> None:
    """llama-server answers a route it was not started for with 501 and says how to fix it: the
    client gets that status and message, and the backend is not counted as failing."""
    said = {"error": {"code": 501, "message": "This server does not support reranking. Start it with `--reranking`",
                      "type": "not_supported_error"}}

    async def not_served(request: web.Request) -> web.Response:
        return web.json_response(said, status=501)

    async def healthy(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/rerank", not_served)
    app.router.add_get("/health", healthy)
    async with asyncio.timeout(30), running(app) as llama, \
            gateway(sims=0, extra_backends=[BackendConfig(name="llama", url=llama, kind="llamacpp")]) as gw, \
            aiohttp.ClientSession() as s:
        for _ in range(2):
            async with s.post(gw.url + "/v1/rerank", json={"query": "q", "documents": ["d"]}) as r:
                assert r.status == 501
                assert (await r.json())["error"]["message"] == said["error"]["message"]
        m = await scrape(gw.url)
    assert sample(m, "tailguard_upstream_errors_total", backend="llama", kind="status") == 0


async def test_a_responses_follow_up_goes_to_the_backend_that_holds_its_state() -> None:
    """Round-robin alternates two backends; follow-ups naming `previous_response_id` go to the
    one that made that response, streamed or not, however many follow in a row."""
    async with asyncio.timeout(30), gateway(sims=2, routing={"policy": "round-robin"}) as gw, gw.client() as c:
        async def backend_of(**kw: Any) -> tuple[str, str | None]:
            raw = await c.responses.with_raw_response.create(model=MODEL, input="hello", max_output_tokens=2, **kw)
            return raw.headers["x-tailguard-backend"], None if kw.get("stream") else raw.parse().id
        home, made = await backend_of()
        for i in range(4):
            where, latest = await backend_of(previous_response_id=made, stream=i % 2 == 1)
            assert where == home
            made = latest or made  # the chain goes on from the latest whole answer
        plain = {(await backend_of())[0] for _ in range(2)}
        assert plain == {"sim0", "sim1"}  # without one, requests alternate
