"""The simulator as an OpenAI-compatible HTTP server: the engine model driven on a scaled real clock.

The engine task and the live requests are `tailguard.sim.state`'s; what a request may ask is
`tailguard.sim.request`'s and the bytes of an answer `tailguard.sim.answer`'s. This module is the
HTTP side: routes, handlers (add a request, wait for its tokens, write them, abort it if the
client goes) and starting and stopping a server.

Endpoints behave like vLLM's where a client or the gateway can tell: `/v1/chat/completions` and
`/v1/completions` (stream and non-stream, `stream_options.include_usage`, `usage`, finish_reason
"length"), `/v1/responses` and `/v1/messages` (their typed events, `sim.typed`), `/v1/embeddings`,
`/v1/rerank` (and `/rerank`, `/v2/rerank`), `/score` (and `/v1/score`), `/tokenize`, `/detokenize`
(`sim.pooling`: each input or pair a prefill on the engine, deterministic vectors and scores), `/v1/models` (its model lists the `time_scale`), `/health`, `/version` (naming itself),
`/metrics` (`vllm:*`). Started with a model name of its own (`strict_model`), it answers a request
for another model with vLLM's 404 (`model_not_found`); otherwise it serves whatever model is asked.
`faults` make it hang or fail on purpose (`tailguard.sim.fault`). Body `priority` is vLLM's (lower
runs earlier) and, as in vLLM, a non-zero priority is refused unless the policy is "priority". A
missing `max_tokens` means "up to max_model_len". Every generated token is the text " tok" (one token by the bytes/4 estimate). A
client that disconnects has its request aborted at once when the server runs with
`handler_cancellation=True` (as `serve` and `start_sim` do); otherwise a stream is aborted at its
next write.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable

from aiohttp import web
from aiohttp.hdrs import CONTENT_TYPE as CONTENT_TYPE_HEADER
from aiohttp.typedefs import Handler

from tailguard import __version__
from tailguard.errors import APIError, BadRequest, PayloadTooLarge
from tailguard.sim import pooling
from tailguard.sim.typed import body_for, chunks_for
from tailguard.sim.vectors import vector
from tailguard.sim.cost import EngineConfig
from tailguard.sim.engine import Engine, SimRequest
from tailguard.sim.fault import Faults
from tailguard.sim.metrics import CONTENT_TYPE
from tailguard.sim.request import block_keys, output_budget
from tailguard.sim.state import Live, SimState, engine_loop
from tailguard.wire import anthropic, openai as wire
from tailguard.wire.embeddings import embeddings_body, inputs

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MODEL_NAME = "tailguard-sim"
SIM = web.AppKey("tailguard.sim", SimState)


@dataclass(slots=True)
class _Accepted:
    """A request the engine took: what its handler answers from."""

    id: str
    parsed: wire.ParsedRequest
    prompt_tokens: int
    max_tokens: int


def _unavailable(state: SimState) -> APIError:
    if state.broken:
        return APIError("The simulated engine failed; see the simulator's log.", status=500, type="server_error")
    return APIError("The simulator is shutting down.", status=503, type="server_error")


def _error(err: APIError, endpoint: wire.Endpoint = "chat") -> web.Response:
    body = anthropic.error_body(err) if endpoint == "messages" else wire.error_body(err)  # each route's own shape
    return web.Response(status=err.status, body=body, content_type="application/json",
                        headers=wire.error_headers(err))


_ID_PREFIXES = {"chat": "chatcmpl", "responses": "resp", "messages": "msg"}


async def _read_body(request: web.Request) -> bytes:
    if CONTENT_TYPE_HEADER in request.headers and not wire.is_json_media_type(request.content_type):
        # vLLM's FastAPI refuses a body that is not declared JSON (as a 400 validation error).
        raise BadRequest(f"Content-Type must be application/json, got {request.content_type!r}.",
                         param="Content-Type", code="invalid_type")
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(
            f"Request body is larger than {request.app[SIM].max_body_bytes} bytes.", code="payload_too_large"
        ) from None
    except web.RequestPayloadError:
        raise BadRequest("The request body could not be decoded.", code="invalid_body") from None


async def _generate(request: web.Request, endpoint: wire.Endpoint) -> web.StreamResponse:
    state = request.app[SIM]
    try:
        raw = await _read_body(request)
        parsed = wire.parse_request(raw, endpoint)
        _check_model(state, parsed.body.get("model"))
        wire.validate_engine_fields(parsed.body)
        max_tokens = output_budget(state.config, parsed)
        acc = _Accepted(state.new_id(_ID_PREFIXES.get(endpoint, "cmpl")), parsed, parsed.prompt_tokens, max_tokens)
        keys = block_keys(state.config, parsed, acc.max_tokens)
    except APIError as err:
        resp = _error(err, endpoint)
        if not request.content.is_eof():
            resp.force_close()  # the body was not read to its end: this connection cannot be reused
        return resp
    if state.closing:
        return _error(_unavailable(state), endpoint)
    engine, clock = state.engine, state.clock
    priority = int(parsed.body.get("priority") or 0)
    now = clock.now()
    live = Live(now)
    state.lives[acc.id] = live
    try:
        engine.add(SimRequest(acc.id, acc.prompt_tokens, acc.max_tokens, priority, keys), now)
    except ValueError as e:
        del state.lives[acc.id]
        return _error(BadRequest(str(e), code="invalid_value"))
    state.kick.set()
    if parsed.token_ids is not None:
        state.metrics.token_id_prompts += 1
    try:
        if parsed.stream:
            return await _stream(request, state, acc, live)
        return await _complete(state, acc, live)
    finally:
        del state.lives[acc.id]
        if not live.done:
            engine.abort(acc.id, clock.now())  # client gone or shutdown: free its slot and KV now


def _check_model(state: SimState, model: object) -> None:
    """vLLM checks the model first: one it does not serve is a 404 (a missing one is its own)."""
    if state.strict_model and model not in (None, "", state.model_name):
        raise APIError(f"The model `{model}` does not exist.", status=404, type="invalid_request_error",
                       param="model", code="model_not_found")


_COMPLETIONS = frozenset({"/v1/chat/completions", "/v1/completions"})


@web.middleware
async def _misbehave(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The faults asked for: a request that hangs is read and then never answered (until the
    server shuts down), a completion drawn to fail gets a 500 before the engine sees it."""
    state = request.app[SIM]
    completion = request.path in _COMPLETIONS
    if state.faults.hangs(completion, state.clock.now()):
        with contextlib.suppress(web.HTTPException, web.RequestPayloadError):
            await request.read()
        await state.closed.wait()
        return _error(_unavailable(state))
    if completion and state.errors.fails(state.clock.now()):
        with contextlib.suppress(web.HTTPException, web.RequestPayloadError):
            await request.read()
        return _error(APIError("The simulator failed this request on purpose (--error-rate).", status=500,
                               type="server_error"))
    return await handler(request)


async def _complete(state: SimState, acc: _Accepted, live: Live) -> web.Response:
    while not live.done:
        await state.wait(live, live.ready)
        if state.closing and not live.done:
            return _error(_unavailable(state))
    body = body_for(acc.parsed.endpoint, acc.id, state.model_name, state.created, prompt_tokens=acc.prompt_tokens,
                    output_tokens=live.ready, finish_reason=live.finish_reason, max_tokens=acc.parsed.max_tokens)
    return web.Response(body=body, content_type="application/json")


async def _stream(request: web.Request, state: SimState, acc: _Accepted, live: Live) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    chunks = chunks_for(acc.parsed.endpoint, acc.id, state.model_name, int(time.time()), prompt_tokens=acc.prompt_tokens,
                        include_usage=acc.parsed.include_usage, max_tokens=acc.parsed.max_tokens,
                        prompt_ids=_prompt_ids(acc) if acc.parsed.body.get("return_token_ids") is True else None)
    try:
        await resp.prepare(request)
        sent = 0
        while True:
            await state.wait(live, sent)
            if state.closing and not live.done:
                return resp  # cut off, as a dying server would
            n = live.ready - sent
            if live.done:
                await resp.write(chunks.end(sent, n, live.finish_reason))
                break
            await resp.write(chunks.more(sent, n))
            sent += n
        await resp.write_eof()
    except ConnectionError:
        pass  # the client left; the caller aborts the request
    return resp


def _prompt_ids(acc: _Accepted) -> list[int]:
    """The prompt's token ids, as `return_token_ids` returns them: those it came as, else one
    made-up id per prompt token, the same for the same text (the simulator has no vocabulary)."""
    parsed = acc.parsed
    if parsed.token_ids is not None:
        return parsed.token_ids
    return pooling.token_ids(parsed.prompt_text(), acc.prompt_tokens)


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completions")


async def _responses(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "responses")


async def _messages(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "messages")


async def _pooled(request: web.Request, endpoint: wire.Endpoint) -> web.Response:
    """Embeddings, rerank, score, tokenize, detokenize (`sim.pooling`): each input or pair an
    engine request of its own (as vLLM splits a batch), a prefill and one step, so they cost what
    their inputs cost and share the engine with generation; the tokenizer routes none. The answer
    comes when every one is done; vectors and scores are deterministic."""
    state = request.app[SIM]
    try:
        parsed = wire.parse_request(await _read_body(request), endpoint)
        _check_model(state, parsed.body.get("model"))
        sizes = pooling.prefills(endpoint, parsed.body)
    except APIError as err:
        return _error(err)
    if state.closing:
        return _error(_unavailable(state))
    try:
        await _prefill_all(state, sizes)
    except ValueError as e:
        return _error(BadRequest(str(e), code="invalid_value"))
    if state.closing:
        return _error(_unavailable(state))
    body = parsed.body
    if endpoint == "embeddings":
        answer = embeddings_body(state.model_name, [vector(i) for i in inputs(body)], parsed.prompt_tokens,
                                 body.get("encoding_format") == "base64")
    else:
        rid = state.new_id(pooling.ID_PREFIXES.get(endpoint, "pool"))
        answer = pooling.answer(endpoint, body, state.model_name, rid, int(time.time()), state.config.max_model_len)
    return web.Response(body=answer, content_type="application/json")


async def _prefill_all(state: SimState, sizes: list[int]) -> None:
    """Run one engine request of one step per size, and wait for all (or the shutdown); a request
    left unfinished (client gone, shutdown) is aborted."""
    engine, now = state.engine, state.clock.now()
    ids = [state.new_id("pool") for _ in sizes]
    lives = [Live(now) for _ in sizes]
    try:
        for rid, size, live in zip(ids, sizes, lives):
            state.lives[rid] = live
            engine.add(SimRequest(rid, size, 1), now)
        state.kick.set()
        for live in lives:
            while not live.done and not state.closing:
                await state.wait(live, live.ready)
    finally:
        for rid, live in zip(ids, lives):
            if state.lives.pop(rid, None) is not None and not live.done:
                engine.abort(rid, state.clock.now())


def _pooled_route(endpoint: wire.Endpoint) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        return await _pooled(request, endpoint)
    return handle


# vLLM's paths of each pooling and tokenizer route.
POOLING_ROUTES: dict[str, wire.Endpoint] = {
    "/v1/embeddings": "embeddings", "/v1/rerank": "rerank", "/rerank": "rerank", "/v2/rerank": "rerank",
    "/score": "score", "/v1/score": "score", "/tokenize": "tokenize", "/detokenize": "detokenize",
}


async def _models(request: web.Request) -> web.Response:
    state = request.app[SIM]
    return web.json_response({
        "object": "list",
        "data": [{"id": state.model_name, "object": "model", "created": state.created, "owned_by": "tailguard",
                  "root": state.model_name, "parent": None, "max_model_len": state.config.max_model_len,
                  # Wall seconds per simulated second: a load generator reads it to report simulated time.
                  "time_scale": state.clock.time_scale}],
    })


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _version(request: web.Request) -> web.Response:
    """Like vLLM's `/version`, plus `engine`, which is how a gateway of `kind: auto` tells the
    simulator from the engine it imitates."""
    return web.json_response({"version": __version__, "engine": "tailguard-sim"})


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[SIM].metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def _on_startup(app: web.Application) -> None:
    state = app[SIM]
    state.task = asyncio.get_running_loop().create_task(engine_loop(state), name="tailguard-sim-engine")


async def _on_shutdown(app: web.Application) -> None:
    state = app[SIM]
    state.closing = True
    state.closed.set()
    state.wake_all()
    if state.task is not None:
        state.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # a failure was logged already
            await state.task
        state.task = None


def create_app(
    config: EngineConfig, *, time_scale: float = 1.0, model_name: str = DEFAULT_MODEL_NAME,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, faults: Faults = Faults(), strict_model: bool = False,
) -> web.Application:
    """The simulator app; serve it with `handler_cancellation=True` so disconnects abort at once."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_misbehave] if faults.misbehaves else [])
    state = SimState(config, time_scale, model_name, max_body_bytes, faults, strict_model)
    app[SIM] = state
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/responses", _responses)
    app.router.add_post("/v1/messages", _messages)
    for path, endpoint in POOLING_ROUTES.items():
        app.router.add_post(path, _pooled_route(endpoint))
    app.router.add_get("/health", _health)
    app.router.add_get("/version", _version)
    app.router.add_get("/metrics", _metrics)
    app.on_startup.append(_on_startup)
    app.on_shutdown.append(_on_shutdown)
    return app


@dataclass(slots=True)
class RunningSim:
    """A simulator serving in this process (see `start_sim`)."""

    url: str  # http://host:port, no trailing slash; the OpenAI base URL is url + "/v1"
    app: web.Application
    runner: web.AppRunner

    @property
    def engine(self) -> Engine:
        return self.app[SIM].engine

    async def close(self) -> None:
        await self.runner.cleanup()


DEFAULT_PRESET = "h100-llama8b"


async def start_sim(
    config: EngineConfig | None = None, *, preset: str | None = None, host: str = "127.0.0.1", port: int = 0,
    time_scale: float = 1.0, model_name: str = DEFAULT_MODEL_NAME, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    faults: Faults = Faults(), strict_model: bool = False,
) -> RunningSim:
    """Serve a simulator on this event loop; port 0 picks a free port. Call `close()` when done.

    Give a full `config`, or a `preset` name (default "h100-llama8b")."""
    if config is None:
        config = EngineConfig.from_preset(preset or DEFAULT_PRESET)
    elif preset is not None:
        raise ValueError("give either config or preset, not both")
    app = create_app(config, time_scale=time_scale, model_name=model_name, max_body_bytes=max_body_bytes,
                     faults=faults, strict_model=strict_model)
    runner = web.AppRunner(app, handle_signals=False, handler_cancellation=True, access_log=None,
                           shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0]
    return RunningSim(f"http://{_url_host(host)}:{bound[1]}", app, runner)


@asynccontextmanager
async def running_sim(
    config: EngineConfig | None = None, *, preset: str | None = None, host: str = "127.0.0.1", port: int = 0,
    time_scale: float = 1.0, model_name: str = DEFAULT_MODEL_NAME, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    faults: Faults = Faults(), strict_model: bool = False,
) -> AsyncIterator[RunningSim]:
    """`async with running_sim(cfg, time_scale=0.05) as sim:` ... `sim.url`; stopped on exit."""
    sim = await start_sim(config, preset=preset, host=host, port=port, time_scale=time_scale,
                          model_name=model_name, max_body_bytes=max_body_bytes, faults=faults,
                          strict_model=strict_model)
    try:
        yield sim
    finally:
        await sim.close()


async def serve(
    config: EngineConfig, host: str = "127.0.0.1", port: int = 8000, time_scale: float = 1.0,
    model_name: str = DEFAULT_MODEL_NAME, ready: Callable[[RunningSim], None] | None = None,
    faults: Faults = Faults(), strict_model: bool = False,
) -> None:
    """Serve until cancelled (the CLI's entrypoint); `ready` is called once the port is bound."""
    sim = await start_sim(config, host=host, port=port, time_scale=time_scale, model_name=model_name,
                          faults=faults, strict_model=strict_model)
    try:
        if ready is not None:
            ready(sim)
        await asyncio.Event().wait()
    finally:
        await sim.close()


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host

