"""The gateway's audit log: what goes into the trail (`tailguard.audit`) and when.

    request        every request, as it ends (a listener of `Lifecycle.end`): time, ids, caller, key fingerprint,
                   client address, route, model, class, tokens, outcome, status, reason, backend,
                   the guards' verdicts, the config's hash; its prompt (and a non-stream answer)
                   only with `audit.retain_text`, redacted as `redaction:` says
    auth_failure   a request refused for its key (401; an admin route asked with a client key,
                   403), whatever the route: the key's fingerprint, never the key
    admin          an operator's action: reload and rollback (what changed, by field name),
                   reads of usage and of the config, batch create, cancel and retry
    start, gap     the gateway started (its config); entries dropped when the queue was full

The lifecycle (each request's end, and its `admit` before the front) and the routes call it; it builds a small dict on the loop and hands it to the trail's
queue, whose thread does the rest (redaction, hashing, writing).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from tailguard.audit.store import FILE_NAME, open_store
from tailguard.audit.trail import Trail
from tailguard.config import GatewayConfig
from tailguard.config.auth import MAX_KEY_CHARS
from tailguard.config.base import fingerprint
from tailguard.errors import APIError, AuditFull, ConfigError
from tailguard.front.intake import NO_CLASS
from tailguard.gateway.ops.live import Live
from tailguard.gateway.ops.metrics import GatewayMetrics
from tailguard.gateway.request import Ended
from tailguard.types import RejectReason


def key_fingerprint(key: str | None) -> str | None:
    """A presented key as the trail names it (a wrong one too: a guesser's keys are told apart)."""
    return None if key is None else fingerprint(key[:MAX_KEY_CHARS])


def is_auth_failure(err: APIError) -> bool:
    """Refused for its key: none or an unknown one (401), or a client key on an admin route."""
    return err.status == 401 or err.code == "admin_key_required"


def default_chain(cfg: GatewayConfig) -> str:
    """`<hostname>:<port>`, so a restart continues its chain; on a port picked at random, the pid."""
    return f"{socket.gethostname()}:{cfg.port if cfg.port else f'pid{os.getpid()}'}"


class AuditLog:
    def __init__(self, trail: Trail, live: Live, *, retain_text: bool, refuse: bool) -> None:
        self.trail, self._live = trail, live
        self.retain_text, self._refuse = retain_text, refuse
        self._reported = (0, 0, 0)  # written, dropped, failures: what the metrics have counted

    @classmethod
    def open(cls, live: Live, state_dir: Path | None) -> AuditLog | None:
        """The running config's trail, started; None when `audit.enabled` is off."""
        cfg = live.cfg
        a = cfg.audit
        if not a.enabled:
            return None
        path = a.path or (state_dir / FILE_NAME if state_dir is not None else None)
        try:
            store = open_store(a.store, path)
        except Exception as e:  # one line at start, never the store's password
            where = a.shown_store() if a.store != "sqlite" else str(path)
            raise ConfigError(f"audit: cannot open the trail at {where}: {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}") from None
        finder = cfg.redaction.finder()
        trail = Trail(store, a.chain or default_chain(cfg), queue_entries=a.queue_entries, flush_s=a.flush_s,
                      max_age_s=a.max_age_days * 86400.0, max_entries=a.max_entries, redact=finder.redact)
        trail.start()
        log = cls(trail, live, retain_text=a.retain_text, refuse=a.when_full == "refuse")
        log._add({"kind": "start", "config": live.hash, "n": live.n, "pid": os.getpid()})
        return log

    def admit(self, metrics: GatewayMetrics, cls: str) -> None:
        """Refuse a request while the queue is full, when the operator chose to (`when_full:
        refuse`): its entry could not be kept."""
        if self._refuse and self.trail.full():
            metrics.rejected.labels(cls, RejectReason.AUDIT_UNAVAILABLE).inc()
            raise AuditFull()

    def ended(self, e: Ended) -> None:
        """A request's entry, as the lifecycle ends it (a 401 is an `auth_failure`)."""
        t = e.request
        doc: dict[str, Any] = {
            "kind": "auth_failure" if t.status == 401 else "request", "id": t.id, "request_id": t.request_id,
            "caller": t.caller, "key": t.key, "client": t.client, "method": e.method, "route": e.path,
            "model": t.model, "class": None if t.cls == NO_CLASS else t.cls, "prompt_tokens": t.prompt_tokens,
            "output_tokens": t.output_tokens, "outcome": t.outcome.value, "status": t.status, "reason": t.reason,
            "backend": None if t.backend == "-" else t.backend, "guards": t.verdicts or None, "config": self._live.hash,
        }
        if self.retain_text:
            doc["prompt"], doc["completion"] = t.prompt_text, t.completion
        self._add(doc)

    def auth_failure(self, *, method: str, path: str, client: str | None, key: str | None, status: int,
                     reason: str | None) -> None:
        """A route other than a generation route refused a key (theirs are `request` entries with 401)."""
        self._add({"kind": "auth_failure", "caller": None, "key": key_fingerprint(key), "client": client,
                   "method": method, "route": path, "status": status, "reason": reason})

    def admin(self, action: str, *, key: str | None, client: str | None, ok: bool, **detail: Any) -> None:
        """An operator's (or a batch owner's) action, by whose key, from where, and how it went."""
        self._add({"kind": "admin", "action": action, "caller": None, "key": key_fingerprint(key), "client": client,
                   "ok": ok, **detail})

    def _add(self, doc: dict[str, Any]) -> None:
        self.trail.add({k: v for k, v in doc.items() if v is not None or k == "caller"})

    def export(self, metrics: GatewayMetrics) -> None:
        """At a scrape: what the trail did since the last one, into the counters, and its queue."""
        f = metrics.families
        now = (self.trail.written, self.trail.dropped, self.trail.failures)
        for name, new, old in zip(("tailguard_audit_entries", "tailguard_audit_dropped",
                                   "tailguard_audit_write_failures"), now, self._reported):
            if new > old:
                f[name].inc(new - old)
        self._reported = now
        f["tailguard_audit_queue_length"].set(self.trail.queued())

    def close(self) -> None:
        self.trail.close()
