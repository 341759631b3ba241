"""A live reload: a new config applied to the running gateway without losing a request.

The front takes the new queue, slot, preemption, retry and health-count parameters in place
(`Front.reconfigure`: queued, running and suspended requests are kept); the class table (caps,
classification) and the auth keys are swapped for requests that arrive from then on, the
deadlines and probe settings reach new requests and probes through `Live` (`gateway.ops.live`), and
a backend's new address, key or model reaches its next attempt and probe (a `kind: auto` one is
asked again what it is), while requests in flight keep what they started with. A new backend
is probed and takes requests at once; a removed one takes no new request, is no longer probed,
and leaves (its metrics with it) when its last request has ended. Settings read only at start
(listening address, body limit, logging, the output estimator, a kept backend's kind) and
adding, removing or renaming a class need a restart: such a config is refused whole, with the
settings named, and the gateway keeps what it had.

SIGHUP triggers it (`serve` installs the handler): the stored config that `tailguard config
rollback` (or `reload --to N`) asked for in the state directory, else the `--config` file read again.
A request names the config it was made for and when: a leftover one is ignored. A config that
would switch auth off (every key removed) is refused unless it says so (`auth.allow_keyless`) or
the asker confirmed it (`tailguard config reload --allow-auth-change`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tailguard.errors import ConfigError
from tailguard.config import BackendConfig, GatewayConfig
from tailguard.gateway.dispatch import Dispatcher
from tailguard.gateway.http.classes import ClassTable
from tailguard.gateway.http.proxy import Proxy
from tailguard.gateway.ops.live import Live
from tailguard.gateway.ops.metrics import GatewayMetrics
from tailguard.gateway.ops.store import ConfigStore
from tailguard.gateway.upstream.backends import resolved
from tailguard.gateway.upstream.client import Upstream
from tailguard.gateway.upstream.kinds import get_kind
from tailguard.gateway.upstream.probes import Probes
from tailguard.guards.guard import GuardSet
from tailguard.guards.moderation import Moderation
from tailguard.settings import Change, diff, flatten, item_of

if TYPE_CHECKING:
    from tailguard.gateway.ops.audit import AuditLog

log = logging.getLogger("tailguard.gateway")

# What a backend may change live: the front's slots, and where and how requests reach it (read
# by each new attempt and probe; one in flight keeps its connection). Its kind decides what the
# front may do with its requests, and is what a restart is for.
_LIVE_BACKEND = frozenset({"max_concurrency", "weight", "reserved_slots", "adaptive", "url", "api_key", "model"})
_RESTART = frozenset({"host", "port", "max_body_bytes", "access_log", "log_prompts"})
_RESTART_PREFIXES = ("scheduler.output_estimate.", "audit.")
REQUEST_TTL_S = 60.0  # a reload request older than this is a leftover, not the asker's


def restart_needed(old: GatewayConfig, new: GatewayConfig) -> list[Change]:
    """The changes from `old` to `new` that a live reload cannot make. A backend added or
    removed is not one of them: only a setting of a backend that both configs name can be."""
    both = {b.name for b in old.backends} & {b.name for b in new.backends}
    return [c for c in diff(flatten(old.settings()), flatten(new.settings())) if _needs_restart(c.name, both)]


def _needs_restart(name: str, kept_backends: set[str]) -> bool:
    item = item_of(name)
    if item is not None and item.startswith("backends["):
        field = name[len(item) + 1:]
        return item[len("backends["):-1] in kept_backends and field.split(".", 1)[0] not in _LIVE_BACKEND
    return name in _RESTART or name.startswith(_RESTART_PREFIXES)


def _auth_kept(old: GatewayConfig, new: GatewayConfig) -> None:
    """Refuse a config that would switch auth off unasked: from keys to none, unless it says
    `auth.allow_keyless` (a file cut off before its `auth:` section parses as just that)."""
    if old.auth.api_keys and not new.auth.api_keys and not new.auth.allow_keyless:
        raise ConfigError(
            f"the new config has no auth.api_keys, so anyone could call the gateway without a key (it has "
            f"{len(old.auth.api_keys)} now); if that is meant, set auth.allow_keyless: true in it or run "
            "`tailguard config reload --allow-auth-change`; if the file was being written, reload once it is whole")


@dataclass(frozen=True, slots=True)
class Parts:
    """The running gateway's parts that a reload changes."""

    dispatcher: Dispatcher
    proxy: Proxy
    backends: dict[str, BackendConfig]  # by name, kinds resolved: what exchanges and probes read
    probes: Probes
    metrics: GatewayMetrics
    upstream: Upstream
    moderation: Moderation  # the guards' moderation client, kept across reloads


class Reloader:
    """Applies a config to the running gateway's parts, and answers a SIGHUP."""

    def __init__(self, live: Live, parts: Parts, store: ConfigStore | None,
                 reread: Callable[[], GatewayConfig] | None, audit: AuditLog | None = None) -> None:
        self.live, self._parts, self._store, self._reread = live, parts, store, reread
        self._audit = audit  # each reload and rollback, applied or refused, goes into the trail

    def apply(self, cfg: GatewayConfig, *, allow_auth_change: bool = False) -> None:
        """Make `cfg` the running config, or raise `ConfigError` and change nothing."""
        blocked = restart_needed(self.live.cfg, cfg)
        if blocked:
            raise ConfigError("these settings need a restart of the gateway: " + "; ".join(str(c) for c in blocked))
        if not allow_auth_change:
            _auth_kept(self.live.cfg, cfg)
        p, kept = self._parts, {b.name for b in self.live.cfg.backends}
        # A kept backend keeps the kind detected (`auto`) or configured (unchanged); a new one
        # starts as at start.
        entries = {b.name: b.model_copy(update={"kind": p.backends[b.name].kind}) if b.name in kept else resolved(b)
                   for b in cfg.backends}
        continues = {n: get_kind(b.kind).continues_generation for n, b in entries.items()}
        p.dispatcher.reconfigure(cfg.front_params(continues))  # the last check that can refuse
        p.proxy.reconfigure(cfg, ClassTable(cfg))
        p.proxy.guards = GuardSet.of(cfg, p.moderation, p.metrics)  # for requests that arrive from now on
        redact = cfg.redaction.finder().redact
        p.upstream.redact = redact
        if self._audit is not None:
            self._audit.trail.redact = redact
        p.backends.update(entries)  # a removed one stays: its requests in flight still read it
        added = [b for b in cfg.backends if b.name not in kept]
        for b in added:  # healthy as at start, or as it was when named again before it left
            p.metrics.add_backend(b.name, entries[b.name].kind, p.dispatcher.healthy.get(b.name, True))
        p.probes.follow(added, kept - entries.keys())
        health_changed = cfg.health != self.live.cfg.health
        self.live.cfg, self.live.hash = cfg, cfg.digest()
        if health_changed:
            p.probes.retime()

    def on_signal(self) -> None:
        """SIGHUP: apply what was asked for, record it, and leave the result for the asker."""
        try:
            request = self._request()
        except (OSError, ValueError) as e:
            log.error("config not applied, the gateway keeps %s: %s", self.live.hash, e)
            self._answer({"id": None, "ok": False, "error": str(e) or type(e).__name__})
            return
        self._answer(self.run(request))

    def run(self, request: dict[str, Any] | None) -> dict[str, Any]:
        """Apply what `request` asks for (`n`: a stored config, else the file again; `how`;
        `allow_auth_change`), record it, and return the result: what SIGHUP leaves for
        `tailguard config` and what `POST /admin/reload` and `/admin/rollback` answer."""
        store = self._store
        old, was = self.live.hash, self.live.cfg
        result: dict[str, Any] = {"id": request.get("id") if request else None}  # so the asker knows it is its own
        try:
            cfg, how = self._wanted(request)
            self.apply(cfg, allow_auth_change=bool(request and request.get("allow_auth_change")))
        except (ConfigError, OSError, ValueError, KeyError) as e:  # a refusal, or an unreadable request
            log.error("config not applied, the gateway keeps %s: %s", old, e)
            self._audited(request, False, error=str(e) or type(e).__name__)
            return {**result, "ok": False, "error": str(e) or type(e).__name__}
        if store is not None:
            try:
                self.live.n = store.record(cfg, how).n
            except OSError as e:  # applied all the same: the history misses it, and says so here
                self.live.n = None
                log.error("config %s applied but not stored in %s: %s", self.live.hash, store.root, e)
        log.warning("config %s applied (%s; was %s)", self.live.hash, how, old)
        self._audited(request, True, how=how, was=old, now=self.live.hash, n=self.live.n,
                      changed=[c.name for c in diff(flatten(was.settings()), flatten(cfg.settings()))])
        return {**result, "ok": True, "n": self.live.n, "hash": self.live.hash}

    def _audited(self, request: dict[str, Any] | None, ok: bool, **detail: Any) -> None:
        """A reload or rollback into the audit trail: by whom (an admin route's key and address; a
        signal has neither), whether it was applied, and which settings it changed, by name."""
        if self._audit is None:
            return
        asked = request or {}
        action = "rollback" if asked.get("good") or "n" in asked else "reload"
        self._audit.admin(action, key=asked.get("key"), client=asked.get("client"), ok=ok,
                          via="admin" if "client" in asked else "signal", **detail)

    def _answer(self, result: dict[str, Any]) -> None:
        if self._store is not None:
            try:
                self._store.write_json(self._store.result_file, result)
            except OSError as e:
                log.error("cannot leave the reload's result in %s: %s", self._store.root, e)

    def _request(self) -> dict[str, Any] | None:
        """The request `tailguard config` left for this SIGHUP, unless it is stale: made for
        another running config, or long ago (a leftover of a CLI that died must not override
        the file at the next bare SIGHUP)."""
        if self._store is None:
            return None
        request = self._store.take_json(self._store.request_file)
        if request is None:
            return None
        made_for, at = request.get("made_for"), request.get("at")
        age_s = time.time() - at if isinstance(at, (int, float)) else None
        if made_for != self.live.hash or age_s is None or not 0 <= age_s <= REQUEST_TTL_S:
            log.warning("ignored a stale reload request in %s (made for config %s, %s ago)", self._store.root,
                        made_for, "?" if age_s is None else f"{age_s:.0f} s")
            return None
        return request

    def _wanted(self, request: dict[str, Any] | None) -> tuple[GatewayConfig, str]:
        if request is not None and request.get("good") and self._store is not None:
            good = self._store.good()
            if good is None:
                raise ConfigError(f"no baseline marked in {self._store.root} (tailguard config mark-good N)")
            return good.load(), f"rollback to {good.n}"
        if request is not None and "n" in request and self._store is not None:
            n = int(request["n"])
            return self._store.get(n).load(), str(request.get("how") or f"apply {n}")
        if self._reread is None:
            raise ConfigError("nothing to reload: the gateway was started without --config")
        return self._reread(), "reload"
