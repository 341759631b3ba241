"""The gateway's configuration: pydantic models for `tailguard.yaml` and `load_config(path)`.

Every field has a default and a description (docs/configuration.md is written from them), and
unknown keys are errors, so a typo in a config file fails loudly instead of being ignored.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal, cast

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tailguard import settings
from tailguard.errors import ConfigError
from tailguard.front import params as fp

BackendKind = Literal["auto", "vllm", "llamacpp", "sglang", "tgi", "openai", "sim"]
SchedulerPolicy = Literal["ranked-sjf", "fcfs"]
CapMode = Literal["clamp", "reject"]
ServiceTier = Literal["auto", "default", "flex", "scale", "priority"]

_CLASS_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_BACKEND_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")
# The front's defaults (tailguard.front.params), so each default number lives in one place.
_CLS = fp.ClassSpec(name="")
_QUEUE = fp.QueueParams()
_PREEMPT = fp.PreemptionParams()
_BACKEND = fp.BackendSpec(name="")
_HEALTH = fp.HealthParams()
_RETRY = fp.RetryParams()


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClassConfig(_Model):
    """A named request class: its rank, caps and queue budgets."""

    name: str = Field(description="Class name, used in `X-Tailguard-Class`, metrics labels and logs.")
    rank: int = Field(
        default=_CLS.rank,
        description="Priority between classes: a lower rank is served first (strict priority, except while a "
        "later-ranked class is below its `min_share`).",
    )
    default_max_tokens: int | None = Field(
        default=None, ge=1,
        description="`max_tokens` set on requests that carry none. When unset, `max_tokens_cap` (if any) "
        "is used instead, so a cap cannot be bypassed by leaving `max_tokens` out.",
    )
    max_tokens_cap: int | None = Field(
        default=None, ge=1,
        description="Largest `max_tokens` (or `max_completion_tokens`) a request of this class may ask for.",
    )
    cap_mode: CapMode = Field(
        default="clamp",
        description="What happens to a request over `max_tokens_cap`: `clamp` lowers it to the cap, "
        "`reject` answers 400.",
    )
    max_prompt_tokens: int | None = Field(
        default=None, ge=1,
        description="Largest estimated prompt (UTF-8 bytes / 4, or exact token ids) accepted; larger is a 400.",
    )
    max_queue_len: int = Field(
        default=_CLS.max_queue_len, ge=1,
        description="Requests of this class that may wait in the gateway at once; more are rejected "
        "with 503 `queue_full`. Bounds the gateway's memory.",
    )
    max_queue_wait_s: float = Field(
        default=_CLS.max_queue_wait_s, gt=0,
        description="Longest a request may wait in the gateway's queue. A request expected to wait longer "
        "is rejected on arrival (503 `wait_bound`); one that does wait this long leaves with the same answer.",
    )
    max_share: float = Field(
        default=_CLS.max_share, gt=0, le=1,
        description="Fraction of each backend's `max_concurrency` that this class and every class ranked "
        "after it may occupy together (rounded down, at least one slot); the rest is kept for "
        "higher-ranked classes.",
    )
    min_share: float = Field(
        default=_CLS.min_share, ge=0, lt=1,
        description="Guaranteed fraction of the slots in use (rounded down) for this class while it has "
        "requests queued: when a slot frees and the class holds fewer, its next request goes before those "
        "of higher ranks, so a flood of higher-ranked work cannot starve it. 0 = no guarantee (strict "
        "priority). Used by `ranked-sjf`; at most `max_share`.",
    )
    preemptible: bool = Field(
        default=_CLS.preemptible,
        description="A running request of this class may be suspended to free its slot for a queued request "
        "of a lower rank, and resumed later where it stopped (the client's connection stays open). Only on "
        "backends whose kind can continue a generation (`vllm`, `llamacpp`, `sim`).",
    )

    def spec(self) -> fp.ClassSpec:
        return fp.ClassSpec(name=self.name, rank=self.rank, max_queue_len=self.max_queue_len,
                            max_queue_wait_s=self.max_queue_wait_s, max_share=self.max_share,
                            min_share=self.min_share, preemptible=self.preemptible)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _CLASS_NAME.match(v):
            raise ValueError(f"class name {v!r} may only hold letters, digits, '_', '.' and '-'")
        return v

    @model_validator(mode="after")
    def _min_within_max_share(self) -> ClassConfig:
        if self.min_share > self.max_share:
            raise ValueError(f"min_share ({self.min_share}) is above max_share ({self.max_share})")
        return self

    @model_validator(mode="after")
    def _default_within_cap(self) -> ClassConfig:
        if (
            self.default_max_tokens is not None
            and self.max_tokens_cap is not None
            and self.default_max_tokens > self.max_tokens_cap
        ):
            raise ValueError(
                f"default_max_tokens ({self.default_max_tokens}) is above max_tokens_cap ({self.max_tokens_cap})"
            )
        return self


def default_classes() -> list[ClassConfig]:
    """`interactive` first; `batch` capped and preemptible, with every slot open to it.

    Without preemption a burst of long batch jobs fills every slot and a chat waits for one of
    them to finish (seconds): the tail this gateway exists to remove. Reserving slots for chats
    trades that against batch throughput and latency, and no share meets both on the seed mix
    (docs/configuration.md). Suspending a batch job for a waiting chat and resuming it later costs
    one re-prefill instead, so batch may use the whole engine (benchmarks/results/seed_des.md).
    """
    caps: dict[str, dict[str, Any]] = {"batch": {"max_tokens_cap": 4096}}
    return [ClassConfig(**asdict(c), **caps.get(c.name, {})) for c in fp.default_classes()]


class BackendConfig(_Model):
    """One upstream OpenAI-compatible server."""

    name: str = Field(description="Backend name, shown in `X-Tailguard-Backend` and metrics labels.")
    url: str = Field(
        description="Base URL without `/v1`, e.g. `http://127.0.0.1:8000` (a trailing `/v1` is removed)."
    )
    kind: BackendKind = Field(
        default="auto",
        description="Server software. `auto` (the default) asks the server at start and whenever it comes "
        "back (vLLM's `/version`, llama.cpp's `/props`, TGI's `/info`, SGLang's `/get_server_info`, the "
        "simulator's `/health`), else `openai`. The kind decides the protection: on `vllm`, `llamacpp` "
        "and `sim` a running batch request can be suspended for a chat and continued; on the others "
        "`reserved_slots` are kept for the top class. `vllm` and `sglang` also get the class as their "
        "`priority`.",
    )
    reserved_slots: int | None = Field(
        default=_BACKEND.reserved_slots, ge=0,
        description="Slots only the top-ranked class (interactive) may take. Unset: none on a kind that "
        "can continue a generation (preemption protects chats there), else a quarter of "
        "`max_concurrency` (at least one), so a burst of long jobs cannot hold every slot.",
    )
    max_concurrency: int = Field(
        default=_BACKEND.max_concurrency, ge=1,
        description="Requests the gateway keeps in flight on this backend at once: the gateway-side twin of "
        "vLLM's `--max-num-seqs` (or llama.cpp's `-np`). Set it to the engine's batch size; more and the "
        "engine queues FCFS behind the gateway's back.",
    )
    weight: float = Field(
        default=_BACKEND.weight, gt=0,
        description="Relative capacity when routing: load is compared as in-flight / (max_concurrency * weight).",
    )
    api_key: str | None = Field(default=None, description="Sent upstream as `Authorization: Bearer <key>`.")
    model: str | None = Field(default=None, description="If set, replaces the request's `model` on the way upstream.")

    def spec(self, continues: bool = False) -> fp.BackendSpec:
        """The front's view; `continues` comes from the kind (named, or detected later)."""
        return fp.BackendSpec(name=self.name, max_concurrency=self.max_concurrency, weight=self.weight,
                              continues=continues, reserved_slots=self.reserved_slots)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _BACKEND_NAME.match(v):
            raise ValueError(f"backend name {v!r} may only hold letters, digits, '_', '.', ':' and '-'")
        return v

    @field_validator("url")
    @classmethod
    def _url_ok(cls, v: str) -> str:
        v = v.strip()
        if not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError(f"url {v!r} must start with http:// or https://")
        v = v.rstrip("/")
        if v.endswith("/v1"):
            v = v[: -len("/v1")]
        if v.count("/") < 2 or not v.split("/", 3)[2]:
            raise ValueError(f"url {v!r} has no host")
        return v


class TimeoutsConfig(_Model):
    """Deadlines per phase of a request once it leaves the gateway's queue."""

    connect_s: float = Field(default=5.0, gt=0, description="Opening the upstream connection and sending the request.")
    first_token_s: float = Field(
        default=120.0, gt=0,
        description="From sending upstream to the first chunk carrying generated content (the role-only chunk does not count; covers a long prompt's prefill).",
    )
    idle_s: float = Field(default=30.0, gt=0, description="Longest gap between two upstream chunks.")
    total_s: float = Field(default=600.0, gt=0, description="Whole upstream request, from connect to the last byte.")


class OutputEstimateConfig(_Model):
    """How big a request without `max_tokens` is assumed to be, for shortest-job-first."""

    initial_tokens: int = Field(
        default=256, ge=1,
        description="Output tokens assumed for a class before any of its requests has finished.",
    )
    ewma_weight: float = Field(
        default=0.05, gt=0, le=1,
        description="Weight of each finished request's real output length in the class's running average.",
    )


class SchedulerConfig(_Model):
    """Who goes next when a slot frees."""

    policy: SchedulerPolicy = Field(
        default=cast(SchedulerPolicy, _QUEUE.policy),
        description="`ranked-sjf`: priority by class rank (with `min_share` guarantees), shortest estimated job "
        "first within a rank (see `sjf_size_ratio`), with aging. `fcfs`: arrival order, for comparison.",
    )
    aging_s: float = Field(
        default=_QUEUE.aging_s, gt=0,
        description="Starvation bound of `ranked-sjf`: once a request has waited this long, no younger request "
        "of its rank is dispatched before it (aged requests go oldest first).",
    )
    sjf_size_ratio: float = Field(
        default=_QUEUE.sjf_size_ratio, ge=1,
        description="Within a class, shortest-first needs a real gap: the oldest queued request goes next "
        "unless another is at least this many times smaller (then the smallest goes). Job sizes are rough "
        "(a prompt token costs far less time than an output token), so near-equal sizes keep arrival order "
        "instead of starving the slightly larger ones. 1 = strict shortest first.",
    )
    output_estimate: OutputEstimateConfig = Field(
        default_factory=OutputEstimateConfig,
        description="Running per-class estimate of output length, used as job size when `max_tokens` is absent.",
    )
    drain_ewma_weight: float = Field(
        default=_QUEUE.drain_ewma_weight, gt=0, le=1,
        description="The drain rate (used for `wait_bound` rejections and `Retry-After`) is counted over the "
        "last `4 / drain_ewma_weight` completions that happened while requests were queued.",
    )
    preemption: bool = Field(
        default=_PREEMPT.enabled,
        description="Suspend a running request of a `preemptible` class when a request of a higher priority (lower rank) is "
        "queued and no backend has a slot for it; the suspended one is resumed where it stopped. "
        "Not done by the `fcfs` policy (the baseline).",
    )
    max_preemptions_per_request: int = Field(
        default=_PREEMPT.max_preemptions_per_request, ge=0,
        description="How often one request may be suspended; after that it runs to its end.",
    )
    min_run_s: float = Field(
        default=_PREEMPT.min_run_s, ge=0,
        description="A request (re)started less than this long ago is not suspended, so a burst of "
        "arrivals cannot suspend the same work over and over before it makes progress.",
    )
    retry_after_min_s: float = Field(default=_QUEUE.retry_after_min_s, gt=0, description="Smallest `Retry-After` ever sent.")
    retry_after_max_s: float = Field(default=_QUEUE.retry_after_max_s, gt=0, description="Largest `Retry-After` ever sent.")

    def queue_params(self) -> fp.QueueParams:
        return fp.QueueParams(policy=self.policy, aging_s=self.aging_s, sjf_size_ratio=self.sjf_size_ratio,
                              drain_ewma_weight=self.drain_ewma_weight, retry_after_min_s=self.retry_after_min_s,
                              retry_after_max_s=self.retry_after_max_s)

    def preemption_params(self) -> fp.PreemptionParams:
        return fp.PreemptionParams(enabled=self.preemption, min_run_s=self.min_run_s,
                                   max_preemptions_per_request=self.max_preemptions_per_request)

    @model_validator(mode="after")
    def _retry_bounds(self) -> SchedulerConfig:
        if self.retry_after_min_s > self.retry_after_max_s:
            raise ValueError("retry_after_min_s is above retry_after_max_s")
        return self


class HealthConfig(_Model):
    """Active health probes of each backend."""

    interval_s: float = Field(default=5.0, gt=0, description="Time between probes of one backend.")
    timeout_s: float = Field(default=2.0, gt=0, description="A probe slower than this counts as a failure.")
    unhealthy_after: int = Field(
        default=_HEALTH.unhealthy_after, ge=1,
        description="Consecutive failures (probes or connection errors) before a backend stops receiving requests.",
    )
    healthy_after: int = Field(
        default=_HEALTH.healthy_after, ge=1, description="Consecutive successful probes before an unhealthy backend is used again."
    )
    path: str = Field(default="/health", description="Probed path; any 2xx answer is healthy. When unset, each backend is probed at its kind's own path (`/health`, or `/v1/models` for `openai`, which has no health endpoint).")

    @field_validator("path")
    @classmethod
    def _path_ok(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"path {v!r} must start with '/'")
        return v


class RetryConfig(_Model):
    """Retries of a request whose upstream failed before any byte reached its client."""

    max_attempts: int = Field(
        default=_RETRY.max_attempts, ge=1,
        description="Attempts per request in all (1 = never retry). A reset or stale keep-alive connection "
        "is retried once on the same backend over a fresh connection; a refused connection, a 5xx or a "
        "429 on another backend with a free slot. Never once content has reached the client.",
    )
    budget_ratio: float = Field(
        default=_RETRY.budget_ratio, ge=0,
        description="Retries may be at most this share of the requests of the last 10 s (plus "
        "`min_retries_per_s`), so a failing backend cannot multiply the load (Envoy's `retry_budget`).",
    )
    min_retries_per_s: float = Field(
        default=_RETRY.min_retries_per_s, ge=0,
        description="Retries per second always allowed, whatever the request rate.",
    )

    def params(self) -> fp.RetryParams:
        return fp.RetryParams(max_attempts=self.max_attempts, budget_ratio=self.budget_ratio,
                              min_retries_per_s=self.min_retries_per_s)


class ApiKeyConfig(_Model):
    """What one client API key may do."""

    name: str | None = Field(default=None, description="Label for logs (the key itself is never logged).")
    default_class: str | None = Field(
        default=None, description="Class for this key's requests when neither header nor `service_tier` names one."
    )


class AuthConfig(_Model):
    """Client authentication. With no keys configured, the gateway accepts every request."""

    api_keys: dict[str, ApiKeyConfig] = Field(
        default_factory=dict,
        description="Accepted keys (`Authorization: Bearer <key>`), each with optional settings. "
        "When non-empty, a request without a listed key gets 401.",
    )


class GatewayConfig(_Model):
    """The whole `tailguard.yaml` of `tailguard serve`."""

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8080, ge=0, le=65535, description="Port to listen on (0 picks a free one).")
    classes: list[ClassConfig] = Field(
        default_factory=default_classes, min_length=1,
        description="Request classes. Defaults: `interactive` (rank 0) and `batch` (rank 1, capped).",
    )
    default_class: str = Field(
        default="interactive", description="Class of a request that nothing else classifies."
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
    log_prompts: bool = Field(
        default=False, description="Include prompt and completion text in the access log (off: metadata only)."
    )
    retries: RetryConfig = Field(default_factory=RetryConfig, description="Retries that lose nothing.")

    def front_params(self, continues: dict[str, bool] | None = None) -> fp.FrontParams:
        """The front's parameters; `continues` maps a backend to whether its kind can continue a
        generation (backends of kind `auto` are added as not continuing until detected)."""
        known = continues or {}
        h = self.health
        return fp.FrontParams(
            classes=[c.spec() for c in self.classes],
            backends=[b.spec(known.get(b.name, False)) for b in self.backends],
            queue=self.scheduler.queue_params(), preemption=self.scheduler.preemption_params(),
            health=fp.HealthParams(unhealthy_after=h.unhealthy_after, healthy_after=h.healthy_after),
            retry=self.retries.params(),
        )

    def settings(self) -> dict[str, Any]:
        """Every setting as plain data, each secret (client keys, backend keys) replaced by a
        fingerprint: what the config's hash covers, what `/config` shows and a bench run records,
        and what `tailguard config diff` compares. A changed key still shows as changed."""
        data = self.model_dump(mode="json")
        data["auth"]["api_keys"] = {_fingerprint(k): v for k, v in data["auth"]["api_keys"].items()}
        for b in data["backends"]:
            if b.get("api_key"):
                b["api_key"] = _fingerprint(b["api_key"])
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
        for tier, target in self.service_tier_map.items():
            if target not in known:
                raise ValueError(f"service_tier_map.{tier} names unknown class {target!r} (known: {listing})")
        for key_cfg in self.auth.api_keys.values():
            if key_cfg.default_class is not None and key_cfg.default_class not in known:
                label = key_cfg.name or "an api key"
                raise ValueError(
                    f"auth: {label} has default_class {key_cfg.default_class!r}, not a configured class (known: {listing})"
                )
        _no_duplicates([b.name for b in self.backends], "backend")
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
        return _validate({"backends": backends}, "--backend")


def _fingerprint(secret: str) -> str:
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:8]


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


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a `tailguard.yaml`; every problem becomes a `ConfigError` naming file and field."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config file: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = ""
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{p}: not valid YAML{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of settings, got {type(data).__name__}")
    return _validate(data, str(p))


def _validate(data: dict[str, Any], source: str) -> GatewayConfig:
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as e:
        lines = [f"{source}: invalid configuration ({e.error_count()} problem{'s' if e.error_count() > 1 else ''}):"]
        for err in e.errors(include_url=False):
            loc = _loc_text(err["loc"], data)
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown setting (check the spelling; see docs/configuration.md)"
            lines.append(f"  {loc}: {msg}" if loc else f"  {msg}")
        raise ConfigError("\n".join(lines)) from None


def _loc_text(loc: tuple[int | str, ...], data: Any) -> str:
    """`('classes', 1, 'rank')` -> `classes[1] (batch).rank`: the name makes list entries findable."""
    out = ""
    node: Any = data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("name"), str):
                out += f" ({node['name']})"
        elif part == "[key]":
            out += " (as a key)"  # pydantic's marker: the mapping key itself is wrong
        else:
            out += f".{part}" if out else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return out
