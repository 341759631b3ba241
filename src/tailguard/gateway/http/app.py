"""The gateway's aiohttp application: its routes and middlewares (`create_app`), the runner that
serves it, and `serve(cfg)`, which runs it until a signal stops it. Its typed state is
`gateway.http.keys`', its start and stop `gateway.http.startup`', the operator routes
`gateway.http.admin`'.

Disconnect detection needs aiohttp's handler cancellation (a queued client that leaves cancels
its handler, which removes it from the queue; a streaming one closes its upstream request).
`serve` turns it on; anything else hosting `create_app` should pass `handler_cancellation=True`
to its `AppRunner` too, or a departed client is noticed only at the next write.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import web

from tailguard.clock import Now, monotonic
from tailguard.errors import APIError
from tailguard.wire.headers import bearer_key, client_request_id
from tailguard.config import GatewayConfig
from tailguard.gateway.http import admin as adm
from tailguard.gateway.http.batches import add_routes as add_batch_routes, batches_lifecycle
from tailguard.gateway.http.keys import (
    ARRIVED_UNDER, AUDIT, BACKENDS, CLOCK, DISPATCHER, LIFECYCLE, LIVE, METRICS, MODERATION, PROBES,
    PROXY, RECORD, STATE_DIR, UPSTREAM,
)
from tailguard.gateway.http.models import fleet_models, one_model
from tailguard.gateway.http.routes import API_ROUTES, not_found_message, served, shaped_error
from tailguard.gateway.http.inbound import REQUEST_ID
from tailguard.gateway.http.proxy import error_response
from tailguard.gateway.http.server import GatewayRunner, raise_file_limit, reserved_only
from tailguard.gateway.http.startup import lifecycle
from tailguard.gateway.ops.audit import is_auth_failure
from tailguard.gateway.ops.live import Live
from tailguard.gateway.ops.logfmt import FORMATTERS
from tailguard.gateway.ops.log_buffer import BufferedLineHandler
from tailguard.gateway.ops.access import ACCESS_LOGGER, route_access_log
from tailguard.gateway.ops.metrics import GatewayMetrics
from tailguard.gateway.ops.reload import Parts, Reloader
from tailguard.gateway.ops.store import ConfigStore
from tailguard.wire.openai import Endpoint

log = logging.getLogger("tailguard.gateway")


def create_app(cfg: GatewayConfig, *, record: Path | None = None, state_dir: Path | None = None,
               clock: Now = monotonic) -> web.Application:
    """The gateway for `cfg`. State is built on startup (it needs the running loop). With
    `record`, the front's events and decisions are written there (`gateway.ops.recorder`); with
    `state_dir`, usage per caller is kept there across restarts (`gateway.ops.metering`). `clock`
    is the gateway's one clock, handed to every part that reads the time."""
    if not cfg.backends:
        raise ValueError("the gateway needs at least one backend")
    app = web.Application(client_max_size=cfg.max_body_bytes, middlewares=[_openai_errors, reserved_only])
    app[LIVE] = Live.of(cfg)
    if record is not None:
        app[RECORD] = record
    if state_dir is not None:
        app[STATE_DIR] = state_dir
    app[METRICS] = GatewayMetrics()
    app[CLOCK] = clock
    app.cleanup_ctx.append(lifecycle)
    app.on_response_prepare.append(_config_header)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model:.+}", _model)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", adm.metrics_route)
    app.router.add_get("/config", adm.config_route)
    app[adm.ADMIN] = adm.Admin(clock)
    app.router.add_get("/admin/config", adm.config_route)
    app.router.add_get("/admin/usage", adm.usage_route)
    app.router.add_post("/admin/reload", adm.reload_route)
    app.router.add_post("/admin/rollback", adm.rollback_route)
    app.cleanup_ctx.append(batches_lifecycle(lambda a: a[LIVE].cfg.batches, LIFECYCLE, DISPATCHER, METRICS, STATE_DIR,
                                             AUDIT))
    add_batch_routes(app)
    for path, endpoint in API_ROUTES.items():  # responses, messages, embeddings and the other pooling routes
        app.router.add_post(path, _api_handler(endpoint))
    return app


async def _chat(request: web.Request) -> web.StreamResponse:
    return await request.app[PROXY].handle(request, "chat")


async def _completions(request: web.Request) -> web.StreamResponse:
    return await request.app[PROXY].handle(request, "completions")


def _api_handler(endpoint: Endpoint) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await request.app[PROXY].handle(request, endpoint)
    return handle


async def _health(request: web.Request) -> web.Response:
    """Each backend as the gateway knows it (`state`: unknown until a probe has answered, failing,
    unhealthy, ejected or healthy; `healthy` whether it takes requests now, so false while ejected; why
    its last probe failed; its pool and models; the engine's own counts with their age), the moment of the
    answer (`at`, RFC 3339), and overall: `ok` when every backend taking requests is healthy and known,
    `degraded` while some are not (the gateway still serves), `unavailable` (503) when none takes
    requests: every backend unhealthy or ejected (a load balancer in front of several gateways then
    sends its clients elsewhere, though the router, in panic, still tries the ejected ones)."""
    front = request.app[DISPATCHER].front
    kinds = request.app[BACKENDS]
    probes = request.app[PROBES]
    load, now = probes.load, request.app[CLOCK]()
    views = list(front.backends())
    backends = {s.name: {"state": s.state, "healthy": s.healthy and not s.ejected, "ejected": s.ejected,
                         "retiring": s.retiring,
                         "kind": kinds[s.name].kind, "pool": s.pool, "models": s.models,
                         "in_flight": s.in_flight, "max_concurrency": s.max_concurrency, "cap": s.cap,
                         "reserved_slots": s.reserved_slots,
                         # The engine's own count, as its last probe read it `age_s` ago (not live).
                         "engine": ({"running": load[s.name].running, "waiting": load[s.name].waiting,
                                     "age_s": round(now - probes.load_at[s.name], 3)}
                                    if s.name in load else None),
                         "probe_error": probes.last_error.get(s.name),
                         # Fields the gateway adds that this backend refused, no longer sent to it.
                         "dropped_fields": sorted(request.app[UPSTREAM].refusals.dropped(s.name))}
                for s in views}
    ok = any(s.takes_requests for s in views)
    all_known = all(s.state == "healthy" for s in views if not s.retiring)
    status = "unavailable" if not ok else "ok" if all_known else "degraded"
    live = request.app[LIVE]
    body = {"status": status, "at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "queued": len(request.app[DISPATCHER]), "backends": backends, "config": {"hash": live.hash, "n": live.n}}
    return web.Response(status=200 if ok else 503, body=orjson.dumps(body), content_type="application/json")


async def _models(request: web.Request) -> web.Response:
    # Keys guard the model list as they guard generation (vLLM's --api-key does the same), so a
    # client with a wrong key learns it from its first call, not from its first generation.
    models = await _visible_models(request)
    return web.Response(body=orjson.dumps({"object": "list", "data": models}), content_type="application/json")


async def _model(request: web.Request) -> web.Response:
    """One model's object (`client.models.retrieve`), or OpenAI's 404."""
    models = await _visible_models(request)
    try:
        body = one_model(models, request.match_info["model"])
    except APIError as err:
        return error_response(err)
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def _visible_models(request: web.Request) -> list[dict[str, Any]]:
    """The fleet's models this request's key may use (401 for a key the gateway does not know)."""
    classes, key = request.app[LIFECYCLE].classes, bearer_key(request.headers)
    classes.authenticate(key)
    spec = classes.intake.key(key)
    return fleet_models(request.app[LIVE].cfg, await request.app[PROBES].known_models(),
                        None if spec is None else spec.allowed_models)


async def _config_header(request: web.Request, response: web.StreamResponse) -> None:
    """Every response, errors and streams included, names the config its request arrived under
    (whose class table and caps it got), even when a reload came while it waited for a slot, and
    carries its `x-request-id` (OpenAI's header, which the SDKs show their users)."""
    response.headers["X-Tailguard-Config"] = request.get(ARRIVED_UNDER) or request.app[LIVE].hash
    response.headers["x-request-id"] = _request_id(request)


def _request_id(request: web.Request) -> str:
    """The request's id: the proxy's (set as it arrived), else the client's, else a new one."""
    rid = request.get(REQUEST_ID)
    if rid is None:
        rid = request[REQUEST_ID] = client_request_id(request.headers) or request.app[LIFECYCLE].new_id()
    return rid


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error the framework raises (404, 405, 413 on other routes) as OpenAI's JSON
    (Anthropic's under /v1/messages); a 404 lists the routes served."""
    request[ARRIVED_UNDER] = request.app[LIVE].hash
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(e.status)
        message = (not_found_message(request.method, request.path, served(request.app.router)) if e.status == 404
                   else f"{e.reason}: {request.method} {request.path}")
        err = APIError(message, status=e.status, type="invalid_request_error", code=code)
        return _logged(request, shaped_error(err, request.path), code)
    except APIError as e:
        audit = request.app.get(AUDIT)
        if audit is not None and is_auth_failure(e):
            audit.auth_failure(method=request.method, path=request.path, client=request.remote,
                               key=bearer_key(request.headers), status=e.status, reason=e.code)
        return _logged(request, shaped_error(e, request.path), e.code)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(APIError("Internal gateway error.", status=500, code="internal_error"))


def _logged(request: web.Request, response: web.Response, reason: str | None) -> web.Response:
    """An error answered outside the generation routes, written to the access log as they are."""
    if request.app[LIVE].cfg.access_log:
        route_access_log(request_id=_request_id(request), method=request.method, path=request.path,
                         status=response.status, reason=reason, client=request.remote,
                         user_agent=request.headers.get("User-Agent"))
    return response


def _bound_port(site: web.TCPSite, configured: int) -> int:
    """The real port when the config asked for 0 (pick a free one)."""
    server = site._server
    sockets = getattr(server, "sockets", None)
    return int(sockets[0].getsockname()[1]) if sockets else configured


def reloader_of(app: web.Application, store: ConfigStore | None = None,
                reread: Callable[[], GatewayConfig] | None = None) -> Reloader:
    """The reloader of a started app (its parts exist once its lifecycle has begun)."""
    parts = Parts(app[DISPATCHER], app[PROXY], app[LIFECYCLE], app[BACKENDS], app[PROBES], app[METRICS], app[UPSTREAM],
                  app[MODERATION])
    return Reloader(app[LIVE], parts, store, reread, app.get(AUDIT))


def gateway_runner(app: web.Application) -> GatewayRunner:
    """The runner that serves a gateway app: aiohttp's, with the client-side limits
    (`gateway.http.server`) and the handler cancellation a departed client needs."""
    return GatewayRunner(app, app[LIVE], app[METRICS], app[CLOCK], lambda: app[PROXY], handle_signals=False,
                         handler_cancellation=True,
                         access_log=None)


def _say_what_it_finds(cfg: GatewayConfig) -> None:
    """From the moment it listens, the gateway's own log (what its probes find, what changes) goes
    to stderr at INFO, in `cfg.log_format`; before, a failed start says one line only."""
    gateway_log = logging.getLogger("tailguard.gateway")
    if not gateway_log.handlers:
        said = logging.StreamHandler(sys.stderr)
        said.setFormatter(FORMATTERS[cfg.log_format]())
        gateway_log.addHandler(said)
    gateway_log.setLevel(logging.INFO)


def _started(cfg: GatewayConfig, live: Live, url: str) -> None:
    """The start line: where it listens, which config (number and hash), its backends, auth; and
    a warning when it listens beyond loopback with no key at all."""
    names = ", ".join(f"{b.name}={b.url}" for b in cfg.backends)
    log.info("tailguard gateway listening on %s (%s; backends: %s)", url, cfg.scheduler.policy, names,
             extra={"event": "start", "fields": {
                 "url": url, "config": {"n": live.n, "hash": live.hash}, "auth": bool(cfg.auth.api_keys),
                 "backends": [{"name": b.name, "url": b.url, "kind": b.kind, "max_concurrency": b.max_concurrency}
                              for b in cfg.backends]}})
    if not cfg.auth.api_keys and not cfg.auth.admin_keys and not _loopback(cfg.host):
        log.warning("listening on %s with no API keys: anyone who reaches it may call every API route, /config and "
                    "/metrics; the admin routes (/admin/*: reload, rollback, usage) answer loopback clients only. "
                    "Set auth.api_keys and auth.admin_keys", cfg.host, extra={"event": "auth", "fields": {"host": cfg.host}})


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _handle_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event,
                    on_hup: Callable[[], None]) -> list[signal.Signals]:
    """SIGINT and SIGTERM set `stop`, SIGHUP reloads; returns the signals still handled (a list
    the stop handler shrinks), for the caller to give back once the drain has ended.

    The first stop signal gives itself back its default, so sending it again during the drain
    ends the process at once (a second Ctrl-C, as uvicorn does), and has the process ignore the
    other one from then on: a terminal's Ctrl-C reaches every worker of `serve --workers` and the
    parent forwards it as a SIGTERM, which may land after a worker's drain, as it exits."""
    installed: list[signal.Signals] = []
    stops = (signal.SIGINT, signal.SIGTERM)

    def stop_on(sig: signal.Signals) -> Callable[[], None]:
        def on_signal() -> None:
            stop.set()
            for s in stops:
                if s in installed:
                    installed.remove(s)
                    loop.remove_signal_handler(s)
            signal.signal(signal.SIGTERM if sig == signal.SIGINT else signal.SIGINT, signal.SIG_IGN)
        return on_signal

    handlers: dict[signal.Signals, Callable[[], None]] = {s: stop_on(s) for s in stops}
    handlers[signal.SIGHUP] = on_hup
    for sig, on_signal in handlers.items():
        try:
            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):
            pass
    return installed


async def serve(
    cfg: GatewayConfig, *, ready: Callable[[str], None] | None = None, store: ConfigStore | None = None,
    reread: Callable[[], GatewayConfig] | None = None, record: Path | None = None, reuse_port: bool = False,
) -> None:
    """Run the gateway until SIGINT/SIGTERM (or cancellation). `ready` gets the base URL.
    `reuse_port`: listen with SO_REUSEPORT, beside the other workers of `tailguard serve --workers`.
    `record` names the file the front's events and decisions go to (`tailguard serve --record`).

    With a `store`, the config is recorded there at start and at each reload, and the state
    directory names this process (its pid file) for `tailguard config rollback`. SIGHUP reloads
    (`tailguard.gateway.ops.reload`): what the store was asked for, else `reread()`."""
    if cfg.access_log:
        _log_access()
    if store is not None:
        store.claim()  # one gateway per state directory (`tailguard serve` claims it before anything starts)
    app = create_app(cfg, record=record, state_dir=store.root if store is not None else None)
    raise_file_limit(cfg)
    runner, site = await _listening(app, cfg, reuse_port)
    _say_what_it_finds(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    reloader = app[adm.ADMIN].reloader = reloader_of(app, store, reread)
    installed = _handle_signals(loop, stop, reloader.on_signal)
    try:
        if store is not None:
            app[LIVE].n = store.record(cfg, "start").n
            store.write_pid()
        url = f"http://{cfg.host}:{_bound_port(site, cfg.port)}"
        _started(cfg, app[LIVE], url)
        if ready is not None:
            ready(url)
        await stop.wait()
    finally:
        log.info("tailguard gateway stopping: no new requests; queued ones are answered 503",
                 extra={"event": "stop", "fields": {"config": {"n": app[LIVE].n, "hash": app[LIVE].hash}}})
        if store is not None:
            store.clear_pid()
        await runner.cleanup()
        if store is not None:
            store.release()
        for sig in installed:
            loop.remove_signal_handler(sig)
        for h in logging.getLogger(ACCESS_LOGGER).handlers:
            h.flush()  # the lines of the last requests


def _log_access() -> None:
    """The access lines go to stderr, one a line, through the buffered handler (unless one is set)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not logger.handlers:
        handler = BufferedLineHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO)


async def _listening(app: web.Application, cfg: GatewayConfig, reuse_port: bool) -> tuple[GatewayRunner, web.TCPSite]:
    """The app set up and listening; one that cannot listen is cleaned up before the error goes on."""
    runner = gateway_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, backlog=1024, reuse_port=reuse_port or None)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()  # its probes stop now: nothing of a gateway that never listened goes on
        raise
    return runner, site
