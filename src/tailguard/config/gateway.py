"""The top of the gateway's config: `GatewayConfig`, the whole `tailguard.yaml`, made of the
sections of its sibling modules plus the listener and request-body settings. It holds what
needs every section at once: the checks across sections (class names referenced elsewhere,
duplicate names), `front_params()` and `intake_params()`, the settings with secrets
fingerprinted and their digest, and `quick()` (the config behind `tailguard serve --backend URL`)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Literal

from pydantic import Field, model_validator

from tailguard import settings
from tailguard.errors import ConfigError
from tailguard.front import params as fp
from tailguard.front.params import ServiceTier
from tailguard.config.audit import AuditConfig
from tailguard.config.auth import AuthConfig
from tailguard.config.backends import BackendConfig
from tailguard.config.batches import BatchesConfig
from tailguard.config.base import _INTAKE, _Model, fingerprint, shown_url
from tailguard.config.classes import POOLING_CLASS, ClassConfig, default_classes
from tailguard.config.fleet import EjectionConfig, HedgingConfig, RoutingConfig
from tailguard.config.guards import GuardConfig, RedactionConfig
from tailguard.config.limits import LimitsConfig
from tailguard.config.problems import validate
from tailguard.config.programs import ProgramsConfig
from tailguard.config.scheduler import SchedulerConfig
from tailguard.config.state import StateConfig
from tailguard.config.telemetry import TelemetryConfig
from tailguard.config.upstream import HealthConfig, RetryConfig, TimeoutsConfig
from tailguard.wire.openai import POOLING

class GatewayConfig(_Model):
    """The whole `tailguard.yaml` of `tailguard serve`."""

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8080, ge=0, le=65535, description="Port to listen on (0 picks a free one).")
    classes: list[ClassConfig] = Field(
        default_factory=default_classes, min_length=1,
        description="Request classes. Defaults: `interactive` (rank 0), `batch` (rank 1, capped) and "
        "`embeddings` (rank 2, at most half the slots: the pooling and tokenizer routes).",
    )
    pooling_class: str | None = Field(
        default=POOLING_CLASS,
        description="Class of requests to `/v1/embeddings`, `/v1/rerank`, `/rerank`, `/score`, `/tokenize` and "
        "`/detokenize` that no header, `service_tier` or key classifies, so a retrieval batch cannot crowd out "
        "chat. Null (or, left at its default, no class of that name): as any other request.",
    )
    default_class: str = Field(
        default=_INTAKE.default_class, description="Class of a request that nothing else classifies."
    )
    service_tier_map: dict[ServiceTier, str] = Field(
        default_factory=dict,
        description="Overrides of the OpenAI `service_tier` -> class mapping. Built in: `priority` and "
        "`scale` -> `interactive` (else the lowest rank), `default` -> `interactive` (else `default_class`), "
        "`flex` -> `batch` (else the highest rank), `auto` -> no opinion.",
    )
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig, description="Queueing policy.")
    backends: list[BackendConfig] = Field(
        default_factory=list, description="Upstream servers (`tailguard serve` needs at least one)."
    )
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig, description="Upstream deadlines per phase.")
    health: HealthConfig = Field(default_factory=HealthConfig, description="Backend health probes.")
    auth: AuthConfig = Field(default_factory=AuthConfig, description="Client API keys.")
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024,
        description="Largest request body accepted; larger is a 413 (at once when its Content-Length says so).",
    )
    body_timeout_s: float = Field(
        default=30.0, gt=0,
        description="Longest wait for a request's body once its headers are in; a slower client gets a 408. "
        "Nothing is queued before its body is in, so a slow client costs a connection, never a slot.",
    )
    access_log: bool = Field(default=True, description="Write one JSON line per request to stderr (written "
                                                       "together every 0.2 s).")
    log_format: Literal["json", "text"] = Field(
        default="json", description="The gateway's own log lines (start, stop, probes, reloads) on stderr: one JSON "
        "object a line with ts, level and event (`json`), or the same fields as plain text for a terminal (`text`).",
    )
    log_prompts: bool = Field(
        default=False, description="Include prompt and completion text in the access log (off: metadata only)."
    )
    retries: RetryConfig = Field(default_factory=RetryConfig, description="Retries that lose nothing.")
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig,
                                       description="OpenTelemetry traces of each request (off by default).")
    aliases: dict[str, str] = Field(
        default_factory=dict,
        description="Model names clients may use for a served model, e.g. `{chat: llama-3-8b}`: a request "
        "for `chat` goes to the backends serving `llama-3-8b`, sent as `llama-3-8b`.",
    )
    routing: RoutingConfig = Field(default_factory=RoutingConfig, description="Routing within a pool.")
    ejection: EjectionConfig = Field(default_factory=EjectionConfig, description="Passive health (ejection).")
    hedging: HedgingConfig = Field(default_factory=HedgingConfig, description="Hedged requests (off by default).")
    limits: LimitsConfig = Field(default_factory=LimitsConfig,
                                 description="Bytes and seconds a backend or a client may cost the gateway.")
    batches: BatchesConfig = Field(default_factory=BatchesConfig,
                                   description="OpenAI's Files and Batches API: journal, files, limits (docs/batch.md).")
    state: StateConfig = Field(default_factory=StateConfig,
                               description="Limits shared by replicas through Redis (off by default).")
    guards: list[GuardConfig] = Field(
        default_factory=list,
        description="Content guards, run in this order: on a request's text before it is queued (`stage: input`) or on "
        "its answer (`stage: output`); a guard that redacts hands the redacted text to the guards after it, so put "
        "personal data first and a moderation service never sees it (docs/security.md, \"Guards\").")
    redaction: RedactionConfig = Field(
        default_factory=RedactionConfig,
        description="Personal data redacted wherever text is kept (logs, the audit trail, relayed engine errors) and "
        "found by `personal_data` guards.")
    audit: AuditConfig = Field(default_factory=AuditConfig,
                               description="The tamper-evident audit trail (off by default; docs/security.md).")
    programs: ProgramsConfig = Field(default_factory=ProgramsConfig,
                                     description="Agent programs: a session's calls known as one (docs/agents.md).")

    def front_params(self, continues: dict[str, bool] | None = None) -> fp.FrontParams:
        """The front's parameters; `continues` maps a backend to whether its kind can continue a
        generation (backends of kind `auto` are added as not continuing until detected)."""
        known = continues or {}
        h = self.health
        return fp.FrontParams(
            classes=[c.spec() for c in self.classes],
            backends=[b.spec(known.get(b.name, False)) for b in self.backends],
            queue=replace(self.scheduler.queue_params(len(self.auth.names())),
                          max_queued_body_bytes=self.limits.max_queued_body_bytes),
            preemption=self.scheduler.preemption_params(),
            health=fp.HealthParams(unhealthy_after=h.unhealthy_after, healthy_after=h.healthy_after),
            retry=self.retries.params(),
            callers=self.auth.callers(),
            routing=self.routing.params(),
            ejection=self.ejection.params(),
            hedging=self.hedging.params(),
            programs=self.programs.params(),
        )

    def ttft_targets(self) -> dict[str, float]:
        """Each class with a TTFT target, and the target in seconds: the classes the TTFT burn-rate
        alerts judge (`gateway.ops.alerts`), each on its own target."""
        return {c.name: c.slo.ttft_s for c in self.classes if c.slo is not None and c.slo.ttft_s is not None}

    def fair_share(self) -> bool:
        """Whether callers share each rank (`scheduler.fair_share`, or its default for these keys)."""
        return self.scheduler.fair_share_on(len(self.auth.names()))

    def intake_params(self) -> fp.IntakeParams:
        """The intake's parameters: how a request is classified and capped (`tailguard.front.intake`)."""
        return fp.IntakeParams(classes=[c.spec() for c in self.classes], default_class=self.default_class,
                               service_tier_map=self.service_tier_map, keys=self.auth.keys(), aliases=self.aliases,
                               route_classes=self._route_classes())

    def _route_classes(self) -> dict[str, str]:
        """The pooling routes' class, when it is configured (`pooling_class`)."""
        if self.pooling_class is None or self.pooling_class not in {c.name for c in self.classes}:
            return {}
        return {route: self.pooling_class for route in sorted(POOLING)}

    def settings(self) -> dict[str, Any]:
        """Every setting as plain data, each secret (client keys, backend keys) replaced by a
        fingerprint: what the config's hash covers, what `/config` shows and a bench run records,
        and what `tailguard config diff` compares. A changed key still shows as changed."""
        data = self.model_dump(mode="json")
        data["auth"]["api_keys"] = {fingerprint(k): v for k, v in data["auth"]["api_keys"].items()}
        data["auth"]["admin_keys"] = [fingerprint(k) for k in data["auth"]["admin_keys"]]
        for b in data["backends"]:
            if b.get("api_key"):
                b["api_key"] = fingerprint(b["api_key"])
        data["state"]["url"] = self.state.shown_url()
        data["batches"]["store"] = shown_url(self.batches.store)
        data["audit"]["store"] = self.audit.shown_store()
        for g in data["guards"]:
            if g.get("api_key"):
                g["api_key"] = fingerprint(g["api_key"])
        return data

    def digest(self) -> str:
        """The short hash of `settings()`: the `X-Tailguard-Config` header, `/health`'s `config`."""
        return settings.digest(self.settings())

    @model_validator(mode="after")
    def _cross_checks(self) -> GatewayConfig:
        names = [c.name for c in self.classes]
        _no_duplicates(names, "class")
        known = set(names)
        listing = ", ".join(names)
        if self.default_class not in known:
            raise ValueError(f"default_class {self.default_class!r} is not a configured class (known: {listing})")
        if "pooling_class" in self.model_fields_set and self.pooling_class is not None and self.pooling_class not in known:
            raise ValueError(f"pooling_class {self.pooling_class!r} is not a configured class (known: {listing})")
        for tier, target in self.service_tier_map.items():
            if target not in known:
                raise ValueError(f"service_tier_map.{tier} names unknown class {target!r} (known: {listing})")
        for key_cfg in self.auth.api_keys.values():
            if key_cfg.default_class is not None and key_cfg.default_class not in known:
                label = key_cfg.name or "an api key"
                raise ValueError(
                    f"auth: {label} has default_class {key_cfg.default_class!r}, not a configured class (known: {listing})"
                )
            for name in key_cfg.allowed_classes or ():
                if name not in known:
                    raise ValueError(f"auth: {key_cfg.name or 'an api key'} allows class {name!r}, not a configured "
                                     f"class (known: {listing})")
            if key_cfg.allowed_classes is not None and key_cfg.default_class is not None \
                    and key_cfg.default_class not in key_cfg.allowed_classes:
                raise ValueError(f"auth: {key_cfg.name or 'an api key'} has default_class "
                                 f"{key_cfg.default_class!r}, which its allowed_classes do not include")
        _no_duplicates([b.name for b in self.backends], "backend")
        for name in self.hedging.classes if self.hedging.enabled else ():
            if name not in known:
                raise ValueError(f"hedging.classes names unknown class {name!r} (known: {listing})")
        if self.batches.line_class is not None and self.batches.line_class not in known:
            raise ValueError(f"batches.line_class names unknown class {self.batches.line_class!r} (known: {listing})")
        _no_duplicates([g.name for g in self.guards], "guard")
        for g in self.guards:
            for name in g.classes or ():
                if name not in known:
                    raise ValueError(f"guard {g.name!r} names unknown class {name!r} (known: {listing})")
        for alias, target in self.aliases.items():
            if target in self.aliases:
                raise ValueError(f"aliases.{alias} names {target!r}, itself an alias: name the served model")
        return self

    @classmethod
    def quick(cls, backend_urls: list[str], max_concurrency: int = 8, kind: str = "auto") -> GatewayConfig:
        """The config behind `tailguard serve --backend URL ... [--backend-kind KIND]`: default
        classes, one backend per URL, all of one kind."""
        if not backend_urls:
            raise ConfigError("at least one --backend URL is needed")
        seen: dict[str, int] = {}
        backends: list[dict[str, Any]] = []
        for url in backend_urls:
            base = _host_port(url)
            n = seen.get(base, 0)
            seen[base] = n + 1
            backends.append({"name": base if n == 0 else f"{base}-{n}", "url": url, "max_concurrency": max_concurrency,
                             "kind": kind})
        return validate(GatewayConfig, {"backends": backends}, "--backend")


def _no_duplicates(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise ValueError(f"{what} name {n!r} appears more than once")
        seen.add(n)


def _host_port(url: str) -> str:
    rest = url.split("://", 1)[-1]
    host = rest.split("/", 1)[0]
    cleaned = re.sub(r"[^A-Za-z0-9_.:-]", "_", host)
    return cleaned or "backend"
