"""The `auth` section of the gateway's config: the client API keys (`AuthConfig`, `ApiKeyConfig`).
Its own module because it is the only section holding client secrets."""

from __future__ import annotations

from pydantic import Field, model_validator

from tailguard.front.params import CallerSpec, KeySpec
from tailguard.gateway.config.base import _Model, fingerprint


class ApiKeyConfig(_Model):
    """What one client API key may do."""

    name: str | None = Field(
        default=None,
        description="The caller this key belongs to: its label in logs and metrics, and what its limits are "
        "counted by (keys with one name share them). Unset: the key's fingerprint (the key itself is never logged).",
    )
    default_class: str | None = Field(
        default=None, description="Class for this key's requests when neither header nor `service_tier` names one."
    )
    rpm_limit: int | None = Field(
        default=None, ge=1,
        description="Requests per minute the caller may send (a bucket refilled continuously, so a burst of "
        "this many is allowed); over it, 429 `rate_limit_exceeded` with Retry-After (LiteLLM's `rpm_limit`).",
    )
    tpm_limit: int | None = Field(
        default=None, ge=1,
        description="Tokens per minute, prompt and generated, counted as each request ends: a caller over it is "
        "refused with 429 until its use falls back under (LiteLLM's `tpm_limit`).",
    )

    def caller(self, key: str) -> str:
        return self.name if self.name is not None else fingerprint(key)

    def spec(self, key: str) -> KeySpec:
        return KeySpec(caller=self.caller(key), default_class=self.default_class)


class AuthConfig(_Model):
    """Client authentication. With no keys configured, the gateway accepts every request."""

    api_keys: dict[str, ApiKeyConfig] = Field(
        default_factory=dict,
        description="Accepted keys (`Authorization: Bearer <key>`), each with optional settings. "
        "When non-empty, a request without a listed key gets 401.",
    )
    allow_keyless: bool = Field(
        default=False,
        description="Confirms that this config means to serve anyone without a key. A live reload that removes "
        "every key (a half-written file cut off before `auth:` reads as exactly that) is refused without it, "
        "or without `tailguard config reload --allow-auth-change`.",
    )

    @model_validator(mode="after")
    def _one_limit_per_caller(self) -> AuthConfig:
        seen: dict[str, tuple[int | None, int | None]] = {}
        for key, k in self.api_keys.items():
            limits = (k.rpm_limit, k.tpm_limit)
            if seen.setdefault(k.caller(key), limits) != limits:
                raise ValueError(f"keys named {k.caller(key)!r} share their limits, so they must give the same "
                                 "rpm_limit and tpm_limit")
        return self

    def keys(self) -> dict[str, KeySpec]:
        """Each key with whose it is and its default class (`tailguard.front.intake`)."""
        return {key: k.spec(key) for key, k in self.api_keys.items()}

    def callers(self) -> list[CallerSpec]:
        """Each caller with limits, once."""
        found = {k.caller(key): CallerSpec(k.caller(key), k.rpm_limit, k.tpm_limit)
                 for key, k in self.api_keys.items() if k.rpm_limit or k.tpm_limit}
        return list(found.values())

