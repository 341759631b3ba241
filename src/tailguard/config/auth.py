"""The `auth` section of the gateway's config: the client API keys (`AuthConfig`, `ApiKeyConfig`)
and the admin keys. Its own module because it is the only section holding client secrets.

A key is written as itself or as `sha256:<64 hex digits>` (its SHA-256, so the file need not
hold the secret; LiteLLM stores its virtual keys hashed the same way). Either way the gateway
keeps only digests and looks a presented key up by its digest (`front.intake.key_id`)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from tailguard.front.intake import key_id
from tailguard.front.params import CallerSpec, KeySpec
from tailguard.config.base import _Model, fingerprint

_HASHED = re.compile(r"sha256:[0-9a-f]{64}")
MAX_KEY_CHARS = 256  # a longer key is refused before it is hashed (a header may hold 8 KB)


def _digest(key: str) -> str:
    """The SHA-256 hex digest a configured key stands for (its own, or the one it names)."""
    return key[7:] if _HASHED.fullmatch(key) else key_id(key)


class ApiKeyConfig(_Model):
    """What one client API key may do (field names as LiteLLM's virtual keys where it has one)."""

    name: str | None = Field(
        default=None, max_length=64,
        description="The caller this key belongs to: its label in logs and metrics, and what its limits are "
        "counted by (keys with one name share them). Unset: the key's fingerprint (the key itself is never logged).",
    )
    default_class: str | None = Field(
        default=None, description="Class for this key's requests when neither header nor `service_tier` names one."
    )
    allowed_classes: list[str] | None = Field(
        default=None, min_length=1,
        description="The classes this key's requests may be in (None: every class). A request naming another, by "
        "header or `service_tier`, is handled as `on_disallowed_class` says.",
    )
    on_disallowed_class: Literal["reject", "lower"] = Field(
        default="reject",
        description="A request naming a class outside `allowed_classes`: `reject` answers 403 `class_not_allowed`; "
        "`lower` serves it in the best-ranked allowed class (its caps apply).",
    )
    allowed_models: list[str] | None = Field(
        default=None,
        description="The models this key may name, as the client names them (None: any); another is 403 "
        "`model_not_allowed` (LiteLLM's `models`).",
    )
    allow_priority: bool = Field(
        default=False,
        description="This key's requests may set an engine's `priority` field themselves; without it a client's "
        "`priority` is dropped for every kind of backend (vLLM and SGLang get the class's instead), so a batch-only "
        "key cannot jump an engine's priority queue.",
    )
    rpm_limit: int | None = Field(
        default=None, ge=1,
        description="Requests per minute the caller may send (a bucket refilled continuously, so a burst of "
        "this many is allowed); over it, 429 `rate_limit_exceeded` with Retry-After (LiteLLM's `rpm_limit`).",
    )
    tpm_limit: int | None = Field(
        default=None, ge=1,
        description="Tokens per minute, prompt and generated. Each request reserves its prompt estimate plus its "
        "capped `max_tokens` on arrival and is refunded what it did not use when it ends, whatever the outcome; "
        "a request the bucket cannot hold now is refused with 429 and Retry-After (TensorZero's reservation).",
    )
    max_parallel_requests: int | None = Field(
        default=None, ge=1,
        description="Requests of the caller queued or running at once; one more is 429 (LiteLLM's name).",
    )
    batch_enqueued_tokens_limit: int | None = Field(
        default=None, ge=1,
        description="Tokens this key's batches in progress may hold together (each line's prompt estimate plus its "
        "`n` x `max_tokens`), as OpenAI's enqueued-token limit: a batch that would pass it ends `failed` with "
        "`token_limit_exceeded` and runs nothing; a batch that ends (completed, cancelled, expired) holds none.",
    )
    weight: float = Field(
        default=1.0, gt=0,
        description="The caller's share under `scheduler.fair_share`: backlogged callers of one class are served "
        "tokens in proportion to their weights.",
    )
    min_ttft_slo_ms: float | None = Field(
        default=None, gt=0,
        description="The tightest TTFT target this key's requests may ask for with `x-tailguard-ttft-slo-ms` "
        "(a tighter ask is raised to it), below their class's own `slo.min_ttft_s` (None: the class's). A tighter "
        "target orders a request sooner and refuses it sooner: a right, not a default (docs/slo.md).",
    )

    def caller(self, key: str) -> str:
        return self.name if self.name is not None else fingerprint(key)

    def spec(self, key: str) -> KeySpec:
        return KeySpec(caller=self.caller(key), default_class=self.default_class,
                       allowed_classes=tuple(self.allowed_classes) if self.allowed_classes is not None else None,
                       lower=self.on_disallowed_class == "lower",
                       allowed_models=frozenset(self.allowed_models) if self.allowed_models is not None else None,
                       batch_enqueued_tokens=self.batch_enqueued_tokens_limit, set_priority=self.allow_priority,
                       min_ttft_slo_s=None if self.min_ttft_slo_ms is None else self.min_ttft_slo_ms / 1000.0)

    def limits(self, key: str) -> CallerSpec:
        return CallerSpec(self.caller(key), self.rpm_limit, self.tpm_limit, self.max_parallel_requests, self.weight)


class AuthConfig(_Model):
    """Client authentication. With no keys configured, the gateway accepts every request."""

    api_keys: dict[str, ApiKeyConfig] = Field(
        default_factory=dict,
        description="Accepted keys (`Authorization: Bearer <key>`), each with optional settings; a key may be "
        "written as `sha256:<hex digest>`. When non-empty, a request without a listed key gets 401.",
    )
    admin_keys: list[str] = Field(
        default_factory=list,
        description="Keys (or `sha256:<hex>` digests) for `/config`, `/admin/*` and, unless `open_metrics` says "
        "otherwise, `/metrics`. With client keys but no admin key, those routes are refused to everyone.",
    )
    open_metrics: Literal["keys", "loopback", "always"] = Field(
        default="loopback",
        description="Who may read `/metrics` when keys are configured: `keys` an admin key only; `loopback` also "
        "any client on 127.0.0.1/::1 (a Prometheus on the same host); `always` anyone.",
    )
    allow_keyless: bool = Field(
        default=False,
        description="Confirms that this config means to serve anyone without a key. A live reload that removes "
        "every key (a half-written file cut off before `auth:` reads as exactly that) is refused without it, "
        "or without `tailguard config reload --allow-auth-change`.",
    )

    @field_validator("api_keys")
    @classmethod
    def _key_sizes(cls, keys: dict[str, ApiKeyConfig]) -> dict[str, ApiKeyConfig]:
        for key in keys:
            if not key or len(key) > MAX_KEY_CHARS or not key.isprintable() or " " in key:
                raise ValueError(f"an api key must be 1 to {MAX_KEY_CHARS} printable characters without spaces "
                                 f"({fingerprint(key)} is not)")
        return keys

    @model_validator(mode="after")
    def _one_limit_per_caller(self) -> AuthConfig:
        seen: dict[str, CallerSpec] = {}
        digests: set[str] = set()
        for key, k in self.api_keys.items():
            spec = k.limits(key)
            if seen.setdefault(spec.name, spec) != spec:
                raise ValueError(f"keys named {spec.name!r} share their limits, so they must give the same "
                                 "rpm_limit, tpm_limit, max_parallel_requests and weight")
            if _digest(key) in digests:
                raise ValueError(f"{fingerprint(key)} is listed twice (once as itself, once as its sha256)")
            digests.add(_digest(key))
        for admin in self.admin_keys:
            if not _HASHED.fullmatch(admin) and not 16 <= len(admin) <= MAX_KEY_CHARS:
                raise ValueError(f"an admin key must be 16 to {MAX_KEY_CHARS} characters, or sha256:<hex> "
                                 f"({fingerprint(admin)} is not)")
            if _digest(admin) in digests:
                raise ValueError(f"{fingerprint(admin)} is both a client key and an admin key")
        return self

    def keys(self) -> dict[str, KeySpec]:
        """Each key's digest with whose it is and what it may use (`tailguard.front.intake`)."""
        return {_digest(key): k.spec(key) for key, k in self.api_keys.items()}

    def admin_digests(self) -> frozenset[str]:
        return frozenset(_digest(k) for k in self.admin_keys)

    def names(self) -> set[str]:
        """The callers the keys name (keys that share a `name` are one caller)."""
        return {k.caller(key) for key, k in self.api_keys.items()}

    def callers(self) -> list[CallerSpec]:
        """Each caller with limits or a weight of its own, once."""
        found = {k.caller(key): k.limits(key) for key, k in self.api_keys.items()}
        return [s for s in found.values() if s.requests_per_minute or s.tokens_per_minute or s.max_parallel
                or s.weight != 1.0]
