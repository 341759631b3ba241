"""A live reload: a new config applied to the running gateway without losing a request.

The front takes the new queue, slot, preemption, retry and health-count parameters in place
(`Front.reconfigure`: queued, running and suspended requests are kept); the class table (caps,
classification) and the auth keys are swapped for requests that arrive from then on, the
deadlines, bounds and probe settings reach new requests and probes through `Live`
(`gateway.ops.live`), a backend's new address, key or model reaches its next attempt and probe
(a `kind: auto` one is asked again what it is), and what the replicas do while Redis is away
(`state.on_unavailable`, `state.replicas`) reaches the shared limits' next request, while requests
in flight keep what they started with. A new backend is probed and takes requests at once; a
removed one takes no new request, is no longer probed, and leaves (its metrics with it) when its
last request has ended.

Only the settings `LIVE` names are applied live; any other (the listening address, the body
limit, logging and tracing, the batch runner, the Redis link, the output estimator, a kept
backend's kind, pool or models) is read only at start, and a config that changes one is refused
whole, with the settings named, and the gateway keeps what it had: so `/config` never shows a
value that is not in force. Adding, removing or renaming a class needs a restart too (the front
refuses it).

SIGHUP triggers it (`serve` installs the handler): the stored config that `tailguard config
rollback` (or `reload --to N`) asked for in the state directory, else the `--config` file read again.
A request names the config it was made for and when: a leftover one is ignored. A config that
weakens the gateway's guard (every client key removed, more than half of them, every admin key in
force, or `/metrics` opened to everyone) is refused unless the asker confirmed it
(`tailguard config reload --force`, `"force": true` to `POST /admin/reload`), or, for a
gateway without keys, the file says so itself (`auth.allow_keyless`): an editor's half-written
file, cut off before its `auth:` section, reads as exactly such a config.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tailguard.config import BackendConfig, GatewayConfig
from tailguard.errors import ConfigError
from tailguard.front.events import LocalShare
from tailguard.gateway.dispatch import Dispatcher
from tailguard.gateway.classes import ClassTable
from tailguard.gateway.http.proxy import Proxy
from tailguard.gateway.lifecycle import Lifecycle
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

# The settings a reload applies live, by name or by the section they open (`classes[`: every
# setting of every class), each with what carries it to where it is read. Any other setting
# needs a restart: a new one is refused by a reload until it is made live and listed here.
LIVE: dict[str, str] = {
    "aliases.": "the class table", "default_class": "the class table", "service_tier_map.": "the class table",
    "pooling_class": "the class table", "classes[": "the front and the class table", "auth.": "the class table",
    "scheduler.": "the front", "routing.": "the front", "ejection.": "the front", "hedging.": "the front",
    "retries.": "the front", "health.": "the probes (retimed)", "timeouts.": "each new request",
    "limits.": "each new request, probe and connection", "body_timeout_s": "each new request",
    "state.on_unavailable": "the shared limits", "state.replicas": "the shared limits",
    "guards[": "the lifecycle's guards (each new request)",
    "redaction.": "the guards, the engines' relayed errors and the audit trail",
    "programs.": "the front and each new request",
}
_NOT_LIVE = ("scheduler.output_estimate.",)  # read once, at start, by the output estimator
# What a backend both configs name may change live: the front's slots, and where and how requests
# reach it (read by each new attempt and probe; one in flight keeps its connection). Its kind
# decides what the front may do with its requests, and its pool and models where it routes them:
# those are what a restart is for.
_LIVE_BACKEND = frozenset({"max_concurrency", "weight", "reserved_slots", "adaptive", "url", "api_key", "model"})
REQUEST_TTL_S = 60.0  # a reload request older than this is a leftover, not the asker's


def restart_needed(old: GatewayConfig, new: GatewayConfig) -> list[Change]:
    """The changes from `old` to `new` that a live reload cannot make. A backend added or
    removed is not one of them: only a setting of a backend that both configs name can be."""
    both = {b.name for b in old.backends} & {b.name for b in new.backends}
    return [c for c in diff(flatten(old.settings()), flatten(new.settings())) if not live(c.name, both)]


def live(name: str, kept_backends: set[str]) -> bool:
    """Whether a reload applies the setting `name` live (`kept_backends`: the backends both
    configs name, whose own settings are live only where `_LIVE_BACKEND` says)."""
    item = item_of(name)
    if item is not None and item.startswith("backends["):
        field = name[len(item) + 1:]
        return item[len("backends["):-1] not in kept_backends or field.split(".", 1)[0] in _LIVE_BACKEND
    if name.startswith(_NOT_LIVE):
        return False
    return any(name == k.rstrip(".[") or (k.endswith((".", "[")) and name.startswith(k)) for k in LIVE)


def weakened(old: GatewayConfig, new: GatewayConfig) -> list[str]:
    """What `new` would open that `old` kept closed, each said in full: a reload that does any of
    it needs the asker's confirmation (`force`). Every client key removed is allowed by the file
    itself with `auth.allow_keyless` (so a gateway meant to go keyless needs no flag)."""
    a, b = old.auth, new.auth
    out: list[str] = []
    old_keys, new_keys = set(a.keys()), set(b.keys())
    gone = len(old_keys - new_keys)
    if old_keys and not new_keys:
        if not b.allow_keyless:
            out.append(f"the new config has no auth.api_keys, so anyone could call the gateway without a key (it has "
                       f"{len(old_keys)} now); if that is meant, set auth.allow_keyless: true in it")
    elif gone * 2 > len(old_keys):
        out.append(f"it removes {gone} of the {len(old_keys)} client keys in force (more than half: a file cut off "
                   "part way through its keys reads so)")
    old_admin = a.admin_digests()
    if old_admin and not old_admin & b.admin_digests():
        out.append(f"it removes every admin key in force ({len(old_admin)}), so nobody could use the admin routes")
    if new_keys and b.open_metrics == "always" and a.open_metrics != "always":
        out.append(f"it opens /metrics to every client (auth.open_metrics: always; it is {a.open_metrics} now)")
    return out


def _confirmed(old: GatewayConfig, new: GatewayConfig) -> None:
    """Refuse a config that weakens the gateway's guard unasked, saying each way it would."""
    why = weakened(old, new)
    if why:
        raise ConfigError("this reload would weaken the gateway: " + "; ".join(why) + ". If that is meant, run "
                          "`tailguard config reload --force` (or POST /admin/reload with {\"force\": true}); if the "
                          "file was being written, reload once it is whole")


@dataclass(frozen=True, slots=True)
class Parts:
    """The running gateway's parts that a reload changes."""

    dispatcher: Dispatcher
    proxy: Proxy
    lifecycle: Lifecycle
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

    def apply(self, cfg: GatewayConfig, *, force: bool = False) -> None:
        """Make `cfg` the running config, or raise `ConfigError` and change nothing."""
        blocked = restart_needed(self.live.cfg, cfg)
        if blocked:
            raise ConfigError("these settings need a restart of the gateway: " + "; ".join(str(c) for c in blocked))
        if not force:
            _confirmed(self.live.cfg, cfg)
        p, kept = self._parts, {b.name for b in self.live.cfg.backends}
        # A kept backend keeps the kind detected (`auto`) or configured (unchanged); a new one
        # starts as at start.
        entries = {b.name: b.model_copy(update={"kind": p.backends[b.name].kind}) if b.name in kept else resolved(b)
                   for b in cfg.backends}
        continues = {n: get_kind(b.kind).continues_generation for n, b in entries.items()}
        p.dispatcher.reconfigure(cfg.front_params(continues))  # the last check that can refuse
        shared = p.lifecycle.shared
        if shared is not None:  # its local share follows `replicas` and `on_unavailable`
            before = shared.local_share()
            shared.link.follow(cfg.state)
            if shared.local_share() != before:
                p.dispatcher.tell(LocalShare(shared.local_share()))
        p.lifecycle.reconfigure(cfg, ClassTable(cfg))
        p.lifecycle.guards = GuardSet.of(cfg, p.moderation, p.metrics)  # for requests that arrive from now on
        redact = cfg.redaction.finder().redact
        p.upstream.redact = redact
        if self._audit is not None:
            self._audit.trail.redact = redact
        p.proxy.reconfigure(cfg)
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
        `force`), record it, and return the result: what SIGHUP leaves for `tailguard config` and
        what `POST /admin/reload` and `/admin/rollback` answer."""
        store = self._store
        old, was = self.live.hash, self.live.cfg
        result: dict[str, Any] = {"id": request.get("id") if request else None}  # so the asker knows it is its own
        try:
            cfg, how = self._wanted(request)
            self.apply(cfg, force=bool(request and request.get("force")))
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
