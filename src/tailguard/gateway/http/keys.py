"""The gateway app's typed state (aiohttp's `AppKey`s, `RequestKey`s): what the app factory
(`gateway.http.app`), its start-up (`gateway.http.startup`) and its routes share. A route module's
own state keeps its key beside it (`admin.ADMIN`, `batches.SERVICE`)."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from tailguard.clock import Now
from tailguard.config import BackendConfig
from tailguard.gateway.dispatch import Dispatcher
from tailguard.gateway.http.proxy import Proxy
from tailguard.gateway.lifecycle import Lifecycle
from tailguard.gateway.ops.audit import AuditLog
from tailguard.gateway.ops.live import Live
from tailguard.gateway.ops.metering import Meter
from tailguard.gateway.ops.metrics import GatewayMetrics
from tailguard.gateway.upstream.client import Upstream
from tailguard.gateway.upstream.probes import Probes
from tailguard.guards.moderation import Moderation

LIVE = web.AppKey("live", Live)
METRICS = web.AppKey("metrics", GatewayMetrics)
DISPATCHER = web.AppKey("dispatcher", Dispatcher)
UPSTREAM = web.AppKey("upstream", Upstream)
PROXY = web.AppKey("proxy", Proxy)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
CLOCK: web.AppKey[Now] = web.AppKey("clock")  # the gateway's one clock, passed to every part
RECORD = web.AppKey("record", Path)  # where `--record` writes the front's events (absent: not recording)
STATE_DIR = web.AppKey("state_dir", Path)  # where usage is kept across restarts (absent: in memory)
METER = web.AppKey("meter", Meter)
AUDIT = web.AppKey("audit", AuditLog)  # the audit trail (absent: `audit.enabled` is off)
MODERATION = web.AppKey("moderation", Moderation)  # the moderation services' client, shared by the guards
BACKENDS = web.AppKey("backends", dict[str, BackendConfig])
PROBES = web.AppKey("probes", Probes)
ARRIVED_UNDER = web.RequestKey("arrived_under", str)  # the config hash when the request came in
