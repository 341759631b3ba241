"""The `auth` section of the gateway's config: the client API keys (`AuthConfig`, `ApiKeyConfig`)
and `_fingerprint`, how a secret is shown wherever settings are shown. Its own module because it
is the only section holding client secrets."""

from __future__ import annotations

import hashlib

from pydantic import Field

from tailguard.gateway.config.base import _Model


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


def _fingerprint(secret: str) -> str:
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:8]
