"""The simulator as an OpenAI-compatible HTTP server: the engine model driven on a scaled real clock.

One task steps the engine: it computes a step, sleeps until the step's end on the wall clock
(an absolute deadline, so timer slack does not accumulate), then hands each request its new tokens.
Handlers add and abort requests directly on the engine (one event loop, so no locking) and wait
on a per-request future; a streamed token costs one pre-encoded chunk and, per step, one write.

Endpoints behave like vLLM's where a client or the gateway can tell: `/v1/chat/completions` and
`/v1/completions` (stream and non-stream, `stream_options.include_usage`, `usage`, finish_reason
"length"), `/v1/models` (its model lists the `time_scale`), `/health`, `/version` (naming itself),
`/metrics` (`vllm:*`). Body
`priority` is vLLM's (lower runs earlier) and, as in vLLM, a non-zero priority is refused unless
the policy is "priority". A missing `max_tokens` means "up to max_model_len". Every generated
token is the text " tok" (one token by the bytes/4 estimate). A client that disconnects has its
request aborted at once when the server runs with `handler_cancellation=True` (as `serve` and
`start_sim` do); otherwise a stream is aborted at its next write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from aiohttp import web
from aiohttp.hdrs import CONTENT_TYPE as CONTENT_TYPE_HEADER

from tailguard import __version__
from tailguard.clock import ScaledClock
from tailguard.errors import APIError, BadRequest, PayloadTooLarge
from tailguard.sim.cost import EngineConfig
from tailguard.sim.engine import Admitted, Engine, FirstToken, RequestFinished, SimRequest, Step
from tailguard.sim.kv import text_block_hashes, token_block_hashes
from tailguard.sim.metrics import CONTENT_TYPE, SimMetrics
from tailguard.wire import openai as wire
from tailguard.wire.sse import DONE_EVENT, encode_event

TOKEN_TEXT = " tok"
_log = logging.getLogger("tailguard.sim")
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


class _Live:
    """A request between `add` and the end of its response, as the handler and the loop see it."""

    __slots__ = ("ready", "done", "finish_reason", "waiter", "added_at", "admitted_at", "first_at")

    def __init__(self, added_at: float) -> None:
        self.ready = 0  # tokens generated so far
        self.done = False
        self.finish_reason = "length"
        self.waiter: asyncio.Future[None] | None = None
        self.added_at = added_at
        self.admitted_at: float | None = None  # first scheduled (prefill starts)
        self.first_at: float | None = None  # first token (decode starts)


class SimState:
    """Everything one simulator app owns: the engine, its clock, live requests and metrics."""

    def __init__(self, config: EngineConfig, time_scale: float, model_name: str, max_body_bytes: int) -> None:
        self.config = config
        self.max_body_bytes = max_body_bytes
        self.engine = Engine(config)
        self.clock = ScaledClock(time_scale)
        self.model_name = model_name
        self.metrics = SimMetrics(self.engine, model_name)
        self.lives: dict[str, _Live] = {}
        self.kick = asyncio.Event()
        self.closing = False
        self.broken = False
        self.task: asyncio.Task[None] | None = None
        self.created = int(time.time())
        self._nonce = os.urandom(4).hex()
        self._counter = 0

    def new_id(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}-{self._nonce}{self._counter:08x}"

    def wake_all(self) -> None:
        for live in self.lives.values():
            _wake(live)


SIM = web.AppKey("tailguard.sim", SimState)


def _wake(live: _Live) -> None:
    w = live.waiter
    if w is not None and not w.done():
        w.set_result(None)


async def engine_loop(state: SimState) -> None:
    """Step the engine while it has work; sleep on `state.kick` while it is idle.

    Should the model ever raise, the simulator stops taking requests and answers the live ones
    with a 500 rather than leaving them hanging."""
    try:
        await _step_forever(state)
    except Exception:
        _log.exception("the simulated engine failed; answering every request with 500 from now on")
        state.broken = True
        state.closing = True
        state.wake_all()
        raise


async def _step_forever(state: SimState) -> None:
    engine, clock, metrics = state.engine, state.clock, state.metrics
    t = clock.now()
    while True:
        if engine.idle():
            state.kick.clear()
            await state.kick.wait()
            t = clock.now()
            continue
        step = engine.step(t)
        end = t + step.duration_s
        delay = clock.wall_delay(end)
        if delay > 0:
            # Waking a little late is fine: the next step still starts at `end`, so timer slack
            # never adds up over a long run.
            await asyncio.sleep(delay)
            metrics.behind_s = 0.0
            _deliver(state, step, end)
            t = end
        else:
            # Computing the step took longer than the step itself: this process cannot keep up at
            # this time_scale. Say so, and carry on from now rather than drift ever further behind.
            now = clock.now()
            metrics.behind_s = now - end
            await asyncio.sleep(0)  # let handlers run even when behind
            _deliver(state, step, end)
            t = max(end, now)


def _deliver(state: SimState, step: Step, end: float) -> None:
    lives = state.lives
    for rid in step.emitted:
        live = lives.get(rid)
        if live is not None:
            live.ready += 1
            w = live.waiter
            if w is not None and not w.done():
                w.set_result(None)
    m = state.metrics
    for ev in step.events:
        if isinstance(ev, RequestFinished):
            live = lives.get(ev.req_id)
            if live is not None:
                live.done = True
                live.finish_reason = ev.finish_reason
                m.e2e.observe(end - live.added_at)
                if live.first_at is not None:
                    m.decode.observe(end - live.first_at)
                _wake(live)
        elif isinstance(ev, FirstToken):
            live = lives.get(ev.req_id)
            if live is not None:
                m.ttft.observe(end - live.added_at)
                live.first_at = end
                if live.admitted_at is not None:
                    m.prefill.observe(end - live.admitted_at)
        elif isinstance(ev, Admitted) and not ev.resumed:
            m.queue.observe(ev.queue_s)
            live = lives.get(ev.req_id)
            if live is not None:
                live.admitted_at = end - step.duration_s  # the step that scheduled it began then
    # Decoding sequences emit on consecutive steps, so each of their tokens came one step after
    # the previous one: the step's duration is their inter-token latency.
    m.itl.observe(step.duration_s, step.decode_seqs)


@dataclass(slots=True)
class _Accepted:
    id: str
    parsed: wire.ParsedRequest
    prompt_tokens: int
    max_tokens: int


def _accept(state: SimState, parsed: wire.ParsedRequest, prefix: str) -> _Accepted:
    cfg = state.config
    prompt = parsed.prompt_tokens
    limit = cfg.max_model_len
    max_tokens = parsed.max_tokens
    if max_tokens is None:
        if prompt >= limit:
            raise BadRequest(
                f"This model's maximum context length is {limit} tokens. However, your request has {prompt} "
                "input tokens. Please reduce the length of the input messages.",
                param="messages" if parsed.endpoint == "chat" else "prompt", code="context_length_exceeded",
            )
        max_tokens = limit - prompt
    elif prompt + max_tokens > limit:
        raise BadRequest(
            f"This model's maximum context length is {limit} tokens. However, you requested {prompt + max_tokens} "
            f"tokens ({prompt} in the messages, {max_tokens} in the completion). Please reduce the length of "
            "the messages or completion.",
            param="max_tokens", code="context_length_exceeded",
        )
    priority = parsed.body.get("priority") or 0
    if priority != 0 and cfg.scheduling_policy != "priority":
        raise BadRequest(f"Got priority {priority} but Priority scheduling is not enabled.", param="priority",
                         code="invalid_value")
    n = parsed.body.get("n")
    if n is not None and n != 1:
        raise BadRequest("The simulator generates one choice per request ('n' must be 1).", param="n",
                         code="invalid_value")
    return _Accepted(state.new_id(prefix), parsed, prompt, max_tokens)


def _block_keys(state: SimState, parsed: wire.ParsedRequest, max_tokens: int) -> tuple[int, ...]:
    """Prefix-cache keys of the request's whole sequence: its prompt as the engine would render
    it, then the output it will generate (every token is TOKEN_TEXT). Keying the output too is what
    lets a continuation (prompt + text so far, as the gateway resumes a suspended request) find the
    blocks its aborted original left cached, as vLLM's prefix cache finds them by token ids."""
    if not state.config.enable_prefix_caching:
        return ()
    bs = state.config.block_size
    if parsed.token_ids is not None:
        return token_block_hashes(parsed.token_ids, bs)
    text = _sequence_prefix(parsed) + TOKEN_TEXT * max_tokens
    return text_block_hashes(text, bs, max_blocks=(parsed.prompt_tokens + max_tokens) // bs)


def _sequence_prefix(parsed: wire.ParsedRequest) -> str:
    """The text generation continues from. Chat is rendered like a chat template: each message,
    then the assistant's turn opened (or, with `continue_final_message`, the last message left
    open), so a continuation's text starts with its original's text and generated output."""
    text = parsed.prompt_text()
    if parsed.endpoint == "completions":
        return text
    if parsed.body.get("continue_final_message") is True:
        return text[:-1]  # the last message's closing newline: it stays open
    return text + "assistant:"


def _unavailable(state: SimState) -> APIError:
    if state.broken:
        return APIError("The simulated engine failed; see the simulator's log.", status=500, type="server_error")
    return APIError("The simulator is shutting down.", status=503, type="server_error")


def _error(err: APIError) -> web.Response:
    return web.Response(status=err.status, body=wire.error_body(err), content_type="application/json",
                        headers=wire.error_headers(err))


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


class _Chunks:
    """The pre-encoded SSE events of one streamed response."""

    __slots__ = ("role", "token", "usage_head")

    def __init__(self, endpoint: wire.Endpoint, rid: str, model: str, created: int) -> None:
        if endpoint == "chat":
            self.role = encode_event(wire.chat_chunk(rid, model, created, role="assistant"))
            self.token = encode_event(wire.chat_chunk(rid, model, created, content=TOKEN_TEXT))
        else:
            self.role = b""
            self.token = encode_event(wire.completion_chunk(rid, model, created, text=TOKEN_TEXT))
        self.usage_head = (rid, model, created)

    def final(self, endpoint: wire.Endpoint, reason: str, with_token: bool) -> bytes:
        rid, model, created = self.usage_head
        if endpoint == "chat":
            return encode_event(wire.chat_chunk(rid, model, created, content=TOKEN_TEXT if with_token else None,
                                                finish_reason=reason))
        return encode_event(wire.completion_chunk(rid, model, created, text=TOKEN_TEXT if with_token else "",
                                                  finish_reason=reason))

    def usage(self, endpoint: wire.Endpoint, prompt_tokens: int, output_tokens: int) -> bytes:
        rid, model, created = self.usage_head
        u = wire.usage_dict(prompt_tokens, output_tokens)
        if endpoint == "chat":
            return encode_event(wire.chat_chunk(rid, model, created, usage=u, empty_choices=True))
        return encode_event(wire.completion_chunk(rid, model, created, usage=u, empty_choices=True))


async def _generate(request: web.Request, endpoint: wire.Endpoint) -> web.StreamResponse:
    state = request.app[SIM]
    try:
        raw = await _read_body(request)
        parsed = wire.parse_request(raw, endpoint)
        wire.validate_engine_fields(parsed.body)
        acc = _accept(state, parsed, "chatcmpl" if endpoint == "chat" else "cmpl")
        keys = _block_keys(state, parsed, acc.max_tokens)
    except APIError as err:
        resp = _error(err)
        if not request.content.is_eof():
            resp.force_close()  # the body was not read to its end: this connection cannot be reused
        return resp
    if state.closing:
        return _error(_unavailable(state))
    engine, clock = state.engine, state.clock
    priority = int(parsed.body.get("priority") or 0)
    now = clock.now()
    live = _Live(now)
    state.lives[acc.id] = live
    try:
        engine.add(SimRequest(acc.id, acc.prompt_tokens, acc.max_tokens, priority, keys), now)
    except ValueError as e:
        del state.lives[acc.id]
        return _error(BadRequest(str(e), code="invalid_value"))
    state.kick.set()
    try:
        if parsed.stream:
            return await _stream(request, state, acc, live)
        return await _complete(state, acc, live)
    finally:
        del state.lives[acc.id]
        if not live.done:
            engine.abort(acc.id, clock.now())  # client gone or shutdown: free its slot and KV now


async def _wait(state: SimState, live: _Live, seen: int) -> None:
    """Until `live` has tokens past `seen`, is done, or the server is closing."""
    loop = asyncio.get_running_loop()
    while live.ready == seen and not live.done and not state.closing:
        live.waiter = loop.create_future()
        try:
            await live.waiter
        finally:
            live.waiter = None


async def _complete(state: SimState, acc: _Accepted, live: _Live) -> web.Response:
    while not live.done:
        await _wait(state, live, live.ready)
        if state.closing and not live.done:
            return _error(_unavailable(state))
    usage = wire.usage_dict(acc.prompt_tokens, live.ready)
    text = TOKEN_TEXT * live.ready
    build = wire.chat_response if acc.parsed.endpoint == "chat" else wire.completion_response
    body = build(acc.id, state.model_name, state.created, text, live.finish_reason, usage)
    return web.Response(body=body, content_type="application/json")


async def _stream(request: web.Request, state: SimState, acc: _Accepted, live: _Live) -> web.StreamResponse:
    endpoint = acc.parsed.endpoint
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    chunks = _Chunks(endpoint, acc.id, state.model_name, int(time.time()))
    try:
        await resp.prepare(request)
        sent = 0
        while True:
            await _wait(state, live, sent)
            if state.closing and not live.done:
                return resp  # cut off, as a dying server would
            n = live.ready - sent
            first = sent == 0 and n > 0
            if live.done:
                parts = [chunks.role] if first else []
                parts.append(chunks.token * (n - 1) if n > 0 else b"")
                parts.append(chunks.final(endpoint, live.finish_reason, with_token=n > 0))
                if acc.parsed.include_usage:
                    parts.append(chunks.usage(endpoint, acc.prompt_tokens, live.ready))
                parts.append(DONE_EVENT)
                await resp.write(b"".join(parts))
                break
            await resp.write(chunks.role + chunks.token * n if first else chunks.token * n)
            sent += n
        await resp.write_eof()
    except ConnectionError:
        pass  # the client left; the caller aborts the request
    return resp


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completions")


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
    state.wake_all()
    if state.task is not None:
        state.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # a failure was logged already
            await state.task
        state.task = None


def create_app(
    config: EngineConfig, *, time_scale: float = 1.0, model_name: str = "tailguard-sim",
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> web.Application:
    """The simulator app; serve it with `handler_cancellation=True` so disconnects abort at once."""
    app = web.Application(client_max_size=max_body_bytes)
    state = SimState(config, time_scale, model_name, max_body_bytes)
    app[SIM] = state
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
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
    time_scale: float = 1.0, model_name: str = "tailguard-sim", max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> RunningSim:
    """Serve a simulator on this event loop; port 0 picks a free port. Call `close()` when done.

    Give a full `config`, or a `preset` name (default "h100-llama8b")."""
    if config is None:
        config = EngineConfig.from_preset(preset or DEFAULT_PRESET)
    elif preset is not None:
        raise ValueError("give either config or preset, not both")
    app = create_app(config, time_scale=time_scale, model_name=model_name, max_body_bytes=max_body_bytes)
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
    time_scale: float = 1.0, model_name: str = "tailguard-sim", max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> AsyncIterator[RunningSim]:
    """`async with running_sim(cfg, time_scale=0.05) as sim:` ... `sim.url`; stopped on exit."""
    sim = await start_sim(config, preset=preset, host=host, port=port, time_scale=time_scale,
                          model_name=model_name, max_body_bytes=max_body_bytes)
    try:
        yield sim
    finally:
        await sim.close()


async def serve(
    config: EngineConfig, host: str = "127.0.0.1", port: int = 8000, time_scale: float = 1.0,
    model_name: str = "tailguard-sim", ready: Callable[[RunningSim], None] | None = None,
) -> None:
    """Serve until cancelled (the CLI's entrypoint); `ready` is called once the port is bound."""
    sim = await start_sim(config, host=host, port=port, time_scale=time_scale, model_name=model_name)
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

