"""The routes for operators, not callers: `/config`, `/metrics`' guard, and `/admin/*` (the
running config with secrets masked, usage per caller, live reload and rollback), each behind
an admin key once keys are configured, and all of them rate-limited per gateway.

Who may call them (`auth.admin_keys`, `auth.open_metrics`): with no key configured at all, anyone
for `/config` and `/metrics`, as every route, but only a loopback client for `/admin/*` (a reload,
a rollback, everyone's usage: a gateway listening beyond loopback without keys must not hand
those to whoever reaches it; it says so at start); otherwise an admin key, sent as
`Authorization: Bearer <key>`: none or an unknown one is 401, a client key 403 (LiteLLM's master
key plays the same part). `/metrics` may be left open to loopback clients, where a Prometheus on
the same host scrapes it.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from tailguard.clock import Now
from tailguard.errors import APIError, BadRequest, Forbidden, RateLimited
from tailguard.front.intake import key_id
from tailguard.wire.headers import bearer_key
from tailguard.front.limits import CallerLimits
from tailguard.front.params import CallerSpec
from tailguard.config import GatewayConfig
from tailguard.config.auth import MAX_KEY_CHARS
from tailguard.gateway.classes import ClassTable, Unauthorized
from tailguard.gateway.http.keys import AUDIT, CLOCK, DISPATCHER, LIFECYCLE, LIVE, METER, METRICS
from tailguard.gateway.ops.metrics import METRICS_CONTENT_TYPE
from tailguard.gateway.ops.reload import Reloader

ADMIN_RPM = 600  # a bucket of 600 requests, refilled at 10 a second: enough for any dashboard, not for a guesser
LOOPBACK = frozenset({"127.0.0.1", "::1"})
_MAX_QUERY_VALUE = 64


class Admin:
    """The admin routes' state: the rate limit they share, and the reloader once the gateway
    serves (`app.serve` sets it; an app hosted otherwise answers reloads with 409)."""

    def __init__(self, clock: Now) -> None:
        self.reloader: Reloader | None = None
        self._clock = clock
        self._limit = CallerLimits([CallerSpec("admin", requests_per_minute=ADMIN_RPM)])

    def admit(self, request: web.Request, cfg: GatewayConfig, classes: ClassTable, *, metrics: bool = False) -> None:
        """Raise unless this request may use an operator route: rate-limited first, so a key
        guesser is slowed down as much as a dashboard gone wild."""
        now = self._clock()
        refusal = self._limit.refusal("admin", 0, now)
        if refusal is not None:
            raise RateLimited("Too many requests to the admin routes; retry later.", code="rate_limit_exceeded",
                              retry_after_s=refusal.retry_after_s)
        self._limit.settle("admin", self._limit.take("admin", 0, now), 0, now)  # a request, nothing held
        auth = cfg.auth
        if not auth.api_keys and not auth.admin_keys:
            if metrics or not request.path.startswith("/admin/") or request.remote in LOOPBACK:
                return
            raise Forbidden("With no keys configured, the admin routes answer only on loopback; set auth.admin_keys "
                            "to use them from elsewhere.", code="admin_key_required")
        if metrics and (auth.open_metrics == "always" or (auth.open_metrics == "loopback" and request.remote in LOOPBACK)):
            return
        key = bearer_key(request.headers)
        if key is None:
            raise Unauthorized("This route requires an admin key: send 'Authorization: Bearer <key>'.",
                               code="missing_api_key")
        if len(key) <= MAX_KEY_CHARS and key_id(key) in classes.admin:
            return
        if len(key) <= MAX_KEY_CHARS and classes.intake.key(key) is not None:
            raise Forbidden("This route requires an admin key (auth.admin_keys); a client key may not use it.",
                            code="admin_key_required")
        raise Unauthorized("Incorrect API key provided.", code="invalid_api_key")

    def reload(self, request: dict[str, Any]) -> web.Response:
        """Apply a reload or rollback on the loop, as SIGHUP does (the front is changed only
        from the loop's thread)."""
        if self.reloader is None:
            raise APIError("This gateway was not started by `tailguard serve`: it has nothing to reload from.",
                           status=409, type="invalid_request_error", code="no_reload")
        result = self.reloader.run(request)
        return web.Response(status=200 if result["ok"] else 409, body=orjson.dumps(result),
                            content_type="application/json")


ADMIN = web.AppKey("admin", Admin)


def config_body(cfg: GatewayConfig, digest: str, n: int | None) -> bytes:
    """The running config: number, hash and settings, every secret as its fingerprint."""
    return orjson.dumps({"hash": digest, "n": n, "settings": cfg.settings()})


async def json_body(request: web.Request) -> dict[str, Any]:
    """A small JSON object body, or {} for none; 400 otherwise."""
    raw = await request.content.read(4096)
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadRequest("The body must be a JSON object.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("The body must be a JSON object.", code="invalid_json")
    return body


def reload_request(body: dict[str, Any]) -> dict[str, Any]:
    """`{"force": true}` applies a config that weakens the guard (`ops.reload.weakened`);
    `allow_auth_change`, its name before, is the same."""
    name = "force" if "force" in body else "allow_auth_change"
    force = body.get(name, False)
    if not isinstance(force, bool):
        raise BadRequest(f"'{name}' must be true or false.", param=name)
    return {"how": "reload (admin)", "force": force}


def rollback_request(body: dict[str, Any]) -> dict[str, Any]:
    to, force = body.get("to"), body.get("force", False)
    if not isinstance(force, bool):
        raise BadRequest("'force' must be true or false.", param="force")
    if to is None:
        return {"good": True, "force": force}
    if not isinstance(to, int) or isinstance(to, bool) or to < 1:
        raise BadRequest("'to' must be a stored config's number.", param="to")
    return {"n": to, "how": f"rollback to {to} (admin)", "force": force}


def query_float(request: web.Request, name: str) -> float | None:
    value = request.query.get(name)
    if value is None:
        return None
    try:
        return float(value[:_MAX_QUERY_VALUE])
    except ValueError:
        raise BadRequest(f"'{name}' must be a number of seconds since the epoch.", param=name) from None


# --- the routes ------------------------------------------------------------------------------------

async def metrics_route(request: web.Request) -> web.Response:
    _admin_only(request, metrics=True)
    dispatcher, metrics = request.app[DISPATCHER], request.app[METRICS]
    dispatcher.export_gauges()
    metrics.export_state(dispatcher.front, request.app[LIVE], request.app[CLOCK]())
    audit = request.app.get(AUDIT)
    if audit is not None:
        audit.export(metrics)
    body = metrics.render()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


async def config_route(request: web.Request) -> web.Response:
    """The running config's settings, secrets as fingerprints, behind an admin key (`/config`
    and `/admin/config`): what `tailguard bench` records so two runs' settings can be compared."""
    _admin_only(request)
    live = request.app[LIVE]
    _audited(request, "read_config", route=request.path)
    return web.Response(body=config_body(live.cfg, live.hash, live.n), content_type="application/json")


def _admin_only(request: web.Request, *, metrics: bool = False) -> None:
    request.app[ADMIN].admit(request, request.app[LIVE].cfg, request.app[LIFECYCLE].classes, metrics=metrics)


async def usage_route(request: web.Request) -> web.Response:
    """Usage per caller, class and model over `since`..`until` (Unix seconds; `gateway.ops.metering`)."""
    _admin_only(request)
    since, until = query_float(request, "since"), query_float(request, "until")
    caller = request.query.get("caller")
    rows, scope = await request.app[METER].usage(since, until, caller[:64] if caller is not None else None)
    _audited(request, "read_usage", since=since, until=until, caller=caller[:64] if caller is not None else None,
             scope=scope)
    return web.Response(body=orjson.dumps({"object": "list", "data": rows, "scope": scope}),
                        content_type="application/json")


async def reload_route(request: web.Request) -> web.Response:
    _admin_only(request)
    return request.app[ADMIN].reload({**reload_request(await json_body(request)), **_asker(request)})


async def rollback_route(request: web.Request) -> web.Response:
    _admin_only(request)
    return request.app[ADMIN].reload({**rollback_request(await json_body(request)), **_asker(request)})


def _asker(request: web.Request) -> dict[str, str | None]:
    """Who asked for a reload, for the audit trail: their key (fingerprinted there) and address."""
    return {"key": bearer_key(request.headers), "client": request.remote}


def _audited(request: web.Request, action: str, **detail: object) -> None:
    """An admin read, into the audit trail (when it is kept)."""
    audit = request.app.get(AUDIT)
    if audit is not None:
        audit.admin(action, key=bearer_key(request.headers), client=request.remote, ok=True, **detail)
